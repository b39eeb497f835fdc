"""Where the pre-training step's time goes on this CPU, TensorFlow's XLA step beside the
JAX runtime's: both compile through XLA:CPU, so their optimized programs and per-operation
times can be read side by side (issue 65, item 6).

For each backend, a fresh process builds the step as `bench_train_step.py` does (the same
batch, the runtime's own host loop), warms it up, times the best of `repeats` x `steps`
steps, then records `steps` more under the profiler with XLA's per-thunk trace events on
(`--xla_cpu_enable_xprof_traceme`) and dumps the optimized HLO. The parent reads both
profiles (XSpace files, one reader for both) and prints, per backend, the milliseconds a
step in each kind of operation (summed over the threads that ran them: with 2 cores the
sum can exceed the wall time), the programs' operation counts, and the operations that
take the most.

    python bench/cpu_step_profile.py --config small --batch_size 32 --max_seq_length 128
    python bench/cpu_step_profile.py --config tiny --xla_flags_jax="--xla_cpu_use_xnnpack=false"

`--xla_flags_jax` / `--xla_flags_tf` add XLA flags to one side (an experiment: which flag
closes the gap); `--threads N` pins both processes to the first N cores.
"""

import argparse
import collections
import glob
import json
import os
import re
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # local: the repo
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # local: bench_train_step
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

TRACE_FLAG = "--xla_cpu_enable_xprof_traceme=true"
# An instruction's kind from its name in the optimized HLO (the profile names thunks by
# their instruction): matrix products, the fusions by what they hold, data movement.
KINDS = (("matmul", re.compile(r"dot|convolution|ynn_fusion|xnn_fusion|onednn|gemm")),
         ("random bits", re.compile(r"rng|philox|threefry")),
         ("reduce / softmax", re.compile(r"reduce|softmax")),
         ("copy / transpose", re.compile(r"copy|transpose|bitcast|slice|concatenate|pad")),
         ("gather / scatter", re.compile(r"gather|scatter|dynamic")),
         ("while / call / sort",
          re.compile(r"while|(?<!custom-)call|conditional|sort|all-reduce")))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="tiny", help="a preset or a config JSON")
    p.add_argument("--params_override", default="", help="key=value,... config overrides")
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--max_seq_length", type=int, default=128)
    p.add_argument("--precision", default="float32")
    p.add_argument("--backends", default="tensorflow,jax")
    p.add_argument("--steps", type=int, default=5, help="steps a repetition and profiled")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1,
                   help="the backends alternated this many times (timing only)")
    p.add_argument("--xla_flags_jax", default="", help="XLA flags added to the JAX process")
    p.add_argument("--xla_flags_tf", default="", help="XLA flags added to TensorFlow's")
    p.add_argument("--threads", type=int, default=0, help="pin to the first N cores")
    p.add_argument("--top", type=int, default=12, help="operations listed per backend")
    p.add_argument("--out", default="", help="keep profiles and HLO here (default: a temp dir)")
    p.add_argument("--json", default="", help="also write the summary here")
    p.add_argument("--one", default="", help=argparse.SUPPRESS)  # child: backend
    return p.parse_args(argv)


def child(args):
    """Builds, warms, times and profiles one backend's step; prints RESULT json."""
    import bench_train_step as bts
    bargs = argparse.Namespace(config=args.config, params_override=args.params_override,
                               batch_size=args.batch_size,
                               max_seq_length=args.max_seq_length)
    profile_dir = os.path.join(args.out, f"profile_{args.one}")
    if args.one == "jax":
        import jax
        cfg, trainer, run = bts.jax_loop(bargs, args.precision)
        start, stop = (lambda: jax.profiler.start_trace(profile_dir)), jax.profiler.stop_trace
    else:
        import tensorflow as tf
        cfg, trainer, run = bts.tf_loop(bargs, args.precision, True)
        start = lambda: tf.profiler.experimental.start(profile_dir)  # noqa: E731
        stop = tf.profiler.experimental.stop
    compile_s, best = bts.timed(run, args.steps, args.repeats)
    start()
    run(args.steps)
    stop()
    print("RESULT " + json.dumps({"backend": args.one, "step_ms": best * 1e3,
                                  "seqs_per_s": args.batch_size / best,
                                  "first_step_s": compile_s}))


# ------------------------------------------------------------------------ reading


def hlo_instructions(dump_dir: str):
    """{instruction name: its opcode and the framework op it came from (metadata op_name's
    last part)} of the optimized programs in an XLA dump, and the opcode counts of the
    biggest program (the step; fused computations' bodies included). A name in several
    programs keeps the biggest program's."""
    programs = []
    for path in glob.glob(os.path.join(dump_dir, "*after_optimizations.txt")):
        with open(path) as f:  # local: XLA's dump directory
            text = f.read()
        names, counts = {}, collections.Counter()
        for m in re.finditer(r"^\s*(?:ROOT )?%?([\w.\-]+) = [^=]*? ([a-z][\w\-]*)\((.*)$",
                             text, re.M):
            source = re.search(r'op_name="([^"]*)"', m.group(3))
            origin = source.group(1).rsplit("/", 1)[-1] if source else ""
            names[m.group(1)] = f"{m.group(2)} {origin}".strip()
            counts[m.group(2)] += 1
        programs.append((sum(counts.values()), names, counts))
    programs.sort(key=lambda p: p[0])
    names = {}
    for _, found, _ in programs:  # the biggest last: its names win
        names.update(found)
    return names, programs[-1][2] if programs else collections.Counter()


def kind_of(name: str, opcode: str) -> str:
    """The kind of an instruction from its name, opcode and source op (`hlo_instructions`):
    a library fusion (YNNPACK's) is a matmul or a reduction by what it came from."""
    source = opcode.split(" ", 1)[1] if " " in opcode else ""
    if re.search(r"reduce|Sum|Max|Min|Mean|ArgMax", source) and "dot" not in source:
        return "reduce / softmax"
    text = f"{name} {opcode}"
    for kind, pattern in KINDS:
        if pattern.search(text):
            return kind
    return "elementwise fusion" if "fusion" in text else "other"


def thunk_times(profile_dir: str, steps: int):
    """{hlo op name: ms a step} from the XLA thunk events of the profile (every thread)."""
    from jax._src.profiler import ProfileData
    files = glob.glob(os.path.join(profile_dir, "**", "*.xplane.pb"), recursive=True)
    if not files:
        raise SystemExit(f"cpu_step_profile: error: no profile written under {profile_dir}")
    times = collections.Counter()
    for plane in ProfileData.from_file(max(files, key=os.path.getmtime)).planes:
        for line in plane.lines:
            for event in line.events:
                stats = dict(event.stats or ())
                if "hlo_op" in stats:
                    times[str(stats["hlo_op"])] += event.duration_ns / 1e6 / steps
    return times


def summarize(backend: str, row: dict, out: str, steps: int, top: int) -> dict:
    names, counts = hlo_instructions(os.path.join(out, f"hlo_{backend}"))
    times = thunk_times(os.path.join(out, f"profile_{backend}"), steps)
    by_kind = collections.Counter()
    for op, ms in times.items():
        by_kind[kind_of(op, names.get(op, ""))] += ms
    return {**row, "ops_ms": dict(times.most_common(top)), "kinds_ms": dict(by_kind),
            "thunk_ms": sum(times.values()), "hlo_ops": sum(counts.values()),
            "hlo_opcodes": dict(counts.most_common(12))}


def main(argv=None):
    args = parse_args(argv)
    if args.one:
        return child(args)
    import bench_train_step as bts
    out = args.out or tempfile.mkdtemp(prefix="cpu_step_profile_")
    backends = args.backends.split(",")
    rows = {}
    print(f"{args.config}: batch {args.batch_size} x length {args.max_seq_length}, "
          f"{args.precision}, best of {args.repeats} x {args.steps} steps; files in {out}")
    for r in range(args.rounds):
        for backend in backends:
            flags = [TRACE_FLAG, f"--xla_dump_to={os.path.join(out, 'hlo_' + backend)}",
                     "--xla_dump_hlo_as_text",
                     args.xla_flags_jax if backend == "jax" else args.xla_flags_tf]
            env = dict(os.environ, KERAS_BACKEND=backend,
                       XLA_FLAGS=" ".join(filter(None, [os.environ.get("XLA_FLAGS", "")]
                                                 + flags)))
            env.pop("JAX_COMPILATION_CACHE_DIR", None)  # compile here: the dump needs it
            env["ELECTRA_TF_COMPILATION_CACHE"] = "off"
            cmd = [sys.executable, os.path.abspath(__file__), *(argv or sys.argv[1:]),
                   f"--one={backend}", f"--out={out}"]
            if args.threads:
                cmd = ["taskset", "-c", f"0-{args.threads - 1}", *cmd]
            row, why = bts.child_result(cmd, env)
            if row is None:
                print(f"{backend}: failed: {why}")
                continue
            print(f"round {r + 1} {backend:<10} step {row['step_ms']:8.1f} ms "
                  f"{row['seqs_per_s']:7.1f} seq/s  first step {row['first_step_s']:.1f} s",
                  flush=True)
            if backend not in rows or row["step_ms"] < rows[backend]["step_ms"]:
                rows[backend] = row
    # The step times are each backend's best round; the profiles and dumps its last round's.
    summary = {b: summarize(b, rows[b], out, args.steps, args.top) for b in rows}
    kinds = sorted({k for s in summary.values() for k in s["kinds_ms"]},
                   key=lambda k: -max(s["kinds_ms"].get(k, 0) for s in summary.values()))
    print("\nms a step by kind of operation (thunk time summed over threads)")
    print(f"{'kind':<22}" + "".join(f"{b:>14}" for b in summary))
    for k in kinds:
        print(f"{k:<22}" + "".join(f"{s['kinds_ms'].get(k, 0):14.1f}"
                                    for s in summary.values()))
    print(f"{'all thunks':<22}" + "".join(f"{s['thunk_ms']:14.1f}" for s in summary.values()))
    print(f"{'wall time a step':<22}" + "".join(f"{s['step_ms']:14.1f}"
                                                for s in summary.values()))
    print(f"{'HLO instructions':<22}" + "".join(f"{s['hlo_ops']:14d}"
                                                for s in summary.values()))
    for b, s in summary.items():
        print(f"\n{b}: the operations that take the most (ms a step)")
        for op, ms in s["ops_ms"].items():
            print(f"  {ms:8.2f}  {op}")
        print(f"{b}: opcodes of the step's program: "
              + ", ".join(f"{k} {v}" for k, v in s["hlo_opcodes"].items()))
    if args.json:
        from electra_tf import fileio
        fileio.write_atomic(args.json, json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
