"""Builder throughput: tokens per second per process, end to end, and peak memory.

    python bench/bench_builder.py                      # bundled sample x4, 1 process
    python bench/bench_builder.py --workers 2          # also time the process pool
    python bench/bench_builder.py --corpus_gb 1        # peak RSS on a 1 GB corpus
    python bench/bench_builder.py --output_root gs://BUCKET/tmp/bench  # remote output
    python bench/bench_builder.py --repeat 10 --rounds 3 \
        --official_python=/path/to/tf2.15-venv/bin/python --official_code=/path/to/electra
        # our CLI's whole process beside the official build_pretraining_dataset.py's,
        # alternated on the same file (the official code needs TensorFlow <= 2.15)

End to end = read + decode + normalise + tokenize + pack + serialize + write pieces +
assemble shards + manifest. Process start-up (importing TensorFlow, loading the
vocabulary) is reported on its own line, not mixed into the rate; the builder CLI's whole
process (start-up of it and its workers included) on a line of its own.
"""

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
import electra_tf  # noqa: E402,F401  (first: the version check; no TPU runtime load without chips)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

WIKI = os.path.join(REPO, "data", "corpus", "enwiki_sample.txt")
VOCAB = os.path.join(REPO, "data", "vocab", "bert_uncased_vocab.txt")


def _repeat_corpus(path, times):
    with open(WIKI, "rb") as f:
        text = f.read().rstrip(b"\n") + b"\n\n"
    with open(path, "wb") as f:
        for _ in range(times):
            f.write(text)


def stage_breakdown(corpus, chunk_bytes):
    """Seconds per stage over the corpus in this process (tokenizer already warm)."""
    from tfrecord_builder import corpus as corpus_lib
    from tfrecord_builder import examples
    from electra_tf.text import Tokenizer, vocab_info
    import tensorflow as tf
    tok = Tokenizer(vocab_info(VOCAB))
    tok.tokenize(["warm up"])
    t = {"read": 0.0, "decode": 0.0, "normalize+tokenize": 0.0, "pack": 0.0,
         "serialize": 0.0, "write": 0.0}
    tokens = 0
    it = corpus_lib.iter_file_chunks(corpus, 0, chunk_bytes)
    tmp = tempfile.mkdtemp()
    clock = time.perf_counter
    while True:
        t0 = clock()
        chunk = next(it, None)
        t["read"] += clock() - t0
        if chunk is None:
            break
        t0 = clock()
        lines = corpus_lib.clean_lines(chunk, corpus_lib.LineStats())
        t1 = clock()
        lines, sentences, _ = examples.tokenize_chunk(chunk, tok)
        t2 = clock()
        t["decode"] += t1 - t0
        t["normalize+tokenize"] += max(0.0, (t2 - t1) - (t1 - t0))
        tokens += sum(map(len, sentences))
        t0 = clock()
        packed, _ = examples.pack_chunk(chunk, lines, sentences, tok.special_ids, 128, 1)
        t1 = clock()
        records = examples.serialize_examples(packed)
        t2 = clock()
        with tf.io.TFRecordWriter(os.path.join(tmp, "piece")) as w:
            for r in records:
                w.write(r)
        t["pack"] += t1 - t0
        t["serialize"] += t2 - t1
        t["write"] += clock() - t2
    shutil.rmtree(tmp)
    return tokens, t


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=4, help="copies of the sample to build")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--corpus_gb", type=float, default=0.0,
                    help="build a corpus of this many GB (sample repeated) in a subprocess "
                         "and report its peak RSS per process")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--rounds", type=int, default=1,
                    help="whole-process timings of the CLI (and the official builder), "
                         "alternated")
    ap.add_argument("--official_python", default=None,
                    help="a Python with TensorFlow <= 2.15 to time the official "
                         "build_pretraining_dataset.py beside ours")
    ap.add_argument("--official_code", default=None,
                    help="a checkout of google-research/electra (with --official_python)")
    ap.add_argument("--output_root", default=None,
                    help="where the builds go (default: the local temp dir); a URL such "
                         "as gs://bucket/dir times a remote --output_dir, to which worker "
                         "processes stage their pieces locally")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="bench_builder_")
    try:
        if args.corpus_gb:
            return memory_run(work, args)
        corpus = os.path.join(work, "corpus.txt")
        _repeat_corpus(corpus, args.repeat)
        size_mb = os.path.getsize(corpus) / 1e6

        t0 = time.perf_counter()
        from tfrecord_builder import import_tensorflow  # start-up, reported separately
        import_tensorflow()  # as a builder process does: without Keras
        from tfrecord_builder.build import BuildConfig, build, _init_worker
        from electra_tf.text import vocab_info
        _init_worker(vocab_info(VOCAB))
        startup = time.perf_counter() - t0
        print(f"machine: {os.cpu_count()} cores; corpus: {size_mb:.1f} MB "
              f"(bundled Wikipedia sample x{args.repeat})")
        print(f"process start-up (import TensorFlow + tokenizer): {startup:.2f} s")

        from electra_tf import fileio
        root = args.output_root or work
        if args.output_root:
            print(f"output: {root}")
        for workers in sorted({1, args.workers}):
            out = fileio.join(root, f"bench_builder_out{workers}")
            fileio.rmtree(out)
            t0 = time.perf_counter()
            m = build(BuildConfig(output_dir=out, inputs=(corpus,), vocab_file=VOCAB,
                                  num_workers=workers, num_shards=16))
            dt = time.perf_counter() - t0
            rate = m["corpus_tokens"] / dt
            label = "per process, end to end" if workers == 1 else \
                f"{workers} worker processes (includes their start-up)"
            print(f"builder, {label}: {rate / 1e6:.2f} M tokens/s "
                  f"({m['corpus_tokens']} tokens, {m['examples']} examples in {dt:.2f} s)")
            if args.output_root and not args.keep:
                fileio.rmtree(out)
        whole_process_rounds(args, corpus, work, fileio.join(root, "bench_builder_cli"))
        tokens, stages = stage_breakdown(corpus, 1 << 19)
        total = sum(stages.values())
        print("stage breakdown (1 process): " + ", ".join(
            f"{k} {v:.2f}s" for k, v in stages.items()) +
              f"; stages alone {tokens / total / 1e6:.2f} M tokens/s")
        print(f"peak RSS of this process: "
              f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def whole_process_rounds(args, corpus, work, out):
    """What a user waits for, every process's start-up included: our CLI and, given
    --official_python, the official builder (one process, --num-processes 1: it splits work
    by input file) on the same corpus, alternated --rounds times."""
    from electra_tf import fileio
    official_dir = os.path.join(work, "official_corpus")  # its --corpus-dir: this file only
    os.makedirs(official_dir, exist_ok=True)
    os.link(corpus, os.path.join(official_dir, "corpus.txt"))
    ours, theirs = [], []
    for _ in range(args.rounds):
        fileio.rmtree(out)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "tfrecord_builder", f"--input={corpus}",
                        f"--output_dir={out}", f"--num_workers={args.workers}"],
                       check=True, cwd=REPO, stdout=subprocess.DEVNULL)
        ours.append(time.perf_counter() - t0)
        if args.output_root and not args.keep:
            fileio.rmtree(out)
        if args.official_python:
            official_out = os.path.join(work, "official_out")
            shutil.rmtree(official_out, ignore_errors=True)
            os.makedirs(official_out)
            t0 = time.perf_counter()
            subprocess.run([args.official_python, "build_pretraining_dataset.py",
                            f"--corpus-dir={official_dir}", f"--vocab-file={VOCAB}",
                            f"--output-dir={official_out}", "--max-seq-length=128",
                            "--num-processes=1"], check=True, cwd=args.official_code,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            theirs.append(time.perf_counter() - t0)
    shown = lambda times: " / ".join(f"{t:.2f}" for t in times)
    print(f"builder CLI, whole process ({args.workers} worker(s)): {shown(ours)} s")
    if theirs:
        print(f"official build_pretraining_dataset.py, whole process (1 process): "
              f"{shown(theirs)} s; ours is {min(theirs) / max(ours):.1f}-"
              f"{max(theirs) / min(ours):.1f}x faster")


def memory_run(work, args):
    """Builds a corpus of args.corpus_gb GB in a child process, then prints the peak RSS
    of the main process and of the largest worker."""
    corpus = os.path.join(work, "big.txt")
    sample = os.path.getsize(WIKI)
    _repeat_corpus(corpus, max(1, int(args.corpus_gb * 1e9 / sample)))
    size = os.path.getsize(corpus)
    out = os.path.join(work, "out")
    code = (
        "import resource, sys, time\n"
        "from tfrecord_builder.build import BuildConfig, build\n"
        "t = time.perf_counter()\n"
        f"m = build(BuildConfig(output_dir={out!r}, inputs=({corpus!r},), "
        f"vocab_file={VOCAB!r}, num_workers={args.workers}, num_shards=64))\n"
        "dt = time.perf_counter() - t\n"
        "print('tokens', m['corpus_tokens'], 'examples', m['examples'], 'seconds', round(dt, 1),"
        " 'tokens/s', round(m['corpus_tokens'] / dt))\n"
        "print('peak RSS main MiB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)\n"
        "print('peak RSS largest worker MiB',"
        " resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)\n")
    print(f"corpus: {size / 1e9:.2f} GB, {args.workers} worker(s)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    print(done.stdout.strip())
    if done.returncode:
        print(done.stderr[-3000:])
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
