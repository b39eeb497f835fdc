"""SavedModel export in TensorFlow Serving's layout: `<export_dir>/<task>/<version>/` the
task model (raw strings, tokenized in-graph, or token ids in; the task's answers out),
`<export_dir>/encoder/<version>/` the encoder alone (features for extraction)."""

import os
import time
from typing import Dict, Optional

import tensorflow as tf

from electra_tf import fileio
from electra_tf.finetune.model import FinetuningModel
from electra_tf.finetune.base_task import Task
from electra_tf.text import TextEncoder

TEXT_SIGNATURE = "serving_default"
IDS_SIGNATURE = "serve_token_ids"


def _ids_spec(max_seq_length: int) -> Dict[str, tf.TensorSpec]:
    return {name: tf.TensorSpec([None, max_seq_length], tf.int32, name=name)
            for name in ("input_ids", "input_mask", "segment_ids")}


def _hold(module: tf.Module, name: str, layer):
    """Keeps a Keras layer on `module` untracked, tracking its plain tf.Variables instead:
    Keras 3 would save a copy of each variable beside the one the functions read, and the
    session-based loader (TensorFlow Serving, `saved_model_cli run`) restores only the copy."""
    module.__dict__[name] = layer
    setattr(module, f"{name}_variables", [v.value for v in layer.variables])


class TaskServer(tf.Module):
    """The task model with its tokenizer; `serve_text` and `serve_ids` are the signatures."""

    def __init__(self, task: Task, model: FinetuningModel, encoder: TextEncoder,
                 max_seq_length: int):
        super().__init__(name="task_server")
        _hold(self, "model", model)
        self.task, self.encoder = task, encoder
        self.max_seq_length = max_seq_length

    def serve_text(self, **texts) -> Dict[str, tf.Tensor]:
        names = sorted(texts)  # every text field has one string per request row
        for name in names[1:]:
            tf.debugging.assert_equal(tf.shape(texts[name])[0], tf.shape(texts[names[0]])[0],
                                      message=f"{names[0]} and {name} must have the same "
                                              "number of rows")
        return self.task.serve_text(self.model, self.encoder, self.max_seq_length, texts)

    def serve_ids(self, **batch) -> Dict[str, tf.Tensor]:
        return self.task.serve_ids(self.model, batch)

    def signatures(self):
        text_spec = {name: tf.TensorSpec([None], tf.string, name=name)
                     for name in self.task.text_fields()}
        text_fn = tf.function(lambda **kw: self.serve_text(**kw))
        ids_fn = tf.function(lambda **kw: self.serve_ids(**kw))
        return {TEXT_SIGNATURE: text_fn.get_concrete_function(**text_spec),
                IDS_SIGNATURE: ids_fn.get_concrete_function(**_ids_spec(self.max_seq_length))}


class EncoderServer(tf.Module):
    """The encoder alone: sequence output [N, L, H] and the [CLS] vector [N, H]."""

    def __init__(self, model: FinetuningModel, encoder: TextEncoder, max_seq_length: int):
        super().__init__(name="encoder_server")
        _hold(self, "electra", model.electra)
        self.encoder = encoder
        self.max_seq_length = max_seq_length

    def _outputs(self, batch):
        hidden = tf.cast(self.electra(batch["input_ids"], batch["input_mask"],
                                      batch["segment_ids"], training=False), tf.float32)
        return {"sequence_output": hidden, "cls_output": hidden[:, 0],
                "input_mask": batch["input_mask"], "input_ids": batch["input_ids"]}

    def signatures(self):
        text_fn = tf.function(
            lambda text: self._outputs(self.encoder.encode(text, None, self.max_seq_length)))
        ids_fn = tf.function(lambda **batch: self._outputs(batch))
        return {TEXT_SIGNATURE: text_fn.get_concrete_function(
                    tf.TensorSpec([None], tf.string, name="text")),
                IDS_SIGNATURE: ids_fn.get_concrete_function(**_ids_spec(self.max_seq_length))}


def _write(module: tf.Module, signatures, directory: str, assets: Dict[str, str]):
    tf.saved_model.save(module, directory, signatures=signatures)
    for name, text in assets.items():
        fileio.write_atomic(fileio.join(directory, "assets.extra_" + name), text)


def _save(module: tf.Module, signatures, directory: str, assets: Dict[str, str]) -> str:
    """Writes the SavedModel and its assets so that no reader (Serving polls) loads a
    half-written version: locally into a sibling renamed into place; elsewhere (gs://...,
    where a rename copies each file) staged locally, then copied `saved_model.pb` last."""
    if not fileio.is_remote(directory):
        tmp = directory + ".tmp"
        fileio.rmtree(tmp)
        _write(module, signatures, tmp, assets)
        fileio.rmtree(directory)
        fileio.rename(tmp, directory, overwrite=False)
    else:
        with fileio.local_staging_dir("electra-export-") as staging:
            _write(module, signatures, staging, assets)
            fileio.rmtree(directory)
            fileio.copy_tree(staging, directory, last=["saved_model.pb"])
    return directory


def export(task: Task, model: FinetuningModel, encoder: TextEncoder, max_seq_length: int,
           export_dir: str, version: Optional[int] = None) -> Dict[str, str]:
    """Writes the task SavedModel and the encoder SavedModel; returns their paths."""
    version = int(time.time()) if version is None else int(version)
    server = TaskServer(task, model, encoder, max_seq_length)
    task_dir = _save(server, server.signatures(),
                     os.path.join(export_dir, task.name, str(version)), task.assets())
    enc = EncoderServer(model, encoder, max_seq_length)
    enc_dir = _save(enc, enc.signatures(), os.path.join(export_dir, "encoder", str(version)),
                    {})
    return {"task": task_dir, "encoder": enc_dir}
