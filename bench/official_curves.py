"""Pre-training curves of the official ELECTRA trainer and of ours, side by side (issue 19).

Runs google-research/electra's `run_pretraining.py` (TF1 Estimator code, from the folder
--official_dir; nothing of it is copied into this repository) and our
`run_pretraining.py` on the same TFRecords with the same sizes, several seeds each, then
evaluates every side's checkpoints on held-out data and writes, in --out_dir:

  curves.json  per side and seed: the total loss of every step, seconds per step, and
               the held-out metrics at each evaluated checkpoint;
  table.md     window means of the total loss (mean +- sd over seeds, per side, and each
               of our sides - official), the held-out metrics per checkpoint, timings,
               the command, the versions and the official hyper-parameters;
  curves.png   the loss per step (smoothed; each seed thin, the mean thick) and the
               held-out MLM and discriminator losses per checkpoint.

    python bench/official_curves.py --official_dir=/path/to/electra \\
        --official_python=/path/to/tf2.15-venv/bin/python          # tiny, 600 steps, 3 seeds
    python bench/official_curves.py ... --steps=10 --seeds=1 --batch_size=8   # smoke run
    python bench/official_curves.py ... --sides=ours_official_masking  # the third side
    python bench/official_curves.py --report_only                  # tables from what ran

Sides (--sides, default official,ours): `official`; `ours`, our trainer with the config
as given; `ours_official_masking`, the same plus objective.mask_with_replacement=true
(our implementation of the official masked-position draw, with replacement; README
"Masking as the official code"). The report covers every side with runs in --out_dir.

The official code needs TensorFlow <= 2.15 (the last with tf.estimator), e.g.
`python3 -m venv V && V/bin/pip install tensorflow-cpu==2.15.1`, given as
--official_python. It runs through a launcher this tool writes to
OUT/official_launcher.py, which supplies what TF 2 lacks (`tensorflow.contrib.layers`'
layer_norm) and seeds the Estimator's graph; its comments list every shim.

The total loss is the same quantity on every side: gen_weight x the generator's MLM loss
+ disc_weight x the discriminator's loss, of the batch each update trains on, before the
update (official: the Estimator's `loss` summary, written every step by the launcher's
save_summary_steps=1; ours: the `loss` summary with train.log_every_steps=1). A
side/seed whose run directory holds DONE.json is skipped on a rerun; an interrupted
training resumes from its last checkpoint.
"""

import argparse
import importlib.util
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # local: the repo
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import tensorflow as tf  # noqa: E402

from electra_tf import configs, fileio  # noqa: E402


def _load_compute_matched():
    """experiments/compute_matched.py (a script, not a package): its run_logged,
    last_error, read_json, check_marker, machine and ExperimentError."""
    spec = importlib.util.spec_from_file_location(
        "compute_matched", os.path.join(REPO, "experiments", "compute_matched.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_cm = _load_compute_matched()
ExperimentError = _cm.ExperimentError  # a bad flag or a failed step; one line
run_logged, last_error, read_json, check_marker, machine = (
    _cm.run_logged, _cm.last_error, _cm.read_json, _cm.check_marker, _cm.machine)

SIDES = ("official", "ours", "ours_official_masking")
DEFAULT_SIDES = ("official", "ours")
# What a side adds to the overrides of "ours" (the official side gets their translation).
SIDE_OVERRIDES = {"ours_official_masking": {"objective.mask_with_replacement": "true"}}
DONE = "DONE.json"
LAUNCHER = "official_launcher.py"
# The held-out metrics every side reports (their definitions differ where table.md says).
EVAL_METRICS = ("loss", "masked_lm_loss", "masked_lm_accuracy", "sampled_masked_lm_accuracy",
                "disc_loss", "disc_accuracy", "disc_auc", "disc_precision", "disc_recall")
# Steps left out of the time per step: graph building / tracing and the first steps.
TIMING_SKIP_STEPS = 5


# --- the official hyper-parameters ----------------------------------------------------

def _require(condition: bool, what: str):
    if not condition:
        raise ExperimentError(f"cannot run this config on the official code: {what}")


def official_hparams(cfg: Dict, *, train_files: str, vocab_file: str, model_dir: str
                     ) -> Dict:
    """The official configure_pretraining.PretrainingConfig hyper-parameters (--hparams)
    of our resolved config `cfg` (PretrainingConfig.to_json()); an ExperimentError names
    what the official code cannot express. model_size "small" is only the base the
    overrides replace: every size is given explicitly."""
    m, o, opt, t = cfg["model"], cfg["objective"], cfg["optimizer"], cfg["train"]
    _require(o["objective"] == "electra", f"objective.objective={o['objective']} (only "
             "electra is translated)")
    _require(o["generator"] == "masked_lm", f"objective.generator={o['generator']}")
    _require(m["layer_norm_eps"] == 1e-12, "model.layer_norm_eps must be 1e-12 (contrib's "
             "layer_norm)")
    _require(not m["two_tower_generator"] and not m["disentangled_embeddings"],
             "two-tower or GDES generators")
    gen_hidden = int(round(m["hidden_size"] * m["generator_hidden_size"]))
    _require(int(round(m["intermediate_size"] * m["generator_hidden_size"])) ==
             4 * gen_hidden, "the official generator's FFN is 4 x its hidden size "
             f"({4 * gen_hidden}); ours would be intermediate_size x generator_hidden_size")
    official_predictions = int((o["mask_prob"] + 0.005) * t["max_seq_length"])
    _require(o["max_predictions_per_seq"] in (0, official_predictions),
             f"objective.max_predictions_per_seq must be 0 or {official_predictions}")
    _require((o["mask_token_prob"], o["random_token_prob"]) == (0.85, 0.0),
             "the official masking replaces 85% of the chosen positions by [MASK], keeps the "
             "rest (objective.mask_token_prob=0.85, random_token_prob=0)")
    _require(not o["temperature_schedule"], "objective.temperature_schedule")
    _require(str(o["gen_focal_gamma"]).strip() in ("0", "0.0"), "objective.gen_focal_gamma")
    _require(opt["optimizer"] == "adamw" and not opt["bias_correction"],
             "only AdamW without bias correction (the official optimizer)")
    _require((opt["beta_1"], opt["beta_2"], opt["epsilon"], opt["clip_norm"],
              opt["end_learning_rate"]) == (0.9, 0.999, 1e-6, 1.0, 0.0),
             "the official optimizer fixes beta_1=0.9, beta_2=0.999, epsilon=1e-6, "
             "clip_norm=1, end_learning_rate=0")
    _require(t["grad_accum_steps"] == 1, "train.grad_accum_steps > 1")
    _require(t["precision"] in ("auto", "float32"), f"train.precision={t['precision']}")
    return {
        "model_size": "small",
        "model_hparam_overrides": {
            k: m[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                              "intermediate_size", "hidden_dropout_prob",
                              "attention_probs_dropout_prob", "max_position_embeddings",
                              "type_vocab_size", "initializer_range")},
        "embedding_size": m["embedding_size"],
        "vocab_size": m["vocab_size"],
        "generator_hidden_size": m["generator_hidden_size"],
        "generator_layers": m["generator_layers"],
        "untied_generator_embeddings": not m["tie_embeddings"],
        "untied_generator": not m["tie_all_weights"],
        "electra_objective": True,
        "mask_prob": o["mask_prob"],
        "gen_weight": o["gen_weight"],
        "disc_weight": o["disc_weight"],
        "temperature": o["temperature"],
        "disallow_correct": o["disallow_correct"],
        "learning_rate": opt["learning_rate"],
        "num_warmup_steps": opt["warmup_steps"],
        "lr_decay_power": opt["lr_decay_power"],
        "weight_decay_rate": opt["weight_decay"],
        "num_train_steps": t["num_train_steps"],
        "train_batch_size": t["train_batch_size"],
        "eval_batch_size": t["eval_batch_size"],
        "num_eval_steps": t["max_eval_steps"],
        "max_seq_length": t["max_seq_length"],
        # On CPU/GPU the TPUEstimator runs one step per session.run whatever this is; 1
        # keeps it so on a TPU too (ETAHook then logs every step).
        "iterations_per_loop": 1,
        "save_checkpoints_steps": t["save_checkpoints_steps"],
        "keep_checkpoint_max": t["keep_checkpoint_max"],
        "use_tpu": False,
        "pretrain_tfrecords": train_files,
        "vocab_file": vocab_file,  # for the [MASK], [CLS], [SEP] ids of the masking
        "model_dir": model_dir,
    }


def official_eval_hparams(train_hparams: Dict, *, eval_files: str, model_dir: str) -> Dict:
    """The same model, evaluated (do_eval reads `pretrain_tfrecords`) from `model_dir`,
    whose `checkpoint` state file names the checkpoint."""
    return dict(train_hparams, do_train=False, do_eval=True, pretrain_tfrecords=eval_files,
                model_dir=model_dir)


def run_overrides(steps: int, save_every: int, keep: int,
                  batch_size: Optional[int] = None) -> Dict[str, str]:
    """What this tool sets on top of the user's --params_override (every side)."""
    out = {"train.num_train_steps": str(steps), "train.save_checkpoints_steps": str(save_every),
           "train.keep_checkpoint_max": str(keep), "train.log_every_steps": "1"}
    if batch_size:
        out["train.train_batch_size"] = str(batch_size)
    return out


def side_overrides(overrides: Dict[str, str], side: str) -> Dict[str, str]:
    """Our trainer's overrides for `side` (official: those translated)."""
    return dict(overrides, **SIDE_OVERRIDES.get(side, {}))


def saved_steps(steps: int, every: int) -> List[int]:
    """The steps both trainers save a checkpoint at: multiples of `every`, and the last."""
    return sorted(set(range(every, steps + 1, every)) | {steps})


def parse_int_list(text: str, flag: str) -> List[int]:
    try:
        values = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise ExperimentError(f"{flag}={text!r}: expected comma-separated integers") from None
    if not values or len(set(values)) != len(values):
        raise ExperimentError(f"{flag}={text!r}: expected distinct comma-separated integers")
    return values


def parse_sides(text: str) -> List[str]:
    sides = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in sides if s not in SIDES]
    if not sides or bad:
        raise ExperimentError(f"--sides={text!r}: expected a comma-separated subset of "
                              f"{','.join(SIDES)}")
    return [s for s in SIDES if s in sides]


def eval_steps(text: str, steps: int, every: int) -> List[int]:
    """--eval_steps (empty: every checkpoint) -> sorted steps; each must be saved."""
    if not text:
        return saved_steps(steps, every)
    chosen = sorted(parse_int_list(text, "--eval_steps"))
    bad = [s for s in chosen if s not in saved_steps(steps, every)]
    if bad:
        raise ExperimentError(f"--eval_steps: no checkpoint at step(s) {bad}; checkpoints "
                              f"are saved every {every} steps and at step {steps}")
    return chosen


def checkpoint_state(prefix: str) -> str:
    """A `checkpoint` state file naming `prefix` as the latest (an absolute path): a
    directory holding only it evaluates that checkpoint on either side."""
    return (f"model_checkpoint_path: {json.dumps(prefix)}\n"
            f"all_model_checkpoint_paths: {json.dumps(prefix)}\n")


# --- parsing what the runs wrote --------------------------------------------------------

Record = Tuple[float, int, str, float]  # (wall time, step, tag, value)


def scalars_by_step(records: Iterable[Record], tag: str) -> Dict[int, float]:
    """{step: value} of `tag`; a step written twice (a resumed run redoes the steps after
    its last checkpoint) keeps its latest value."""
    out: Dict[int, Tuple[float, float]] = {}
    for wall, step, t, value in records:
        if t == tag and (step not in out or wall >= out[step][0]):
            out[step] = (wall, value)
    return {s: v for s, (_, v) in sorted(out.items())}


def step_series(by_step: Dict[int, float], steps: int) -> List[Optional[float]]:
    """Values of steps 1..steps (None where missing)."""
    return [by_step.get(s) for s in range(1, steps + 1)]


def seconds_per_step(records: Iterable[Record], tag: str = "loss",
                     skip: int = TIMING_SKIP_STEPS) -> Optional[float]:
    """Median wall time between consecutive steps' `tag` events after step `skip` (what
    one step takes once built and warm), or None with fewer than two such steps."""
    walls: Dict[int, float] = {}
    for wall, step, t, _ in records:
        if t == tag and step > skip:
            walls[step] = max(wall, walls.get(step, wall))
    deltas = [walls[s] - walls[s - 1] for s in sorted(walls) if s - 1 in walls]
    return statistics.median(deltas) if deltas else None


def metrics_at(records: Iterable[Record], step: int,
               names: Sequence[str] = EVAL_METRICS) -> Dict[str, float]:
    """The `names` written at `step` (the latest of each)."""
    out = {}
    for name in names:
        value = scalars_by_step(records, name).get(step)
        if value is not None:
            out[name] = value
    return out


def _finite(values) -> List[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def window_means(series: Sequence[Optional[float]], window: int
                 ) -> List[Tuple[int, int, Optional[float]]]:
    """(first step, last step, mean of the steps present) over consecutive windows of
    `window` steps: 1..window, window+1..2*window, ... (the last may be shorter)."""
    out = []
    for lo in range(0, len(series), window):
        chunk = _finite(series[lo:lo + window])
        out.append((lo + 1, min(lo + window, len(series)),
                    sum(chunk) / len(chunk) if chunk else None))
    return out


def mean_sd(values: Iterable[Optional[float]]) -> Tuple[Optional[float], Optional[float], int]:
    """(mean, sample sd or None below two values, count) of the values present."""
    xs = _finite(values)
    if not xs:
        return None, None, 0
    return (sum(xs) / len(xs), statistics.stdev(xs) if len(xs) > 1 else None, len(xs))


def smooth(series: Sequence[Optional[float]], k: int) -> List[Optional[float]]:
    """Trailing mean over the last `k` steps present (None where none is)."""
    out = []
    for i in range(len(series)):
        chunk = _finite(series[max(0, i - k + 1):i + 1])
        out.append(sum(chunk) / len(chunk) if chunk else None)
    return out


# --- tables -----------------------------------------------------------------------------

def describe_files(patterns: str) -> str:
    """A comma-separated file list, short: 'N files in DIR: FIRST … LAST' when they share
    a directory (else as given)."""
    files = [f for f in patterns.split(",") if f]
    dirs = {os.path.dirname(f) for f in files}  # local: string handling only
    if len(files) < 3 or len(dirs) != 1:
        return ", ".join(files)
    names = [os.path.basename(f) for f in files]  # local: string handling only
    return f"{len(files)} files in {dirs.pop()}: {names[0]} … {names[-1]}"


def _fmt(x: Optional[float], spec: str = ".4f") -> str:
    return "—" if x is None else format(x, spec)


def _cell(values, spec: str = ".4f") -> str:
    mean, sd, n = mean_sd(values)
    if mean is None:
        return "—"
    return f"{_fmt(mean, spec)} ± {_fmt(sd, spec)} (n={n})"


def _diff(a, b, spec: str = "+.4f") -> str:
    ma, mb = mean_sd(a)[0], mean_sd(b)[0]
    return "—" if ma is None or mb is None else format(mb - ma, spec)


def present_sides(curves: Dict) -> List[str]:
    """The sides with runs, in SIDES order."""
    return [side for side in SIDES if curves.get(side)]


def _columns(curves: Dict, suffix: str = "") -> Tuple[List[str], List[str], List[str]]:
    """(the present sides, ours that have a difference column (official present), the
    header cells: a column per side, then each of ours − official)."""
    sides = present_sides(curves)
    diffs = [s for s in sides if s != "official"] if "official" in sides else []
    return sides, diffs, [s + suffix for s in sides] + [f"{s} − official" for s in diffs]


def _row(first: str, vals: Dict[str, List], sides: List[str], diffs: List[str]) -> str:
    cells = [_cell(vals[s]) for s in sides] + [_diff(vals["official"], vals[s]) for s in diffs]
    return f"| {first} | " + " | ".join(cells) + " |"


def loss_table(curves: Dict, steps: int, window: int) -> List[str]:
    """Rows of the window means of the total loss: each present side, then each of ours
    − official."""
    sides, diffs, header = _columns(curves, ": mean ± sd over seeds")
    per_side = {side: [window_means(r["loss"][:steps], window)
                       for r in curves[side].values()] for side in sides}
    lines = ["| steps | " + " | ".join(header) + " |", "|---|" + "---:|" * len(header)]
    for i, lo in enumerate(range(0, steps, window)):
        hi = min(lo + window, steps)
        vals = {side: [w[i][2] for w in per_side[side] if i < len(w)] for side in sides}
        lines.append(_row(f"{lo + 1}–{hi}", vals, sides, diffs))
    first = {side: [r["loss"][0] if r["loss"] else None for r in curves[side].values()]
             for side in sides}
    lines.append(_row("step 1 alone", first, sides, diffs))
    return lines


def eval_table(curves: Dict, checkpoints: Sequence[int]) -> List[str]:
    sides, diffs, header = _columns(curves)
    lines = ["| step | metric | " + " | ".join(header) + " |",
             "|---:|---|" + "---:|" * len(header)]
    for step in checkpoints:
        for name in EVAL_METRICS:
            vals = {side: [r["eval"].get(str(step), {}).get(name)
                           for r in curves[side].values()] for side in sides}
            if not any(_finite(v) for v in vals.values()):
                continue
            lines.append(_row(f"{step} | {name}", vals, sides, diffs))
    return lines


def timing_table(curves: Dict) -> List[str]:
    lines = ["| side | seconds per step (per seed) | mean |", "|---|---|---:|"]
    for side in SIDES:
        runs = curves.get(side, {})
        if not runs:
            continue
        per_seed = ", ".join(f"seed {s}: {_fmt(r.get('seconds_per_step'), '.3f')}"
                             for s, r in runs.items())
        mean = mean_sd(r.get("seconds_per_step") for r in runs.values())[0]
        lines.append(f"| {side} | {per_seed} | {_fmt(mean, '.3f')} |")
    return lines


def masking_line(with_replacement: Optional[bool], sides: Sequence[str] = DEFAULT_SIDES
                 ) -> str:
    """How each side draws the masked positions (the one documented difference);
    `with_replacement`: the config's (side ours), `sides`: those reported."""
    ours = ("with replacement too (objective.mask_with_replacement=true)" if with_replacement
            else "without replacement (objective.mask_with_replacement=false, our default: "
            "more distinct tokens corrupted; README predicts ours ≈0.9 higher on the tiny "
            "total loss; =true draws as the official)")
    line = f"Masked positions: the official code draws them with replacement; ours {ours}"
    if "ours_official_masking" in sides:
        line += ("; ours_official_masking is ours with objective.mask_with_replacement=true "
                 "added, our implementation of the official draw (with replacement)")
    return line + "."


def render_table(data: Dict) -> str:
    """table.md from curves.json's dict (pure)."""
    meta, curves = data["meta"], data["curves"]
    steps, window = meta["steps"], meta["window"]
    versions = meta.get("versions", {})
    lines = ["# Official ELECTRA vs electra-tf: pre-training curves", "",
             f"Command: `{meta['command']}`", "",
             f"Machine: {meta.get('machine', 'unknown')}", "",
             f"Versions: official side TensorFlow {versions.get('official', '—')} "
             f"(code: {meta.get('official_code', '—')}); ours TensorFlow "
             f"{versions.get('ours', '—')} (electra-tf {meta.get('ours_code', '—')}).", "",
             f"Config: `{meta['config']}` + `{meta['params_override']}`; {steps} steps; "
             f"seeds {', '.join(str(s) for s in meta['seeds'])}.", "",
             f"Data: training {describe_files(meta['train_data'])}; held-out "
             f"{describe_files(meta['eval_data'])}.", "",
             masking_line(meta.get("mask_with_replacement"), present_sides(curves)), "",
             "Seeds: ours `--seed`; official: the launcher sets the Estimator graph's seed "
             "(RunConfig tf_random_seed; the official code sets none). The official input "
             "pipeline interleaves files `sloppy` (nondeterministic order), so its seed fixes "
             "the initialisation and the random ops' streams, not the data order.", "",
             f"## Total loss per step, means over windows of {window} steps", "",
             "Total loss = gen_weight × generator MLM loss + disc_weight × discriminator "
             "loss of the training batch, before that step's update. At initialisation "
             f"≈ ln(vocab) + disc_weight · ln 2 = {meta.get('init_loss', 0.0):.2f}.", ""]
    lines += loss_table(curves, steps, window)
    lines += ["", "## Held-out metrics at checkpoints (mean ± sd over seeds)", "",
              f"{meta['eval_batches']} batches of {meta['eval_batch_size']} from the held-out "
              "data, no dropout, fresh random masking and sampling. Definitions differ: the "
              "official disc_loss is the mean over sequences of each sequence's mean token "
              "loss (ours: over tokens); the official disc_auc is tf.metrics.auc (200 "
              "thresholds) over all positions with padding as negatives scored 0 (ours: over "
              "real tokens only, histogram AUC); masked_lm_* agree.", ""]
    lines += eval_table(curves, meta["eval_steps"])
    lines += ["", "## Time per step", "",
              "Median wall time between consecutive steps' loss summaries after step "
              f"{TIMING_SKIP_STEPS} (every step logged and summarised on every side; the "
              "machine may be shared).", ""]
    lines += timing_table(curves)
    hparams = dict(meta.get("official_hparams") or {})
    if "pretrain_tfrecords" in hparams:  # in full in curves.json
        hparams["pretrain_tfrecords"] = describe_files(hparams["pretrain_tfrecords"])
    lines += ["", "## Official hyper-parameters (--hparams of the training runs)", "",
              "The translation of our config (bench/official_curves.py `official_hparams`); "
              "evaluation runs add do_train=false, do_eval=true and the held-out data as "
              "pretrain_tfrecords.", "",
              "```json", json.dumps(hparams, indent=1, sort_keys=True), "```", ""]
    if meta.get("failures"):
        lines += ["## Failed jobs", ""] + [f"- {k}: {v}" for k, v in
                                            sorted(meta["failures"].items())] + [""]
    return "\n".join(lines)


# --- the launcher -----------------------------------------------------------------------

LAUNCHER_SOURCE = '''"""Runs google-research/electra's run_pretraining.py under TensorFlow 2.x
(<= 2.15: tf.estimator). Written by bench/official_curves.py; the official code stays in
its folder.

    python official_launcher.py OFFICIAL_DIR SEED INFO_JSON -- ARGS OF run_pretraining.py

Shims, each only what the official code needs and cannot get from TF 2.15:
1. `tensorflow.contrib.layers.layer_norm` (model/modeling.py imports it; contrib is gone in
   TF 2): contrib's function re-stated for the one way modeling.py calls it
   (begin_norm_axis=-1, begin_params_axis=-1, scope=name or None): variables `beta` (zeros)
   and `gamma` (ones) of the last axis under variable scope `scope`, default name
   "LayerNorm" made unique as contrib did (so checkpoint names match the released ones:
   .../LayerNorm/beta, .../LayerNorm/gamma), moments over the last axis, epsilon 1e-12.
2. tf.estimator.tpu.RunConfig: tf_random_seed=SEED (the official code sets no seed: this
   makes the graph's random ops, truncated-normal initialisers, masking, sampling, dropout
   and tf.data shuffles, a function of SEED) and save_summary_steps=1 (the Estimator's
   `loss` summary every step, not every 100).
3. random.seed(SEED): tf.layers.dense without a kernel_initializer (embeddings_project,
   discriminator_predictions/dense_1) gets Keras 2.15's glorot_uniform, whose seed Keras
   draws from Python's `random`, not from the graph seed.
Everything else (tf.compat.v1, tf.estimator.tpu.TPUEstimator, tf.layers) TF 2.15 still has.
"""
import json
import os
import random
import runpy
import sys
import types

official_dir, seed, info_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
assert sys.argv[4] == "--", "usage: official_launcher.py OFFICIAL_DIR SEED INFO_JSON -- ARGS"
import tensorflow.compat.v1 as tf  # noqa: E402


def layer_norm(inputs, begin_norm_axis=-1, begin_params_axis=-1, scope=None, reuse=None):
    if begin_norm_axis != -1 or begin_params_axis != -1:
        # The official modeling.py normalises the last axis only (its one call site).
        raise ValueError("this layer_norm supports begin_norm_axis=begin_params_axis=-1")
    with tf.variable_scope(scope, default_name="LayerNorm", values=[inputs], reuse=reuse):
        shape, dtype = inputs.shape[-1:], inputs.dtype.base_dtype
        beta = tf.get_variable("beta", shape=shape, dtype=dtype,
                               initializer=tf.zeros_initializer())
        gamma = tf.get_variable("gamma", shape=shape, dtype=dtype,
                                initializer=tf.ones_initializer())
        mean, variance = tf.nn.moments(inputs, [inputs.shape.ndims - 1], keep_dims=True)
        return tf.nn.batch_normalization(inputs, mean, variance, offset=beta, scale=gamma,
                                         variance_epsilon=1e-12)


contrib = types.ModuleType("tensorflow.contrib")  # shim 1
contrib.layers = types.ModuleType("tensorflow.contrib.layers")
contrib.layers.layer_norm = layer_norm
sys.modules["tensorflow.contrib"] = contrib
sys.modules["tensorflow.contrib.layers"] = contrib.layers

_RunConfig = tf.estimator.tpu.RunConfig


class SeededRunConfig(_RunConfig):  # shim 2
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("tf_random_seed", seed)
        kwargs.setdefault("save_summary_steps", 1)
        super().__init__(*args, **kwargs)


tf.estimator.tpu.RunConfig = SeededRunConfig
random.seed(seed)  # shim 3

with tf.io.gfile.GFile(info_path, "w") as f:
    json.dump({"tensorflow": tf.__version__, "python": sys.version.split()[0],
               "seed": seed, "official_dir": official_dir}, f)
print("official_launcher: TensorFlow %s, graph seed %d, %s" % (tf.__version__, seed,
                                                               official_dir), flush=True)
script = os.path.join(official_dir, "run_pretraining.py")
sys.path[:0] = [official_dir]
sys.argv = [script] + sys.argv[5:]
runpy.run_path(script, run_name="__main__")
'''


# --- running ----------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, through main's handler
        raise ExperimentError(message)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = _Parser(prog="official_curves.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--official_dir", default=None, help="A checkout of "
                   "google-research/electra (its run_pretraining.py is run from there).")
    p.add_argument("--official_python", default=None, help="A Python with TensorFlow "
                   "<= 2.15 (tf.estimator) for the official side.")
    p.add_argument("--sides", default=",".join(DEFAULT_SIDES), help="A comma-separated "
                   f"subset of {','.join(SIDES)} (module docstring).")
    p.add_argument("--seeds", default="1,2,3", help="Comma-separated seeds per side.")
    p.add_argument("--steps", type=int, default=600, help="Training steps of every run.")
    p.add_argument("--config", default="tiny", help="Our preset or JSON config; the "
                   "official side gets its translation (printed; in table.md).")
    p.add_argument("--params_override", default="", help="key=value,... for our config, "
                   "translated for the official side too (e.g. train.max_eval_steps=2).")
    p.add_argument("--batch_size", type=int, default=None, help="Training batch of both "
                   "sides (default: the config's).")
    p.add_argument("--eval_every", type=int, default=100, help="Checkpoint interval of "
                   "every side (save_checkpoints_steps).")
    p.add_argument("--eval_steps", default="", help="Checkpoints to evaluate, e.g. "
                   "100,300,600 (default: every saved one).")
    p.add_argument("--window", type=int, default=50, help="Steps per window of the loss "
                   "table.")
    p.add_argument("--smooth", type=int, default=10, help="Trailing mean over this many "
                   "steps in the plot.")
    p.add_argument("--train_data", default=None, help="TFRecord glob(s), comma-separated "
                   "(default: the bundled sample's first 15 shards).")
    p.add_argument("--eval_data", default=None, help="Held-out TFRecords (default: the "
                   "bundled sample's 16th shard).")
    p.add_argument("--vocab_file", default=None, help="The data's WordPiece vocabulary: "
                   "the official masking reads [MASK], [CLS], [SEP] from it (default: the "
                   "bundled BERT uncased one).")
    p.add_argument("--out_dir", default=os.path.join(REPO, "experiments", "results",
                                                     "official_curves"))
    p.add_argument("--report_only", action="store_true", help="Only collect what ran and "
                   "write curves.json, table.md, curves.png.")
    p.add_argument("--dry_run", action="store_true", help="Print the official "
                   "hyper-parameters and the commands, run nothing.")
    args = p.parse_args(argv)
    if not fileio.is_remote(args.out_dir):
        # Absolute: the eval directories' `checkpoint` files name the training run's
        # checkpoints, and a relative name there is read relative to the eval directory.
        args.out_dir = os.path.abspath(args.out_dir)  # local: not a remote path
    args.side_list = parse_sides(args.sides)
    args.seed_list = parse_int_list(args.seeds, "--seeds")
    for name in ("steps", "eval_every", "window", "smooth"):
        if getattr(args, name) < 1:
            raise ExperimentError(f"--{name}={getattr(args, name)} must be at least 1")
    if args.batch_size is not None and args.batch_size < 1:
        raise ExperimentError(f"--batch_size={args.batch_size} must be at least 1")
    args.eval_step_list = eval_steps(args.eval_steps, args.steps, args.eval_every)
    if "official" in args.side_list and not args.report_only:
        check_official(args)
    return args


def check_official(args):
    """One-line errors for an --official_dir / --official_python that cannot work."""
    if not args.official_dir:
        raise ExperimentError("--official_dir is required for the official side (a "
                              "checkout of google-research/electra), or use --sides=ours")
    args.official_dir = os.path.abspath(args.official_dir)  # local: a local checkout
    for name in ("run_pretraining.py", "configure_pretraining.py",
                 os.path.join("model", "modeling.py")):
        if not os.path.isfile(os.path.join(args.official_dir, name)):  # local: as above
            raise ExperimentError(f"--official_dir={args.official_dir}: no {name} there "
                                  "(expected a checkout of google-research/electra)")
    if not args.official_python:
        raise ExperimentError("--official_python is required for the official side: a "
                              "Python with TensorFlow <= 2.15, e.g. a venv with "
                              "tensorflow-cpu==2.15.1")
    found = shutil.which(args.official_python)
    if not found:
        raise ExperimentError(f"--official_python={args.official_python}: not an "
                              "executable")
    args.official_python = found


def resolve_data(args):
    """Fills args.train_data, args.eval_data, args.vocab_file (the bundled sample by
    default, built into ./cache if needed)."""
    if not args.train_data or not args.eval_data:
        from tfrecord_builder.sample import SAMPLE_CACHE, bundled_sample
        length = configs.load_config(args.config, args.params_override).train.max_seq_length
        train, held_out = bundled_sample(length, os.path.join(REPO, SAMPLE_CACHE))
        args.train_data = args.train_data or train
        args.eval_data = args.eval_data or held_out
    if not args.vocab_file:
        from electra_tf import DEFAULT_VOCAB
        args.vocab_file = DEFAULT_VOCAB


def plan(args) -> Dict:
    """Our resolved config, the tool's overrides and the official hyper-parameters."""
    try:
        user = configs.parse_overrides(args.params_override)
        keep = max(10, len(saved_steps(args.steps, args.eval_every)) + 2)
        overrides = dict(user, **run_overrides(args.steps, args.eval_every, keep,
                                               args.batch_size))
        cfg = configs.load_config(args.config, overrides)
    except configs.ConfigError as e:
        raise ExperimentError(str(e)) from None
    hparams = official_hparams(cfg.to_json(), train_files=args.train_data,
                               vocab_file=args.vocab_file, model_dir="<run>/model")
    return {"cfg": cfg, "overrides": overrides, "hparams": hparams}


def run_dir(out_dir: str, side: str, seed: int) -> str:
    return fileio.join(out_dir, "pretrain", side, f"seed{seed}")


def model_dir(out_dir: str, side: str, seed: int) -> str:
    return fileio.join(run_dir(out_dir, side, seed), "model")


def eval_dir(out_dir: str, side: str, seed: int, step: int) -> str:
    return fileio.join(run_dir(out_dir, side, seed), "eval", f"step{step}")


def checkpoint_prefix(out_dir: str, side: str, seed: int, step: int) -> str:
    name = f"model.ckpt-{step}" if side == "official" else f"ckpt-{step}"
    return fileio.join(model_dir(out_dir, side, seed), name)


def launcher_path(out_dir: str) -> str:
    if fileio.is_remote(out_dir):  # Python runs a local file
        import tempfile
        return os.path.join(tempfile.gettempdir(), LAUNCHER)  # local: by design
    return fileio.join(out_dir, LAUNCHER)


def official_command(args, seed: int, hparams_path: str, info_path: str,
                     workdir: str) -> List[str]:
    return [args.official_python, launcher_path(args.out_dir), args.official_dir, str(seed),
            info_path, "--", "--data-dir", workdir, "--model-name", f"seed{seed}",
            "--hparams", hparams_path]


def ours_command(args, p: Dict, seed: int, mdir: str, evaluate: bool,
                 side: str = "ours") -> List[str]:
    overrides = side_overrides(p["overrides"], side)
    cmd = [sys.executable, os.path.join(REPO, "run_pretraining.py"), f"--config={args.config}",
           f"--model_dir={mdir}", f"--train_data={args.train_data}", f"--seed={seed}",
           "--params_override=" + ",".join(f"{k}={v}" for k, v in overrides.items())]
    if evaluate:
        cmd += [f"--eval_data={args.eval_data}", "--do_eval", "--nodo_train"]
    return cmd


def read_events(directory: str) -> List[Record]:
    """The scalar summaries of the event files directly in `directory` (any filesystem;
    TF1 simple values and TF2 tensors); a torn last record ends its file."""
    from tensorflow.core.util import event_pb2
    out: List[Record] = []
    for path in sorted(fileio.glob(fileio.join(directory, "events.out.tfevents.*"))):
        try:
            for raw in tf.data.TFRecordDataset(path).as_numpy_iterator():
                event = event_pb2.Event.FromString(raw)
                for v in event.summary.value:
                    if v.HasField("simple_value"):
                        value = float(v.simple_value)
                    elif v.HasField("tensor") and not v.tensor.tensor_shape.dim:
                        array = tf.make_ndarray(v.tensor)  # strings too (checkpoint_path)
                        if array.dtype.kind not in "fiub":
                            continue
                        value = float(array)
                    else:
                        continue
                    out.append((event.wall_time, int(event.step), v.tag, value))
        except tf.errors.DataLossError:
            # An events file still being written ends in a torn record: the events read
            # before it are kept (appended above), the rest of that file is not there yet.
            continue
    return out


def train_events_dir(out_dir: str, side: str, seed: int) -> str:
    mdir = model_dir(out_dir, side, seed)
    return mdir if side == "official" else fileio.join(mdir, "train")


def eval_result(out_dir: str, side: str, seed: int, step: int) -> Optional[Dict]:
    """The held-out metrics of a checkpoint (official: read from its eval events once and
    kept as eval_results.json, ours: run_pretraining's eval_results.json), or None."""
    edir = eval_dir(out_dir, side, seed, step)
    path = fileio.join(edir, "eval_results.json")
    result = read_json(path)
    if result is not None or side != "official":
        return result
    metrics = metrics_at(read_events(fileio.join(edir, "eval")), step)
    if not metrics:
        return None
    fileio.write_json_atomic(path, dict(metrics, step=step))
    return dict(metrics, step=step)


def run_side(args, p: Dict, side: str, seed: int, log_line) -> Optional[str]:
    """Trains and evaluates one side/seed unless its DONE marker says it is done; returns
    an error line, or None."""
    rdir, mdir = run_dir(args.out_dir, side, seed), model_dir(args.out_dir, side, seed)
    job = f"{side}/seed{seed}"
    hparams = dict(p["hparams"], model_dir=mdir)
    expected = {"side": side, "seed": seed, "steps": args.steps, "config": args.config,
                "overrides": side_overrides(p["overrides"], side),
                "train_data": args.train_data,
                "eval_data": args.eval_data, "eval_steps": args.eval_step_list}
    if side == "official":
        expected["hparams"] = hparams
    if check_marker(read_json(fileio.join(rdir, DONE)), expected, job):
        log_line(f"{job}: done before, skipped")
        return None
    log = fileio.join(args.out_dir, "logs", f"{side}_seed{seed}.log")
    fileio.makedirs(rdir)
    info = fileio.join(rdir, "official_tf.json")
    t0 = time.monotonic()
    log_line(f"{job}: training {args.steps} steps ...")
    if side == "official":
        hpath = fileio.join(rdir, "hparams.json")
        fileio.write_json_atomic(hpath, hparams, sort_keys=True)
        cmd = official_command(args, seed, hpath, info, rdir)
    else:
        cmd = ours_command(args, p, seed, mdir, evaluate=False, side=side)
    rc = run_logged(cmd, log)
    missing = [s for s in args.eval_step_list
               if not fileio.exists(checkpoint_prefix(args.out_dir, side, seed, s) + ".index")]
    if rc != 0 or missing:
        why = f"exit {rc}" if rc else f"no checkpoint at step(s) {missing}"
        return f"{why}: {last_error(log)} (log: {log})"
    train_seconds = time.monotonic() - t0
    for step in args.eval_step_list:
        if eval_result(args.out_dir, side, seed, step) is not None:
            continue
        edir = eval_dir(args.out_dir, side, seed, step)
        fileio.makedirs(edir)
        fileio.write_atomic(fileio.join(edir, "checkpoint"), checkpoint_state(
            checkpoint_prefix(args.out_dir, side, seed, step)))
        log_line(f"{job}: evaluating step {step} ...")
        if side == "official":
            hpath = fileio.join(edir, "hparams.json")
            fileio.write_json_atomic(hpath, official_eval_hparams(
                hparams, eval_files=args.eval_data, model_dir=edir), sort_keys=True)
            cmd = official_command(args, seed, hpath, info, edir)
        else:
            cmd = ours_command(args, p, seed, edir, evaluate=True, side=side)
        rc = run_logged(cmd, log)
        if rc != 0 or eval_result(args.out_dir, side, seed, step) is None:
            return f"eval of step {step}: exit {rc}: {last_error(log)} (log: {log})"
    versions = read_json(info) if side == "official" else {"tensorflow": tf.__version__}
    fileio.write_json_atomic(fileio.join(rdir, DONE), dict(
        expected, seconds=time.monotonic() - t0, train_seconds=train_seconds,
        tensorflow=(versions or {}).get("tensorflow")), sort_keys=True)
    log_line(f"{job}: done in {time.monotonic() - t0:.0f} s")
    return None


def collect(args) -> Dict:
    """{side: {seed: {"loss": [...], "seconds_per_step", "eval": {step: metrics},
    "complete", "tensorflow"}}} of every run directory with training events (of every
    side, not only --sides: a side run later into the same --out_dir joins the report)."""
    curves: Dict = {}
    for side in SIDES:
        for seed in args.seed_list:
            records = read_events(train_events_dir(args.out_dir, side, seed))
            if not records:
                continue
            done = read_json(fileio.join(run_dir(args.out_dir, side, seed), DONE)) or {}
            evals = {}
            for step in args.eval_step_list:
                result = eval_result(args.out_dir, side, seed, step)
                if result:
                    evals[str(step)] = {k: v for k, v in result.items() if k in EVAL_METRICS}
            curves.setdefault(side, {})[str(seed)] = {
                "loss": step_series(scalars_by_step(records, "loss"), args.steps),
                "seconds_per_step": seconds_per_step(records),
                "eval": evals, "complete": bool(done), "tensorflow": done.get("tensorflow")}
    return curves


def _git_head(directory: Optional[str]) -> str:
    if not directory:
        return "—"
    try:
        out = subprocess.run(["git", "-C", directory, "rev-parse", "HEAD"], check=True,
                             capture_output=True, text=True, timeout=30)
        return f"{directory} at {out.stdout.strip()[:12]}"
    except (OSError, subprocess.SubprocessError):
        return f"{directory} (not a git work tree)"


def plot(data: Dict, path: str, k: int) -> bool:
    """curves.png: the smoothed loss per step (seeds thin, mean thick) and the held-out
    MLM (solid, left axis) and discriminator (dashed, right axis) losses per checkpoint."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("official_curves: matplotlib is missing (pip install -e .[experiments]); "
              "no plot", file=sys.stderr)
        return False
    import io
    colors = {"official": "tab:blue", "ours": "tab:orange",
              "ours_official_masking": "tab:green"}
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    ax3 = ax2.twinx()
    for side, runs in data["curves"].items():
        series = [r["loss"] for r in runs.values()]
        for s in series:
            ys = smooth(s, k)
            ax.plot(range(1, len(ys) + 1), [math.nan if y is None else y for y in ys],
                    color=colors[side], linewidth=0.6, alpha=0.35)
        if series:
            mean = [mean_sd(col)[0] for col in zip(*series)]
            ys = smooth(mean, k)
            ax.plot(range(1, len(ys) + 1), [math.nan if y is None else y for y in ys],
                    color=colors[side], linewidth=2.2, label=f"{side} (mean of {len(series)})")
        for metric, axis, style, marker in (("masked_lm_loss", ax2, "-", "o"),
                                            ("disc_loss", ax3, "--", "s")):
            steps = sorted({int(s) for r in runs.values() for s in r["eval"]})
            stats = [mean_sd(r["eval"].get(str(s), {}).get(metric) for r in runs.values())
                     for s in steps]
            xs = [s for s, st in zip(steps, stats) if st[0] is not None]
            if xs:
                axis.errorbar(xs, [st[0] for st in stats if st[0] is not None],
                              yerr=[st[1] or 0.0 for st in stats if st[0] is not None],
                              color=colors[side], linestyle=style, marker=marker,
                              fillstyle="none" if marker == "s" else "full", capsize=3,
                              label=f"{side} {metric}")
    ax.set_xlabel("step")
    ax.set_ylabel(f"total loss (trailing mean of {k} steps)")
    ax.set_title("Training loss: gen MLM + disc_weight x disc")
    ax.legend(fontsize=8)
    ax2.set_xlabel("checkpoint step")
    ax2.set_ylabel("held-out masked_lm_loss (solid)")
    ax3.set_ylabel("held-out disc_loss (dashed)")
    ax2.set_title("Held-out eval (mean ± sd over seeds)")
    handles = ax2.get_legend_handles_labels()[0] + ax3.get_legend_handles_labels()[0]
    if handles:
        ax2.legend(handles, [h.get_label() for h in handles], fontsize=8, loc="upper right")
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    fileio.write_atomic(path, png.getvalue())
    return True


def write_outputs(args, p: Dict, command: str, failures: Dict[str, str]) -> Dict:
    curves = collect(args)
    cfg = p["cfg"]
    versions = {side: next((r["tensorflow"] for r in curves.get(side, {}).values()
                            if r.get("tensorflow")), None) for side in SIDES}
    versions["ours"] = versions["ours"] or tf.__version__
    data = {"meta": {
        "command": command, "machine": machine(), "versions": versions,
        "official_code": _git_head(args.official_dir), "ours_code": _git_head(REPO),
        "config": args.config, "params_override": ",".join(
            f"{k}={v}" for k, v in p["overrides"].items()),
        "steps": args.steps, "seeds": args.seed_list, "window": args.window,
        "eval_steps": args.eval_step_list, "eval_batches": cfg.train.max_eval_steps,
        "eval_batch_size": cfg.train.eval_batch_size,
        "train_data": args.train_data, "eval_data": args.eval_data,
        "mask_with_replacement": getattr(cfg.objective, "mask_with_replacement", False),
        "init_loss": math.log(cfg.model.vocab_size) * cfg.objective.gen_weight +
        cfg.objective.disc_weight * math.log(2),
        "official_hparams": p["hparams"], "failures": failures},
        "curves": curves}
    fileio.write_json_atomic(fileio.join(args.out_dir, "curves.json"), data)
    fileio.write_atomic(fileio.join(args.out_dir, "table.md"), render_table(data))
    plot(data, fileio.join(args.out_dir, "curves.png"), args.smooth)
    return data


def main(argv: Sequence[str]) -> int:
    try:
        args = parse_args(argv)
        resolve_data(args)
        p = plan(args)
    except ExperimentError as e:
        print(f"official_curves: error: {e}", file=sys.stderr)
        return 1
    command = "python " + shlex.join(
        [os.path.relpath(os.path.abspath(__file__), REPO)] +  # local: this script
        [a for a in argv if a != "--report_only"])
    print("official hyper-parameters (--hparams; model_dir per run):")
    print(json.dumps(p["hparams"], indent=1, sort_keys=True))
    if args.dry_run:
        for seed in args.seed_list:
            for side in args.side_list:
                rdir = run_dir(args.out_dir, side, seed)
                cmd = (official_command(args, seed, fileio.join(rdir, "hparams.json"),
                                        fileio.join(rdir, "official_tf.json"), rdir)
                       if side == "official" else
                       ours_command(args, p, seed, model_dir(args.out_dir, side, seed), False,
                                    side))
                print(f"{side}/seed{seed}: {shlex.join(cmd)}")
        return 0
    fileio.makedirs(args.out_dir)
    failures: Dict[str, str] = {}
    if not args.report_only:
        start = time.monotonic()

        def log_line(text):
            s = int(time.monotonic() - start)
            print(f"[{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}] {text}", flush=True)

        if "official" in args.side_list:
            launcher = launcher_path(args.out_dir)
            if fileio.is_remote(args.out_dir):
                with open(launcher, "w", encoding="utf-8") as f:  # local: by design
                    f.write(LAUNCHER_SOURCE)
            else:
                fileio.write_atomic(launcher, LAUNCHER_SOURCE)
        try:
            for seed in args.seed_list:
                for side in args.side_list:
                    error = run_side(args, p, side, seed, log_line)
                    if error:
                        failures[f"{side}/seed{seed}"] = error
                        log_line(f"{side}/seed{seed}: FAILED ({error})")
        except ExperimentError as e:
            print(f"official_curves: error: {e}", file=sys.stderr)
            return 1
    write_outputs(args, p, command, failures)
    print(f"table: {fileio.join(args.out_dir, 'table.md')}")
    if failures:
        print(f"official_curves: {len(failures)} run(s) failed: {', '.join(failures)}; "
              "rerun the same command to retry them", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
