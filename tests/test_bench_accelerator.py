"""bench/bench_accelerator.py: its trace summary, case order and FLOP counts, and one run on
this CPU of every path it takes on a GPU (ours and the PyTorch peer, pre-training and
fine-tuning, the accelerator-vs-CPU check, the profile)."""

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

from electra_tf import compat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # local: the repo
_spec = importlib.util.spec_from_file_location(
    "bench_accelerator", os.path.join(ROOT, "bench", "bench_accelerator.py"))
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def _trace():
    """A GPU trace as jax.profiler writes it: a device with two streams and an 'XLA Ops'
    line that repeats them (not counted), and the host's Python thread (not counted)."""
    meta = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "Stream #13"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 8, "args": {"name": "Stream #14"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 9, "args": {"name": "XLA Ops"}},
        {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}},
        {"ph": "M", "name": "thread_name", "pid": 2, "tid": 1, "args": {"name": "python"}}]
    kernels = [("nvjet_sm90_tst_128x128_TNT", 7, 40.0), ("nvjet_sm90_tst_128x128_TNT", 8, 20.0),
               ("loop_convert_multiply_fusion_12", 7, 25.0),
               ("input_add_reduce_fusion_13", 8, 10.0), ("MemcpyH2D", 7, 5.0)]
    events = [{"ph": "X", "name": n, "pid": 1, "tid": t, "dur": d} for n, t, d in kernels]
    events += [{"ph": "X", "name": "fusion.1", "pid": 1, "tid": 9, "dur": 500.0},
               {"ph": "X", "name": "PjitFunction(step)", "pid": 2, "tid": 1, "dur": 900.0}]
    return {"traceEvents": meta + events}


def test_trace_summary_counts_the_device_streams_only():
    s = bench.summarise_trace(_trace())
    assert s["source"] == "device streams" and s["busy_us"] == 100.0
    assert s["top"][0] == ["nvjet_sm90_tst_128x128_TNT", 60.0, 0.6]
    assert [row[0] for row in s["top"]] == ["nvjet_sm90_tst_128x128_TNT",
                                           "loop_convert_multiply_fusion_12",
                                           "input_add_reduce_fusion_13", "MemcpyH2D"]
    assert s["kinds"] == pytest.approx({"matmul": 0.6, "fused elementwise": 0.25,
                                        "reduction": 0.1, "copy": 0.05})


def test_cases_run_the_compiled_peer_last_and_bad_specs_name_the_flag():
    args = bench.parse_args(["--cases", "small:128:128,base:512:256", "--precisions",
                             "bfloat16,float32", "--finetune", "base:32:128"])
    cases = bench.cases_of(args)
    order = [(c["kind"], c["config"], c["length"], c["precision"], c["impl"]) for c in cases]
    assert order[:3] == [("pretrain", "small", 128, "bfloat16", "jax"),
                         ("pretrain", "small", 128, "bfloat16", "torch"),
                         ("pretrain", "base", 512, "bfloat16", "jax")]
    compiled = [o for o in order if o[4] == "torch_compile"]
    assert order[-len(compiled):] == compiled and len(compiled) == 3  # bfloat16 only
    assert len(order) == 2 * 3 * 2 + 3
    assert [c.get("check_rows") for c in cases if c["config"] == "small"] == [32, None, 32,
                                                                              None, None]
    # Every mode: ours with the fused kernel checked like ours, both compiled peers last.
    every = bench.cases_of(bench.parse_args([
        "--cases", "base:128:256", "--precisions", "bfloat16", "--finetune=",
        "--check_cases", "base:128", "--peers",
        "jax,jax_fused,torch,torch_compile,torch_compile_max"]))
    assert [(c["impl"], c.get("check_rows")) for c in every] == [
        ("jax", 32), ("jax_fused", 32), ("torch", None), ("torch_compile", None),
        ("torch_compile_max", None)]
    assert [bench.attention_of(c["impl"]) for c in every] == [
        "reference", "fused", "reference", "reference", "reference"]
    assert bench.COMPILE_MODES == {"torch_compile": "default",
                                   "torch_compile_max": "max-autotune"}
    with pytest.raises(SystemExit, match="--cases: 'base:128' is not preset:length:batch"):
        bench.cases_of(bench.parse_args(["--cases", "base:128"]))
    with pytest.raises(SystemExit, match="--peers: unknown 'tf'"):
        bench.cases_of(bench.parse_args(["--peers", "jax,tf"]))


def test_finetuning_flops_are_three_forward_passes_of_the_encoder_and_classifier():
    cfg = bench.load("base", 32, 128)
    h, f, s, layers = 768, 3072, 128, 12
    per_layer = s * (2 * 4 * h * h + 2 * 2 * h * f) + 2 * 2 * h * s * s
    assert bench.finetune_flops(cfg) == 3 * 32 * (layers * per_layer + 2 * h * h + 2 * h * 2)
    # ELECTRA-Small's pre-training step (hardware convention) is our flops module's count.
    small = bench.load("small", 128, 128)
    from electra_tf.pretraining import flops
    assert bench.pretrain_flops(small) == flops.count_config(
        small, flops.HARDWARE).train_per_step()["total"]


@pytest.mark.skipif(not (compat.module_exists("jax") and compat.module_exists("torch")
                         and compat.module_exists("transformers")),
                    reason="needs jax, torch and transformers (the test extra)")
@pytest.mark.subprocess
@pytest.mark.jax
def test_bench_runs_ours_and_the_peer_on_this_cpu(tmp_path):
    rows_file = tmp_path / "rows.jsonl"
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(
        [sys.executable, "bench/bench_accelerator.py", "--in_process", "--cases", "tiny:32:4",
         "--finetune", "tiny:4:32", "--precisions", "float32", "--peers", "jax,torch",
         "--steps", "1", "--repeats", "2", "--check_cases", "tiny:32", "--check_rows", "2",
         "--kernel_check", "2:2:16:8",
         "--profile", "tiny:32:float32", "--profile_dir", str(tmp_path / "trace"),
         "--jsonl", str(rows_file)], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in rows_file.read_text().splitlines()]
    kernel = lines[0]["kernel_check"]  # the fused kernel in the interpreter, first
    assert kernel["interpret"] and [c["dtype"] for c in kernel["cases"]] == [
        "bfloat16", "float32"] and all(c["ok"] for c in kernel["cases"])
    assert max(kernel["cases"][1]["errors"]) < 1e-5
    assert "kernel check 2:2:16:8 (batch:heads:length:depth) on cpu" in done.stdout
    rows = lines[1:]
    assert [(r["kind"], r["impl"]) for r in rows] == [
        ("pretrain", "jax"), ("pretrain", "torch"), ("finetune", "jax"), ("finetune", "torch")]
    for r in rows:
        assert r["seqs_per_s"] == pytest.approx(r["batch"] / (r["step_ms"] / 1e3))
        assert len(r["step_ms_repeats"]) == 2 and r["step_ms"] == min(r["step_ms_repeats"])
        assert r["achieved_flops"] == pytest.approx(r["train_flops"] / (r["step_ms"] / 1e3))
    ours = rows[0]
    assert ours["fed_ahead_seqs_per_s"] > 0 and "placed 2 steps ahead" in done.stdout
    assert ours["mfu"] == pytest.approx(ours["achieved_flops"] / ours["peak_flops"])
    assert ours["peak_source"].startswith("measured: 2048^2 float32 jnp matmul")
    assert ours["program_bytes"] > 0
    # Both objectives at initialisation: MLM ~ ln(30522), discriminator ~ ln 2, x 50.
    expected = math.log(30522) + 50 * math.log(2)
    for r in rows[:2]:
        assert r["first_loss"] == pytest.approx(expected, abs=1.0)
    for r in rows[2:]:
        assert r["first_loss"] == pytest.approx(math.log(2), abs=0.1)
    check = ours["check"]  # on a CPU the 'accelerator' is the CPU: the same numbers
    assert check["ok"] and check["rows"] == 2 and set(check["rel_diff"]) == {
        "loss_sum", "mlm_loss_sum", "disc_loss_sum", "grad_norm_sum"}
    assert max(check["rel_diff"].values()) == 0.0
    profile = ours["profile"]
    assert profile["source"] == "host XLA" and profile["busy_us"] > 0
    assert 0 < sum(share for _, _, share in profile["top"]) <= 1.0 + 1e-9
    assert "profile" not in rows[2]  # only the pre-training case asked for
    assert "agree" in done.stdout and "ours / torch: pretrain tiny 32 float32 batch 4" \
        in done.stdout
