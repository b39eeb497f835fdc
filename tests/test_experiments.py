"""experiments/compute_matched.py without training: the plan, markers, report and plot."""

import importlib.util
import json
import os

import pytest

from electra_tf import configs, fileio
from electra_tf.pretraining import flops
import experiment_scripts

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


cm = experiment_scripts.load("compute_matched")
ALL = list(cm.VARIANTS)


def write_marker(directory, data):
    """A job's done marker, as the experiment writes it."""
    fileio.makedirs(directory)
    fileio.write_json_atomic(fileio.join(directory, cm.DONE), data, sort_keys=True)


@pytest.fixture(scope="module")
def plan():
    return cm.plan_variants("tiny", ALL, "electra", 100, [0.5, 1.0])


def test_variants_are_valid_configs():
    assert len(ALL) == 13
    for name in ALL:
        cfg = cm.variant_config("tiny", name, {}, 100)
        assert cfg.objective.objective in configs.OBJECTIVE_NAMES
    bert = cm.variant_config("tiny", "bert_mlm", {}, 100).objective
    assert (bert.objective, bert.mask_token_prob, bert.random_token_prob) == ("mlm", 0.8, 0.1)
    hp = cm.variant_config("tiny", "hp_loss_focal", {}, 100).objective
    assert hp.focal_gamma() == "piecewise"
    assert cm.variant_config("tiny", "gdes", {}, 100).model.disentangled_embeddings
    fast = cm.variant_config("tiny", "fast_electra", {}, 100)
    assert fast.objective.generator == "fixed" and not fast.model.tie_embeddings
    assert fast.objective.schedule() == ("exponential", 2.0, 1.0)
    assert cm.variant_config("tiny", "electra_seed2", {}, 100).train.seed == 2


def test_fast_electra_reads_the_electra_run_of_the_experiment():
    plan = cm.plan_variants("tiny", ["electra", "fast_electra"], "electra", 100, [1.0],
                            out_dir="/exp")
    over = plan["variants"]["fast_electra"].overrides
    assert over["objective.generator_checkpoint"] == "/exp/pretrain/electra"
    # Forward-only generator: more steps than electra for the same FLOPs.
    assert plan["variants"]["fast_electra"].steps > plan["variants"]["electra"].steps
    unresolved = cm.plan_variants("tiny", ["fast_electra"], "electra", 100, [1.0])
    assert unresolved["variants"]["fast_electra"].overrides[
        "objective.generator_checkpoint"] == "@electra"


def test_interval_and_separation():
    mean, half = cm.interval([0.70, 0.72, 0.74])
    # t(0.975, 2) = 4.3027; sd 0.02; n 3.
    assert mean == pytest.approx(0.72) and half == pytest.approx(4.302653 * 0.02 / 3 ** 0.5,
                                                                 rel=1e-5)
    assert cm.interval([0.7]) == (0.7, None) and cm.interval(None) == (None, None)
    assert cm.separation([0.71, 0.72], [0.60, 0.70]) == "above"
    assert cm.separation([0.5, 0.55], [0.60, 0.70]) == "below"
    assert cm.separation([0.65, 0.75], [0.60, 0.70]) == "within spread"


def test_plan_matches_every_variant_to_the_budget(plan):
    budget = plan["budget"]
    reference = cm.variant_config("tiny", "electra", {}, 100)
    assert budget == cm.train_flops(reference)
    v = plan["variants"]
    assert list(v) == ALL and v["electra"].steps == 100 and v["electra"].flops == budget
    for p in v.values():
        cfg = configs.load_config("tiny", p.overrides)  # what the subprocess will run
        assert cfg.train.num_train_steps == p.steps
        assert cm.train_flops(cfg) == pytest.approx(p.flops, rel=1e-12)
        # Within one (costliest) step of the budget.
        count = flops.count_config(cfg)
        step = max(per_step for _, per_step in cm.stages(count))
        assert abs(p.flops - budget) <= step
        # Every point is a step the run saves and keeps.
        assert [pt.fraction for pt in p.points] == [0.5, 1.0]
        assert p.points[-1].step == p.steps
        saved = set(range(p.save_every, p.steps + 1, p.save_every)) | {p.steps}
        assert {pt.step for pt in p.points} <= saved and p.keep >= len(saved)
        assert cfg.train.save_checkpoints_steps == p.save_every
        assert cfg.train.keep_checkpoint_max == p.keep
        assert cfg.optimizer.warmup_steps == max(1, round(0.1 * p.steps))
        for pt in p.points:
            assert pt.flops == pytest.approx(cm.flops_at_step(count, pt.step), rel=1e-12)
            assert abs(pt.flops - pt.fraction * budget) <= max(0.02 * budget, step)
    # Cheaper steps get more of them.
    assert v["bert_mlm"].steps > v["electra"].steps > v["replace_mlm"].steps > \
        v["all_tokens_mlm"].steps
    assert v["electra_15"].steps == v["adversarial"].steps == 100
    assert v["two_stage"].switch_step == v["two_stage"].steps // 2
    assert v["electric"].steps < v["electra"].steps  # two towers, cloze logits everywhere
    assert v["electra"].points[0].step == 50 and v["electra"].save_every == 50


def test_plan_with_an_explicit_switch_and_another_reference():
    p = cm.plan_variants("tiny", ["two_stage", "electra"], "bert_mlm", 200, [1.0],
                         {"objective.two_stage_switch_step": "50",
                          "train.train_batch_size": "16"})
    bert = cm.variant_config("tiny", "bert_mlm", {"train.train_batch_size": "16"}, 200)
    assert p["budget"] == cm.train_flops(bert)
    two = p["variants"]["two_stage"]
    assert two.switch_step == round(two.steps / 4)  # 50 of 200: a quarter of the run
    assert two.overrides["objective.two_stage_switch_step"] == str(two.switch_step)
    assert configs.load_config("tiny", two.overrides).train.train_batch_size == 16


def test_checkpoint_steps_on_a_linear_cost():
    def cost(s):
        return 10.0 * s
    g, steps = cm.checkpoint_steps([500.0, 1000.0], 100, cost, tolerance=20.0)
    assert (g, steps) == (50, [50, 100])
    g, steps = cm.checkpoint_steps([250.0, 500.0, 750.0, 1000.0], 100, cost, 20.0)
    assert (g, steps) == (25, [25, 50, 75, 100])
    # 1/3: no interval hits it exactly; the fewest checkpoints within the tolerance.
    g, steps = cm.checkpoint_steps([333.3, 1000.0], 100, cost, 20.0)
    assert steps[1] == 100 and abs(steps[0] - 33.3) <= 2 and g == steps[0]


# --- the FLOP budget ---------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["electra", "bert_mlm", "all_tokens_mlm", "two_stage",
                                     "hp_loss_focal"])
def test_steps_for_budget_round_trips(variant):
    extra = {"objective.two_stage_switch_step": "250"} if variant == "two_stage" else {}
    cfg = cm.variant_config("tiny", variant, extra, 1000)
    budget = cm.train_flops(cfg)
    assert cm.steps_for_budget(cfg, budget) == 1000
    hardware = cm.train_flops(cfg, flops.HARDWARE)
    assert cm.steps_for_budget(cfg, hardware, flops.HARDWARE) == 1000
    # Another variant at the same budget: its run costs the budget to within half its
    # costliest step.
    electra = cm.variant_config("tiny", "electra", {}, 777)
    n = cm.steps_for_budget(cfg, cm.train_flops(electra))
    matched = cm.with_train_steps(cfg, n)
    costliest = max(per_step for _, per_step in cm.stages(flops.count_config(matched)))
    assert abs(cm.train_flops(matched) - cm.train_flops(electra)) <= costliest / 2
    if variant == "two_stage":  # the switch keeps its place in the run: 1/4
        assert matched.objective.two_stage_switch_step == round(n / 4)
    with pytest.raises(ValueError):
        cm.steps_for_budget(cfg, 0)


def test_steps_for_budget_orders_the_variants():
    budget = cm.train_flops(cm.variant_config("tiny", "electra", {}, 1000))
    steps = {v: cm.steps_for_budget(cm.variant_config("tiny", v, {}, 600), budget)
             for v in ("electra", "bert_mlm", "all_tokens_mlm", "two_stage", "replace_mlm")}
    assert steps["electra"] == 1000
    assert steps["bert_mlm"] > steps["electra"] > steps["replace_mlm"] > \
        steps["all_tokens_mlm"]
    assert steps["two_stage"] > steps["electra"]  # equal-size networks, one trains a stage


def test_flops_at_step_and_its_inverse():
    cfg = cm.variant_config("tiny", "two_stage", {"objective.two_stage_switch_step": "300"},
                            1000)
    count = flops.count_config(cfg)
    phase1, phase2 = (count.train_per_step(p)["total"] for p in ("generator", "discriminator"))
    assert cm.stages(count) == [(300, phase1), (700, phase2)]
    run = 300 * phase1 + 700 * phase2
    assert cm.flops_at_step(count, 200) == pytest.approx(200 * phase1, rel=1e-12)
    assert cm.flops_at_step(count, 500) == pytest.approx(300 * phase1 + 200 * phase2,
                                                         rel=1e-12)
    assert cm.step_at_flops(count, 300 * phase1 + 200 * phase2) == 500
    assert cm.step_at_flops(count, run) == 1000 and cm.step_at_flops(count, 0) == 0
    # One stage: the cost is linear in the step.
    electra = flops.count_config(cm.variant_config("tiny", "electra", {}, 100))
    per_step = electra.train_per_step()["total"]
    assert cm.stages(electra) == [(100, per_step)]
    assert cm.flops_at_step(electra, 40) == 40 * per_step
    assert cm.step_at_flops(electra, 40.4 * per_step) == 40
    assert cm.step_at_flops(electra, 1e30) == 100


def test_markers_are_atomic_and_checked(tmp_path):
    d = str(tmp_path / "job")
    assert cm.read_marker(d) is None
    write_marker(d, {"steps": 10, "x": [1, 2]})
    assert os.listdir(d) == [cm.DONE]  # no temporary file left
    marker = cm.read_marker(d)
    assert cm.check_marker(marker, {"steps": 10}, "job")
    assert not cm.check_marker(None, {"steps": 10}, "job")
    with pytest.raises(cm.ExperimentError, match="steps=10.*11"):
        cm.check_marker(marker, {"steps": 11}, "job")
    with open(os.path.join(d, cm.DONE), "w") as f:
        f.write('{"steps": 1')  # a torn write: not done
    assert cm.read_marker(d) is None


def fake_results(plan):
    results = cm.collect_results("/nonexistent", plan)
    for i, (name, v) in enumerate(results["variants"].items()):
        v["pretrain_seconds"] = 60.0 + i
        v["eval_results"] = {"disc_auc": 0.7 + i / 100, "loss": 3.0}
        if name == "hp_dist":
            v["eval_results"]["hp_correlation"] = 0.25
        for j, p in enumerate(v["points"]):
            if name == "adversarial" and j == 1:
                continue  # not run yet
            p.update(scores=[0.5, 0.55 + j / 10, 0.6], metric="accuracy",
                     median=0.55 + j / 10)
    return results


def test_report_renders_every_part(plan):
    results = fake_results(plan)
    text = cm.render_report(results, "python experiments/compute_matched.py --seeds=3",
                            "AMD EPYC, 2 core(s)", {"pretrain/x": "exit 1: boom"})
    assert "Command: `python experiments/compute_matched.py --seeds=3`" in text
    assert "Machine: AMD EPYC, 2 core(s)" in text
    assert f"{plan['budget']:.4e}" in text
    for name in ALL:
        assert f"| {name} |" in text
    assert "| bert_mlm | objective=mlm, mask_token_prob=0.8, random_token_prob=0.1 | 176 |" \
        in text
    assert "| electra | 0.5500 | 0.6500 |" in text  # medians at 0.5 and 1 of the budget
    assert "| electra | 0.5 | 50 |" in text and "0.5000, 0.5500, 0.6000" in text
    assert "| adversarial | 1 | 100 |" in text and "not run" in text
    assert "(discriminator stage)" in text or "(generator stage)" in text
    assert "| hp_correlation |" in text and "| disc_auc |" in text
    assert "## Failed jobs" in text and "boom" in text
    assert "## What this scale can and cannot show" in text
    assert text.split("## What this scale can and cannot show")[1].strip().startswith(
        "(Not written yet: put the reading of these numbers in interpretation.md")
    assert "## Discriminators on fixed held-out corruptions" not in text  # none judged
    results["baseline"] = {"scores": [0.50, 0.52, 0.51], "metric": "accuracy"}
    results["judge"] = "electra_seed2"
    results["corruptions"] = {"tokens": 4000, "replaced_share": 0.1234}
    results["intrinsic"] = {
        "electra": {"score_kind": "discriminator", "auc": 0.61, "replaced_auc_at_masked":
                    0.7, "accuracy": 0.86, "fitted_accuracy": 0.87,
                    "majority_accuracy": 0.86},
        "electra_seed2": {"score_kind": "discriminator", "auc": 0.63},
        cm.BASELINE: {"score_kind": "discriminator", "auc": 0.5, "accuracy": None}}
    text = cm.render_report(results, "python x", "a machine")
    assert f"| {cm.BASELINE} (0 FLOPs) | 0.5100 | 0.5100 |" in text
    assert f"| {cm.BASELINE} | 0 | 0.5100 | ± 0.0248 | 0.5000 | 0.5200 | — | — |" in text
    # electra at the full budget: 0.5, 0.65, 0.6 -> every seed above 0.52? no (0.5).
    assert "| electra | 100 | 0.5833 |" in text and "| +0.0733 | within spread |" in text
    assert "4000 scored tokens, 0.1234 of the masked slots replaced" in text
    assert "| electra | discriminator | 0.6100 | 0.7000 | 0.8600 | 0.8700 | 0.8600 |" in text
    assert "| electra_seed2 (judge: its own generator) | discriminator | 0.6300 | — |" in text
    assert f"| {cm.BASELINE} | discriminator | 0.5000 | — | — | — | — |" in text
    with_notes = cm.render_report(results, "python experiments/compute_matched.py --seeds=3",
                                  "a machine", interpretation="\nChance level.\n")
    assert with_notes.endswith("## What this scale can and cannot show\n\nChance level.\n")


def test_outputs_from_markers_and_resume_without_rerunning(tmp_path, monkeypatch):
    small = cm.plan_variants("tiny", ["electra", "bert_mlm"], "electra", 20, [0.5, 1.0])
    args = cm.parse_args(["--variants=electra,bert_mlm", "--reference_steps=20",
                          f"--out_dir={tmp_path}"])
    for v in small["variants"].values():
        write_marker(cm.pretrain_dir(str(tmp_path), v.name), {
            "steps": v.steps, "overrides": v.overrides, "config": "tiny", "seconds": 9.0,
            "eval_results": {"disc_auc": 0.6}})
        for p in v.points:
            write_marker(cm.finetune_dir(str(tmp_path), v.name, p.step), {
                "task": "polarity", "seeds": 3, "seed": 1, "checkpoint_step": p.step,
                "max_seq_length": 64, "epochs": None, "metric": "accuracy",
                "scores": [0.5, 0.6, 0.7], "median": 0.6})
    write_marker(cm.finetune_dir(str(tmp_path), cm.BASELINE, 0), {
        "task": "polarity", "seeds": 3, "seed": 1, "checkpoint_step": 0,
        "max_seq_length": 64, "epochs": None, "metric": "accuracy",
        "scores": [0.5, 0.5, 0.55], "median": 0.5})
    monkeypatch.setattr(cm, "run_logged", lambda *a: pytest.fail("reran a done job"))
    assert cm.run_experiment(args, small) == {}
    results = cm.write_outputs(args, small, "python x", {})
    assert results["baseline"]["scores"] == [0.5, 0.5, 0.55]
    report = open(tmp_path / "report.md").read()
    assert f"| {cm.BASELINE} (0 FLOPs) | 0.5000 | 0.5000 |" in report
    assert "| electra | 20 | 0.6000 | ± 0.2484 | 0.5000 | 0.7000 | +0.0833 | within spread |" \
        in report
    saved = json.load(open(tmp_path / "results.json"))
    assert saved["variants"]["electra"]["points"][1]["scores"] == [0.5, 0.6, 0.7]
    assert results["variants"]["bert_mlm"]["eval_results"] == {"disc_auc": 0.6}
    assert "| disc_auc | 0.6000 | 0.6000 |" in open(tmp_path / "report.md").read()
    pytest.importorskip("matplotlib")
    assert (tmp_path / "score_vs_flops.png").stat().st_size > 1000
    # A marker from other settings stops the run instead of mixing results.
    other = cm.parse_args(["--variants=electra,bert_mlm", "--reference_steps=20",
                           f"--out_dir={tmp_path}", "--seeds=5"])
    with pytest.raises(cm.ExperimentError, match="seeds=3"):
        cm.run_experiment(other, small)


@pytest.mark.e2e
def test_commands():
    args = cm.parse_args(["--variants=electra", "--extra_pretrain_flags=--seed 3"])
    v = cm.plan_variants("tiny", ["electra"], "electra", 40, [0.5, 1.0])["variants"]["electra"]
    cmd = cm.pretrain_command(args, v, "/o/pretrain/electra")
    assert cmd[1].endswith("run_pretraining.py") and "--do_eval" in cmd
    assert "--nojit_compile" in cmd and cmd[-2:] == ["--seed", "3"]
    override = next(c for c in cmd if c.startswith("--params_override="))
    assert "train.num_train_steps=40" in override and "train.save_checkpoints_steps=20" \
        in override
    ft = cm.finetune_command(args, "/o/pretrain/electra/ckpt-20", "/o/ft")
    assert "--init_checkpoint=/o/pretrain/electra/ckpt-20" in ft
    assert "--num_trials=3" in ft and "--max_seq_length=64" in ft
    assert any(c.startswith("--data_dir=") for c in ft)  # no demo export
    base = cm.finetune_command(args, None, "/o/ft0")
    assert "--init_checkpoint=none" in base and "--config=tiny" in base


@pytest.mark.parametrize("argv, message", [
    (["--variants=electra,nope"], "unknown nope"),
    (["--points=0,1"], "--points"),
    (["--reference=nope"], "--reference=nope"),
    (["--seeds=0"], "--seeds=0"),
    (["--bogus"], "unrecognized arguments"),
    (["--params_override=model.nope=1"], "unknown key"),
    (["--variants=fast_electra,electra"], "fast_electra reads the run of electra: list "
                                          "electra before it"),
    (["--variants=electra", "--judge=bert_mlm"], "--judge=bert_mlm: not among --variants"),
])
def test_bad_flags_are_one_line_errors(argv, message, capsys):
    assert cm.main(argv + ["--dry_run"]) == 1
    err = capsys.readouterr().err
    assert message in err and err.startswith("compute_matched: error:")
    assert len(err.strip().splitlines()) == 1


def test_dry_run_prints_the_plan(capsys):
    assert cm.main(["--dry_run", "--variants=electra,all_tokens_mlm"]) == 0
    out = capsys.readouterr().out
    assert "budget" in out and "all_tokens_mlm" in out and "estimated wall time" in out


@pytest.mark.subprocess
def test_outputs_and_logs_on_a_remote_filesystem(monkeypatch):
    """--out_dir on a bucket: markers, results.json, report.md, the plot and the job logs
    go through TensorFlow's filesystem layer (ram:// here, as gs:// would)."""
    import sys
    import uuid

    import tensorflow as tf
    out = f"ram://experiments_{uuid.uuid4().hex}"
    try:
        small = cm.plan_variants("tiny", ["electra"], "electra", 20, [1.0])
        args = cm.parse_args(["--variants=electra", "--reference_steps=20", "--points=1",
                              f"--out_dir={out}"])
        v = small["variants"]["electra"]
        write_marker(cm.pretrain_dir(out, "electra"), {
            "steps": v.steps, "overrides": v.overrides, "config": "tiny", "seconds": 9.0,
            "eval_results": {"disc_auc": 0.625}})
        write_marker(cm.finetune_dir(out, "electra", v.steps), {
            "task": "polarity", "seeds": 3, "seed": 1, "checkpoint_step": v.steps,
            "max_seq_length": 64, "epochs": None, "metric": "accuracy",
            "scores": [0.5, 0.75, 0.7], "median": 0.7})
        write_marker(cm.finetune_dir(out, cm.BASELINE, 0), {
            "task": "polarity", "seeds": 3, "seed": 1, "checkpoint_step": 0,
            "max_seq_length": 64, "epochs": None, "metric": "accuracy",
            "scores": [0.5, 0.5, 0.5], "median": 0.5})
        with tf.io.gfile.GFile(f"{out}/{cm.INTERPRETATION_FILE}", "w") as f:
            f.write("Noise at this scale.\n")
        monkeypatch.setattr(cm, "run_logged", lambda *a: pytest.fail("reran a done job"))
        assert cm.run_experiment(args, small) == {}
        cm.write_outputs(args, small, "python x", {})
        saved = json.loads(tf.io.gfile.GFile(f"{out}/results.json").read())
        assert saved["variants"]["electra"]["points"][0]["scores"] == [0.5, 0.75, 0.7]
        report = tf.io.gfile.GFile(f"{out}/report.md").read()
        assert "| disc_auc | 0.6250 |" in report and "| electra | 0.7000 |" in report
        assert report.endswith("Noise at this scale.\n")
        names = set(tf.io.gfile.listdir(out))
        assert {"results.json", "report.md", "pretrain", "finetune"} <= \
            {n.rstrip("/") for n in names}
        assert not [n for n in names if n.endswith(".tmp")]
        if "matplotlib" in sys.modules or importlib.util.find_spec("matplotlib"):
            png = tf.io.gfile.GFile(f"{out}/score_vs_flops.png", "rb").read()
            assert png.startswith(b"\x89PNG") and len(png) > 1000
        # A job's output is appended to its log there, and its last error line found.
        monkeypatch.undo()
        log = f"{out}/logs/job.log"
        code = "import sys; print('step 1'); print('error: boom', file=sys.stderr); sys.exit(3)"
        assert cm.run_logged([sys.executable, "-u", "-c", code], log) == 3
        assert cm.run_logged([sys.executable, "-c", "print('again')"], log) == 0
        text = tf.io.gfile.GFile(log).read()
        assert text.count("\n$ ") == 2 and "step 1\nerror: boom\n" in text
        assert text.endswith("again\n")
        assert cm.last_error(log) == "error: boom"
        assert cm.last_error(f"{out}/logs/missing.log") == ""
    finally:
        if tf.io.gfile.exists(out):
            tf.io.gfile.rmtree(out)


def test_intrinsic_draws_once_and_judges_every_finished_run(tmp_path, monkeypatch):
    """The intrinsic phase with a stand-in for experiments/fixed_corruptions.py: the
    corruptions are drawn once from the judge into OUT/intrinsic/ (made if missing),
    every finished variant and the untrained baseline are judged once, a rerun judges
    nothing again, and the report shows the table."""
    small = cm.plan_variants("tiny", ["electra", "electra_seed2"], "electra", 20, [1.0])
    out = str(tmp_path / "exp")
    args = cm.parse_args(["--variants=electra,electra_seed2", "--reference_steps=20",
                          "--points=1", f"--out_dir={out}", "--eval_data=held_out",
                          "--no-baseline"])
    assert args.judge == "electra_seed2"
    for v in small["variants"].values():
        write_marker(cm.pretrain_dir(out, v.name), {
            "steps": v.steps, "overrides": v.overrides, "config": "tiny", "seconds": 1.0,
            "eval_results": {}})
    calls = []

    class Fake:
        @staticmethod
        def draw(judge_dir, eval_data, path, num_batches=None):
            calls.append(("draw", judge_dir, eval_data, num_batches))
            fileio.write_atomic(path, b"arrays")
            return {"tokens": 100, "replaced_share": 0.9}

        @staticmethod
        def judge(path, model_dir=None, config=None, checkpoint=None):
            calls.append(("judge", model_dir, config, checkpoint))
            return {"score_kind": "discriminator", "auc": 0.5 if config else 0.6}

    monkeypatch.setattr(cm, "_fixed_corruptions", lambda: Fake)
    failures = {}
    cm.intrinsic(args, small, failures)
    assert failures == {}
    assert calls[0] == ("draw", cm.pretrain_dir(out, "electra_seed2"), "held_out", None)
    judged = [(c[1], c[2], c[3]) for c in calls[1:]]
    assert judged == [(cm.pretrain_dir(out, "electra"), None,
                       fileio.join(cm.pretrain_dir(out, "electra"), "ckpt-20")),
                      (cm.pretrain_dir(out, "electra_seed2"), None,
                       fileio.join(cm.pretrain_dir(out, "electra_seed2"), "ckpt-20")),
                      (None, "tiny", None)]
    calls.clear()
    cm.intrinsic(args, small, failures)  # all done: nothing drawn or judged again
    assert calls == [] and failures == {}
    results = cm.collect_results(out, small)
    assert results["judge"] == "electra_seed2" and results["corruptions"]["tokens"] == 100
    assert list(results["intrinsic"]) == ["electra", "electra_seed2", cm.BASELINE]
    text = cm.render_report(results, "python x", "a machine")
    assert "| electra_seed2 (judge: its own generator) | discriminator | 0.6000 |" in text
    assert f"| {cm.BASELINE} | discriminator | 0.5000 |" in text
