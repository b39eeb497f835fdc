"""Train-step throughput and MFU of the compiled pre-training step.

For a preset, a batch and a sequence length, times `steps` train steps (one host visit,
as `steps_per_loop` does in training) after a warm-up call, for each precision and XLA
setting asked for, each in a fresh subprocess. Achieved FLOP/s use the hardware
convention of `electra_tf.pretraining.flops` (train = 3 x forward matmul FLOPs, gathered
embeddings); the peak is measured in the same run (a large matmul per dtype on CPU) or
taken from `electra_tf.training.hardware`'s table on a GPU/TPU, or given with --peak_flops.

    python bench/bench_train_step.py --config small --batch_size 32 --max_seq_length 128 \\
        --precisions float32,bfloat16 --jit on,off --steps 10

Prints one row per setting and, with --json, writes them to a file.
"""

import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # local: the repo
sys.path.insert(0, REPO)  # run as a script from a checkout, installed or not
import electra_tf  # noqa: E402,F401  (first: the version check; no TPU runtime load without chips)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="small", help="a preset or a config JSON")
    p.add_argument("--params_override", default="", help="key=value,... config overrides")
    p.add_argument("--batch_size", type=int, default=32, help="global batch")
    p.add_argument("--max_seq_length", type=int, default=128)
    p.add_argument("--precisions", default="float32,bfloat16")
    p.add_argument("--jit", default="on", help="on, off or on,off (TensorFlow; JAX: on)")
    p.add_argument("--backends", default="tensorflow",
                   help="tensorflow, jax or both (the runtimes, --backend of the CLIs)")
    p.add_argument("--rounds", type=int, default=1,
                   help="repeat every setting this many times, alternating them (a noisy "
                   "machine's drift falls on each alike)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per repetition")
    p.add_argument("--repeats", type=int, default=3, help="timed repetitions; the best is kept")
    p.add_argument("--peak_flops", type=float, default=None,
                   help="peak FLOP/s of the whole machine for the MFU (default: measured "
                   "on CPU, the accelerator table otherwise)")
    p.add_argument("--json", default=None, help="also write the rows to this file")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # "precision:jit" child
    return p.parse_args(argv)


def _batch(batch_size: int, length: int, vocab_size: int, seed: int = 0):
    """A fixed batch of realistic shape: random ids, full rows, [CLS] ... [SEP]."""
    import numpy as np
    import tensorflow as tf
    r = np.random.RandomState(seed)
    ids = r.randint(1000, vocab_size, size=(batch_size, length)).astype(np.int32)
    ids[:, 0], ids[:, -1] = 101, 102
    return {"input_ids": tf.constant(ids),
            "input_mask": tf.ones([batch_size, length], tf.int32),
            "segment_ids": tf.zeros([batch_size, length], tf.int32)}


def _config(args, precision):
    from electra_tf.configs import load_config
    overrides = {"train.train_batch_size": str(args.batch_size),
                 "train.max_seq_length": str(args.max_seq_length),
                 "train.precision": precision}
    if args.params_override:
        for item in args.params_override.split(","):
            k, v = item.split("=", 1)
            overrides[k.strip()] = v.strip()
    return load_config(args.config, overrides)


def _row(args, cfg, precision, jit, best, compile_s, traces, peak, source, backend):
    from electra_tf.pretraining import flops
    train_flops = flops.count_config(cfg, flops.HARDWARE).train_per_step()["total"]
    achieved = train_flops / best
    return {"config": args.config, "batch_size": args.batch_size, "backend": backend,
            "max_seq_length": args.max_seq_length, "precision": precision, "xla": jit,
            "step_ms": best * 1e3, "seqs_per_s": args.batch_size / best,
            "train_flops_per_step": train_flops, "achieved_flops": achieved,
            "peak_flops": peak, "peak_source": source, "mfu": achieved / peak,
            "compile_s": compile_s, "traces": traces}


def jax_loop(args, precision: str):
    """The JAX runtime's step (its host loop: each batch sent from the host, as in
    training), in a process with KERAS_BACKEND=jax: -> (cfg, trainer, run), where `run(n)`
    takes n steps and waits for the last."""
    import numpy as np
    from electra_tf.pretraining.trainer import make_pretrainer
    from electra_tf.training import runtime
    from electra_tf.training.jax_runtime.devices import jax_devices
    cfg = _config(args, precision)
    runtime.set_precision(precision)
    trainer = make_pretrainer(cfg, jax_devices("auto"))
    batch = {k: np.asarray(v) for k, v in _batch(args.batch_size, args.max_seq_length,
                                                  cfg.model.vocab_size).items()}

    def forever():
        while True:
            yield batch

    it, loop = forever(), trainer.make_train_loop()
    return cfg, trainer, lambda n: float(loop(it, n)["loss_sum"])


def tf_loop(args, precision: str, jit: bool):
    """The TensorFlow runtime's step (its host loop over a dataset of the batch):
    -> (cfg, trainer, run) as `jax_loop`."""
    import tensorflow as tf

    from electra_tf.pretraining.trainer import make_pretrainer
    from electra_tf.training import runtime
    from electra_tf.training.tf_runtime.devices import TfDevices
    cfg = _config(args, precision)
    runtime.set_precision(precision)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0" if not tf.config.list_physical_devices(
        "GPU") else "/gpu:0")
    trainer = make_pretrainer(cfg, TfDevices(strategy), jit_compile=jit)
    batch = _batch(args.batch_size, args.max_seq_length, cfg.model.vocab_size)
    ds = strategy.distribute_datasets_from_function(
        lambda ctx: tf.data.Dataset.from_tensors(batch).repeat())
    it, loop = iter(ds), trainer.make_train_loop()
    return cfg, trainer, lambda n: float(loop(it, tf.constant(n))["loss_sum"])


def timed(run, steps: int, repeats: int):
    """-> (seconds to the first step: trace, compile and one step; the best repetition's
    seconds a step), after a warm-up of `steps`."""
    t0 = time.perf_counter()
    run(1)
    compile_s = time.perf_counter() - t0
    run(steps)  # warm
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        run(steps)  # waits for the last step
        best = min(best, (time.perf_counter() - t0) / steps)
    return compile_s, best


def measure_one(args, precision: str, jit: bool, backend: str) -> dict:
    """Runs in a child process: builds the trainer, warms up, times the best repetition."""
    from electra_tf.training import hardware
    cfg, trainer, run = (jax_loop(args, precision) if backend == "jax"
                         else tf_loop(args, precision, jit))
    compile_s, best = timed(run, args.steps, args.repeats)
    if args.peak_flops:
        peak, source = args.peak_flops, "--peak_flops"
    else:
        peak, source = hardware.peak_flops(trainer.devices, precision)
    return _row(args, cfg, precision, jit or backend == "jax", best, compile_s,
                trainer.trace_count, peak, source, backend)


def child_result(cmd, env):
    """Runs a child that prints `RESULT <json>`: -> (the row, None), or (None, the last
    line it wrote to stderr)."""
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode or not lines:
        return None, (done.stderr.strip().splitlines() or ["?"])[-1]
    return json.loads(lines[-1][len("RESULT "):]), None


def main(argv=None):
    args = parse_args(argv)
    if args.one:
        precision, jit, backend = (args.one.split(":") + ["tensorflow"])[:3]
        row = measure_one(args, precision, jit == "on", backend)
        print("RESULT " + json.dumps(row))
        return
    rows = []
    print(f"{args.config}: batch {args.batch_size} x length {args.max_seq_length}, best of "
          f"{args.repeats} x {args.steps} steps, {args.rounds} round(s) alternating the "
          "settings, each in a fresh process")
    print(f"{'backend':<10} {'precision':<10} {'XLA':<4} {'step ms':>9} {'seq/s':>8} "
          f"{'TFLOP/s':>8} {'peak':>8} {'MFU':>6} {'compile s':>9}  peak from")
    settings = [(b, p, j) for b in args.backends.split(",") for p in args.precisions.split(",")
                for j in (["on"] if b == "jax" else args.jit.split(","))]
    for _ in range(args.rounds):
        for backend, precision, jit in settings:
            child = [a for a in (argv if argv is not None else sys.argv[1:])]
            script = os.path.abspath(__file__)  # local: this script
            env = dict(os.environ, KERAS_BACKEND=backend)
            r, why = child_result([sys.executable, script, *child,
                                   f"--one={precision}:{jit}:{backend}"], env)
            if r is None:
                print(f"{backend:<10} {precision:<10} {jit:<4} failed: {why}")
                continue
            rows.append(r)
            print(f"{backend:<10} {precision:<10} {jit:<4} {r['step_ms']:9.1f} "
                  f"{r['seqs_per_s']:8.1f} {r['achieved_flops'] / 1e12:8.3f} "
                  f"{r['peak_flops'] / 1e12:8.3f} {100 * r['mfu']:5.1f}% "
                  f"{r['compile_s']:9.1f}  {r['peak_source']}", flush=True)
    if args.json:  # any filesystem TensorFlow knows (local, gs://...)
        from electra_tf import fileio
        fileio.write_atomic(args.json, json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
