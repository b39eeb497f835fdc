"""Resume cost of the pre-training input pipeline: seconds from `make_dataset` with
`skip_batches=STEP` to its first batch, against STEP.

The pipeline finds the position of a step from the manifest's per-shard counts and reads
only the current shards up to their place, so the time should not grow with the step.
The peer, in the same run, is reading the stream from its start and discarding the
batches before STEP (`Dataset.skip`, how resuming worked before), for the steps where
that finishes within --peer_limit_s.

    python bench/bench_resume.py [--steps 0,1000,10000,100000,1000000] [--data_dir DIR]
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # local: the repo
sys.path.insert(0, REPO)  # run as a script from a checkout, installed or not
import electra_tf  # noqa: E402,F401  (first: the version check; no TPU runtime load without chips)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from electra_tf import fileio
from electra_tf.data.dataset import InputConfig, make_dataset  # noqa: E402
from electra_tf.data import manifest as manifest_lib  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data_dir", help="where to write the synthetic build (any filesystem, "
                   "gs:// included); default: a local temp dir, removed afterwards")
    p.add_argument("--num_shards", type=int, default=64)
    p.add_argument("--records_per_shard", type=int, default=2000)
    p.add_argument("--max_seq_length", type=int, default=128)
    p.add_argument("--batch_size", type=int, default=128)
    p.add_argument("--steps", default="0,1000,10000,100000,1000000")
    p.add_argument("--shuffle_buffer", type=int, default=10_000)
    p.add_argument("--repeats", type=int, default=3, help="timings per step (median shown)")
    p.add_argument("--peer_limit_s", type=float, default=120.0,
                   help="skip the read-through peer for steps it would take longer on")
    return p.parse_args(argv)


def write_build(directory: str, args) -> int:
    """A build of num_shards shards of random ids with a manifest; returns its records."""
    rng = np.random.default_rng(0)
    seq = args.max_seq_length
    names = [f"pretrain_data.tfrecord-{i:05d}-of-{args.num_shards:05d}"
             for i in range(args.num_shards)]
    fileio.makedirs(directory)
    first = fileio.join(directory, names[0])
    with tf.io.TFRecordWriter(first) as w:
        for _ in range(args.records_per_shard):
            ids = rng.integers(1000, 30522, seq).tolist()
            feats = {"input_ids": ids, "input_mask": [1] * seq, "segment_ids": [0] * seq}
            w.write(tf.train.Example(features=tf.train.Features(feature={
                k: tf.train.Feature(int64_list=tf.train.Int64List(value=v))
                for k, v in feats.items()})).SerializeToString())
    for name in names[1:]:  # the same records in every shard: the cost is what is measured
        fileio.copy(first, fileio.join(directory, name))
    total = args.num_shards * args.records_per_shard
    manifest_lib.write_manifest(directory, {
        "format": manifest_lib.FORMAT, "format_version": manifest_lib.FORMAT_VERSION,
        "max_seq_length": seq, "examples": total, "tokenizer": {"vocab_size": 30522},
        "shards": [{"name": n, "examples": args.records_per_shard} for n in names]})
    return total


def _config(directory, args, skip_batches):
    return InputConfig(file_pattern=directory, max_seq_length=args.max_seq_length,
                       batch_size=args.batch_size, shuffle_buffer=args.shuffle_buffer,
                       seed=1, deterministic=True, check_data=False,
                       skip_batches=skip_batches)


def time_resume(directory, args, step) -> float:
    t0 = time.perf_counter()
    next(iter(make_dataset(_config(directory, args, step))))
    return time.perf_counter() - t0


def time_read_through(directory, args, step) -> float:
    t0 = time.perf_counter()
    next(iter(make_dataset(_config(directory, args, 0)).skip(step)))
    return time.perf_counter() - t0


def main(argv=None):
    args = parse_args(argv)
    steps = [int(s) for s in args.steps.split(",")]
    with fileio.local_staging_dir("bench-resume-") as tmp:
        directory = args.data_dir or os.path.join(tmp, "build")
        t0 = time.perf_counter()
        total = write_build(directory, args)
        print(f"build: {args.num_shards} shards x {args.records_per_shard} records of "
              f"{args.max_seq_length} ({total:,} per epoch) in {directory} "
              f"({time.perf_counter() - t0:.1f} s)")
        time_resume(directory, args, 0)  # warm-up: imports, first tf.data graph
        print(f"{'step':>9} {'records skipped':>16} {'epoch':>6} {'resume s':>9} "
              f"{'read-through s':>15}")
        rate = None  # records/s of the read-through, to predict what it would take
        for step in steps:
            times = sorted(time_resume(directory, args, step) for _ in range(args.repeats))
            records = step * args.batch_size
            peer = "-"
            if rate is None or records / rate < args.peer_limit_s:
                s = time_read_through(directory, args, step)
                if step:
                    rate = records / s
                peer = f"{s:.2f}"
            elif rate:
                peer = f"~{records / rate:,.0f} (est.)"
            print(f"{step:>9,} {records:>16,} {records // total:>6} "
                  f"{times[len(times) // 2]:>9.2f} {peer:>15}", flush=True)


if __name__ == "__main__":
    main()
