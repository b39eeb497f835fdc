"""Fine-tuning throughput and end-to-end time of our path beside transformers/PyTorch.

Both frameworks fine-tune the same encoder (identical initial weights: drawn here as
the released code initialises them, written by `conversion.formats.export_hf`: the
directory that `--init_checkpoint` and `from_pretrained` both read) on the same
sentence-classification data (the bundled polarity set, its train split cycled to
`--num_train_examples` rows) with the same recipe: AdamW (eps 1e-6, no weight decay),
lr 3e-4 with 10% linear warmup and linear decay, layer-wise lr decay 0.8, global-norm
clipping 1.0, batch 32, 128 tokens, dropout 0.1 on. Each framework runs in its own
subprocess, one after the other (`--repeats` alternates them), so they share the
machine's state of the moment as closely as a sequential run can.

Ours drives the library: the TensorFlow runtime (`training/tf_runtime/trainer.py`) with
`finetune.trainer.FinetuningJob` + `train_trial` (the compiled step
in host loops of `--steps_per_loop`, checkpoint at the end) + `finetune.trainer.evaluate`, the
stages of `trainer.run`; each host loop is timed, so steady-state seq/s excludes the
first loop, which holds the trace + compile time.
PyTorch: `ElectraForSequenceClassification` (transformers' default attention), a plain
loop (forward, backward, clip, AdamW, scheduler) as transformers' Trainer runs it.

    python bench/bench_finetune.py                       # 2 epochs of 1,780 examples
    python bench/bench_finetune.py --max_steps 30 --steps_per_loop 10 --repeats 2

Prints one row per framework and run; with --json, writes them to a file.
"""

import argparse
import csv
import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # local: the repo
sys.path.insert(0, REPO)  # run as a script from a checkout, installed or not
import electra_tf  # noqa: E402,F401  (first: the version check; no TPU runtime load without chips)
VOCAB = os.path.join(REPO, "data", "vocab", "bert_uncased_vocab.txt")
POLARITY = os.path.join(REPO, "data", "polarity")
FRAMEWORKS = ("ours", "torch")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--frameworks", default="ours,torch", help="ours, torch or both")
    p.add_argument("--epochs", type=float, default=2.0)
    p.add_argument("--max_steps", type=int, default=None,
                   help="train this many steps instead of --epochs (the lr schedule spans "
                   "them)")
    p.add_argument("--num_train_examples", type=int, default=1780,
                   help="the polarity train split (160 rows) cycled to this many rows")
    p.add_argument("--num_dev_examples", type=int, default=0,
                   help="the dev split cycled to this many rows (0: as it is, 40)")
    p.add_argument("--threads", type=int, default=0,
                   help="intra-op threads for both (TF intra and inter op, torch); 0: each "
                   "framework's default")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=384)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--intermediate", type=int, default=1536)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--max_seq_length", type=int, default=128)
    p.add_argument("--learning_rate", type=float, default=3e-4)
    p.add_argument("--steps_per_loop", type=int, default=None,
                   help="ours: steps per host loop (default: the library's)")
    p.add_argument("--jit", default="auto", help="ours: on, off or auto (the library's "
                   "choice for the device)")
    p.add_argument("--repeats", type=int, default=1, help="runs of each framework, "
                   "alternated")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workdir", default=None, help="data, weights and checkpoints (default: "
                   "a temporary directory, removed at the end)")
    p.add_argument("--json", default=None, help="also write the rows to this file")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # child: ours | torch | prepare
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- shared

def _cycled_tsv(src: str, dst: str, rows: int):
    with open(src, newline="") as f:  # local: the bundled data
        header, *body = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    if rows > 0:
        body = [body[i % len(body)] for i in range(rows)]
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with open(dst, "w", newline="") as f:  # local: the bench's scratch directory
        w = csv.writer(f, delimiter="\t", quoting=csv.QUOTE_NONE, escapechar="\\",
                       lineterminator="\n")
        w.writerow(header)
        w.writerows(body)


def _model_config(args):
    from electra_tf.configs import ModelConfig
    return ModelConfig(embedding_size=args.hidden, hidden_size=args.hidden,
                       num_hidden_layers=args.layers, num_attention_heads=args.heads,
                       intermediate_size=args.intermediate)


def prepare(args, workdir: str):
    """The cycled TSVs and the initial encoder as a Hugging Face directory."""
    import numpy as np
    from electra_tf.conversion import formats
    _cycled_tsv(os.path.join(POLARITY, "train.tsv"),
                os.path.join(workdir, "data", "polarity", "train.tsv"), args.num_train_examples)
    _cycled_tsv(os.path.join(POLARITY, "dev.tsv"),
                os.path.join(workdir, "data", "polarity", "dev.tsv"), args.num_dev_examples)
    config = _model_config(args)
    config.check()
    r = np.random.RandomState(args.seed)
    arrays = {}
    for name, shape in formats.expected_shapes(config, generator=False).items():
        leaf = name.rsplit("/", 1)[-1]
        if leaf == "gamma":
            arrays[name] = np.ones(shape, np.float32)
        elif leaf in ("beta", "bias"):
            arrays[name] = np.zeros(shape, np.float32)
        else:  # truncated normal 0.02, as the released initialiser
            a = r.standard_normal(shape)
            while np.any(np.abs(a) > 2):
                bad = np.abs(a) > 2
                a[bad] = r.standard_normal(int(bad.sum()))
            arrays[name] = (a * config.initializer_range).astype(np.float32)
    formats.export_hf(arrays, config, os.path.join(workdir, "init_hf"))


def _num_steps(args, num_examples: int) -> int:
    if args.max_steps:
        return args.max_steps
    return max(1, int(math.ceil(num_examples * args.epochs / args.batch_size)))


# ----------------------------------------------------------------------------- ours

def measure_ours(args, workdir: str, t_start: float) -> dict:
    import tensorflow as tf
    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    from electra_tf.configs import apply_overrides
    from electra_tf.conversion import source
    from electra_tf.finetune import tasks
    from electra_tf.finetune import trainer as ft
    from electra_tf.text import TextEncoder
    from electra_tf.training import backends, runtime
    from electra_tf.training.tf_runtime.trainer import TfRuntime
    t_imported = time.perf_counter()

    loops = []  # (steps, wall s, process CPU s) of every host loop
    started = {}  # seconds from the process's start to its first step

    class TimedRuntime(TfRuntime):
        def make_train_loop(self, *args, **kwargs):
            loop = super().make_train_loop(*args, **kwargs)

            def timed(iterator, num_steps):
                t, c = time.perf_counter(), time.process_time()
                started.setdefault("first_step", t - t_start)
                sums = loop(iterator, num_steps)
                float(next(iter(sums.values())))  # waits for the loop's steps
                loops.append((int(num_steps), time.perf_counter() - t,
                              time.process_time() - c))
                return sums
            return timed

    data_dir = os.path.join(workdir, "data")
    init = os.path.join(workdir, "init_hf")
    model_config = source.resolve(init).config
    task = tasks.get_task("polarity", data_dir)
    devices = backends.devices("auto")
    # --max_steps: the epochs that give exactly that many steps (trainer.num_train_steps)
    epochs = args.epochs
    t0 = time.perf_counter()
    encoder = TextEncoder(VOCAB, True)
    train = task.train_split(data_dir, encoder, args.max_seq_length)
    evals = task.eval_splits(data_dir, encoder, args.max_seq_length)
    t_tok = time.perf_counter() - t0
    if args.max_steps:
        epochs = (args.max_steps - 0.5) * args.batch_size / train.num_examples
    extra = {} if args.steps_per_loop is None else {"steps_per_loop": args.steps_per_loop}
    cfg = apply_overrides(ft.FinetuneConfig(), dict(
        learning_rate=args.learning_rate, num_train_epochs=epochs,
        train_batch_size=args.batch_size, eval_batch_size=args.batch_size,
        max_seq_length=args.max_seq_length, seed=args.seed, **extra))
    cfg = cfg.resolved(model_config, task).check()  # as run()
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(
        cfg.train, precision=devices.resolve_precision(cfg.train.precision)))
    runtime.set_precision(cfg.train.precision)
    steps = ft.num_train_steps(train.num_examples, cfg)
    jit = {"on": True, "off": False, "auto": None}[args.jit]
    t1 = time.perf_counter()
    finetuner = TimedRuntime(ft.FinetuningJob(task, model_config, cfg, steps, init, args.seed),
                             devices, jit)
    t_build = time.perf_counter() - t1
    trial_dir = tempfile.mkdtemp(prefix="trial_", dir=workdir)
    t2 = time.perf_counter()
    ft.train_trial(finetuner, train, trial_dir, args.seed)
    t_train = time.perf_counter() - t2
    t3 = time.perf_counter()
    metrics = ft.evaluate(finetuner, evals[0])
    t_eval = time.perf_counter() - t3
    t4 = time.perf_counter()
    ft.evaluate(finetuner, evals[0])  # again: a retrace or recompile would show here
    t_eval2 = time.perf_counter() - t4
    t_end = time.perf_counter()
    row = _rates(loops, args.batch_size)
    row.update({
        "framework": "ours", "steps": steps, "examples": train.num_examples,
        "jit_compile": finetuner.jit_compile, "steps_per_loop": cfg.train.steps_per_loop,
        "threads": f"intra {tf.config.threading.get_intra_op_parallelism_threads() or 'default'}"
                   f", inter {tf.config.threading.get_inter_op_parallelism_threads() or 'default'}",
        "import_s": t_imported - t_start, "tokenize_s": t_tok, "build_s": t_build,
        "train_s": t_train, "eval_s": t_eval, "eval_again_s": t_eval2,
        "e2e_s": t_tok + t_build + t_train + t_eval, "process_s": t_end - t_start,
        "train_loop_host_s": t_train - sum(t for _, t, _ in loops),
        "step_traces": finetuner.trace_count,
        "eval_traces": finetuner.predict_step.experimental_get_tracing_count(),
        "dev_accuracy": metrics.get("accuracy"), "to_first_step_s": started["first_step"],
    })
    return row


def _rates(loops, batch_size: int) -> dict:
    """Steady-state rate from the loops after the first; `first_s` is the first step with
    the one-off trace + compile (the first loop less its other steps at the steady rate).
    `loops`: (steps, wall s, process CPU s) of each host loop."""
    if not loops:
        return {}
    n0, t0, _ = loops[0]
    rest = loops[1:] or loops  # one loop only: no steady state to separate
    steps = sum(n for n, _, _ in rest)
    step_s = sum(t for _, t, _ in rest) / steps
    return {"step_s": step_s, "seq_per_s": batch_size / step_s,
            "step_cpu_s": sum(c for _, _, c in rest) / steps,
            "first_s": t0 - (n0 - 1) * step_s if len(loops) > 1 else float("nan"),
            "loops": [[n, round(t, 3)] for n, t, _ in loops]}


# ----------------------------------------------------------------------------- torch

def measure_torch(args, workdir: str, t_start: float) -> dict:
    import numpy as np
    import torch
    import transformers
    if args.threads:
        torch.set_num_threads(args.threads)
    t_imported = time.perf_counter()
    transformers.logging.set_verbosity_error()
    torch.manual_seed(args.seed)
    data_dir = os.path.join(workdir, "data", "polarity")

    def read(name):
        with open(os.path.join(data_dir, name), newline="") as f:  # local: bench scratch
            rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
        return [r[0] for r in rows], np.array([int(r[1]) for r in rows])

    t0 = time.perf_counter()
    tokenizer = transformers.BertTokenizerFast(vocab_file=VOCAB, do_lower_case=True)

    def encode(name):
        texts, labels = read(name)
        enc = tokenizer(texts, max_length=args.max_seq_length, padding="max_length",
                        truncation=True, return_tensors="pt")
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                "token_type_ids": enc["token_type_ids"],
                "labels": torch.tensor(labels, dtype=torch.long)}

    train, dev = encode("train.tsv"), encode("dev.tsv")
    t_tok = time.perf_counter() - t0
    n = len(train["labels"])
    steps = _num_steps(args, n)

    t1 = time.perf_counter()
    model = transformers.ElectraForSequenceClassification.from_pretrained(
        os.path.join(workdir, "init_hf"), num_labels=2)
    # Layer-wise lr: embeddings depth 0, layer i depth i + 1, head L + 1 (as ours).
    top, decay = args.layers + 1, 0.8
    groups = {}
    for name, p in model.named_parameters():
        if name.startswith("electra.encoder.layer."):
            depth = int(name.split(".")[3]) + 1
        elif name.startswith("electra.embeddings"):
            depth = 0
        else:
            depth = top
        groups.setdefault(depth, []).append(p)
    opt = torch.optim.AdamW([{"params": ps, "lr": args.learning_rate * decay ** (top - d)}
                             for d, ps in sorted(groups.items())],
                            lr=args.learning_rate, eps=1e-6, weight_decay=0.0)
    warmup = int(round(0.1 * steps))  # ours: linear decay to 0 times a linear warmup
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: max(0.0, 1.0 - s / steps) * (min(1.0, s / warmup) if warmup else 1.0))
    t_build = time.perf_counter() - t1

    gen = torch.Generator().manual_seed(args.seed)
    step_times, step_cpu = [], []
    model.train()
    t2 = time.perf_counter()
    order, at = torch.randperm(n, generator=gen), 0
    for _ in range(steps):
        if at + args.batch_size > n:
            order, at = torch.randperm(n, generator=gen), 0
        idx = order[at:at + args.batch_size]
        at += args.batch_size
        batch = {k: v[idx] for k, v in train.items()}
        t, c = time.perf_counter(), time.process_time()
        if not step_times:
            to_first_step = t - t_start
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        last_loss = float(loss.detach())  # the Trainer's logging sync
        step_times.append(time.perf_counter() - t)
        step_cpu.append(time.process_time() - c)
    t_train = time.perf_counter() - t2

    def evaluate():
        model.eval()
        preds = []
        with torch.no_grad():
            for i in range(0, len(dev["labels"]), args.batch_size):
                batch = {k: v[i:i + args.batch_size] for k, v in dev.items() if k != "labels"}
                preds.append(model(**batch).logits.argmax(-1))
        return float((torch.cat(preds) == dev["labels"]).float().mean())

    t3 = time.perf_counter()
    acc = evaluate()
    t_eval = time.perf_counter() - t3
    t4 = time.perf_counter()
    evaluate()
    t_eval2 = time.perf_counter() - t4
    t_end = time.perf_counter()
    rest = step_times[2:] or step_times
    step_s = sum(rest) / len(rest)
    rest_cpu = step_cpu[2:] or step_cpu
    return {
        "framework": "torch", "steps": steps, "examples": n, "jit_compile": None,
        "steps_per_loop": 1, "threads": f"torch {torch.get_num_threads()}",
        "attention": model.config._attn_implementation,
        "step_s": step_s, "seq_per_s": args.batch_size / step_s,
        "step_cpu_s": sum(rest_cpu) / len(rest_cpu), "first_s": step_times[0],
        "import_s": t_imported - t_start, "tokenize_s": t_tok,
        "build_s": t_build, "train_s": t_train, "eval_s": t_eval, "eval_again_s": t_eval2,
        "e2e_s": t_tok + t_build + t_train + t_eval, "process_s": t_end - t_start,
        "train_loop_host_s": t_train - sum(step_times), "dev_accuracy": acc,
        "loss_last": last_loss, "to_first_step_s": to_first_step,
    }


# ----------------------------------------------------------------------------- driver

def _child(args, what: str, workdir: str) -> dict:
    argv = [sys.executable, os.path.abspath(__file__), f"--one={what}",
            f"--workdir={workdir}"] + [f"--{k}={v}" for k, v in vars(args).items()
                                       if v is not None and k not in ("one", "workdir", "json")]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"bench_finetune: the {what} run failed (exit {proc.returncode})")
    lines = [l for l in proc.stdout.splitlines() if l.startswith("ROW ")]
    return json.loads(lines[-1][4:]) if lines else {}


def _table(rows) -> str:
    head = ("framework", "XLA", "threads", "steps", "seq/s", "step s", "step CPU s",
            "import s", "tokenize s", "build s", "to 1st step s", "1st step s", "train s",
            "outside steps s", "eval s", "e2e s", "process s", "dev acc")
    out = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        xla = "-" if r.get("jit_compile") is None else ("on" if r["jit_compile"] else "off")
        out.append(" | ".join([
            r["framework"], xla, r["threads"], str(r["steps"]), f"{r['seq_per_s']:.2f}",
            f"{r['step_s']:.3f}", f"{r['step_cpu_s']:.3f}", f"{r['import_s']:.2f}",
            f"{r['tokenize_s']:.2f}", f"{r['build_s']:.2f}", f"{r['to_first_step_s']:.1f}",
            f"{r['first_s']:.1f}", f"{r['train_s']:.1f}", f"{r['train_loop_host_s']:.2f}",
            f"{r['eval_s']:.2f}",
            f"{r['e2e_s']:.1f}", f"{r['process_s']:.1f}", f"{r['dev_accuracy']:.3f}"]))
    return "\n".join("| " + line + " |" for line in out)


def main(argv=None):
    args = parse_args(argv)
    if args.one:
        t_start = time.perf_counter()
        if args.one == "prepare":
            prepare(args, args.workdir)
            return
        fn = {"ours": measure_ours, "torch": measure_torch}[args.one]
        print("ROW " + json.dumps(fn(args, args.workdir, t_start)), flush=True)
        return
    frameworks = [f for f in args.frameworks.split(",") if f]
    for f in frameworks:
        if f not in FRAMEWORKS:
            raise SystemExit(f"--frameworks: {f} is not one of {', '.join(FRAMEWORKS)}")
    scratch = None
    workdir = args.workdir
    if workdir is None:
        scratch = tempfile.TemporaryDirectory(prefix="bench_finetune_")
        workdir = scratch.name
    _child(args, "prepare", workdir)
    load_before = os.getloadavg()
    rows = []
    for r in range(args.repeats):
        for f in (frameworks if r % 2 == 0 else frameworks[::-1]):
            row = _child(args, f, workdir)
            row["repeat"] = r
            rows.append(row)
            print(f"{f} run {r + 1}: {row['seq_per_s']:.2f} seq/s, e2e {row['e2e_s']:.1f} s",
                  file=sys.stderr, flush=True)
    print(f"Fine-tuning {args.layers} x {args.hidden} ({args.heads} heads, FFN "
          f"{args.intermediate}), batch {args.batch_size} x {args.max_seq_length}, "
          f"{rows[0]['examples']} train examples, {rows[0]['steps']} steps; "
          f"{os.cpu_count()} CPU cores, load average {load_before[0]:.1f} before and "
          f"{os.getloadavg()[0]:.1f} after")
    print(_table(rows))
    print("seq/s, step s: steady state, wall clock (ours: host loops after the first; "
          "torch: steps after the second); step CPU s: the process's CPU time per step (all "
          "threads; steadier than wall time on a shared machine). to 1st step: from the "
          "process's start to its first step (imports, tokenize, build, the input pipeline). "
          "1st step: the first step with its one-off costs (ours: trace + graph optimisation "
          "or XLA compile; the first host loop less its other steps at the steady rate). "
          "train: every step, ours with its end-of-training checkpoint. outside steps: train's "
          "time outside the steps (ours: the input pipeline's start, logs, the checkpoint; "
          "torch: batch slicing). eval: the dev set "
          "once, with its one-off costs. e2e: tokenize + build + train + eval; process: the "
          "whole process, imports included.")
    if args.json:
        with open(args.json, "w") as f:  # local: a results file
            json.dump(rows, f, indent=2)
    if scratch is not None:
        scratch.cleanup()


if __name__ == "__main__":
    main()
