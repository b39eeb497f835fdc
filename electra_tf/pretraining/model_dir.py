"""A pre-training model_dir <-> a released (TF1, name-based) checkpoint. Importing one
writes a model_dir that `run_pretraining.py` continues (weights, Adam slots, global_step:
the TensorFlow runtime's object graph of a pre-training job, hence here). Reading either is `conversion.source`; the
command line is `python -m electra_tf.conversion.convert {import-tf1,export-tf1}`."""

import os
from typing import Dict, Optional, Tuple

import tensorflow as tf

from electra_tf import fileio
from electra_tf.conversion.formats import ConvertError, Report, pretraining_config
from electra_tf.conversion.source import inspect_tf1, resolve
from electra_tf.model.modeling import tf1_name, tf1_variables
from electra_tf.pretraining.trainer import make_pretrainer
from electra_tf.training import checkpoints
from electra_tf.training.tf_runtime.devices import TfDevices


def _named_variables(trainer) -> Dict[str, object]:
    """{TF1 name: variable} for the weights, their Adam slots and global_step."""
    out = dict(tf1_variables(trainer.model))
    for key, slot in trainer.optimizer.slot_variables().items():
        base, suffix = key.rsplit("/", 1)
        out[f"{tf1_name(base)}/{suffix}"] = slot
    out["global_step"] = trainer.global_step
    return out


def tf1_to_model_dir(ckpt_path: str, model_dir: str, base: Optional[str] = None,
                     overrides: Optional[str] = None, num_heads: Optional[int] = None,
                     allow_missing: bool = False) -> Tuple[Report, str]:
    """Writes `model_dir/config.json` and a training checkpoint (`ckpt-<step>`) that
    `run_pretraining.py --model_dir=model_dir --config=model_dir/config.json` continues: weights,
    Adam slots (else zeros), global_step (else 0). Returns (report, checkpoint path)."""
    if fileio.isdir(model_dir) and checkpoints.find_checkpoints(model_dir):
        raise ConvertError(f"{model_dir} already holds a checkpoint; refusing to overwrite")
    report = inspect_tf1(ckpt_path, num_heads)
    if report.missing and not allow_missing:
        raise ConvertError(f"{len(report.missing)} model variables are not in the checkpoint "
                           f"(first: {report.missing[0]}); pass --allow_missing to keep their "
                           "random init")
    cfg = pretraining_config(report.config, base, overrides)
    trainer = make_pretrainer(cfg, TfDevices(tf.distribute.get_strategy()))
    src = resolve(ckpt_path, report.config)
    for name, var in _named_variables(trainer).items():
        if name in src.shapes:
            if src.shapes[name] != tuple(var.shape):
                raise ConvertError(f"{name}: checkpoint shape {list(src.shapes[name])} != "
                                   f"expected {list(var.shape)}")
            var.assign(tf.cast(src.read(name), var.dtype))
    fileio.makedirs(model_dir)
    fileio.write_json_atomic(os.path.join(model_dir, "config.json"), cfg.to_json())
    # The checkpoint state file the manager writes after the checkpoint marks completion.
    manager = trainer.checkpoint_manager(model_dir, max_to_keep=1)
    return report, manager.save(checkpoint_number=trainer.step)


def model_dir_to_tf1(model_dir: str, prefix: str, include_optimizer: bool = False) -> str:
    """Our training checkpoint -> a name-based checkpoint with the released names
    (weights and global_step; the `<var>/adam_m|v` slots too with `include_optimizer`).
    A GDES run exports the released untied layout (the discriminator's tables folded)."""
    src = resolve(model_dir, what="MODEL_DIR")
    if include_optimizer and src.kind == "gdes":
        raise ConvertError("--include_optimizer: the optimizer state of a GDES run's "
                           "embedding deltas has no released layout; export the weights alone")
    return checkpoints.write_tf1(src.arrays(slots=include_optimizer), prefix)
