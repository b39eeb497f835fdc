"""The official and our discriminators on the SAME held-out corruptions (issue 19).

`bench/official_curves.py` evaluates each side with its own eval code, data order and
metric definitions. This script removes those differences: every side's checkpoint at
--step is loaded into our model (the official one through our TF1 loader: its names are
the released layout) and scored on one corruptions file drawn once by
`experiments/fixed_corruptions.py draw` from a generator independent of both sides. It
prints, per side and seed, the discriminator loss over real tokens ([CLS]/[SEP] included,
as both trainers weigh it) pooled over tokens and as the mean of per-sequence means (the
official eval's definition), and the AUC over the scored tokens.

    python bench/official_same_corruptions.py \
        --runs=experiments/results/official_curves/pretrain \
        --corruptions=experiments/results/compute_matched_movies/intrinsic/corruptions.npz
"""

import argparse
import os
import statistics
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # local: the repo
for path in (REPO, os.path.join(REPO, "experiments")):
    if path not in sys.path:
        sys.path.insert(0, path)

import electra_tf  # noqa: E402,F401  (first: the version check; no TPU runtime load without chips)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import fixed_corruptions as fc  # noqa: E402
from electra_tf import fileio  # noqa: E402
from electra_tf.configs import load_config  # noqa: E402
from electra_tf.model.modeling import ElectraPretrainingModel  # noqa: E402
from electra_tf.pretraining import scoring  # noqa: E402
from electra_tf.training import checkpoints  # noqa: E402


def load(runs: str, side: str, seed: int, step: int, config: str):
    model_dir = fileio.join(runs, side, f"seed{seed}", "model")
    if side == "official":
        model = ElectraPretrainingModel(load_config(config).model)
        checkpoints.assign_arrays(model, checkpoints.read_tf1(
            fileio.join(model_dir, f"model.ckpt-{step}")))
        return model
    return scoring.load_run(model_dir, fileio.join(model_dir, f"ckpt-{step}"))[1]


def losses(model, arrays, scored, batch: int = 32):
    tensors = [tf.constant(arrays[k].astype(np.int32))
               for k in ("input_ids", "input_mask", "segment_ids")]
    logits = np.concatenate([model.discriminator(*(t[i:i + batch] for t in tensors)).numpy()
                             for i in range(0, len(arrays["input_ids"]), batch)])
    y, w = arrays["labels"].astype(np.float64), arrays["input_mask"].astype(np.float64)
    bce = np.maximum(logits, 0) - logits * y + np.log1p(np.exp(-np.abs(logits)))
    pooled = float((bce * w).sum() / w.sum())
    per_sequence = float(((bce * w).sum(1) / np.maximum(w.sum(1), 1e-6)).mean())
    return pooled, per_sequence, fc.auc(logits[scored], y[scored])


def main(argv) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", required=True, help="official_curves.py's OUT/pretrain.")
    p.add_argument("--corruptions", required=True, help="A fixed_corruptions.py draw.")
    p.add_argument("--sides", default="official,ours_official_masking,ours")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--step", type=int, default=600)
    p.add_argument("--config", default="tiny")
    args = p.parse_args(argv)
    arrays, meta = fc.load_corruptions(args.corruptions)
    scored = fc.scored_tokens(arrays, meta["special_ids"])
    print(f"{args.corruptions}: {int(scored.sum())} scored tokens, judge "
          f"{meta['judge_model_dir']}")
    for side in args.sides.split(","):
        rows = []
        for seed in (int(s) for s in args.seeds.split(",")):
            rows.append(losses(load(args.runs, side, seed, args.step, args.config), arrays,
                               scored))
            print(f"{side} seed {seed}: disc_loss pooled {rows[-1][0]:.4f}, mean of "
                  f"sequences {rows[-1][1]:.4f}, AUC {rows[-1][2]:.4f}", flush=True)
        cols = list(zip(*rows))
        print(f"{side}: disc_loss pooled {statistics.fmean(cols[0]):.4f} ± "
              f"{statistics.stdev(cols[0]):.4f} (range {min(cols[0]):.4f}-{max(cols[0]):.4f}), "
              f"mean of sequences {statistics.fmean(cols[1]):.4f}, AUC "
              f"{statistics.fmean(cols[2]):.4f} ± {statistics.stdev(cols[2]):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
