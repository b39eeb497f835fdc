"""The two data-order checks of docs/transfer.md (issue 30).

`permute`: the same pre-training examples in random order across the shards, as a build
that had shuffled them: every record of IN's shards, permuted with --seed and dealt round
robin to as many shards in OUT (any filesystem; IN's manifest.json is copied with the
record counts rewritten, so our trainer reads OUT as it reads IN).

    python experiments/data_order.py permute IN_DIR OUT_DIR [--seed=0]

`pretrain`: run_pretraining.py reading its data through a shuffle window of
--shuffle_buffer records instead of the trainer's 10,000 (the official input function
shuffles 100 after interleaving the shards). Everything after `--` goes to
run_pretraining.py.

    python experiments/data_order.py pretrain --shuffle_buffer=100 -- --config=tiny ...
"""

import argparse
import dataclasses
import json
import os
import runpy
import sys
from typing import List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import electra_tf  # noqa: E402,F401  (first: the version check)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from electra_tf import fileio  # noqa: E402
from electra_tf.data.files import resolve_files  # noqa: E402

MANIFEST = "manifest.json"


def permute_shards(in_dir: str, out_dir: str, seed: int = 0) -> List[int]:
    """Writes IN's records permuted into as many shards under OUT; returns their counts."""
    files = resolve_files(in_dir, on_bad_shard="stop")
    records = [r.numpy() for f in files for r in tf.data.TFRecordDataset(f)]
    order = np.random.default_rng(seed).permutation(len(records))
    fileio.makedirs(out_dir)
    counts = []
    for s, name in enumerate(os.path.basename(f) for f in files):
        picked = order[s::len(files)]
        with tf.io.TFRecordWriter(fileio.join(out_dir, name)) as writer:
            for i in picked:
                writer.write(records[i])
        counts.append(len(picked))
    manifest_path = fileio.join(in_dir, MANIFEST)
    if fileio.exists(manifest_path):
        manifest = fileio.read_json(manifest_path)
        for entry, count in zip(manifest.get("shards", []), counts):
            if isinstance(entry, dict) and "examples" in entry:
                entry["examples"] = count
        manifest["permuted_from"] = {"input": in_dir, "seed": seed}
        counts_file = manifest.get("token_counts_file")  # the same records: the same counts
        if counts_file and fileio.exists(fileio.join(in_dir, counts_file)):
            tf.io.gfile.copy(fileio.join(in_dir, counts_file),
                             fileio.join(out_dir, counts_file), overwrite=True)
        fileio.write_json_atomic(fileio.join(out_dir, MANIFEST), manifest, indent=1)
    return counts


def pretrain_with_window(shuffle_buffer: int, argv: List[str]):
    """run_pretraining.py with its training input read through `shuffle_buffer`."""
    from electra_tf.pretraining import pretrain
    original = pretrain.input_config

    def input_config(files, cfg, batch_size, training, skip_batches=0):
        config = original(files, cfg, batch_size, training, skip_batches)
        return dataclasses.replace(config, shuffle_buffer=shuffle_buffer) if training \
            else config

    pretrain.input_config = input_config
    sys.argv = ["run_pretraining.py"] + argv
    runpy.run_path(os.path.join(REPO, "run_pretraining.py"), run_name="__main__")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    rest: List[str] = []
    if "--" in argv:
        argv, rest = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    perm = sub.add_parser("permute")
    perm.add_argument("in_dir")
    perm.add_argument("out_dir")
    perm.add_argument("--seed", type=int, default=0)
    pre = sub.add_parser("pretrain")
    pre.add_argument("--shuffle_buffer", type=int, default=100)
    args = p.parse_args(argv)
    if args.command == "permute":
        counts = permute_shards(args.in_dir, args.out_dir, args.seed)
        print(json.dumps({"out_dir": args.out_dir, "records": counts}))
    else:
        pretrain_with_window(args.shuffle_buffer, rest)


if __name__ == "__main__":
    main()
