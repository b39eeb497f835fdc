"""What a second process costs a JAX run on one machine: the same pre-training run (the
same global batch, the same devices in all) as 1 process of D devices and as P processes
of D/P devices each (`--strategy=multi_worker`, `jax.distributed` on localhost, the CPU's
collectives), measured in one invocation, one shape after the other.

    python bench/bench_processes.py [--config tiny] [--devices 2] [--processes 2]
        [--steps 60] [--batch 32] [--train_data DIR]

Prints per shape: the median step time and sequences/s over the steps after the first
host loop (the step lines' own rate, logged every step by process 0), the wall time of
the whole command (start-up and compile included) and the ratio to one process. On a CPU
the devices are `--xla_force_host_platform_device_count` host devices sharing its cores,
so the figure is the cost of the processes' coordination and collectives over TCP, not of
more hardware. JAX only; TensorFlow is not needed."""

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RATE = re.compile(r"\] step (\d+)/\d+ \|.*\| ([0-9.]+) seq/s \|")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_shape(args, processes: int, devices_each: int, model_dir: str):
    """-> (step rates after the first, wall seconds) of one run of `processes` x
    `devices_each`."""
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices_each}"}
    argv = [sys.executable, "run_pretraining.py", "--backend=jax", f"--config={args.config}",
            f"--model_dir={model_dir}", f"--num_train_steps={args.steps}",
            f"--train_batch_size={args.batch}", "--steps_per_loop=1",
            f"--save_checkpoints_steps={args.steps}",
            "--params_override=log_every_steps=1,warmup_steps=2"]
    if args.train_data:
        argv.append(f"--train_data={args.train_data}")
    cluster = [f"127.0.0.1:{free_port()}" for _ in range(processes)]
    started = time.monotonic()
    procs = []
    for i in range(processes):
        extra_env = {}
        if processes > 1:
            extra_env["TF_CONFIG"] = json.dumps({"cluster": {"worker": cluster},
                                                 "task": {"type": "worker", "index": i}})
        procs.append(subprocess.Popen(
            argv + (["--strategy=multi_worker"] if processes > 1 else []), cwd=REPO,
            env={**env, **extra_env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True))
    logs = [p.communicate()[1] for p in procs]
    wall = time.monotonic() - started
    for p, log in zip(procs, logs):
        if p.returncode != 0:
            sys.exit(f"{processes} x {devices_each}: exit {p.returncode}\n{log[-3000:]}")
    rates = [float(rate) for step, rate in RATE.findall(logs[0]) if int(step) > 1]
    return rates, wall


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="tiny")
    parser.add_argument("--devices", type=int, default=2, help="devices in all")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=32, help="global batch")
    parser.add_argument("--train_data", default=None,
                        help="default: the bundled sample (built into ./cache on first use)")
    args = parser.parse_args()
    if args.devices % args.processes:
        sys.exit(f"--devices={args.devices} is not a multiple of --processes={args.processes}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for processes in (1, args.processes):
            each = args.devices // processes
            rates, wall = run_shape(args, processes, each, os.path.join(tmp, str(processes)))
            median = statistics.median(rates)
            rows.append((processes, each, median, args.batch / median * 1e3, wall))
    print(f"{args.config}, global batch {args.batch}, {args.devices} host device(s) in all, "
          f"{args.steps} steps (median over steps 2..{args.steps}), "
          f"{os.cpu_count()} CPU core(s)")
    print("| processes x devices | seq/s | ms/step | x one process | wall (start-up, compile) |")
    print("|---|---:|---:|---:|---:|")
    for processes, each, rate, ms, wall in rows:
        print(f"| {processes} x {each} | {rate:.1f} | {ms:.1f} | {rate / rows[0][2]:.2f} | "
              f"{wall:.0f} s |")


if __name__ == "__main__":
    main()
