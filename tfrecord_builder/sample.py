"""The bundled Wikipedia sample as ready pre-training data: what `run_pretraining.py` trains
on when no --train_data is given."""

import dataclasses
import os
from typing import Optional, Tuple

from absl import logging

from electra_tf import DEFAULT_CORPUS, DEFAULT_VOCAB
from tfrecord_builder import BuildError
from tfrecord_builder.build import BuildConfig, build

SAMPLE_CACHE = os.path.join("cache", "tfrecords")  # relative to the working directory
SAMPLE_VOCAB_SIZE = 30522  # the BERT uncased vocabulary it is tokenized with
NUM_SHARDS = 16


def bundled_sample(max_seq_length: int, cache_dir: str = SAMPLE_CACHE,
                   num_workers: Optional[int] = None) -> Tuple[str, str]:
    """Builds the sample at this length into `cache_dir` (once: a finished identical
    build is reused) and returns (training shards, held-out shard) as file patterns: the
    last of its 16 shards is kept out of training for evaluation."""
    out = os.path.join(cache_dir, f"enwiki_sample-seq{max_seq_length}")
    logging.info("No --train_data: using the bundled Wikipedia sample, built in %s", out)
    cfg = BuildConfig(output_dir=out, inputs=(DEFAULT_CORPUS,), vocab_file=DEFAULT_VOCAB,
                      max_seq_length=max_seq_length, num_shards=NUM_SHARDS,
                      num_workers=num_workers or min(2, os.cpu_count() or 1))
    try:
        manifest = build(cfg)
    except BuildError:  # the cache holds another build of ours (older builder): replace it
        manifest = build(dataclasses.replace(cfg, overwrite=True))
    shards = sorted(os.path.join(out, s["name"]) for s in manifest["shards"])
    return ",".join(shards[:-1]), shards[-1]
