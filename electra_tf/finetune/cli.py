"""What `run_finetuning.py` does with its flags: resolve the task, the model config, the
checkpoint and the vocabulary, run, and for the bundled demo answer one request."""

import dataclasses
import json
import os
from typing import Optional

from absl import logging

from electra_tf import backend, configs, fileio, text
from electra_tf.conversion import source
from electra_tf.conversion.formats import ConvertError
from electra_tf.training import loop
from electra_tf.finetune import DataError
from electra_tf.finetune.model import InitError, ModelMismatchError
from electra_tf.finetune.tasks import get_task
from electra_tf.finetune.trainer import run
from electra_tf.training.options import FinetuneOptions, options_from_flags

USER_ERRORS = loop.USER_ERRORS + (DataError, InitError, ConvertError)
DEFAULT_PRETRAIN_DIR = os.path.join("runs", "pretrain_tiny")
DEMO_REQUEST = "a gripping , beautifully acted and thoroughly enjoyable film ."
# The demo's data (8,568 / 2,000 human-rated movie snippets, data/README.md) and recipe.
DEMO_DATA = os.path.join("data", "movie_snippets")
DEMO_CONFIG = os.path.join("configs", "finetune", "demo.json")


def find_config(init_checkpoint: Optional[str], config: Optional[str]) -> configs.ModelConfig:
    """--config if given, else the config.json of the Hugging Face directory or pre-training run of
    the checkpoint (`conversion.source`; sizes inferred from shapes alone are not trusted)."""
    given = configs.load_config(config).model if config else None
    if init_checkpoint:
        src = source.resolve(init_checkpoint, given, "--init_checkpoint")
        if given or src.config_file:
            return given or src.config
    elif given:
        return given
    raise configs.ConfigError(f"no config.json found near --init_checkpoint="
                              f"{init_checkpoint}; give the model size with --config")


def demo_request(export_path: str, text: str = DEMO_REQUEST) -> dict:
    """Loads the exported SavedModel and classifies one raw string with it."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the in-graph tokenizer's ops)
    served = tf.saved_model.load(export_path)
    out = served.signatures["serving_default"](sentence=tf.constant([text]))
    decode = lambda x: x.decode("utf-8", "replace") if isinstance(x, bytes) else x
    # Sorted: a loaded signature's outputs come in an order that varies between processes.
    return {k: [decode(x) for x in out[k].numpy().tolist()] for k in sorted(out)}


def _scores(results: dict) -> str:
    return ", ".join(f"{s:.4f}" for s in results["scores"])


def use_tfds(data_source: str, tfds_data_dir: Optional[str]) -> bool:
    """--data_source: files | tfds | auto (tfds exactly when --tfds_data_dir is given)."""
    if data_source == "files" and tfds_data_dir:
        raise configs.ConfigError("--tfds_data_dir reads tensorflow-datasets data: it "
                                  "contradicts --data_source=files")
    if data_source not in ("auto", "files", "tfds"):
        raise configs.ConfigError(f"--data_source={data_source} is not auto, files or tfds")
    return data_source == "tfds" or (data_source == "auto" and bool(tfds_data_dir))


def main(flags, repo: str) -> dict:
    demo = flags.task == "polarity" and flags.data_dir is None
    data_dir = flags.data_dir or os.path.join(repo, DEMO_DATA if demo else "data")
    labels = [] if flags.labels == [""] else flags.labels
    task = get_task(flags.task, data_dir, flags.text_columns, flags.label_column, labels,
                    flags.metric)
    init = flags.init_checkpoint
    if init is None:
        init = DEFAULT_PRETRAIN_DIR
        if not fileio.isdir(init):
            raise InitError(f"no --init_checkpoint and no {init}/ from the pre-training demo: "
                            "run `python run_pretraining.py` first, or pass --init_checkpoint")
    if init.lower() == "none":  # a random-init baseline
        init = None
        if not flags.config:
            raise configs.ConfigError("--init_checkpoint=none needs --config (the model size)")
    baseline = flags.untrained_baseline
    if baseline is None:  # default: on for the bundled demo
        baseline = demo and init is not None
    if baseline and init is None:
        raise configs.ConfigError("--untrained_baseline compares a checkpoint with random "
                                  "initialisation: it contradicts --init_checkpoint=none")
    model_config = find_config(init, flags.config)
    if use_tfds(flags.data_source, flags.tfds_data_dir):
        backend.require_tensorflow("--data_source=tfds (tensorflow-datasets)")
        from electra_tf.finetune.tfds_data import from_tfds
        task = from_tfds(task, flags.tfds_data_dir)
    model_dir = flags.model_dir or os.path.join("runs", f"finetune_{task.name}")
    export_dir = flags.export_dir or (os.path.join(model_dir, "export") if demo else None)
    # Without TensorFlow the demo trains and scores, and says why it exports nothing.
    skipped = None if flags.export_dir or not demo else backend.tensorflow_missing(
        "the demo's SavedModel export")
    if skipped:
        export_dir = None
    cfg = configs.config_from_flags(flags, configs.FinetuneConfig,
                                    os.path.join(repo, DEMO_CONFIG) if demo else None)
    tokenizer = dict(vocab_file=flags.vocab_file, spm_model=flags.spm_model,
                     do_lower_case=flags.do_lower_case)
    if flags.vocab_file is None and flags.spm_model is None:
        # The vocabulary and casing the checkpoint was trained with, when it records them
        # (our runs, keras-hub presets, Hugging Face directories), else BERT's uncased one.
        found = text.find_run_vocab(init) if init else None
        if found:
            tokenizer = found.flags()
            logging.info("Vocabulary of %s: %s (%s, %s)", init, found.path, found.kind,
                         "lower-cased" if found.do_lower_case else "cased")
        else:
            tokenizer["vocab_file"] = os.path.join(repo, "data", "vocab",
                                                   "bert_uncased_vocab.txt")
    options = options_from_flags(flags, FinetuneOptions, data_dir=data_dir,
                                 model_dir=model_dir, init_checkpoint=init,
                                 export_dir=export_dir, **tokenizer)
    try:
        results = run(task, model_config, cfg, options)
    except ModelMismatchError as e:
        hint = (f"--config={flags.config} is not the size the checkpoint was pre-trained "
                "with: drop --config (the run's config.json beside the checkpoint gives the "
                "size) or give the config it was trained with" if flags.config else
                "give the config it was pre-trained with by --config")
        raise ModelMismatchError(f"{e}; {hint}") from None
    summary = (f"{task.name} dev {results['metric']}: median {results['median']:.4f} over "
               f"{len(results['scores'])} trial(s) ({_scores(results)})")
    if baseline:  # the same recipe and seeds from random initialisation, in a subfolder
        untrained = run(task, model_config, cfg, dataclasses.replace(
            options, init_checkpoint=None, export_dir=None, do_predict=False,
            model_dir=os.path.join(model_dir, "untrained")))
        results["untrained"] = {k: untrained[k] for k in ("median", "scores")}
        summary += (f"; untrained (random initialisation, same recipe): median "
                    f"{untrained['median']:.4f} ({_scores(untrained)})")
    paths = [os.path.join(model_dir, "results.json")] + (
        [os.path.join(model_dir, "untrained", "results.json")] if baseline else [])
    print(f"{summary}; results in {' and '.join(paths)}")
    if skipped:
        print(f"skipped: {skipped}")
    for path in results.get("predictions", {}).values():
        print(f"test predictions: {path}")
    if demo and "export" in results:
        answer = demo_request(results["export"]["task"])
        logging.info("Served by %s", results["export"]["task"])
        print(f"SavedModel answer for {DEMO_REQUEST!r}: {json.dumps(answer)}")
        results["demo_answer"] = answer
    return results
