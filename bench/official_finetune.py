"""The official ELECTRA fine-tuning code on a sentence task, from any discriminator (issue 30).

Runs google-research/electra's `run_finetuning.py` (TF1 Estimator code, from --official_dir;
nothing of it is copied here) under TensorFlow <= 2.15 through the launcher that
`bench/official_curves.py` writes (its shims: contrib's layer_norm, a graph seed, Python's
`random` seed), pointed at `run_finetuning.py` instead of `run_pretraining.py`. The task
is a `sentence<TAB>label` TSV pair (--data_dir/polarity/{train,dev}.tsv, the layout
`experiments/movie_snippets.py` and `experiments/transfer_study.py` write), fine-tuned as the
official code's SST-2 task (the same file layout, labels 0/1).

    python bench/official_finetune.py --official_dir=/path/to/electra \\
        --official_python=/path/to/tf2.15-venv/bin/python --data_dir=TASK_DIR \\
        --model=ours=runs/pretrain_tiny/discriminator --model=random=none --out_dir=OUT

The official fine-tuning code imports scipy and scikit-learn besides TensorFlow:
`V/bin/pip install tensorflow-cpu==2.15.1 scipy scikit-learn` makes the venv.

Each `--model=NAME=PATH` is a TF1-named checkpoint (a prefix, or a directory with a
`checkpoint` file: our runs' `discriminator/` export, the official trainer's model dir, a
released model) or `none` (the official code's own random initialisation). Sizes come
from --config (our preset or JSON). Each trial is one process with graph seed = trial
number (the official code seeds nothing itself, so its trials in one process are not
independent draws). Prints and writes OUT/results.json: the dev accuracy of every trial.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
from typing import Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import importlib.util  # noqa: E402

import tensorflow as tf  # noqa: E402

from electra_tf import configs, fileio  # noqa: E402

_spec = importlib.util.spec_from_file_location(  # bench/official_curves.py: the launcher
    "official_curves", os.path.join(REPO, "bench", "official_curves.py"))
official_curves = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(official_curves)

ACCURACY = re.compile(r"sst: accuracy: ([\d.]+)")


def launcher_source() -> str:
    """official_curves' launcher, running run_finetuning.py instead of run_pretraining.py."""
    old = '"run_pretraining.py")'
    if old not in official_curves.LAUNCHER_SOURCE:
        raise SystemExit("official_finetune: bench/official_curves.py's launcher changed")
    return official_curves.LAUNCHER_SOURCE.replace(old, '"run_finetuning.py")')


def finetune_hparams(model: Dict, *, init_checkpoint, max_seq_length: int, epochs: float,
                     learning_rate: float, layerwise_lr_decay: float, batch_size: int
                     ) -> Dict:
    """configure_finetuning.FinetuningConfig hyper-parameters for our model config `model`
    (ModelConfig as JSON): every size explicit; init_checkpoint None = random init."""
    return {
        "model_size": "small", "task_names": ["sst"],
        "model_hparam_overrides": {
            k: model[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                  "intermediate_size", "hidden_dropout_prob",
                                  "attention_probs_dropout_prob", "max_position_embeddings",
                                  "type_vocab_size", "initializer_range")},
        "embedding_size": model["embedding_size"], "vocab_size": model["vocab_size"],
        "learning_rate": learning_rate, "layerwise_lr_decay": layerwise_lr_decay,
        "num_train_epochs": float(epochs), "max_seq_length": max_seq_length,
        "train_batch_size": batch_size, "eval_batch_size": batch_size, "num_trials": 1,
        "keep_all_models": False, "init_checkpoint": init_checkpoint,
        "use_tfrecords_if_existing": False,
    }


def checkpoint_files(path: str) -> List[str]:
    """The files of a TF1 checkpoint: `path` a prefix, or a directory's latest."""
    if not fileio.exists(path + ".index"):
        state = fileio.join(path, "checkpoint")
        if not fileio.exists(state):
            raise SystemExit(f"official_finetune: {path}: neither a checkpoint prefix nor a "
                             "directory with a checkpoint file")
        name = re.search(r'model_checkpoint_path: "([^"]+)"',
                         fileio.read_bytes(state).decode()).group(1)
        path = name if name.startswith("/") or "://" in name else fileio.join(path, name)
    folder, base = os.path.split(path)
    return [fileio.join(folder, f) for f in tf.io.gfile.listdir(folder)
            if f == base + ".index" or f.startswith(base + ".data-")]


def run_trial(args, name: str, path: str, trial: int, model_cfg: Dict) -> float:
    """One official fine-tuning run; returns its dev accuracy (0-1)."""
    work = fileio.join(args.out_dir, name, f"trial{trial}")
    if fileio.exists(work):
        tf.io.gfile.rmtree(work)
    models = fileio.join(work, "models", name)
    fileio.makedirs(fileio.join(work, "finetuning_data", "sst"))
    fileio.makedirs(models)
    for split in ("train", "dev"):
        tf.io.gfile.copy(fileio.join(args.data_dir, "polarity", f"{split}.tsv"),
                         fileio.join(work, "finetuning_data", "sst", f"{split}.tsv"))
    tf.io.gfile.copy(args.vocab_file, fileio.join(models, "vocab.txt"))
    init = None
    if path != "none":
        for f in checkpoint_files(path):
            tf.io.gfile.copy(f, fileio.join(models, os.path.basename(f)))
        prefix = [f for f in tf.io.gfile.listdir(models) if f.endswith(".index")][0]
        init = fileio.join(models, prefix[:-len(".index")])
    hparams = finetune_hparams(model_cfg, init_checkpoint=init,
                               max_seq_length=args.max_seq_length, epochs=args.epochs,
                               learning_rate=args.learning_rate,
                               layerwise_lr_decay=args.layerwise_lr_decay,
                               batch_size=args.batch_size)
    hparams_path = fileio.join(work, "hparams.json")
    fileio.write_json_atomic(hparams_path, hparams)
    launcher = official_curves.launcher_path(args.out_dir)
    cmd = [args.official_python, launcher, args.official_dir, str(trial),
           fileio.join(work, "info.json"), "--", "--data-dir", work, "--model-name", name,
           "--hparams", hparams_path]
    log = fileio.join(args.out_dir, f"{name}_trial{trial}.log")
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    fileio.write_atomic(log, proc.stdout)
    found = ACCURACY.findall(proc.stdout.decode("utf-8", errors="replace"))
    if proc.returncode or not found:
        raise SystemExit(f"official_finetune: {name} trial {trial} failed (exit "
                         f"{proc.returncode}); log: {log}")
    if fileio.exists(fileio.join(models, "finetuning_models")):
        tf.io.gfile.rmtree(fileio.join(models, "finetuning_models"))
    return float(found[-1]) / 100.0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--official_dir", required=True)
    p.add_argument("--official_python", required=True)
    p.add_argument("--data_dir", required=True, help="Holds polarity/{train,dev}.tsv")
    p.add_argument("--model", action="append", required=True, help="NAME=PATH or NAME=none")
    p.add_argument("--config", default="tiny", help="Our preset or JSON: the model sizes")
    p.add_argument("--vocab_file", default=os.path.join(REPO, "data", "vocab",
                                                        "bert_uncased_vocab.txt"))
    p.add_argument("--max_seq_length", type=int, default=64)
    p.add_argument("--epochs", type=float, default=10)
    p.add_argument("--learning_rate", type=float, default=3e-4)
    p.add_argument("--layerwise_lr_decay", type=float, default=0.8)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--out_dir", required=True)
    args = p.parse_args(argv)
    fileio.makedirs(args.out_dir)
    fileio.write_atomic(official_curves.launcher_path(args.out_dir), launcher_source())
    model_cfg = configs.load_config(args.config).to_json()["model"]
    results_path = fileio.join(args.out_dir, "results.json")
    results = fileio.read_json(results_path) if fileio.exists(results_path) else {}
    for spec in args.model:
        name, _, path = spec.partition("=")
        scores = [run_trial(args, name, path, t, model_cfg) for t in range(1, args.trials + 1)]
        results[name] = {"path": path, "scores": scores, "mean": statistics.fmean(scores)}
        print(f"official_finetune: {name}: dev accuracy {statistics.fmean(scores):.4f} "
              f"({', '.join(f'{s:.4f}' for s in scores)})", flush=True)
        fileio.write_json_atomic(results_path, results, sort_keys=True)


if __name__ == "__main__":
    main()
