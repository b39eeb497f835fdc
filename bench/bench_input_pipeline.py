"""Throughput of electra_tf.data.dataset on the bundled Wikipedia sample.

Reads with repeat=True, as the trainer does, and compares the rate with how fast a trainer
consumes sequences (--trainer_seqs_per_s), to show whether input could ever be the limit.
Both pipelines by default, one after the other in one process, in turns (--rounds):
tf.data's (`make_dataset`, the TensorFlow runtime's) and the NumPy one (`make_batches`,
the JAX runtime's, one host process, no TensorFlow; `--pipelines host` runs it alone and
imports no TensorFlow).

    python bench/bench_input_pipeline.py [--data_dir DIR] [--num_batches 3000]
"""

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # local: the repo
sys.path.insert(0, REPO)  # run as a script from a checkout, installed or not
import electra_tf  # noqa: E402,F401  (first: the version check; no TPU runtime load without chips)

from electra_tf.data.dataset import (InputConfig, InputContext, make_batches,  # noqa: E402
                                     make_dataset)
from electra_tf.data.files import check_data, resolve_files  # noqa: E402

DEFAULT_DATA = os.path.join(REPO, "cache", "tfrecords", "enwiki_sample-seq128")
CORPUS = os.path.join(REPO, "data", "corpus", "enwiki_sample.txt")
VOCAB = os.path.join(REPO, "data", "vocab", "bert_uncased_vocab.txt")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data_dir", help="a build directory or file pattern; default: the main "
                   "job's build of the sample if present, else a fresh build in a temp dir")
    p.add_argument("--max_seq_length", type=int, default=128)
    p.add_argument("--batch_sizes", default="128,32", help="comma-separated global batches")
    p.add_argument("--num_batches", type=int, default=3000, help="timed batches per size")
    p.add_argument("--warmup", type=int, default=200, help="untimed batches first")
    p.add_argument("--shuffle_buffer", type=int, default=InputConfig.shuffle_buffer)
    p.add_argument("--cycle_length", type=int, default=InputConfig.cycle_length)
    p.add_argument("--pipelines", default="tf,host", help="tf (tf.data), host (NumPy), or both")
    p.add_argument("--rounds", type=int, default=2, help="turns of each pipeline")
    p.add_argument("--trainer_seqs_per_s", type=float, default=13.0,
                   help="the trainer's consumption rate to compare with (ELECTRA-Small "
                   "train steps on this CPU, fp32: roughly 13 sequences/s)")
    return p.parse_args(argv)


def _build_sample(output_dir: str, max_seq_length: int):
    from tfrecord_builder.build import BuildConfig, build
    build(BuildConfig(output_dir=output_dir, inputs=(CORPUS,), vocab_file=VOCAB,
                      max_seq_length=max_seq_length, num_shards=16, num_workers=1))


def measure(pattern: str, batch_size: int, args, pipeline: str = "tf") -> dict:
    cfg = InputConfig(file_pattern=pattern, max_seq_length=args.max_seq_length,
                      batch_size=batch_size, shuffle_buffer=args.shuffle_buffer,
                      cycle_length=args.cycle_length, repeat=True)
    t0 = time.perf_counter()
    it = iter(make_dataset(cfg) if pipeline == "tf" else make_batches(cfg, InputContext()))
    next(it)
    first_s = time.perf_counter() - t0
    for _ in range(args.warmup):
        next(it)
    t1 = time.perf_counter()
    for _ in range(args.num_batches):
        batch = next(it)
    elapsed = time.perf_counter() - t1
    assert batch["input_ids"].shape == (batch_size, args.max_seq_length)
    return {"first_s": first_s, "elapsed": elapsed,
            "batches_per_s": args.num_batches / elapsed,
            "examples_per_s": args.num_batches * batch_size / elapsed}


def main(argv=None):
    args = parse_args(argv)
    tmp = None
    pattern = args.data_dir
    if pattern is None:
        pattern = DEFAULT_DATA
        if not os.path.exists(os.path.join(pattern, "manifest.json")):  # local: DEFAULT_DATA
            tmp = tempfile.TemporaryDirectory(prefix="bench_input_pipeline-")
            pattern = tmp.name
            t = time.perf_counter()
            _build_sample(pattern, args.max_seq_length)
            print(f"built the sample into {pattern} in {time.perf_counter() - t:.1f} s")
    try:
        manifest = check_data(pattern, max_seq_length=args.max_seq_length)
        files = resolve_files(pattern)
        examples = manifest["examples"] if manifest else "unknown"
        print(f"data: {pattern} ({examples} examples in {len(files)} files)")
        pipelines = [p.strip() for p in args.pipelines.split(",") if p.strip()]
        versions = (f"tensorflow {__import__('tensorflow').__version__}" if "tf" in pipelines
                    else "no TensorFlow")
        print(f"host: {os.cpu_count()} CPUs, {versions}; repeat=True, "
              f"shuffle_buffer={args.shuffle_buffer}, cycle_length={args.cycle_length}, "
              f"{args.warmup} warm-up + {args.num_batches} timed batches each")
        names = {"tf": "tf.data (make_dataset)", "host": "NumPy (make_batches)"}
        for batch_size in [int(b) for b in args.batch_sizes.split(",") if b.strip()]:
            for round_ in range(args.rounds):
                for pipeline in pipelines:
                    r = measure(pattern, batch_size, args, pipeline)
                    ratio = r["examples_per_s"] / args.trainer_seqs_per_s
                    print(f"round {round_ + 1} {names[pipeline]}: batch {batch_size} x seq "
                          f"{args.max_seq_length}: {r['batches_per_s']:.1f} batches/s, "
                          f"{r['examples_per_s']:.0f} examples/s ({args.num_batches} batches "
                          f"in {r['elapsed']:.2f} s; first batch after {r['first_s']:.2f} s; "
                          f"{ratio:.0f}x the trainer's {args.trainer_seqs_per_s:g} seq/s)",
                          flush=True)
    finally:
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    main()
