"""experiments/gpu_budget.py: the card study's plan, its verdicts, and the whole study on
the CPU at the `tiny` plan (a few steps per budget) with TensorFlow unimportable, as on
the GPU machines, so that the card's minutes are not spent on a typo."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, without_tensorflow

_spec = importlib.util.spec_from_file_location(
    "gpu_budget", os.path.join(REPO, "experiments", "gpu_budget.py"))
gpu_budget = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_budget)


def test_the_card_plan_turns_minutes_into_steps_and_fits_the_call():
    """0.5-6 minutes at 4,000 seq/s of 128 sequences: multiples of 936 steps (a multiple of
    4: a step line every 234 steps falls on each); the largest budget is 6 minutes of
    steps, its fine-tunings inside the call's 9 minutes."""
    plan = gpu_budget.PLANS["card"]
    steps = gpu_budget.budget_steps(plan)
    assert steps == [936, 1872, 3744, 7488, 11232]
    assert steps[-1] * plan.batch_size / plan.seq_per_s == pytest.approx(359.4, abs=0.1)
    assert plan.deadline_s + 30 < 600  # the wheels' install, inside one 10-minute call
    cfg = gpu_budget.plan_config(plan, steps[-1])
    assert (cfg.model.hidden_size, cfg.model.num_hidden_layers) == (256, 12)
    assert cfg.optimizer.warmup_steps == 1123 and cfg.train.num_train_steps == 11232
    assert [t.name for t in plan.tasks] == ["movies", "movies_500", "tweets"]
    assert gpu_budget.budget_steps(gpu_budget.PLANS["tiny"]) == [4, 8]


def test_the_verdict_of_a_row_against_no_pretraining():
    assert gpu_budget.versus([0.70, 0.71], [0.60, 0.69]) == "above (every seed)"
    assert gpu_budget.versus([0.70, 0.60], [0.60, 0.69]) == "within the spread"
    assert gpu_budget.versus([0.50, 0.55], [0.60, 0.69]) == "below (every seed)"
    assert gpu_budget._mean_range([0.5, 0.7, 0.6]) == "0.6000 (0.5000-0.7000)"


def _run(args, timeout=900):
    done = subprocess.run([sys.executable, *without_tensorflow(args)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stderr[-4000:]
    return done


@pytest.mark.subprocess
@pytest.mark.e2e
@pytest.mark.jax
def test_the_tiny_plan_runs_the_whole_study_without_tensorflow(tmp_path):
    """prepare --plan=tiny, then run with TensorFlow unimportable, the pre-training stopped
    at step 5 as the deadline stops it: the untrained model, the first budget (step 4) and
    the cut (step 5) each fine-tuned on both tasks with 2 seeds, from the checkpoint each
    names; FLOPs per row = step x the plan's per-step count; the report's rows."""
    bundle, out = tmp_path / "bundle", tmp_path / "out"
    _run(["experiments/gpu_budget.py", "prepare", "--plan=tiny", f"--bundle={bundle}"])
    plan = json.loads((bundle / "plan.json").read_text())
    assert plan["budget_steps"] == [4, 8] and plan["wheels"] == []
    assert plan["task_rows"] == {"polarity": {"train": 160, "dev": 40},
                                 "polarity_64": {"train": 64, "dev": 40}}
    assert plan["corpus_manifest"]["documents"] == 300
    assert not (bundle / "text").exists()
    done = _run(["experiments/gpu_budget.py", "run", f"--bundle={bundle}", f"--out={out}",
                 "--stop_at_step=5"])
    results = json.loads((out / "results.json").read_text())
    assert results["pretrain_exit"] == 75 and results["cut_at"] >= 5
    cut = results["cut_at"]
    assert [r["step"] for r in results["rows"]] == [0, 4, cut]
    assert [r["budget_min"] for r in results["rows"]] == [None, 1, None]
    assert "1 CPU device(s) (cpu)" in results["machine"]
    per_step = plan["flops_per_step"]
    losses = set()
    for row in results["rows"]:
        assert row["flops_paper"] == per_step["paper"] * row["step"]
        assert row["flops_hardware"] == per_step["hardware"] * row["step"]
        if row["step"]:
            assert 0.0 <= row["metrics"]["disc_auc"] <= 1.0 and "mlm_acc" in row["metrics"]
            assert row["train_s"] > 0
        for task in ("polarity", "polarity_64"):
            ft = row["finetune"][task]
            assert len(ft["scores"]) == 2 and all(0 <= s <= 1 for s in ft["scores"]), ft
            assert [t["seed"] for t in ft["trials"]] == [1, 2]
            want = None if not row["step"] else f"/pretrain/ckpt-{row['step']}"
            assert ft["init_checkpoint"] == want or ft["init_checkpoint"].endswith(want)
            losses.add(round(ft["trials"][0]["loss"], 6))
            assert not (out / "work" / "finetune" / task / f"step{row['step']}" /
                        "trial_0").exists()
    assert len(losses) == 6  # every start and task gives its own network
    report = (out / "report.md").read_text()
    assert report == done.stdout
    assert f"stopped at step {cut} (SIGTERM" in report
    for task in ("polarity", "polarity_64"):
        assert f"## {task}: " in report
    assert report.count("| ckpt-4 | 1 min |") == 2 and report.count(f"| ckpt-{cut} | cut |") == 2
    logs = (out / "logs.txt").read_text()
    assert logs.count("$ ") == 7 and "== pretrain.log" in logs
    again = _run(["experiments/gpu_budget.py", "report", f"--results={out / 'results.json'}"])
    assert again.stdout == report


def test_a_bundle_without_a_plan_and_a_missing_corpus_are_one_line(tmp_path):
    done = subprocess.run([sys.executable, "experiments/gpu_budget.py", "run",
                           f"--bundle={tmp_path}", f"--out={tmp_path / 'o'}"], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 1 and done.stderr.strip() == (
        f"gpu_budget: error: --bundle={tmp_path}: no plan.json (write it with gpu_budget.py "
        "prepare)")
    done = subprocess.run([sys.executable, "experiments/gpu_budget.py", "prepare",
                           f"--bundle={tmp_path / 'b'}", "--tweets_dir=/nowhere"], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 1 and done.stderr.strip() == (
        "gpu_budget: error: tweets: no /nowhere/polarity/train.tsv")
