"""Every variant's discriminator judged on the SAME held-out corruptions.

A variant's own eval metrics (disc_auc, ...) measure it against its own generator's
replacements, which differ from variant to variant. Here one fixed "judge" run's generator
corrupts the held-out data ONCE (`draw`: ELECTRA's masking with the judge's objective
settings, its generator forward without dropout, one sample per slot at --temperature);
then every run is scored on those same inputs (`judge`) for "is this token replaced?":

* replaced-token detectors (electra, electra_15, two_stage, adversarial, hp_*, GDES,
  Fast-ELECTRA, a freshly initialised model): sigmoid of the discriminator's logit;
* ELECTRIC: the energy E (higher = less data-like);
* mlm / replace_mlm: 1 - p(observed token) from the MLM head on the main encoder, read
  at every position of the unmasked corrupted input; all_tokens_mlm: 1 - its copy-mixture
  probability D + (1 - D) p(observed) of the observed token.

    python experiments/fixed_corruptions.py draw --judge=runs/electra --eval_data=GLOB \
        --out=corruptions.npz [--num_batches=N --batch_size=32 --seed=0 --temperature=1]
    python experiments/fixed_corruptions.py score --corruptions=corruptions.npz \
        (--model_dir=OUT/pretrain/VARIANT | --config=tiny) [--checkpoint=PATH]

Each prints one JSON line. Real tokens other than [CLS] / [SEP] are scored; AUC is exact
(ties count half); fitted_accuracy takes the threshold that is best on the first half of
the batches to the second half, so it compares every kind of score.
"""

import argparse
import dataclasses
import io
import json
import os
import sys
from typing import Dict, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # local: the repo
if REPO not in sys.path:
    sys.path.insert(0, REPO)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import electra_tf  # noqa: E402,F401  (first: the version check; no TPU runtime load without chips)
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import logging  # noqa: E402
from sklearn.metrics import roc_auc_score  # noqa: E402

from electra_tf import configs, fileio, rng  # noqa: E402
from electra_tf.data import files as data_files  # noqa: E402
from electra_tf.data.dataset import make_dataset  # noqa: E402
from electra_tf.model.modeling import ElectraPretrainingModel  # noqa: E402
from electra_tf.pretraining import losses as obj  # noqa: E402
from electra_tf.pretraining import objectives, pretrain, scoring  # noqa: E402
from tfrecord_builder import BuildError  # noqa: E402

FORMAT = "electra-tf/fixed-corruptions/1"
ARRAYS = ("input_ids", "original_ids", "input_mask", "segment_ids", "labels", "masked")
# objective -> how its model scores a token for "replaced" (anything else: discriminator)
SCORE_KINDS = {"electric": "energy", "mlm": "mlm", "replace_mlm": "mlm",
               "all_tokens_mlm": "copy_mlm"}
_SEED_KEY = 0xF1C5  # the second word of every draw's stateless seed


class FixedCorruptionError(ValueError):
    """A bad flag, run directory or corruptions file; the message is one line."""


# ----------------------------------------------------------------------------- models

def fresh_model(config: str, overrides=None, seed: int = 0):
    """(config, model) of a preset or config file, freshly initialised under `seed`: the
    no-pre-training baseline."""
    cfg = configs.load_config(config, overrides)
    keras.utils.set_random_seed(seed)
    model = ElectraPretrainingModel(
        cfg.model, dtype="float32", heads=objectives.OBJECTIVES[cfg.objective.objective].heads)
    return cfg, model


# ----------------------------------------------------------------------------- draw

def draw(judge_model_dir: str, eval_data: Optional[str], out_path: str,
         num_batches: Optional[int] = None, batch_size: int = 32, seed: int = 0,
         temperature: float = 1.0, checkpoint: Optional[str] = None) -> Dict:
    """Corrupts held-out data once with the judge run's generator; writes the arrays (.npz,
    any filesystem) to `out_path` and returns their metadata.

    `eval_data`: held-out TFRecords (globs, files or build directories); None takes the
    bundled sample's held-out shard, as run_pretraining.py --do_eval does. The data are
    read as --do_eval reads them (`pretrain.input_config(..., training=False)`, order
    fixed by the judge's train.seed) but in one pass: `num_batches` full batches, or all of
    them (None)."""
    if batch_size < 1 or (num_batches is not None and num_batches < 1):
        raise FixedCorruptionError("--batch_size and --num_batches must be >= 1")
    if not temperature > 0:
        raise FixedCorruptionError(f"--temperature={temperature} must be > 0")
    cfg, model, path = scoring.load_run(judge_model_dir, checkpoint)
    oc = cfg.objective
    if (oc.objective in ("mlm", "electric") or oc.generator not in ("masked_lm", "fixed")):
        raise FixedCorruptionError(
            f"--judge={judge_model_dir}: objective {oc.objective} with generator "
            f"{oc.generator} has no masked-LM generator network to draw replacements from")
    length = cfg.train.max_seq_length
    if eval_data is None:
        from tfrecord_builder.sample import bundled_sample
        eval_data = bundled_sample(length)[1]
    files = data_files.resolve_files(eval_data, "stop")
    manifest = data_files.check_data(eval_data, vocab_size=cfg.model.vocab_size,
                                     max_seq_length=length, on_bad_shard="stop")
    data_files.check_sequence_length(files[:1], length, "stop")
    special, _ = pretrain.special_ids_and_counts(manifest, files, cfg)
    objective = objectives.build_objective(cfg, special)
    icfg = dataclasses.replace(pretrain.input_config(files, cfg, batch_size, training=False),
                               repeat=False, on_bad_shard="stop")
    dataset = make_dataset(icfg)
    if num_batches is not None:
        dataset = dataset.take(num_batches)

    @tf.function(reduce_retracing=True)
    def corrupt_batch(batch, batch_seed):
        seeds = rng.split(batch_seed, 3)  # masking, sampling, (unused: no dropout)
        masked = objective.mask(batch, seeds[0])
        logits, _ = objective.generator(model, masked, batch, seeds[2], training=False)
        sampled = obj.categorical_sample(logits, seeds[1], temperature)
        args = (batch["input_ids"], masked["masked_positions"], sampled,
                masked["masked_weights"])
        fake, labels = obj.corrupt(*args)
        _, slots = obj.corrupt(*args, label_all_slots=True)  # 1 at every masked slot
        return fake, labels * batch["input_mask"], slots

    parts = {k: [] for k in ARRAYS}
    base = rng.as_seed([seed, _SEED_KEY])
    for index, batch in enumerate(dataset):
        fake, labels, slots = corrupt_batch(batch, rng.step_seed(base, index))
        for key, value in (("input_ids", fake), ("original_ids", batch["input_ids"]),
                           ("input_mask", batch["input_mask"]),
                           ("segment_ids", batch["segment_ids"]), ("labels", labels),
                           ("masked", slots)):
            parts[key].append(value.numpy())
    if not parts["input_ids"]:
        raise FixedCorruptionError(f"--eval_data={eval_data}: fewer examples than one batch "
                                   f"of {batch_size}")
    arrays = {k: np.concatenate(v).astype(np.int32 if k.endswith("ids") else np.int8)
              for k, v in parts.items()}
    drawn = len(parts["input_ids"])
    if num_batches is not None and drawn < num_batches:
        logging.warning("%s holds %d full batches of %d, not %d: drew them all", eval_data,
                        drawn, batch_size, num_batches)
    scored = scored_tokens(arrays, special)
    masked_n, replaced = int(arrays["masked"].sum()), int(arrays["labels"][scored].sum())
    meta = {"format": FORMAT, "judge_model_dir": judge_model_dir, "checkpoint": path,
            "judge_objective": oc.objective, "eval_data": eval_data, "eval_files": files,
            "seed": seed, "temperature": temperature, "batch_size": batch_size,
            "num_batches": drawn, "max_seq_length": length, "special_ids": special,
            "mask_prob": oc.mask_prob, "max_predictions": objective.max_predictions,
            "mask_token_prob": oc.mask_token_prob,
            "random_token_prob": oc.random_token_prob, "sequences": drawn * batch_size,
            "tokens": int(scored.sum()), "masked": masked_n, "replaced": replaced,
            "replaced_share": replaced / max(masked_n, 1),
            "replaced_token_share": replaced / max(int(scored.sum()), 1)}
    buffer = io.BytesIO()
    np.savez_compressed(buffer, metadata=np.array(json.dumps(meta, sort_keys=True)), **arrays)
    fileio.write_atomic(out_path, buffer.getvalue())
    return meta


def load_corruptions(path: str):
    """(arrays, metadata) of a `draw` output."""
    if not fileio.exists(path):
        raise FixedCorruptionError(f"--corruptions={path}: no such file")
    try:
        with np.load(io.BytesIO(fileio.read_bytes(path)), allow_pickle=False) as f:
            arrays = {k: f[k] for k in ARRAYS}
            meta = json.loads(str(f["metadata"]))
    except (OSError, ValueError, KeyError) as e:
        raise FixedCorruptionError(f"--corruptions={path}: not a draw output ({e})") from None
    if meta.get("format") != FORMAT:
        raise FixedCorruptionError(f"--corruptions={path}: format {meta.get('format')!r}, "
                                   f"expected {FORMAT}")
    return arrays, meta


def scored_tokens(arrays, special) -> np.ndarray:
    """[N,L] bool: real tokens whose original is not [CLS] / [SEP]."""
    original = arrays["original_ids"]
    return (arrays["input_mask"] > 0) & (original != special["[CLS]"]) & \
        (original != special["[SEP]"])


# ----------------------------------------------------------------------------- metrics

def auc(scores, labels) -> Optional[float]:
    """Exact ROC AUC (scikit-learn's: ties count half); None without positives or
    negatives."""
    y = np.asarray(labels).ravel() > 0
    if y.all() or not y.any():
        return None
    return float(roc_auc_score(y, np.asarray(scores, np.float64).ravel()))


def fit_threshold(scores, labels) -> float:
    """The threshold t for which "replaced iff score > t" is most accurate on these tokens
    (the highest such t on a tie: the fewest tokens called replaced)."""
    s = np.asarray(scores, np.float64).ravel()
    y = np.asarray(labels).ravel() > 0
    values, inverse = np.unique(s, return_inverse=True)
    pos = np.bincount(inverse, weights=y, minlength=len(values))
    neg = np.bincount(inverse, weights=~y, minlength=len(values))
    # t below every score, then t = each value: negatives at or below t + positives above
    right = np.concatenate([[pos.sum()], np.cumsum(neg) + pos.sum() - np.cumsum(pos)])
    best = len(right) - 1 - int(np.argmax(right[::-1]))
    if best == 0:
        return float(np.nextafter(values[0], -np.inf))
    low = values[best - 1]
    if best == len(values):
        return float(low)
    mid = low + (values[best] - low) / 2.0
    return float(mid if mid < values[best] else low)


# ----------------------------------------------------------------------------- judge

def _score_fn(model, kind: str):
    def scores(input_ids, input_mask, segment_ids):
        if kind in ("discriminator", "energy"):
            out = model.discriminator(input_ids, input_mask, segment_ids, training=False)
            return tf.sigmoid(out) if kind == "discriminator" else out
        hidden = model.discriminator_hidden(input_ids, input_mask, segment_ids, training=False)
        log_p = -tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=input_ids, logits=model.mlm_predictions(hidden))
        if kind == "copy_mlm":  # log(D + (1 - D) p): the observed token is the input
            copy = model.discriminator_predictions(hidden)
            log_p = tf.reduce_logsumexp(tf.stack([tf.math.log_sigmoid(copy),
                                                  tf.math.log_sigmoid(-copy) + log_p]), 0)
        return -tf.math.expm1(log_p)  # 1 - p, accurate where p is near 1
    spec = tf.TensorSpec([None, None], tf.int32)
    return tf.function(scores, input_signature=[spec] * 3)


def judge(corruptions_path: str, model_dir: Optional[str] = None,
          config: Optional[str] = None, checkpoint: Optional[str] = None,
          overrides=None, init_seed: int = 0, batch_size: int = 8) -> Dict:
    """Scores every scored token of a `draw` output for "replaced" with a run's model
    (`model_dir`, its latest checkpoint or `checkpoint`) or, with `config` instead, a
    freshly initialised one (seed `init_seed`). Returns auc, accuracy (at the model's own
    threshold: the discriminator's 0.5; None for energies and MLM scores),
    fitted_accuracy / fitted_threshold, majority_accuracy, replaced_auc_at_masked,
    score_kind and counts."""
    if (model_dir is None) == (config is None):
        raise FixedCorruptionError("give one of --model_dir and --config")
    if overrides and model_dir is not None:
        raise FixedCorruptionError("--params_override goes with --config, not --model_dir")
    arrays, meta = load_corruptions(corruptions_path)
    if model_dir is not None:
        cfg, model, source = scoring.load_run(model_dir, checkpoint)
    else:
        (cfg, model), source = fresh_model(config, overrides, init_seed), None
    ids = arrays["input_ids"]
    if int(ids.max()) >= cfg.model.vocab_size or \
            ids.shape[1] > cfg.model.max_position_embeddings:
        raise FixedCorruptionError(
            f"{model_dir or config}: vocabulary {cfg.model.vocab_size} / "
            f"{cfg.model.max_position_embeddings} positions do not fit the corruptions "
            f"(ids up to {int(ids.max())}, length {ids.shape[1]})")
    kind = SCORE_KINDS.get(cfg.objective.objective, "discriminator")
    fn = _score_fn(model, kind)
    scores = np.concatenate([
        fn(*(tf.constant(arrays[k][i:i + batch_size].astype(np.int32))
             for k in ("input_ids", "input_mask", "segment_ids"))).numpy()
        for i in range(0, len(ids), batch_size)]).astype(np.float64)

    scored = scored_tokens(arrays, meta["special_ids"])
    labels = arrays["labels"] > 0
    rows = len(ids)
    split = (meta["num_batches"] // 2) * meta["batch_size"] if meta["num_batches"] > 1 \
        else rows // 2
    fit, held = scored.copy(), scored.copy()
    fit[split:], held[:split] = False, False
    threshold = fit_threshold(scores[fit], labels[fit])
    at_masked = scored & (arrays["masked"] > 0)
    accuracy = None
    if kind == "discriminator":
        accuracy = float(np.mean((scores[scored] > 0.5) == labels[scored]))
    held_n = int(held.sum())
    return {
        "score_kind": kind, "objective": cfg.objective.objective,
        "model_dir": model_dir, "config": config, "checkpoint": source,
        "corruptions": corruptions_path, "judge_model_dir": meta["judge_model_dir"],
        "auc": auc(scores[scored], labels[scored]),
        "accuracy": accuracy,
        "fitted_accuracy": float(np.mean((scores[held] > threshold) == labels[held]))
        if held_n else None,
        "fitted_threshold": threshold,
        "majority_accuracy": float(np.mean(~labels[held])) if held_n else None,
        "replaced_auc_at_masked": auc(scores[at_masked], labels[at_masked]),
        "tokens": int(scored.sum()), "replaced": int(labels[scored].sum()),
        "masked": int(at_masked.sum()), "fit_tokens": int(fit.sum()), "eval_tokens": held_n,
    }


# ----------------------------------------------------------------------------- CLI

class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise FixedCorruptionError(message)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = _Parser(prog="fixed_corruptions.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    d = sub.add_parser("draw", help="Corrupt held-out data once with a judge's generator.")
    d.add_argument("--judge", required=True, help="The judge's pre-training run directory.")
    d.add_argument("--eval_data", default=None, help="Held-out TFRecords (default: the "
                   "bundled sample's held-out shard).")
    d.add_argument("--out", required=True, help="The .npz to write (any filesystem).")
    d.add_argument("--checkpoint", default=None, help="Judge checkpoint (default: latest).")
    d.add_argument("--num_batches", type=int, default=None, help="Default: one whole pass.")
    d.add_argument("--batch_size", type=int, default=32)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--temperature", type=float, default=1.0)
    s = sub.add_parser("score", help="Score a run's model on drawn corruptions.")
    s.add_argument("--corruptions", required=True)
    group = s.add_mutually_exclusive_group(required=True)
    group.add_argument("--model_dir", help="A pre-training run directory.")
    group.add_argument("--config", help="Preset or JSON config: a fresh, untrained model.")
    s.add_argument("--params_override", default="", help="key=value,... for --config.")
    s.add_argument("--checkpoint", default=None, help="Checkpoint (default: the latest).")
    s.add_argument("--init_seed", type=int, default=0, help="Initialisation of --config.")
    s.add_argument("--batch_size", type=int, default=8, help="Sequences per forward pass.")
    return p.parse_args(argv)


def main(argv: Sequence[str]) -> int:
    try:
        args = parse_args(argv)
        if args.command == "draw":
            out = draw(args.judge, args.eval_data, args.out, args.num_batches,
                       args.batch_size, args.seed, args.temperature, args.checkpoint)
        else:
            out = judge(args.corruptions, args.model_dir, args.config, args.checkpoint,
                        args.params_override or None, args.init_seed, args.batch_size)
    except (FixedCorruptionError, configs.ConfigError, data_files.InputDataError,
            BuildError, ValueError, OSError, tf.errors.OpError) as e:
        message = (str(e).strip().splitlines() or [type(e).__name__])[0]
        print(f"fixed_corruptions: error: {message}", file=sys.stderr)
        return 1
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
