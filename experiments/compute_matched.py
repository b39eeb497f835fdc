"""Pre-training objectives compared at equal training FLOPs (issue 7; the ELECTRA paper's
Figure 3 right and Table 4 at a scale this machine can run).

Every variant (`VARIANTS`: a name -> config overrides) pre-trains for the number of steps
whose train FLOPs (`electra_tf.pretraining.flops`, the paper's convention by default) match a budget:
the reference variant's FLOPs at --reference_steps. Checkpoints at the --points fractions
of that budget are fine-tuned with --seeds seeds each; report.md, results.json and
score_vs_flops.png in --out_dir hold the numbers, the pre-training diagnostics
(eval_results.json of each run) and the plot.

Pre-training and fine-tuning run as subprocesses of the repository's CLIs
(run_pretraining.py, run_finetuning.py). A rerun of the same command skips every job
whose done marker exists, so a killed experiment goes on where it stopped (an
interrupted pre-training resumes from its last checkpoint).

    python experiments/compute_matched.py                      # all variants, tiny preset
    python experiments/compute_matched.py --variants=electra,bert_mlm --dry_run
"""

import argparse
import collections
import dataclasses
import io
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # local: the repo
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import electra_tf  # noqa: E402,F401  (first: the version check; no TPU runtime load without chips)
import tensorflow as tf  # noqa: E402

from electra_tf import configs, fileio
from electra_tf.pretraining import flops  # noqa: E402

# name -> config overrides of the variant (on top of --config and --params_override).
VARIANTS = collections.OrderedDict([
    ("electra", {}),
    # BERT: MLM on the discriminator-sized encoder, 80% [MASK] / 10% random / 10% kept.
    ("bert_mlm", {"objective.objective": "mlm", "objective.mask_token_prob": "0.8",
                  "objective.random_token_prob": "0.1"}),
    ("electra_15", {"objective.objective": "electra_15"}),
    ("replace_mlm", {"objective.objective": "replace_mlm"}),
    ("all_tokens_mlm", {"objective.objective": "all_tokens_mlm"}),
    # Generator and discriminator of one size; the discriminator starts from the
    # generator at the switch (half of the run), so the embeddings are not shared.
    ("two_stage", {"objective.objective": "two_stage", "model.generator_hidden_size": "1.0",
                   "model.tie_embeddings": "false"}),
    ("adversarial", {"objective.objective": "adversarial"}),
    ("hp_loss_focal", {"objective.objective": "hp_loss",
                       "objective.gen_focal_gamma": "piecewise"}),
    ("hp_dist", {"objective.objective": "hp_dist"}),
    # ELECTRIC: NCE energies, two-tower cloze generator (its configs set it).
    ("electric", {"objective.objective": "electric"}),
    # DeBERTaV3's gradient-disentangled embedding sharing.
    ("gdes", {"model.tie_embeddings": "true", "model.disentangled_embeddings": "true"}),
    # Fast-ELECTRA: the electra run's final generator, fixed (forward only), sampled at a
    # temperature that falls from 2 to 1 over the run. Its generator's own training is
    # not charged to it (the paper's premise: an existing model).
    ("fast_electra", {"objective.generator": "fixed",
                      "objective.generator_checkpoint": "@electra",
                      "objective.temperature_schedule": "exponential:2"}),
    # ELECTRA again with another pre-training seed: the pre-training seed spread, and the
    # default judge whose generator draws the fixed held-out corruptions.
    ("electra_seed2", {"train.seed": "2"}),
])
# An override value "@VARIANT" is that variant's pre-training run directory in this
# experiment (`resolve_runs`); the variant must run before the one that reads it.
RUN_REF = "@"
# The fine-tuning row without pre-training (random initialisation, the preset's sizes).
BASELINE = "no_pretraining"
DEFAULT_JUDGE = "electra_seed2"

# Defaults sized for a quick look (the committed report's command sets its own budget;
# experiments/README.md has the timings).
DEFAULT_REFERENCE_STEPS = 80
DEFAULT_POINTS = "0.5,1"
DEFAULT_SEEDS = 3
DEFAULT_FINETUNE_MAX_SEQ_LENGTH = 64
# A-priori costs (seconds, the smoke run's) for the ETA before any job has finished; the
# ETA then scales them by the measured / predicted time of the jobs done.
PRETRAIN_FIXED_S = 85.0  # start, compilation, discriminator export, evaluation
ELECTRA_STEP_S = 0.75  # one tiny electra step (batch 32 x 128); others by hardware FLOPs
FINETUNE_FIXED_S = 11.0
FINETUNE_TRIAL_S = 10.0

DONE = "DONE.json"
# On a bucket every flush of a log re-uploads it: flush it this often (seconds) there.
REMOTE_LOG_FLUSH_S = 30.0
# What reading a file that is missing, unreadable or torn raises.
_READ_ERRORS = (OSError, tf.errors.OpError, UnicodeDecodeError, json.JSONDecodeError)


class ExperimentError(Exception):
    """A bad flag or a failed step; the message is one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise ExperimentError(message)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = _Parser(prog="compute_matched.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="tiny", help="Preset or JSON config (default tiny).")
    p.add_argument("--params_override", default="", help="key=value,... applied to every "
                   "variant (sizes, batch, length: the FLOP planning sees them).")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"Comma-separated, of: {', '.join(VARIANTS)} (default: all).")
    p.add_argument("--reference", default="electra", help="The variant whose FLOPs at "
                   "--reference_steps are the budget.")
    p.add_argument("--reference_steps", type=int, default=DEFAULT_REFERENCE_STEPS)
    p.add_argument("--points", default=DEFAULT_POINTS, help="Fractions of the budget "
                   "whose checkpoints are fine-tuned, e.g. 0.25,0.5,1.")
    p.add_argument("--seeds", type=int, default=DEFAULT_SEEDS,
                   help="Fine-tuning seeds per point (--seed .. --seed + N - 1).")
    p.add_argument("--seed", type=int, default=1, help="First fine-tuning seed.")
    p.add_argument("--convention", default="paper", choices=sorted(flops.CONVENTIONS),
                   help="FLOP convention of the matching (paper: Appendix E).")
    p.add_argument("--warmup_fraction", type=float, default=0.1, help="Each run warms "
                   "its learning rate up over this share of its steps (negative: keep the "
                   "config's optimizer.warmup_steps).")
    p.add_argument("--train_data", default=None, help="Pre-training TFRecords (default: "
                   "the bundled Wikipedia sample).")
    p.add_argument("--eval_data", default=None, help="Held-out TFRecords for the "
                   "diagnostics (default: the bundled sample's held-out shard).")
    p.add_argument("--task", default="polarity", help="Fine-tuning task (run_finetuning.py "
                   "--task; default the bundled polarity set).")
    p.add_argument("--data_dir", default=os.path.join(REPO, "data"),
                   help="Fine-tuning --data_dir.")
    p.add_argument("--finetune_max_seq_length", type=int,
                   default=DEFAULT_FINETUNE_MAX_SEQ_LENGTH)
    p.add_argument("--finetune_epochs", type=float, default=None,
                   help="Fine-tuning epochs (default: the task's).")
    p.add_argument("--jit_compile", default="false", choices=["true", "false", "auto"],
                   help="XLA for both CLIs (false: on a CPU compilation costs more than "
                   "it saves in runs this short).")
    p.add_argument("--extra_pretrain_flags", default="", help="Passed to run_pretraining.py "
                   "as they are (not seen by the FLOP planning).")
    p.add_argument("--extra_finetune_flags", default="", help="Passed to run_finetuning.py.")
    p.add_argument("--name", default=None, help="Experiment name (default "
                   "compute_matched_<config>).")
    p.add_argument("--out_dir", default=None, help="Default experiments/results/<name>.")
    p.add_argument("--baseline", default=True, action=argparse.BooleanOptionalAction,
                   help=f"Fine-tune a randomly initialised model of the preset's size too "
                   f"(the '{BASELINE}' row; default on).")
    p.add_argument("--judge", default=None, help="The variant whose final generator draws "
                   "the fixed held-out corruptions every discriminator is judged on "
                   f"(default {DEFAULT_JUDGE} when it is among --variants; 'none': skip).")
    p.add_argument("--judge_batches", type=int, default=0, help="Held-out batches (of 32) "
                   "of fixed corruptions; 0 (default): one pass over the held-out data.")
    p.add_argument("--dry_run", action="store_true", help="Print the plan and exit.")
    p.add_argument("--report_only", action="store_true",
                   help="Write the report from the results so far, run nothing.")
    args = p.parse_args(list(argv))
    args.variant_list = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in args.variant_list if v not in VARIANTS]
    if unknown or not args.variant_list:
        raise ExperimentError(f"--variants: unknown {', '.join(unknown) or '(none given)'}; "
                              f"choose from {', '.join(VARIANTS)}")
    if args.reference not in VARIANTS:
        raise ExperimentError(f"--reference={args.reference}: not one of "
                              f"{', '.join(VARIANTS)}")
    if args.reference_steps < 2:
        raise ExperimentError(f"--reference_steps={args.reference_steps} must be >= 2")
    for i, name in enumerate(args.variant_list):
        for value in VARIANTS[name].values():
            if value.startswith(RUN_REF) and value[1:] not in args.variant_list[:i]:
                raise ExperimentError(f"--variants: {name} reads the run of {value[1:]}: "
                                      f"list {value[1:]} before it")
    if args.judge is None:
        args.judge = DEFAULT_JUDGE if DEFAULT_JUDGE in args.variant_list else "none"
    if args.judge != "none" and args.judge not in args.variant_list:
        raise ExperimentError(f"--judge={args.judge}: not among --variants")
    if args.judge_batches == 1 or args.judge_batches < 0:
        raise ExperimentError(f"--judge_batches={args.judge_batches}: 0 (all) or >= 2 "
                              "(half fits the threshold, half is scored)")
    args.point_list = parse_points(args.points)
    if args.seeds < 1:
        raise ExperimentError(f"--seeds={args.seeds} must be >= 1")
    if args.finetune_max_seq_length < 8:
        raise ExperimentError(f"--finetune_max_seq_length={args.finetune_max_seq_length} "
                              "must be >= 8")
    for flag in ("extra_pretrain_flags", "extra_finetune_flags"):
        try:
            shlex.split(getattr(args, flag))
        except ValueError as e:
            raise ExperimentError(f"--{flag}: {e}") from None
    args.name = args.name or f"compute_matched_{os.path.basename(args.config).split('.')[0]}"
    args.out_dir = args.out_dir or os.path.join(REPO, "experiments", "results", args.name)
    return args


def parse_points(text: str) -> List[float]:
    try:
        points = sorted({float(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ExperimentError(f"--points={text!r}: expected fractions such as 0.5,1") from None
    if not points or points[0] <= 0 or points[-1] > 1:
        raise ExperimentError(f"--points={text!r}: fractions in (0, 1] expected")
    return points


# --- planning --------------------------------------------------------------------------

@dataclasses.dataclass
class Point:
    fraction: float  # of the budget
    step: int  # the checkpoint fine-tuned
    flops: float  # train FLOPs spent up to it


@dataclasses.dataclass
class VariantPlan:
    name: str
    overrides: Dict[str, str]  # the config overrides of the run (variant + common + steps)
    steps: int
    flops_per_step: float  # the run's average (convention of the plan)
    flops: float  # of the whole run
    hardware_flops_per_step: float
    save_every: int  # checkpoint interval: every point is a saved step
    keep: int  # checkpoints kept (all of them)
    points: List[Point]
    switch_step: Optional[int] = None  # two_stage


def variant_config(preset: str, variant: str, common: Dict[str, str], steps: int):
    overrides = dict(VARIANTS[variant])
    overrides.update(common)
    overrides["train.num_train_steps"] = str(steps)
    try:
        return configs.load_config(preset, overrides)
    except configs.ConfigError as e:
        raise ExperimentError(f"variant {variant}: {e}") from None


def train_flops(cfg, convention=flops.PAPER) -> float:
    """Train FLOPs of the whole run `cfg` describes."""
    return flops.count_config(cfg, convention).train_per_run()["total"]


def with_train_steps(cfg, steps: int):
    """`cfg` with `steps` train steps; an explicit two_stage switch step moves with the
    run so that it stays at the same fraction of it (0, half of the run, stays 0)."""
    steps = int(steps)
    objective = cfg.objective
    if objective.objective == "two_stage" and objective.two_stage_switch_step:
        fraction = objective.switch_step(cfg.train.num_train_steps) / cfg.train.num_train_steps
        switch = min(max(int(round(fraction * steps)), 1), max(steps - 1, 1))
        objective = dataclasses.replace(objective, two_stage_switch_step=switch)
    return dataclasses.replace(cfg, objective=objective,
                               train=dataclasses.replace(cfg.train, num_train_steps=steps))


def steps_for_budget(cfg, budget: float, convention=flops.PAPER) -> int:
    """The number of train steps whose run (`with_train_steps`) costs nearest to `budget`
    train FLOPs: at least 1 (2 for two_stage, which needs both stages)."""
    if not budget > 0:
        raise ValueError(f"a FLOP budget must be > 0, not {budget}")
    least = 2 if cfg.objective.objective == "two_stage" else 1
    guess = budget / flops.count_config(cfg, convention).train_per_step()["total"]
    candidates = range(max(least, int(math.floor(guess)) - 2),
                       max(least, int(math.ceil(guess)) + 3))
    return min(candidates, key=lambda n: (
        abs(train_flops(with_train_steps(cfg, n), convention) - budget), n))


def stages(count: flops.Count) -> List[Tuple[int, float]]:
    """(steps, train FLOPs of one of its steps) of each stage of `count`'s run: its
    `phases` (two_stage), else the whole run."""
    if not count.phases:
        return [(count.num_train_steps, count.train_per_step()["total"])]
    return [(p.steps, count.train_per_step(p.name)["total"]) for p in count.phases]


def flops_at_step(count: flops.Count, step: float) -> float:
    """Train FLOPs of the run's first `step` steps (the cost of the checkpoint at
    `step`)."""
    done, spent = 0.0, 0.0
    for steps, per_step in stages(count):
        spent += min(max(step - done, 0.0), steps) * per_step
        done += steps
    return spent


def step_at_flops(count: flops.Count, target: float) -> int:
    """The step whose `flops_at_step` is nearest to `target` (within the run)."""
    if target <= 0:
        return 0
    done, spent = 0, 0.0
    for steps, per_step in stages(count):
        if per_step > 0 and spent + steps * per_step >= target:
            return done + int(round((target - spent) / per_step))
        done, spent = done + steps, spent + steps * per_step
    return count.num_train_steps


def checkpoint_steps(targets: Sequence[float], steps: int, cost, tolerance: float,
                     step_at=None, max_saves: Optional[int] = None):
    """-> (save interval g, the saved step for each target FLOPs).

    The run saves every g steps and at its last; a point takes the saved step nearest to
    its target FLOPs (`cost(step)`: FLOPs spent up to `step`; `step_at(flops)`: the step
    nearest to `flops`). Of the intervals whose points all land within `tolerance` FLOPs
    of their targets: the fewest checkpoints, then the smallest total miss; if none does
    with at most `max_saves` checkpoints (4 per point), the smallest largest miss (the
    report plots each point at the FLOPs of its real step)."""
    if step_at is None:
        def step_at(t):
            return min(range(steps + 1), key=lambda s: abs(cost(s) - t))
    near = [min(max(step_at(t), 1), steps) for t in targets]
    max_saves = max_saves or 4 * len(targets) + 1
    best = None
    for g in range(steps, 0, -1):
        saves = steps // g + (1 if steps % g else 0)
        if saves > max_saves:
            break
        chosen = []
        for t, s in zip(targets, near):
            below = max(g, s // g * g)
            candidates = {c for c in (below, below + g, steps) if 1 <= c <= steps}
            chosen.append(min(candidates, key=lambda c: (abs(cost(c) - t), c)))
        miss = [abs(cost(c) - t) for c, t in zip(chosen, targets)]
        key = ((0, saves, sum(miss)) if max(miss) <= tolerance else
               (1, max(miss), saves))
        if best is None or key < best[0]:
            best = (key, g, chosen)
    return best[1], best[2]


def resolve_runs(overrides: Dict[str, str], out_dir: Optional[str]) -> Dict[str, str]:
    """`overrides` with each "@VARIANT" value replaced by that variant's run directory
    under `out_dir` (unchanged without one: planning alone)."""
    if out_dir is None:
        return dict(overrides)
    return {k: pretrain_dir(out_dir, v[1:]) if v.startswith(RUN_REF) else v
            for k, v in overrides.items()}


def plan_variants(preset: str, variants: Sequence[str], reference: str,
                  reference_steps: int, points: Sequence[float],
                  common: Optional[Dict[str, str]] = None, convention=flops.PAPER,
                  warmup_fraction: float = 0.1, out_dir: Optional[str] = None) -> Dict:
    """The budget (the reference variant's train FLOPs at `reference_steps`) and each
    variant's steps, checkpoints and points. Pure: no training. With `out_dir`, "@VARIANT"
    values name that experiment's run directories."""
    common = dict(common or {})
    ref_cfg = variant_config(preset, reference, common, reference_steps)
    budget = train_flops(ref_cfg, convention)
    plans = collections.OrderedDict()
    for name in variants:
        cfg = variant_config(preset, name, common, reference_steps)
        steps = steps_for_budget(cfg, budget, convention)
        cfg = with_train_steps(cfg, steps)
        count = flops.count_config(cfg, convention)
        targets = [p * budget for p in points]
        # A point may miss its FLOPs by up to a step of the run's costliest stage.
        tolerance = max(0.02 * budget, max(per_step for _, per_step in stages(count)))
        g, chosen = checkpoint_steps(targets, steps, lambda s: flops_at_step(count, s),
                                     tolerance, lambda t: step_at_flops(count, t))
        overrides = resolve_runs(VARIANTS[name], out_dir)
        overrides.update(common)
        overrides["train.num_train_steps"] = str(steps)
        overrides["train.save_checkpoints_steps"] = str(g)
        keep = len(range(g, steps + 1, g)) + 1
        overrides["train.keep_checkpoint_max"] = str(keep)
        if warmup_fraction >= 0:
            overrides["optimizer.warmup_steps"] = str(max(1, int(round(warmup_fraction *
                                                                       steps))))
        switch = None
        if cfg.objective.objective == "two_stage":
            switch = cfg.objective.switch_step(steps)
            if cfg.objective.two_stage_switch_step:
                overrides["objective.two_stage_switch_step"] = str(switch)
        plans[name] = VariantPlan(
            name=name, overrides=overrides, steps=steps,
            flops_per_step=count.train_per_step()["total"],
            flops=count.train_per_run()["total"],
            hardware_flops_per_step=flops.count_config(
                cfg, flops.HARDWARE).train_per_step()["total"],
            save_every=g, keep=keep, switch_step=switch,
            points=[Point(f, s, flops_at_step(count, s)) for f, s in zip(points, chosen)])
    return {"budget": budget, "reference": reference, "reference_steps": reference_steps,
            "convention": convention.name, "variants": plans}


def estimate_seconds(plan: Dict, seeds: int) -> Dict[str, float]:
    """A-priori wall time of each job (the smoke run's costs; steps scale with the
    hardware-convention FLOPs relative to a tiny electra step)."""
    electra_step = None
    for v in plan["variants"].values():
        if v.name == "electra":
            electra_step = v.hardware_flops_per_step
    electra_step = electra_step or 2.2244e10
    out = collections.OrderedDict()
    for v in plan["variants"].values():
        out[f"pretrain/{v.name}"] = PRETRAIN_FIXED_S + v.steps * ELECTRA_STEP_S * (
            v.hardware_flops_per_step / electra_step)
        for p in v.points:
            out[f"finetune/{v.name}/step{p.step}"] = FINETUNE_FIXED_S + seeds * FINETUNE_TRIAL_S
    out[f"finetune/{BASELINE}/step0"] = FINETUNE_FIXED_S + seeds * FINETUNE_TRIAL_S
    return out


# --- done markers ----------------------------------------------------------------------

def read_marker(directory: str) -> Optional[dict]:
    # A marker that is missing or cannot be read is no marker: the job runs again.
    return read_json(fileio.join(directory, DONE))


def check_marker(marker: Optional[dict], expected: dict, where: str) -> bool:
    """True if `marker` records the job `expected` describes; raises if it records another
    (the experiment's settings changed under the same --out_dir)."""
    if marker is None:
        return False
    for key, value in expected.items():
        if marker.get(key) != value:
            raise ExperimentError(f"{where} was done with {key}={marker.get(key)!r}, this "
                                  f"plan has {value!r}; use another --out_dir")
    return True


# --- running ---------------------------------------------------------------------------

def jit_flag(setting: str) -> List[str]:
    return {"true": ["--jit_compile"], "false": ["--nojit_compile"], "auto": []}[setting]


def pretrain_command(args, v: VariantPlan, model_dir: str) -> List[str]:
    cmd = [sys.executable, os.path.join(REPO, "run_pretraining.py"), f"--config={args.config}",
           f"--model_dir={model_dir}", "--do_eval",
           "--params_override=" + ",".join(f"{k}={val}" for k, val in v.overrides.items())]
    if args.train_data:
        cmd.append(f"--train_data={args.train_data}")
    if args.eval_data:
        cmd.append(f"--eval_data={args.eval_data}")
    return cmd + jit_flag(args.jit_compile) + shlex.split(args.extra_pretrain_flags)


def finetune_command(args, checkpoint: Optional[str], model_dir: str) -> List[str]:
    """run_finetuning.py from `checkpoint`; None: the randomly initialised baseline (the
    preset's sizes)."""
    init = [f"--init_checkpoint={checkpoint}"] if checkpoint else [
        "--init_checkpoint=none", f"--config={args.config}"]
    cmd = [sys.executable, os.path.join(REPO, "run_finetuning.py"), f"--task={args.task}",
           f"--data_dir={args.data_dir}"] + init + [
           f"--model_dir={model_dir}", f"--num_trials={args.seeds}", f"--seed={args.seed}",
           f"--max_seq_length={args.finetune_max_seq_length}"]
    if args.finetune_epochs is not None:
        cmd.append(f"--num_train_epochs={args.finetune_epochs}")
    return cmd + jit_flag(args.jit_compile) + shlex.split(args.extra_finetune_flags)


class Progress:
    """Elapsed time and an ETA: the a-priori job estimates, scaled by how the finished
    jobs' real times compare with theirs."""

    def __init__(self, estimates: Dict[str, float]):
        self.estimates = dict(estimates)
        self.start = time.monotonic()
        self.done_estimate = self.done_actual = 0.0
        self.remaining = set(estimates)

    def skip(self, job: str):
        self.remaining.discard(job)

    def finish(self, job: str, seconds: float):
        self.remaining.discard(job)
        self.done_estimate += self.estimates.get(job, 0.0)
        self.done_actual += seconds

    def eta(self) -> float:
        scale = self.done_actual / self.done_estimate if self.done_estimate else 1.0
        return scale * sum(self.estimates[j] for j in self.remaining)

    def line(self, text: str) -> str:
        return (f"[{format_seconds(time.monotonic() - self.start)} elapsed, ETA "
                f"{format_seconds(self.eta())}] {text}")


def format_seconds(s: float) -> str:
    s = int(round(max(s, 0)))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def run_logged(cmd: List[str], log_path: str) -> int:
    """Runs `cmd` in the repository, its stdout and stderr appended to `log_path` (any
    filesystem) line by line as they come; returns its exit status."""
    fileio.makedirs(os.path.dirname(log_path))
    flush_every = REMOTE_LOG_FLUSH_S if fileio.is_remote(log_path) else 0.0
    with fileio.open_file(log_path, "a") as log:
        log.write(f"\n$ {shlex.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        try:
            flushed = time.monotonic()
            for line in proc.stdout:
                log.write(line)
                if time.monotonic() - flushed >= flush_every:
                    log.flush()
                    flushed = time.monotonic()
            return proc.wait()
        except BaseException:  # as subprocess.run does: no orphaned child
            proc.kill()
            proc.wait()
            raise
        finally:
            proc.stdout.close()


def last_error(log_path: str) -> str:
    try:
        text = fileio.read_bytes(log_path).decode("utf-8", errors="replace")
    except (OSError, tf.errors.OpError):
        return ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if "error" in line.lower() and not line.startswith("$"):
            return line[-300:]
    return lines[-1][-300:] if lines else ""


def pretrain_dir(out_dir: str, variant: str) -> str:
    return fileio.join(out_dir, "pretrain", variant)


def finetune_dir(out_dir: str, variant: str, step: int) -> str:
    return fileio.join(out_dir, "finetune", variant, f"step{step}")


def run_experiment(args, plan: Dict) -> Dict[str, str]:
    """Runs the jobs not done yet; returns {job: error} for the jobs that failed."""
    progress = Progress(estimate_seconds(plan, args.seeds))
    failures = {}
    logs = fileio.join(args.out_dir, "logs")
    for v in plan["variants"].values():
        pdir = pretrain_dir(args.out_dir, v.name)
        job = f"pretrain/{v.name}"
        expected = {"steps": v.steps, "overrides": v.overrides, "config": args.config}
        if check_marker(read_marker(pdir), expected, job):
            progress.skip(job)
            print(progress.line(f"{job}: done before, skipped"), flush=True)
        else:
            print(progress.line(f"{job}: {v.steps} steps, {v.flops:.3e} FLOPs ..."),
                  flush=True)
            t0 = time.monotonic()
            log = fileio.join(logs, f"pretrain_{v.name}.log")
            rc = run_logged(pretrain_command(args, v, pdir), log)
            seconds = time.monotonic() - t0
            progress.finish(job, seconds)
            missing = [p.step for p in v.points
                       if not fileio.exists(fileio.join(pdir, f"ckpt-{p.step}.index"))]
            if rc != 0 or missing:
                why = f"exit {rc}" if rc else f"no checkpoint at steps {missing}"
                failures[job] = f"{why}: {last_error(log)} (log: {log})"
                print(progress.line(f"{job}: FAILED ({failures[job]})"), flush=True)
                for p in v.points:
                    progress.skip(f"finetune/{v.name}/step{p.step}")
                continue
            eval_results = read_json(fileio.join(pdir, "eval_results.json")) or {}
            fileio.write_json_atomic(fileio.join(pdir, DONE), dict(
                expected, seconds=seconds, eval_results=eval_results), sort_keys=True)
            print(progress.line(f"{job}: done in {format_seconds(seconds)}"), flush=True)
        for p in v.points:
            finetune_job(args, v.name, p.step, fileio.join(pdir, f"ckpt-{p.step}"),
                         progress, failures)
    if args.baseline:
        finetune_job(args, BASELINE, 0, None, progress, failures)
    if args.judge != "none":
        intrinsic(args, plan, failures)
    return failures


def finetune_job(args, name: str, step: int, checkpoint: Optional[str], progress: Progress,
                 failures: Dict[str, str]):
    """Fine-tunes `checkpoint` (None: the random-init baseline) with every seed into
    finetune_dir(name, step), unless its marker says it is done."""
    job = f"finetune/{name}/step{step}"
    fdir = finetune_dir(args.out_dir, name, step)
    expected = {"task": args.task, "seeds": args.seeds, "seed": args.seed,
                "checkpoint_step": step, "max_seq_length": args.finetune_max_seq_length,
                "epochs": args.finetune_epochs}
    if check_marker(read_marker(fdir), expected, job):
        progress.skip(job)
        print(progress.line(f"{job}: done before, skipped"), flush=True)
        return
    print(progress.line(f"{job}: {args.seeds} seed(s) ..."), flush=True)
    t0 = time.monotonic()
    log = fileio.join(args.out_dir, "logs", f"finetune_{name}_step{step}.log")
    rc = run_logged(finetune_command(args, checkpoint, fdir), log)
    seconds = time.monotonic() - t0
    progress.finish(job, seconds)
    results = read_json(fileio.join(fdir, "results.json"))
    if rc != 0 or not results:
        failures[job] = f"exit {rc}: {last_error(log)} (log: {log})"
        print(progress.line(f"{job}: FAILED ({failures[job]})"), flush=True)
        return
    fileio.write_json_atomic(fileio.join(fdir, DONE), dict(
        expected, seconds=seconds, metric=results.get("metric"),
        scores=results.get("scores"), median=results.get("median")), sort_keys=True)
    drop_trial_checkpoints(fdir)
    print(progress.line(f"{job}: median {results.get('median'):.4f} "
                        f"(seeds {', '.join(f'{s:.4f}' for s in results['scores'])}) "
                        f"in {format_seconds(seconds)}"), flush=True)


def intrinsic_dir(out_dir: str) -> str:
    return fileio.join(out_dir, "intrinsic")


def _fixed_corruptions():
    """experiments/fixed_corruptions.py (imported on use: it builds models)."""
    here = os.path.dirname(os.path.abspath(__file__))  # local: this script's folder
    if here not in sys.path:
        sys.path.insert(0, here)
    import fixed_corruptions
    return fixed_corruptions


def intrinsic(args, plan: Dict, failures: Dict[str, str]):
    """Draws the held-out corruptions once from the judge's final generator, then judges
    every variant's final discriminator (and the untrained baseline) on them:
    OUT/intrinsic/corruptions.npz and OUT/intrinsic/<variant>.json."""
    fc = _fixed_corruptions()
    idir = intrinsic_dir(args.out_dir)
    fileio.makedirs(idir)
    path = fileio.join(idir, "corruptions.npz")
    judge_dir = pretrain_dir(args.out_dir, args.judge)
    if read_marker(judge_dir) is None:
        failures["intrinsic"] = f"the judge {args.judge} has not finished pre-training"
        return
    expected = {"judge": args.judge, "batches": args.judge_batches}
    marker = read_marker(idir)
    if not check_marker(marker, expected, "intrinsic/corruptions"):
        print(f"intrinsic: drawing {args.judge_batches or 'all'} held-out batches of "
              f"corruptions from {args.judge}'s generator", flush=True)
        eval_data = args.eval_data
        if not eval_data:  # the bundled sample's held-out shard, as the runs' --do_eval
            from tfrecord_builder.sample import SAMPLE_CACHE, bundled_sample
            length = configs.load_config(args.config).train.max_seq_length
            eval_data = bundled_sample(length, os.path.join(REPO, SAMPLE_CACHE))[1]
        meta = fc.draw(judge_dir, eval_data, path, num_batches=args.judge_batches or None)
        fileio.write_json_atomic(fileio.join(idir, DONE), dict(expected, draw=meta),
                                 sort_keys=True)
    jobs = [(v.name, pretrain_dir(args.out_dir, v.name), max(v.points, key=lambda p: p.step))
            for v in plan["variants"].values()]
    for name, pdir, point in jobs + [(BASELINE, None, None)]:
        out = fileio.join(idir, f"{name}.json")
        step = point.step if point else 0
        done = read_json(out)
        if done and done.get("step") == step:
            continue
        if pdir is not None and read_marker(pdir) is None:
            continue  # its pre-training failed or has not run: reported there
        try:
            if pdir is None:
                scores = fc.judge(path, config=args.config)
            else:
                scores = fc.judge(path, model_dir=pdir,
                                  checkpoint=fileio.join(pdir, f"ckpt-{step}"))
        except Exception as e:  # noqa: BLE001  (one variant's failure stops no other)
            failures[f"intrinsic/{name}"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
            continue
        fileio.write_json_atomic(out, dict(scores, step=step), sort_keys=True)
        print(f"intrinsic/{name}: fixed-corruption AUC {scores['auc']:.4f}", flush=True)


def drop_trial_checkpoints(fdir: str):
    """Removes the fine-tuned weights of finished trials (their result.json stays): the
    experiment needs only the scores, and 54 trials of checkpoints fill a disk."""
    for root, _, files in tf.io.gfile.walk(fdir):
        if os.path.basename(root.rstrip("/")).startswith("trial_") and "result.json" in files:
            for name in files:
                if name.startswith("ckpt-") or name == "checkpoint":
                    fileio.remove(fileio.join(root, name))


def read_json(path: str):
    """The JSON in `path` (any filesystem), or None if it is missing, unreadable or torn."""
    try:
        return fileio.read_json(path)
    except _READ_ERRORS:
        return None


# --- results, report, plot -------------------------------------------------------------

def collect_results(out_dir: str, plan: Dict) -> Dict:
    """Everything the markers hold, by variant: the plan, the pre-training diagnostics and
    each point's fine-tuning scores (None where not done)."""
    variants = collections.OrderedDict()
    for v in plan["variants"].values():
        marker = read_marker(pretrain_dir(out_dir, v.name)) or {}
        points = []
        for p in v.points:
            fm = read_marker(finetune_dir(out_dir, v.name, p.step)) or {}
            points.append({"fraction": p.fraction, "step": p.step, "flops": p.flops,
                           "scores": fm.get("scores"), "median": fm.get("median"),
                           "metric": fm.get("metric"), "seconds": fm.get("seconds")})
        variants[v.name] = {
            "overrides": VARIANTS[v.name], "run_overrides": v.overrides, "steps": v.steps,
            "switch_step": v.switch_step, "flops_per_step": v.flops_per_step,
            "flops": v.flops, "hardware_flops_per_step": v.hardware_flops_per_step,
            "pretrain_seconds": marker.get("seconds"),
            "eval_results": marker.get("eval_results"), "points": points}
    baseline = read_marker(finetune_dir(out_dir, BASELINE, 0)) or {}
    intrinsic_results = collections.OrderedDict()
    for name in list(variants) + [BASELINE]:
        found = read_json(fileio.join(intrinsic_dir(out_dir), f"{name}.json"))
        if found:
            intrinsic_results[name] = found
    corruptions = read_marker(intrinsic_dir(out_dir)) or {}
    return {"budget": plan["budget"], "reference": plan["reference"],
            "reference_steps": plan["reference_steps"], "convention": plan["convention"],
            "variants": variants,
            "baseline": {"scores": baseline.get("scores"), "metric": baseline.get("metric"),
                         "seconds": baseline.get("seconds")},
            "judge": corruptions.get("judge"), "corruptions": corruptions.get("draw"),
            "intrinsic": intrinsic_results}


def interval(scores: Optional[Sequence[float]], level: float = 0.95
             ) -> Tuple[Optional[float], Optional[float]]:
    """(mean, half-width of the Student-t interval at `level`) over seeds; the half-width
    is None for fewer than two scores."""
    if not scores:
        return None, None
    mean = statistics.fmean(scores)
    if len(scores) < 2:
        return mean, None
    from scipy import stats
    t = stats.t.ppf(0.5 + level / 2, len(scores) - 1)
    return mean, float(t * statistics.stdev(scores) / math.sqrt(len(scores)))


def separation(scores: Sequence[float], baseline: Sequence[float]) -> str:
    """How `scores` stand against the baseline's: "above"/"below" when every seed of one
    beats every seed of the other (beyond the seed spread), else "within spread"."""
    if not scores or not baseline:
        return "—"
    if min(scores) > max(baseline):
        return "above"
    if max(scores) < min(baseline):
        return "below"
    return "within spread"


def machine() -> str:
    model, cores = "unknown CPU", 0
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:  # local: /proc
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    cores += 1
    except OSError:
        pass
    return f"{model}, {cores or os.cpu_count()} core(s)"


def _fmt(x, spec=".4f") -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        return format(x, spec)
    return str(x)


INTERPRETATION_FILE = "interpretation.md"  # beside report.md: the human reading of it


def render_report(results: Dict, command: str, machine_line: str,
                  failures: Optional[Dict[str, str]] = None,
                  interpretation: Optional[str] = None) -> str:
    """report.md from `collect_results`'s dict (pure, for the tests); `interpretation`
    (the text of OUT/interpretation.md) becomes the last section."""
    v_all = results["variants"]
    metric = next((p["metric"] for v in v_all.values() for p in v["points"] if p["metric"]),
                  "score")
    lines = ["# Pre-training objectives at equal training FLOPs", "",
             f"Command: `{command}`", "", f"Machine: {machine_line}", "",
             f"Budget: **{results['budget']:.4e}** train FLOPs ({results['convention']} "
             f"convention) = `{results['reference']}` at {results['reference_steps']} "
             "steps. Each variant trains for the steps whose FLOPs match it "
             "(`steps_for_budget` in experiments/compute_matched.py).", "",
             "## Runs", "",
             "| variant | overrides | steps | FLOPs / step | run FLOPs | / budget | "
             "hw FLOPs / step | fine-tuned checkpoints (step: FLOPs) | pre-train time |",
             "|---|---|---:|---:|---:|---:|---:|---|---:|"]
    for name, v in v_all.items():
        overrides = ", ".join(f"{k.split('.')[-1]}={val}" for k, val in v["overrides"].items())
        if v["switch_step"] is not None:
            overrides += f" (switch at step {v['switch_step']})"
        pts = "; ".join(f"{p['step']}: {p['flops']:.3e}" for p in v["points"])
        secs = v["pretrain_seconds"]
        lines.append(f"| {name} | {overrides or '—'} | {v['steps']} | "
                     f"{v['flops_per_step']:.3e} | {v['flops']:.3e} | "
                     f"{v['flops'] / results['budget']:.3f} | "
                     f"{v['hardware_flops_per_step']:.3e} | {pts} | "
                     f"{format_seconds(secs) if secs is not None else '—'} |")
    fractions = sorted({p["fraction"] for v in v_all.values() for p in v["points"]})
    lines += ["", f"## Downstream dev {metric} (median over seeds)", "",
              "| variant | " + " | ".join(f"{f:g} of budget" for f in fractions) + " |",
              "|---|" + "---:|" * len(fractions)]
    for name, v in v_all.items():
        by_f = {p["fraction"]: p for p in v["points"]}
        lines.append(f"| {name} | " + " | ".join(
            _fmt(by_f[f]["median"]) if f in by_f else "—" for f in fractions) + " |")
    base = (results.get("baseline") or {}).get("scores")
    if base:
        lines.append(f"| {BASELINE} (0 FLOPs) | " + " | ".join(
            _fmt(statistics.median(base)) for _ in fractions) + " |")
    lines += ["", "## Seeds and intervals at the full budget", "",
              f"Mean over the fine-tuning seeds with its 95% Student-t interval; the last "
              f"column says whether every seed lies above (or below) every seed of "
              f"`{BASELINE}` (a randomly initialised model of the same size, fine-tuned "
              "the same way), i.e. a difference larger than the seed spread.", "",
              "| variant | step | mean | 95% interval | min | max | mean − "
              f"{BASELINE} | vs {BASELINE} |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    base_mean, base_half = interval(base)
    rows = ([(f"{BASELINE}", 0, base)] if base else []) + [
        (name, max(v["points"], key=lambda p: p["step"])["step"],
         max(v["points"], key=lambda p: p["step"])["scores"]) for name, v in v_all.items()]
    for name, step, scores in rows:
        mean, half = interval(scores)
        diff = (mean - base_mean) if mean is not None and base_mean is not None else None
        lines.append(f"| {name} | {step} | {_fmt(mean)} | "
                     f"{'± ' + _fmt(half) if half is not None else '—'} | "
                     f"{_fmt(min(scores)) if scores else '—'} | "
                     f"{_fmt(max(scores)) if scores else '—'} | "
                     f"{_fmt(diff, '+.4f') if diff is not None and name != BASELINE else '—'} | "
                     f"{separation(scores, base) if name != BASELINE else '—'} |")
    judged = results.get("intrinsic") or {}
    if judged:
        meta = results.get("corruptions") or {}
        lines += ["", "## Discriminators on fixed held-out corruptions", "",
                  f"Every variant's final discriminator judged on the same corruptions of "
                  f"the held-out shard, drawn once from the final generator of "
                  f"`{results.get('judge')}` (15% of the tokens masked as in ELECTRA, "
                  f"replacements sampled at temperature 1; "
                  f"{meta.get('tokens', '—')} scored tokens, "
                  f"{_fmt(meta.get('replaced_share'))} of the masked slots replaced), so "
                  "no variant is measured "
                  "against its own generator (the judge's own row excepted). Score: the "
                  "discriminator's P(replaced); ELECTRIC's energy; for the masked-LM "
                  "objectives 1 − P_MLM(observed token) from the unmasked input. AUC over "
                  "all scored tokens and over the masked positions only (replaced against "
                  "sampled-original); 'fitted accuracy': the threshold that is best on half "
                  "of the batches, applied to the other half (comparable across score "
                  "kinds; the majority class gives the last column).", "",
                  "| variant | score | AUC | AUC at masked positions | own accuracy | "
                  "fitted accuracy | majority |", "|---|---|---:|---:|---:|---:|---:|"]
        for name, r in judged.items():
            label = f"{name} (judge: its own generator)" if name == results.get("judge") \
                else name
            lines.append(f"| {label} | {r.get('score_kind', '—')} | {_fmt(r.get('auc'))} | "
                         f"{_fmt(r.get('replaced_auc_at_masked'))} | "
                         f"{_fmt(r.get('accuracy'))} | {_fmt(r.get('fitted_accuracy'))} | "
                         f"{_fmt(r.get('majority_accuracy'))} |")
    lines += ["", "All seeds:", "", "| variant | budget fraction | step | FLOPs | median | "
              "min | max | seeds |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for name, v in v_all.items():
        for p in v["points"]:
            s = p["scores"]
            stage = ""
            if v["switch_step"] is not None:
                stage = (" (generator stage)" if p["step"] <= v["switch_step"] else
                         " (discriminator stage)")
            lines.append(f"| {name} | {p['fraction']:g}{stage} | {p['step']} | "
                         f"{p['flops']:.3e} | {_fmt(p['median'])} | "
                         f"{_fmt(min(s)) if s else '—'} | {_fmt(max(s)) if s else '—'} | "
                         f"{', '.join(_fmt(x) for x in s) if s else 'not run'} |")
    keys = []
    for v in v_all.values():
        for k in (v["eval_results"] or {}):
            if k not in keys:
                keys.append(k)
    lines += ["", "## Pre-training diagnostics", "",
              "Held-out metrics of each run's last step (`run_pretraining.py --do_eval`, "
              "eval_results.json).", ""]
    if keys:
        lines += ["| metric | " + " | ".join(v_all) + " |",
                  "|---|" + "---:|" * len(v_all)]
        for k in keys:
            lines.append(f"| {k} | " + " | ".join(
                _fmt((v["eval_results"] or {}).get(k)) for v in v_all.values()) + " |")
    else:
        lines.append("No eval_results.json yet.")
    if failures:
        lines += ["", "## Failed jobs", ""] + [f"- `{job}`: {why}"
                                                for job, why in failures.items()]
    lines += ["", "Plot: `score_vs_flops.png` (left: median over seeds, bars from the lowest "
              f"to the highest seed, the band {BASELINE}'s range; right: the fixed-"
              "corruption AUC). All numbers: `results.json`.", "",
              "## What this scale can and cannot show", "",
              interpretation.strip() if interpretation else
              f"(Not written yet: put the reading of these numbers in {INTERPRETATION_FILE} "
              "beside this report and rerun with --report_only.)", ""]
    return "\n".join(lines)


def pyplot(who: str):
    """matplotlib's pyplot on the Agg backend, or None (with a one-line note) without it."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"{who}: matplotlib is missing (pip install -e .[experiments]); no plot",
              file=sys.stderr)
        return None
    return plt


def save_png(plt, fig, path: str, dpi: int = 120):
    """`fig` as a PNG at `path` (any filesystem), then closed."""
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=dpi)
    plt.close(fig)
    fileio.write_atomic(path, png.getvalue())


def plot(results: Dict, path: str) -> bool:
    """score_vs_flops.png at `path` (any filesystem): one line per variant through its
    fine-tuned checkpoints."""
    plt = pyplot("compute_matched")
    if plt is None:
        return False
    judged = results.get("intrinsic") or {}
    fig, axes = plt.subplots(1, 2 if judged else 1, figsize=(12 if judged else 7, 4.5),
                             squeeze=False)
    ax = axes[0][0]
    metric = "score"
    # One point per run (--points=1): the variants side by side, not along FLOPs (all
    # within 0.1% of the budget).
    single = all(len(v["points"]) == 1 for v in results["variants"].values())
    ran = [n for n, v in results["variants"].items() if any(p["scores"] for p in v["points"])]
    for name, v in results["variants"].items():
        pts = [p for p in v["points"] if p["scores"]]
        if not pts:
            continue
        metric = pts[0]["metric"] or metric
        xs = [ran.index(name)] if single else [p["flops"] for p in pts]
        med = [statistics.median(p["scores"]) for p in pts]
        err = [[m - min(p["scores"]) for m, p in zip(med, pts)],
               [max(p["scores"]) - m for m, p in zip(med, pts)]]
        ax.errorbar(xs, med, yerr=err, marker="o", capsize=3, label=name)
    base = (results.get("baseline") or {}).get("scores")
    if base:
        ax.axhspan(min(base), max(base), color="black", alpha=0.12,
                   label=f"{BASELINE} (seed range)")
        ax.axhline(statistics.median(base), color="black", linewidth=1)
    if single:
        ax.set_xticks(range(len(ran)))
        ax.set_xticklabels(ran, rotation=45, ha="right", fontsize=8)
        ax.set_xlabel(f"variant (each {results['budget']:.2e} pre-train FLOPs, "
                      f"{results['convention']} convention)")
    else:
        ax.axvline(results["budget"], color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel(f"pre-train FLOPs ({results['convention']} convention)")
    ax.set_ylabel(f"dev {metric} (median, min-max over seeds)")
    if single:  # the variants are the tick labels
        ax.set_title("Pre-training objectives at equal compute"
                     + (f"\n(grey band and line: {BASELINE}, its seed range and median)"
                        if base else ""), fontsize=10)
    else:
        ax.set_title("Pre-training objectives at equal compute")
        ax.legend(fontsize=7, ncol=2)
    if judged:
        ax = axes[0][1]
        names = list(judged)
        ax.barh(range(len(names)), [judged[n]["auc"] for n in names], color="tab:blue",
                label="all tokens")
        ax.scatter([judged[n].get("replaced_auc_at_masked") or float("nan") for n in names],
                   range(len(names)), color="tab:orange", zorder=3, label="masked positions")
        ax.axvline(0.5, color="grey", linestyle=":", linewidth=1)
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels(names, fontsize=8)
        ax.invert_yaxis()
        shown = [v for n in names for v in (judged[n]["auc"],
                                              judged[n].get("replaced_auc_at_masked"))
                 if v is not None and v == v]
        ax.set_xlim(min([0.3] + [v - 0.05 for v in shown]), 1.0)  # every point in view
        ax.set_xlabel(f"AUC on fixed corruptions (judge: {results.get('judge')})")
        ax.set_title("Discriminators on the same held-out corruptions")
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    save_png(plt, fig, path)
    return True


def write_outputs(args, plan: Dict, command: str, failures: Dict[str, str]) -> Dict:
    results = collect_results(args.out_dir, plan)
    results["command"] = command
    results["machine"] = machine()
    results["failures"] = failures
    fileio.write_json_atomic(fileio.join(args.out_dir, "results.json"), results,
                             sort_keys=True)
    notes = fileio.join(args.out_dir, INTERPRETATION_FILE)
    interpretation = fileio.read_text(notes) if fileio.exists(notes) else None
    report = render_report(results, command, results["machine"], failures, interpretation)
    fileio.write_atomic(fileio.join(args.out_dir, "report.md"), report)
    plot(results, fileio.join(args.out_dir, "score_vs_flops.png"))
    return results


def print_plan(plan: Dict, seeds: int):
    print(f"budget {plan['budget']:.4e} train FLOPs ({plan['convention']}): "
          f"{plan['reference']} x {plan['reference_steps']} steps")
    for v in plan["variants"].values():
        pts = ", ".join(f"{p.fraction:g}->step {p.step}" for p in v.points)
        print(f"  {v.name:<15} {v.steps:>6} steps  {v.flops_per_step:.3e} FLOPs/step  "
              f"run {v.flops:.3e}  save every {v.save_every}  points {pts}")
    est = sum(estimate_seconds(plan, seeds).values())
    print(f"estimated wall time (smoke-run costs of a shared 2-core CPU): "
          f"{format_seconds(est)}")


def main(argv: Sequence[str]) -> int:
    try:
        args = parse_args(argv)
        try:
            common = configs.parse_overrides(args.params_override)
        except configs.ConfigError as e:
            raise ExperimentError(str(e)) from None
        plan = plan_variants(args.config, args.variant_list, args.reference, args.reference_steps,
                             args.point_list, common, flops.CONVENTIONS[args.convention],
                             args.warmup_fraction, out_dir=args.out_dir)
    except ExperimentError as e:
        print(f"compute_matched: error: {e}", file=sys.stderr)
        return 1
    command = shlex.join([os.path.relpath(os.path.abspath(__file__), REPO)] +  # local: this script
                         [a for a in argv if a != "--report_only"])
    command = "python " + command
    print_plan(plan, args.seeds)
    if args.dry_run:
        return 0
    fileio.makedirs(args.out_dir)
    failures: Dict[str, str] = {}
    if not args.report_only:
        try:
            failures = run_experiment(args, plan)
        except ExperimentError as e:
            print(f"compute_matched: error: {e}", file=sys.stderr)
            return 1
    write_outputs(args, plan, command, failures)
    print(f"report: {fileio.join(args.out_dir, 'report.md')}")
    if failures:
        print(f"compute_matched: {len(failures)} job(s) failed: {', '.join(failures)}; "
              "rerun the same command to retry them", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
