"""Reading a build's shards without TensorFlow (`electra_tf.data.records`) beside
TensorFlow's reader and parser, in one process, alternated round by round: sequences/s of
framing + checksums + parsing into int32 batches, one thread.

    python bench/bench_records.py [BUILD_DIR] [--batch_size 128] [--rounds 3]

BUILD_DIR defaults to the bundled sample's build (`cache/`, made by `run_pretraining.py`
on first use). The TensorFlow side is `tf.data.TFRecordDataset` over the same files in
the same order, batched, `tf.io.parse_example`: the work, not the shuffled order, of the
training pipeline."""

import argparse
import glob
import json
import os
import sys
import time


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from electra_tf import wire  # noqa: E402
from electra_tf.data import records  # noqa: E402


def ours(paths, length, batch_size):
    n, pending = 0, []
    for path in paths:
        with open(path, "rb") as f:
            for raw in records.read_records(f, path):
                pending.append(raw)
                if len(pending) == batch_size:
                    n += len(records.parse_examples(pending, length)["input_ids"])
                    pending = []
    return n


def ours_in_order(paths, length, batch_size):
    """The training order (cycle 8, a 10,000-record window, one epoch) from `order.records`,
    each shard read whole first."""
    import itertools
    from electra_tf.data.order import StreamOrder
    shards = []
    for path in paths:
        with open(path, "rb") as f:
            shards.append(list(records.read_records(f, path)))
    order = StreamOrder(num_shards=len(paths), cycle_length=min(8, len(paths)),
                        window=10_000, key=(1234, 0))
    stream = order.records([len(s) for s in shards], lambda i: shards[i], repeat=False)
    n = 0
    while True:
        raw = list(itertools.islice(stream, batch_size))
        if len(raw) < batch_size:
            return n
        n += len(records.parse_examples(raw, length)["input_ids"])


def tensorflows(paths, length, batch_size):
    import tensorflow as tf
    spec = {k: tf.io.FixedLenFeature([length], tf.int64) for k in records.FEATURE_NAMES}
    ds = tf.data.TFRecordDataset(paths).batch(batch_size, drop_remainder=True)
    n = 0
    for batch in ds:
        parsed = tf.io.parse_example(batch, spec)
        n += int(tf.shape(tf.cast(parsed["input_ids"], tf.int32))[0])
    return n


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build_dir", nargs="?",
                        default=os.path.join(REPO, "cache", "tfrecords", "enwiki_sample-seq128"))
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with open(os.path.join(args.build_dir, "manifest.json")) as f:
        manifest = json.load(f)
    paths = sorted(glob.glob(os.path.join(args.build_dir, "*.tfrecord*")))
    length = manifest["max_seq_length"]
    print(f"{len(paths)} shards, {manifest['examples']} examples of length {length}, "
          f"batch {args.batch_size}; CRC-32C: "
          f"{'google-crc32c (C)' if wire._crc32c_c else 'Python loop'}")
    runs = (("ours", ours), ("ours, training order", ours_in_order),
            ("tensorflow", tensorflows))
    for name, fn in runs:
        fn(paths, length, args.batch_size)  # warm-up: imports, file cache
    for r in range(args.rounds):
        line = [f"round {r + 1}:"]
        for name, fn in runs:
            start = time.perf_counter()
            n = fn(paths, length, args.batch_size)
            took = time.perf_counter() - start
            line.append(f"{name} {n / took:,.0f} seq/s ({n} in {took:.3f} s)")
        print("  ".join(line))
    print("ELECTRA-Small's goal on a GPU: 12,000 seq/s per host process")
    return 0


if __name__ == "__main__":
    sys.exit(main())
