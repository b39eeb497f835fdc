"""Pre-training and fine-tuning throughput on whatever devices JAX sees, beside a PyTorch
peer on the same device, with no TensorFlow (a GPU machine with only JAX and PyTorch).

Ours: the JAX runtime's compiled train step (`training/jax_runtime/step.py`: masking,
sampling, both networks, the losses, clipping and the AdamW update in one `jax.jit`, the state donated)
on a fixed batch already on the devices, again fed a host batch per step as the training
loop does, and fed by a thread that places each batch two steps ahead ('ahead', in the row). Timed after a warm-up call, the step's outputs fetched at the end of each timed
repetition; the best repetition is kept. Sequences/s; MFU against the device's published
dense peak (`training/hardware.py`'s table; on a CPU, a jnp matmul measured here) with the
hardware convention of `pretraining/flops.py` (train = 3 x forward matmul FLOPs); the
compiled program's memory (XLA's analysis) and the device's peak memory where it reports one.
With --fit, a case's batch is the largest power-of-two fraction of the given one whose
program fits in the device's memory.

The peer: ELECTRA pre-training with transformers' `ElectraForMaskedLM` generator and
`ElectraForPreTraining` discriminator of the same sizes (shared embeddings, the generator's
output layer tied to them, generator logits at the masked slots only, 85% [MASK], Gumbel-max
sampling, loss = MLM + 50 x BCE, global-norm clipping, torch AdamW), bf16 autocast (float32
weights) or float32 at torch's defaults; AdamW `fused=True` on a GPU; eager, and the
whole step (loss, backward, clipping, the optimizer step) under `torch.compile` in its
default mode (`torch_compile`) and `max-autotune` (`torch_compile_max`). Fine-tuning: a
classification step of ours against `ElectraForSequenceClassification`. Ours with the
fused attention kernel is `jax_fused`; `--kernel_check` first holds that kernel to the
reference attention at the given shapes on the device (`kernel_check`).

The agreement check (--check_cases): in the same process as the timing, one step of ours
from the same weights and batch (its first `--check_rows` rows) on the accelerator and on
the CPU; loss, MLM loss, discriminator loss and gradient norm compared, with tolerances
(`TOLERANCES`) stated in the output.

    python bench/bench_accelerator.py                       # the issue's cases, all peers
    python bench/bench_accelerator.py --cases tiny:64:8 --peers jax,torch --steps 2 \\
        --precisions float32 --finetune tiny:8:64           # a CPU smoke run (CI's test)

Each case runs in a fresh process (`--one`), so an out-of-memory or a crash loses only its
row and each process's peak memory is its own. Rows go to stdout as they finish and, with
--jsonl, to a file line by line.
"""

import argparse
import glob
import gzip
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # local: the repo
sys.path.insert(0, REPO)  # run as a script from a checkout, installed or not

PEERS = ("jax", "jax_fused", "torch", "torch_compile", "torch_compile_max")
OURS = ("jax", "jax_fused")  # jax_fused: ELECTRA_TF_ATTENTION=fused (kernels/jax_attention.py)
# torch.compile's mode of each compiled peer.
COMPILE_MODES = {"torch_compile": "default", "torch_compile_max": "max-autotune"}
# |accelerator - CPU| / |CPU| allowed for one step's scalars (loss, MLM loss, discriminator
# loss, gradient norm). float32: the GPU's float32 matmuls run in TF32 (JAX's default
# precision), ~1e-3 per matmul; bfloat16: 8-bit mantissas on both sides, summed in another
# order. A Gumbel-max sample can flip between devices where two logits nearly tie: the
# discriminator's labels then differ at that slot.
TOLERANCES = {"float32": 5e-3, "bfloat16": 3e-2}
DEFAULT_CASES = "small:128:128,base:128:256,base:512:256"
GENERATOR_WEIGHT = 50.0
CLS, SEP, MASK = 101, 102, 103


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=DEFAULT_CASES,
                   help="pre-training cases preset:length:batch, comma-separated ('' none)")
    p.add_argument("--precisions", default="bfloat16,float32")
    p.add_argument("--peers", default="jax,torch,torch_compile",
                   help=f"which steps to time: any of {','.join(PEERS)}")
    p.add_argument("--compile_precisions", default="bfloat16",
                   help="precisions torch_compile runs in (its compile takes a minute a case)")
    p.add_argument("--finetune", default="base:32:128",
                   help="fine-tuning case preset:batch:length ('' none)")
    p.add_argument("--fit", action=argparse.BooleanOptionalAction, default=True,
                   help="halve a case's batch until its program fits the device's memory")
    p.add_argument("--steps", type=int, default=10, help="timed steps per repetition")
    p.add_argument("--repeats", type=int, default=3, help="timed repetitions; the best kept")
    p.add_argument("--check_cases", default="small:128",
                   help="preset:length of the cases whose process also runs the CPU check")
    p.add_argument("--check_rows", type=int, default=32, help="rows of the CPU check's batch")
    p.add_argument("--profile", default="",
                   help="preset:length:precision of a case to trace with jax.profiler; the "
                   "trace's top kernels are summarised in its row")
    p.add_argument("--profile_dir", default="/tmp/bench_accelerator_trace")
    p.add_argument("--deadline_s", type=float, default=0,
                   help="start no case after this many seconds (0: none)")
    p.add_argument("--jsonl", default="", help="append each row to this local file")
    p.add_argument("--kernel_check", default="",
                   help="batch:heads:length:depth: the fused attention kernel against the "
                   "reference on the device first, bfloat16 and float32, dropout 0.1")
    p.add_argument("--in_process", action="store_true",
                   help="run every case in this process (quicker to start; a crash or an "
                   "out-of-memory ends the run, and the peak memory accumulates): a CPU check")
    p.add_argument("--one", default="", help=argparse.SUPPRESS)  # a child's case (JSON)
    return p.parse_args(argv)


# --------------------------------------------------------------------------- shared


def load(preset: str, batch: int, length: int):
    from electra_tf.configs import load_config
    return load_config(preset, {"train.train_batch_size": str(batch),
                                "train.max_seq_length": str(length)})


def host_batch(batch: int, length: int, vocab: int, seed: int = 0):
    """Full rows of random word ids between [CLS] and [SEP], as the builder writes them."""
    import numpy as np
    r = np.random.RandomState(seed)
    ids = r.randint(1000, vocab, size=(batch, length)).astype(np.int32)
    ids[:, 0], ids[:, -1] = CLS, SEP
    return {"input_ids": ids, "input_mask": np.ones_like(ids),
            "segment_ids": np.zeros_like(ids)}


def pretrain_flops(cfg) -> float:
    """Train FLOPs of one step of the whole batch (hardware convention)."""
    from electra_tf.pretraining import flops
    return flops.count_config(cfg, flops.HARDWARE).train_per_step()["total"]


def finetune_flops(cfg, num_labels: int = 2) -> float:
    """3 x forward matmul FLOPs of the discriminator's encoder and a classifier on [CLS]
    (dense H -> H, then H -> labels), the whole batch."""
    from electra_tf.pretraining import flops
    _, disc = flops.config_networks(cfg)
    h = cfg.model.hidden_size
    forward = (flops.total(flops.encoder_terms(disc), flops.HARDWARE)
               + 2 * h * h + 2 * h * num_labels)
    return 3.0 * forward * cfg.train.train_batch_size


def time_steps(run, fetch, steps: int, repeats: int, each=None) -> float:
    """Best seconds per step of `repeats` x `steps` calls of `run()`, `fetch()` waiting
    for the last one's outputs; `each` (a list) gets every repetition's."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            run()
        fetch()
        took = (time.perf_counter() - start) / steps
        best = min(best, took)
        if each is not None:
            each.append(took)
    return best


# --------------------------------------------------------------------------- ours (JAX)


def jax_peak(device, precision: str):
    """(peak FLOP/s of one device, where from): the table for an accelerator, a timed
    4096^2 jnp matmul in the compute dtype on a CPU."""
    import jax
    import jax.numpy as jnp
    from electra_tf.training import hardware
    if device.platform == "cpu":
        dtype = jnp.bfloat16 if precision == "bfloat16" else jnp.float32
        n = 2048
        a = jax.device_put(jnp.ones((n, n), dtype) * 0.5, device)
        f = jax.jit(lambda x: (x @ x)[0, 0])
        f(a).block_until_ready()
        best = min(_timed(lambda: f(a).block_until_ready()) for _ in range(3))
        return 2.0 * n ** 3 / best, f"measured: {n}^2 {precision} jnp matmul"
    chip = hardware.lookup(device.device_kind)
    if chip is None:
        return None, f"{device.device_kind}: not in the table"
    peak, column = chip.peak(precision, hardware.tf32_enabled(device))  # a JAX device
    return peak, f"{chip.name} {column} ({chip.source})"


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def memory_of(compiled) -> int:
    """Bytes the compiled program holds at once: arguments + outputs - donated + temps."""
    m = compiled.memory_analysis()
    if m is None:
        return 0
    return int(m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
               + m.temp_size_in_bytes)


def device_limit(device):
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    return (stats or {}).get("bytes_limit")


def device_peak(device):
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    return (stats or {}).get("peak_bytes_in_use")


class OursPretraining:
    """The JAX runtime's pre-training step for a config on `devices`, without TensorFlow:
    the objective and model as `PretrainingJob` builds them, `jax_runtime.step.StepBuilder`'s
    step."""

    def __init__(self, cfg, precision: str):
        import keras
        from electra_tf.model.modeling import ElectraPretrainingModel
        from electra_tf.pretraining.objectives import build_objective
        keras.config.set_dtype_policy(
            {"bfloat16": "mixed_bfloat16", "float32": "float32"}[precision])
        keras.utils.set_random_seed(cfg.train.seed)
        self.cfg = cfg
        self.objective = build_objective(cfg)
        self.model = ElectraPretrainingModel(cfg.model, heads=self.objective.heads)
        self.trainable = list(self.model.trainable_variables)
        self.frozen = list(self.model.non_trainable_variables)

    def loss(self, batch, seed, context, training, phase=0, step=None):
        self.objective.global_step = step
        return self.objective.loss(self.model, batch, seed, context, training, phase)

    def builder(self, devices):
        from electra_tf.training.jax_runtime import step as jax_step
        rule = jax_step.UpdateRule.of(self.cfg.optimizer, self.cfg.train.num_train_steps,
                                      jax_step.names_of(self.trainable))
        return jax_step.StepBuilder(self.trainable, self.frozen, self.loss,
                                    self.objective.denominators, rule,
                                    clip_norm=self.cfg.optimizer.clip_norm,
                                    mesh=jax_step.make_mesh(devices))

    def host_state(self):
        import jax
        import numpy as np
        from electra_tf.training.jax_runtime import step as jax_step
        state = jax_step.initial_state(self.trainable, self.frozen, False,
                                       [self.cfg.train.seed, 0x5EED])
        return jax.tree.map(np.asarray, state)


class OursFinetuning(OursPretraining):
    """A classification step: the fine-tuning model (discriminator encoder + a two-way
    head) and the task's weighted cross-entropy, in the same compiled step."""

    def __init__(self, cfg, precision: str):
        import keras
        from electra_tf.finetune.model import FinetuningModel, make_head
        keras.config.set_dtype_policy(
            {"bfloat16": "mixed_bfloat16", "float32": "float32"}[precision])
        keras.utils.set_random_seed(cfg.train.seed)
        self.cfg = cfg
        self.model = FinetuningModel(cfg.model, make_head("classification", cfg.model, 2))
        ids = host_batch(2, 8, cfg.model.vocab_size)
        self.model(ids)  # builds the variables
        self.trainable = list(self.model.trainable_variables)
        self.frozen = list(self.model.non_trainable_variables)
        self.objective = type("NoContext", (), {"denominators": staticmethod(lambda b: {})})

    def loss(self, batch, seed, context, training, phase=0, step=None):
        from keras import ops
        from electra_tf import kernels as K
        logits = self.model(batch, training=training, seed=seed)["logits"]
        per_example = K.softmax_xent(batch["label"], ops.cast(logits, "float32"))
        return ops.sum(per_example * batch["weight"]) / float(batch["label"].shape[0]), {}


def run_jax(case: dict) -> dict:
    import jax
    import numpy as np
    finetune = case["kind"] == "finetune"
    device = jax.devices()[0]
    batch = case["batch"]
    while True:
        cfg = load(case["config"], batch, case["length"])
        job = (OursFinetuning if finetune else OursPretraining)(cfg, case["precision"])
        steps = job.builder([device])
        host = host_batch(batch, case["length"], cfg.model.vocab_size)
        if finetune:
            host["label"] = (host["input_ids"][:, 1] % 2).astype(np.int32)
            host["weight"] = np.ones([batch], np.float32)
        state = steps.place_state(job.host_state())
        placed = steps.place_batch(host)
        train = steps.compile_train()
        lengths = jax.device_put(steps.rule.lengths(), state["step"].sharding)
        start = time.perf_counter()
        compiled = train.jitted.lower(state, placed, lengths).compile()
        compile_s = time.perf_counter() - start
        need, limit = memory_of(compiled), device_limit(device)
        if case.get("fit") and limit and need > 0.95 * limit and batch > 1:
            print(f"# {case['config']} {case['length']} batch {batch}: program needs "
                  f"{need / 2**30:.1f} GiB of {limit / 2**30:.1f}; halving", flush=True)
            batch //= 2
            continue
        break
    box = {"state": state}

    def run():
        box["state"], box["sums"] = compiled(box["state"], placed, lengths)

    def fetch():
        jax.block_until_ready((box["state"], box["sums"]))

    run()
    fetch()
    first = float(box["sums"]["loss_sum"])
    repeats = []
    step_s = time_steps(run, fetch, case["steps"], case["repeats"], repeats)
    # Host-fed: a new host batch placed every step, as the training loop sends them.
    hosts = [host_batch(batch, case["length"], cfg.model.vocab_size, seed=s)
             for s in range(1, 5)]
    if finetune:
        for h in hosts:
            h["label"] = (h["input_ids"][:, 1] % 2).astype(np.int32)
            h["weight"] = np.ones([batch], np.float32)
    turn = {"i": 0}

    def run_fed():
        fed = steps.place_batch(hosts[turn["i"] % len(hosts)])
        turn["i"] += 1
        box["state"], box["sums"] = compiled(box["state"], fed, lengths)

    fed_s = time_steps(run_fed, fetch, case["steps"], 1)
    # The same, the batches placed two steps ahead by a thread, as the training loop's
    # `jax_step.BatchesAhead` does: whether placing a batch costs the step loop itself
    # (the difference) or overlaps with the step.
    from electra_tf.training.jax_runtime import step as jax_step
    ahead = jax_step.BatchesAhead((hosts[i % len(hosts)] for i in range(case["steps"])),
                                  steps.place_batch)

    def run_ahead():
        box["state"], box["sums"] = compiled(box["state"], next(ahead), lengths)

    ahead_s = time_steps(run_ahead, fetch, case["steps"], 1)
    ahead.close()
    peak, source = jax_peak(device, case["precision"])
    train_flops = (finetune_flops if finetune else pretrain_flops)(cfg)
    row = dict(case, batch=batch, device=device.device_kind,
               platform=device.platform, versions=f"jax {jax.__version__}",
               step_ms=step_s * 1e3, step_ms_repeats=[1e3 * t for t in repeats],
               seqs_per_s=batch / step_s,
               fed_seqs_per_s=batch / fed_s, fed_ahead_seqs_per_s=batch / ahead_s,
               compile_s=compile_s,
               train_flops=train_flops, achieved_flops=train_flops / step_s,
               peak_flops=peak, peak_source=source,
               mfu=(train_flops / step_s / peak) if peak else None,
               program_bytes=memory_of(compiled), peak_bytes=device_peak(device),
               first_loss=first, last_loss=float(box["sums"]["loss_sum"]))
    if case.get("check_rows"):
        row["check"] = cpu_check(job, host, case, device)
    if case.get("profile"):
        row["profile"] = profile(run, fetch, case["profile"])
    return row


def cpu_check(job, host, case, device) -> dict:
    """One step from the same weights and the batch's first rows on `device` and on the
    CPU: each scalar's relative difference against the CPU's."""
    import jax
    import numpy as np
    rows = min(case["check_rows"], case["batch"])
    small = {k: v[:rows] for k, v in host.items()}
    out = {}
    for name, dev in (("device", device), ("cpu", jax.devices("cpu")[0])):
        steps = job.builder([dev])
        state = steps.place_state(job.host_state())
        _, sums = steps.compile_train(donate=False)(state, steps.place_batch(small))
        out[name] = {k: float(v) for k, v in sums.items() if np.ndim(v) == 0}
    keys = [k for k in ("loss_sum", "mlm_loss_sum", "disc_loss_sum", "grad_norm_sum")
            if k in out["cpu"]]
    diffs = {k: abs(out["device"][k] - out["cpu"][k]) / max(abs(out["cpu"][k]), 1e-12)
             for k in keys}
    tol = TOLERANCES[case["precision"]]
    return {"rows": rows, "device": {k: out["device"][k] for k in keys},
            "cpu": {k: out["cpu"][k] for k in keys}, "rel_diff": diffs, "tolerance": tol,
            "ok": all(d <= tol for d in diffs.values())}


def profile(run, fetch, log_dir: str, steps: int = 5) -> dict:
    import jax
    with jax.profiler.trace(log_dir, create_perfetto_trace=True):
        for _ in range(steps):
            run()
        fetch()
    files = sorted(glob.glob(os.path.join(log_dir, "**", "perfetto_trace.json.gz"),
                             recursive=True), key=os.path.getmtime)
    if not files:
        return {"error": f"no perfetto trace under {log_dir}"}
    with gzip.open(files[-1], "rt") as f:
        summary = summarise_trace(json.load(f))
    summary["trace"] = files[-1]
    summary["steps"] = steps
    return summary


def kernel_kind(name: str) -> str:
    n = name.lower()
    if any(s in n for s in ("gemm", "cutlass", "cublas", "matmul", "dot", "xmma", "sm90",
                            "wgmma", "triton_gemm", "ynn_")):
        return "matmul"
    if any(s in n for s in ("reduce", "softmax")):
        return "reduction"
    if "fusion" in n or "loop_" in n or "input_" in n:
        return "fused elementwise"
    if any(s in n for s in ("memcpy", "memset", "copy")):
        return "copy"
    return "other"


def summarise_trace(trace, top: int = 15) -> dict:
    """The device's busy time by kernel from a Chrome/Perfetto trace: a GPU's stream
    threads where there are any, else the host threads XLA executes on (CPU)."""
    import collections
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    procs = {e["pid"]: e.get("args", {}).get("name", "") for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e["pid"], e.get("tid")): e.get("args", {}).get("name", "") for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    device_pids = {p for p, n in procs.items() if n.startswith("/device:")}

    def on_device(e):
        t = threads.get((e["pid"], e.get("tid")), "")
        if device_pids:
            return e["pid"] in device_pids and t.lower().startswith("stream")
        return t.startswith("tf_XLA") and not e["name"].startswith(
            ("ThunkExecutor", "SlinkyThreadPool"))  # wrappers of the ops below them

    by_name, by_kind = collections.Counter(), collections.Counter()
    for e in events:
        if e.get("ph") == "X" and on_device(e):
            by_name[e["name"]] += float(e.get("dur", 0))
            by_kind[kernel_kind(e["name"])] += float(e.get("dur", 0))
    total = sum(by_name.values())
    return {"busy_us": total, "source": "device streams" if device_pids else "host XLA",
            "kinds": {k: v / total for k, v in by_kind.most_common()} if total else {},
            "top": [[n, v, v / total] for n, v in by_name.most_common(top)] if total else []}


# --------------------------------------------------------------------------- the peer


def hf_configs(cfg):
    """transformers' ElectraConfigs of our preset's discriminator and generator."""
    from transformers import ElectraConfig
    m = cfg.model

    def config(hidden, heads, ffn):
        return ElectraConfig(
            vocab_size=m.vocab_size, embedding_size=m.embedding_size, hidden_size=hidden,
            num_hidden_layers=m.num_hidden_layers, num_attention_heads=heads,
            intermediate_size=ffn, hidden_act="gelu",
            hidden_dropout_prob=m.hidden_dropout_prob,
            attention_probs_dropout_prob=m.attention_probs_dropout_prob,
            max_position_embeddings=m.max_position_embeddings,
            type_vocab_size=m.type_vocab_size, layer_norm_eps=m.layer_norm_eps)

    return (config(m.hidden_size, m.num_attention_heads, m.intermediate_size),
            config(m.generator_hidden, m.generator_heads, m.generator_intermediate))


class TorchPretraining:
    """ELECTRA pre-training in PyTorch with transformers' models (the peer)."""

    def __init__(self, cfg, device):
        import torch
        from transformers import ElectraForMaskedLM, ElectraForPreTraining
        torch.manual_seed(cfg.train.seed)
        disc_cfg, gen_cfg = hf_configs(cfg)
        self.disc = ElectraForPreTraining(disc_cfg).to(device)
        self.gen = ElectraForMaskedLM(gen_cfg).to(device)
        self.gen.electra.embeddings = self.disc.electra.embeddings  # shared embeddings
        self.gen.generator_lm_head.weight = self.disc.electra.embeddings.word_embeddings.weight
        self.params = list({id(p): p for m in (self.disc, self.gen)
                            for p in m.parameters()}.values())
        self.slots = cfg.objective.predictions_per_seq(cfg.train.max_seq_length)
        self.mask_prob = cfg.objective.mask_prob
        self.device = device

    def loss(self, ids, mask, segments):
        import torch
        import torch.nn.functional as F
        batch, length = ids.shape
        real = mask.sum(1)
        count = torch.clamp(torch.round(real.float() * self.mask_prob), 1, self.slots).long()
        candidate = (mask > 0) & (ids != CLS) & (ids != SEP) & (ids != MASK)
        score = torch.where(candidate, torch.rand(batch, length, device=ids.device), -1.0)
        positions = torch.topk(score, self.slots, dim=1).indices  # [B, P], no repeats
        used = torch.arange(self.slots, device=ids.device)[None, :] < count[:, None]
        originals = torch.gather(ids, 1, positions)
        to_mask = used & (torch.rand(batch, self.slots, device=ids.device) < 0.85)
        masked = ids.scatter(1, positions, torch.where(to_mask, MASK, originals))
        hidden = self.gen.electra(masked, attention_mask=mask,
                                  token_type_ids=segments).last_hidden_state
        slots = torch.gather(hidden, 1, positions[..., None].expand(-1, -1, hidden.shape[-1]))
        logits = self.gen.generator_lm_head(self.gen.generator_predictions(slots)).float()
        mlm = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), originals.reshape(-1),
                              reduction="none").reshape(batch, self.slots)
        mlm_loss = (mlm * used).sum() / used.sum().clamp(min=1)
        with torch.no_grad():
            u = torch.rand_like(logits)
            sampled = torch.argmax(logits - torch.log(-torch.log(u + 1e-9) + 1e-9), -1)
            sampled = torch.where(used, sampled, originals)
        corrupted = ids.scatter(1, positions, sampled)
        labels = (corrupted != ids).float()
        disc_logits = self.disc(corrupted, attention_mask=mask,
                                token_type_ids=segments).logits.float()
        bce = F.binary_cross_entropy_with_logits(disc_logits, labels, reduction="none")
        disc_loss = (bce * mask).sum() / mask.sum()
        return mlm_loss + GENERATOR_WEIGHT * disc_loss


class TorchFinetuning:
    def __init__(self, cfg, device):
        import torch
        from transformers import ElectraForSequenceClassification
        torch.manual_seed(cfg.train.seed)
        disc_cfg, _ = hf_configs(cfg)
        disc_cfg.num_labels = 2
        self.model = ElectraForSequenceClassification(disc_cfg).to(device)
        self.params = list(self.model.parameters())

    def loss(self, ids, mask, segments, labels):
        return self.model(ids, attention_mask=mask, token_type_ids=segments,
                          labels=labels).loss


def run_torch(case: dict) -> dict:
    import numpy as np
    import torch
    import transformers
    finetune = case["kind"] == "finetune"
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    batch = case["batch"]
    cfg = load(case["config"], batch, case["length"])
    job = (TorchFinetuning if finetune else TorchPretraining)(cfg, device)
    lr = cfg.optimizer.learning_rate
    # The peer at its strongest: the fused AdamW kernel on a GPU.
    opt = torch.optim.AdamW(job.params, lr=lr, weight_decay=cfg.optimizer.weight_decay,
                            eps=cfg.optimizer.epsilon, fused=cuda)

    def tensors(seed):
        h = host_batch(batch, case["length"], cfg.model.vocab_size, seed=seed)
        out = [torch.from_numpy(h[k].astype(np.int64)) for k in
               ("input_ids", "input_mask", "segment_ids")]
        if finetune:
            out.append(torch.from_numpy((h["input_ids"][:, 1] % 2).astype(np.int64)))
        return out

    on_device = [t.to(device) for t in tensors(0)]
    box = {}

    def train_step(inputs):
        if case["precision"] == "bfloat16":
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = job.loss(*inputs)
        else:
            loss = job.loss(*inputs)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(job.params, cfg.optimizer.clip_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    # The whole step under torch.compile (the forward and its backward, the clipping and
    # the optimizer step as compiled graphs), in the peer's mode.
    mode = COMPILE_MODES.get(case["impl"])
    step_fn = torch.compile(train_step, mode=mode) if mode else train_step

    def step(inputs):
        box["loss"] = step_fn(inputs)

    def fetch():
        float(box["loss"])
        if cuda:
            torch.cuda.synchronize()

    start = time.perf_counter()
    step(on_device)
    fetch()
    compile_s = time.perf_counter() - start
    first = float(box["loss"])
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    repeats = []
    step_s = time_steps(lambda: step(on_device), fetch, case["steps"], case["repeats"],
                        repeats)
    hosts = [tensors(s) for s in range(1, 5)]
    turn = {"i": 0}

    def run_fed():
        step([t.to(device, non_blocking=True) for t in hosts[turn["i"] % len(hosts)]])
        turn["i"] += 1

    fed_s = time_steps(run_fed, fetch, case["steps"], 1)
    train_flops = (finetune_flops if finetune else pretrain_flops)(cfg)
    peak, source = None, "no table for the CPU peer"
    if cuda:
        from electra_tf.training import hardware
        chip = hardware.lookup(torch.cuda.get_device_name())
        if chip is not None:  # torch's float32 default: no TF32 in matmuls
            peak, column = chip.peak(case["precision"],
                                     torch.backends.cuda.matmul.allow_tf32)
            source = f"{chip.name} {column} ({chip.source})"
    model = job.model if finetune else job.disc
    return dict(case, batch=batch, device=torch.cuda.get_device_name() if cuda else "cpu",
                platform=device.type,
                versions=f"torch {torch.__version__}, transformers "
                         f"{transformers.__version__}, attention "
                         f"{model.config._attn_implementation}",
                step_ms=step_s * 1e3, step_ms_repeats=[1e3 * t for t in repeats],
                seqs_per_s=batch / step_s, fed_seqs_per_s=batch / fed_s,
                compile_s=compile_s, train_flops=train_flops,
                achieved_flops=train_flops / step_s, peak_flops=peak, peak_source=source,
                mfu=(train_flops / step_s / peak) if peak else None, program_bytes=None,
                peak_bytes=torch.cuda.max_memory_allocated() if cuda else None,
                first_loss=first, last_loss=float(box["loss"]))


# --------------------------------------------------------------------------- driver


def cases_of(args):
    """The children's cases in the order they run: for each precision, each pre-training
    shape and then fine-tuning, ours then the eager peer; `torch_compile`'s cases (a minute
    of compiling each) after all of those, so a --deadline_s drops them first."""
    peers = [p for p in args.peers.split(",") if p]
    bad = sorted(set(peers) - set(PEERS))
    if bad:
        raise SystemExit(f"--peers: unknown {bad[0]!r}; expected some of {', '.join(PEERS)}")
    compile_precisions = args.compile_precisions.split(",")
    checks = {c for c in args.check_cases.split(",") if c}
    out = []

    def add(kind, preset, length, batch, precision):
        for impl in peers:
            if impl in COMPILE_MODES and precision not in compile_precisions:
                continue
            case = {"kind": kind, "impl": impl, "config": preset, "length": length,
                    "batch": batch, "precision": precision, "steps": args.steps,
                    "repeats": args.repeats, "fit": args.fit}
            if impl in OURS and kind == "pretrain" and f"{preset}:{length}" in checks:
                case["check_rows"] = args.check_rows
            if (impl in OURS and kind == "pretrain"
                    and args.profile == f"{preset}:{length}:{precision}"):
                case["profile"] = args.profile_dir
            out.append(case)

    for precision in args.precisions.split(","):
        for spec in (s for s in args.cases.split(",") if s):
            try:
                preset, length, batch = spec.split(":")
                length, batch = int(length), int(batch)
            except ValueError:
                raise SystemExit(f"--cases: {spec!r} is not preset:length:batch")
            add("pretrain", preset, length, batch, precision)
        if args.finetune:
            try:
                preset, batch, length = args.finetune.split(":")
                batch, length = int(batch), int(length)
            except ValueError:
                raise SystemExit(f"--finetune: {args.finetune!r} is not preset:batch:length")
            add("finetune", preset, length, batch, precision)
    return [c for c in out if c["impl"] not in COMPILE_MODES] + [
        c for c in out if c["impl"] in COMPILE_MODES]


def fmt_row(r: dict) -> str:
    mfu = f"{100 * r['mfu']:5.1f}%" if r.get("mfu") is not None else "    - "
    mem = r.get("peak_bytes") or r.get("program_bytes")
    return (f"{r['kind']:<8} {r['config']:<6} {r['length']:>4} {r['batch']:>4} "
            f"{r['precision']:<9} {r['impl']:<13} {r['step_ms']:9.2f} {r['seqs_per_s']:9.1f} "
            f"{r['fed_seqs_per_s']:9.1f} {mfu} {(mem or 0) / 2**30:7.2f} "
            f"{r['compile_s']:7.1f} {r['first_loss']:9.4f}")


HEADER = (f"{'job':<8} {'preset':<6} {'len':>4} {'batch':>4} {'precision':<9} "
          f"{'impl':<13} {'step ms':>9} {'seq/s':>9} {'fed seq/s':>9} {'MFU':>6} "
          f"{'mem GiB':>7} {'first s':>7} {'loss':>9}")


def describe_check(r: dict) -> str:
    c = r["check"]
    parts = ", ".join(f"{k} {c['device'][k]:.5g} vs {c['cpu'][k]:.5g} ({c['rel_diff'][k]:.1e})"
                      for k in c["rel_diff"])
    return (f"  check {r['config']} {r['length']} {r['precision']}, {c['rows']} rows, "
            f"accelerator vs CPU: {parts}; tolerance {c['tolerance']:g}: "
            f"{'agree' if c['ok'] else 'DISAGREE'}")


def describe_profile(r: dict) -> str:
    p = r["profile"]
    if "error" in p:
        return f"  profile: {p['error']}"
    lines = [f"  profile {r['config']} {r['length']} {r['precision']} ({p['steps']} steps, "
             f"{p['source']}, busy {p['busy_us'] / 1e3 / p['steps']:.2f} ms/step): "
             + ", ".join(f"{k} {100 * v:.1f}%" for k, v in p["kinds"].items())]
    lines += [f"    {100 * share:5.1f}% {us / 1e3 / p['steps']:8.3f} ms  {name[:90]}"
              for name, us, share in p["top"]]
    return "\n".join(lines)


def kernel_check(spec: str, repeats: int = 3, steps: int = 10) -> dict:
    """The fused attention kernel (kernels/jax_attention.py; Pallas' interpreter off a
    GPU or TPU) against the reference attention at batch:heads:length:depth on the first
    device: outputs and the three gradients (max |difference| / max |reference|), rows
    padded to lengths from the full length down to 1, dropout 0.1, bfloat16 and float32;
    and the time of a forward and backward pass of each, best of `repeats` x `steps`."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from electra_tf.kernels import jax_attention as A
    from electra_tf.model.modeling import reference_attention
    batch, heads, length, depth = (int(x) for x in spec.split(":"))
    device = jax.devices()[0]
    interpret = device.platform not in ("gpu", "tpu")
    lengths = np.linspace(length, 1, batch).round().astype(int)
    bias = jnp.asarray(np.where(np.arange(length)[None] < lengths[:, None], 0.0, -10000.0),
                       jnp.float32)
    seed = jnp.array([11, 22, 0], jnp.int32)
    out = {"spec": spec, "device": device.device_kind, "interpret": interpret, "cases": []}
    for dtype in ("bfloat16", "float32"):
        q, k, v, do = (jax.random.normal(key, (batch, heads, length, depth)).astype(dtype)
                       / (np.sqrt(depth) if i == 0 else 1.0)
                       for i, key in enumerate(jax.random.split(jax.random.PRNGKey(1), 4)))
        fns = {"fused": lambda q, k, v: A.attention(q, k, v, bias, seed[:2], seed[2], 0.1,
                                                    interpret=interpret),
               "reference": lambda q, k, v: reference_attention(
                   q, k, v, bias[:, None, None, :], seed, 0.1, training=True)}
        grads = {name: jax.jit(lambda q, k, v, do, f=f: (lambda o, back: (o, *back(do)))(
            *jax.vjp(f, q, k, v))) for name, f in fns.items()}
        got = {name: g(q, k, v, do) for name, g in grads.items()}
        errors = [float(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)).max()
                        / jnp.abs(b.astype(jnp.float32)).max())
                  for a, b in zip(got["fused"], got["reference"])]
        ms = {}
        for name, g in grads.items():
            def run(g=g):
                box["r"] = g(q, k, v, do)
            box = {}
            run()
            ms[name] = 1e3 * time_steps(run, lambda: jax.block_until_ready(box["r"]), steps,
                                        repeats)
        tolerance = TOLERANCES[dtype]
        out["cases"].append({"dtype": dtype, "errors": errors, "tolerance": tolerance,
                             "ok": max(errors) <= tolerance, "ms": ms})
    return out


def describe_kernel_check(c: dict) -> str:
    lines = [f"kernel check {c['spec']} (batch:heads:length:depth) on {c['device']}"
             + (" (Pallas interpreter)" if c["interpret"] else "")]
    for case in c["cases"]:
        e = case["errors"]
        lines.append(f"  {case['dtype']:<9} output {e[0]:.1e}, dq {e[1]:.1e}, dk {e[2]:.1e}, "
                     f"dv {e[3]:.1e} (tolerance {case['tolerance']:g}): "
                     f"{'agree' if case['ok'] else 'DISAGREE'}; forward + backward: fused "
                     f"{case['ms']['fused']:.3f} ms, reference {case['ms']['reference']:.3f} ms")
    return "\n".join(lines)


def attention_of(impl: str) -> str:
    return "fused" if impl == "jax_fused" else "reference"


def run_case(case: dict, in_process: bool):
    """-> (the case's row, None) or (None, the last line of its error)."""
    if in_process:
        if os.environ.get("KERAS_BACKEND") != "jax":
            raise SystemExit("--in_process needs KERAS_BACKEND=jax in the environment")
        os.environ["ELECTRA_TF_ATTENTION"] = attention_of(case["impl"])
        return (run_jax(case) if case["impl"] in OURS else run_torch(case)), None
    env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="2",
               ELECTRA_TF_ATTENTION=attention_of(case["impl"]))
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--one",
                           json.dumps(case)], capture_output=True, text=True, cwd=REPO,
                          env=env)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    for ln in done.stdout.splitlines():
        if ln.startswith("# "):
            print(ln, flush=True)
    if done.returncode or not lines:
        tail = [ln for ln in done.stderr.strip().splitlines() if ln.strip()] or ["?"]
        return None, tail[-1]
    return json.loads(lines[-1][len("RESULT "):]), None


def main(argv=None):
    args = parse_args(argv)
    if args.kernel_check and args.kernel_check.startswith("RUN:"):  # the check's child
        print("RESULT " + json.dumps(kernel_check(args.kernel_check[4:])), flush=True)
        return 0
    if args.one:
        case = json.loads(args.one)
        row = run_jax(case) if case["impl"] in OURS else run_torch(case)
        print("RESULT " + json.dumps(row), flush=True)
        return 0
    cases = cases_of(args)
    kernel_ok = True
    if args.kernel_check:  # in its own process, as each case
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--kernel_check",
                               "RUN:" + args.kernel_check], capture_output=True, text=True,
                              cwd=REPO, env=dict(os.environ, KERAS_BACKEND="jax",
                                                 TF_CPP_MIN_LOG_LEVEL="2"))
        found = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
        if done.returncode or not found:
            kernel_ok = False
            tail = [ln for ln in done.stderr.strip().splitlines() if ln.strip()] or ["?"]
            print(f"kernel check {args.kernel_check} failed: {tail[-1][:300]}", flush=True)
        else:
            check = json.loads(found[-1][len("RESULT "):])
            kernel_ok = all(c["ok"] for c in check["cases"])
            print(describe_kernel_check(check), flush=True)
            if args.jsonl:
                with open(args.jsonl, "a") as f:
                    f.write(json.dumps({"kernel_check": check}) + "\n")
    print(f"{len(cases)} case(s), best of {args.repeats} x {args.steps} steps after a "
          f"warm-up step, {'in this process' if args.in_process else 'each in a fresh process'}"
          "; 'fed': a host batch sent every step",
          flush=True)
    print(HEADER, flush=True)
    start, rows, failed = time.perf_counter(), [], 0
    for case in cases:
        if args.deadline_s and time.perf_counter() - start > args.deadline_s:
            print(f"# deadline: skipped {case['kind']} {case['config']} {case['length']} "
                  f"{case['precision']} {case['impl']}", flush=True)
            continue
        fitted = [r["batch"] for r in rows if r["impl"] in OURS and all(
            r[k] == case[k] for k in ("kind", "config", "length", "precision"))]
        if case["impl"] not in OURS and fitted and fitted[-1] < case["batch"]:
            case = dict(case, batch=fitted[-1])  # the peer at the batch ours fitted
        row, error = run_case(case, args.in_process)
        if row is None:
            failed += 1
            print(f"{case['kind']:<8} {case['config']:<6} {case['length']:>4} "
                  f"{case['batch']:>4} {case['precision']:<9} {case['impl']:<13} failed: "
                  f"{error[:200]}", flush=True)
            continue
        rows.append(row)
        print(fmt_row(row), flush=True)
        if len(row.get("step_ms_repeats", [])) > 1:
            times = row["step_ms_repeats"]
            print(f"  repetitions: {', '.join(f'{t:.2f}' for t in times)} ms/step "
                  f"(spread {100 * (max(times) - min(times)) / min(times):.1f}% of the best)",
                  flush=True)
        if "fed_ahead_seqs_per_s" in row:
            print(f"  fed, each batch placed 2 steps ahead by a thread: "
                  f"{row['fed_ahead_seqs_per_s']:.1f} seq/s", flush=True)
        if "check" in row:
            print(describe_check(row), flush=True)
        if "profile" in row:
            print(describe_profile(row), flush=True)
        if args.jsonl:
            with open(args.jsonl, "a") as f:
                f.write(json.dumps(row) + "\n")
    for impl in OURS:  # each of ours against every peer row of its shape
        ours = {(r["kind"], r["config"], r["length"], r["precision"]): r for r in rows
                if r["impl"] == impl}
        for r in rows:
            mine = ours.get((r["kind"], r["config"], r["length"], r["precision"]))
            if r["impl"] != impl and mine and mine["batch"] == r["batch"]:
                print(f"{'ours' if impl == 'jax' else impl} / {r['impl']}: {r['kind']} "
                      f"{r['config']} {r['length']} {r['precision']} batch {r['batch']}: step "
                      f"{mine['seqs_per_s'] / r['seqs_per_s']:.2f}x, fed "
                      f"{mine['fed_seqs_per_s'] / r['fed_seqs_per_s']:.2f}x", flush=True)
    bad_checks = [r for r in rows if "check" in r and not r["check"]["ok"]]
    return 1 if failed or bad_checks or not kernel_ok else 0


if __name__ == "__main__":
    sys.exit(main())
