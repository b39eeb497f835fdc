"""The fine-tuning model: the discriminator encoder (`electra/...`) plus one task head
(`task_specific/...`, as the paper's Appendix and the official code), the encoder's
initialisation and the layer-wise learning rates. The layers are `keras.ops` (any backend);
initialisation from a checkpoint reads files through TensorFlow, imported where it is used."""

import re
from typing import Dict

import keras
from absl import logging
from keras import ops

from electra_tf import kernels as K
from electra_tf import rng
from electra_tf.configs import ModelConfig
from electra_tf.model.modeling import (Encoder, build_discriminator_encoder, dropout, gelu,
                                      tf1_variables, truncated_normal)

HEAD_SCOPE = "task_specific"
_NEG = -1e4  # masked logits; float32, so safe under every precision
# The head's dropout seeds: `rng.fold(step seed, HEAD_STREAM)`, apart from the encoder's.
HEAD_STREAM = 7919


def _dense(units, config: ModelConfig, name, activation=None, dtype=None):
    return keras.layers.Dense(units, activation=activation, name=name, dtype=dtype,
                              kernel_initializer=truncated_normal(config.initializer_range))


class DenseHead(keras.layers.Layer):
    """[CLS] -> dropout -> dense(num_outputs) for classification and regression, logits
    [B, num_outputs]; with `every_token` (tagging) every token -> dropout -> dense, logits
    [B, L, num_labels], the labels sitting on first sub-tokens. Logits in float32."""

    def __init__(self, config: ModelConfig, num_outputs: int, every_token: bool = False,
                 **kwargs):
        super().__init__(**kwargs)
        self.config, self.every_token = config, every_token
        self.classifier = _dense(num_outputs, config, "classifier", dtype=self.dtype_policy)

    def build(self, input_shape=None):
        width = self.config.hidden_size
        self.classifier.build((None, None, width) if self.every_token else (None, width))

    def call(self, hidden, batch, training=False, seed=None):
        x = hidden if self.every_token else hidden[:, 0]
        x = dropout(x, self.config.hidden_dropout_prob, training, seed)
        return {"logits": ops.cast(self.classifier(x), "float32")}


def answer_mask(batch):
    """[B, L] 1.0 where an answer may start or end: the passage (segment 1, not the final
    [SEP]) and the [CLS], which stands for "no answer in this window"."""
    mask = ops.cast(batch["input_mask"], "float32") * ops.cast(batch["segment_ids"], "float32")
    # The last real token is the closing [SEP].
    length = ops.sum(ops.cast(batch["input_mask"], "int32"), axis=1)
    last = ops.one_hot(length - 1, ops.shape(mask)[1], dtype="float32")
    cls = ops.one_hot(ops.zeros_like(length), ops.shape(mask)[1], dtype="float32")
    return ops.clip(mask - last + cls, 0.0, 1.0)


class QAHead(keras.layers.Layer):
    """The joint SQuAD head: start logits; end logits conditioned on a start token's hidden
    state (concat -> dense(512, gelu) -> dense(1)); a beam of `beam` starts x `beam` ends at
    inference; `answerable`: a no-answer logit from [CLS] and the start-weighted state."""

    def __init__(self, config: ModelConfig, beam: int = 20, answerable: bool = False,
                 **kwargs):
        super().__init__(**kwargs)
        self.config, self.beam, self.answerable = config, beam, answerable
        policy = self.dtype_policy
        self.start_logits = _dense(1, config, "start_logits", dtype=policy)
        self.end_dense = _dense(512, config, "end_logits_dense", activation=gelu, dtype=policy)
        self.end_logits = _dense(1, config, "end_logits", dtype=policy)
        if answerable:
            self.null_dense = _dense(512, config, "answer_class_dense", activation=gelu,
                                     dtype=policy)
            self.null_logit = _dense(1, config, "answer_class", dtype=policy)

    def build(self, input_shape=None):
        h = self.config.hidden_size
        self.start_logits.build((None, None, h))
        self.end_dense.build((None, None, 2 * h))
        self.end_logits.build((None, None, 512))
        if self.answerable:
            self.null_dense.build((None, 2 * h))
            self.null_logit.build((None, 512))

    def _end_logits(self, hidden, start_hidden, mask):
        """hidden [B, L, H], start_hidden [B, K, H] -> masked end logits [B, K, L]."""
        k, length = ops.shape(start_hidden)[1], ops.shape(hidden)[1]
        tiled = ops.tile(hidden[:, None], [1, k, 1, 1])
        starts = ops.tile(start_hidden[:, :, None], [1, 1, length, 1])
        x = self.end_dense(ops.concatenate([tiled, starts], axis=-1))
        logits = ops.cast(ops.squeeze(self.end_logits(x), -1), "float32")
        return logits + (1.0 - mask[:, None]) * _NEG

    def call(self, hidden, batch, training=False, seed=None):
        hidden = dropout(hidden, self.config.hidden_dropout_prob, training, seed)
        mask = answer_mask(batch)
        start_logits = ops.cast(ops.squeeze(self.start_logits(hidden), -1), "float32")
        start_logits += (1.0 - mask) * _NEG
        out = {"start_logits": start_logits}
        if training or "start_positions" in batch:
            # Teacher forcing: the end is conditioned on the gold start.
            gold = K.gather_slots(hidden, ops.cast(batch["start_positions"], "int32")[:, None])
            out["end_logits"] = self._end_logits(hidden, gold, mask)[:, 0]
        if not training:
            start_log_probs = ops.log_softmax(start_logits)
            length = ops.shape(start_logits)[1]
            k = min(self.beam, length) if isinstance(length, int) else ops.minimum(self.beam,
                                                                                  length)
            top_start, top_index = ops.top_k(start_log_probs, k)
            start_hidden = K.gather_slots(hidden, top_index)
            end_log_probs = ops.log_softmax(self._end_logits(hidden, start_hidden, mask))
            top_end, end_index = ops.top_k(end_log_probs, k)
            out.update(start_top_log_probs=top_start, start_top_index=top_index,
                       end_top_log_probs=top_end, end_top_index=end_index)
        if self.answerable:
            start_p = ops.softmax(start_logits)
            weighted = ops.einsum("bl,blh->bh", start_p, ops.cast(hidden, "float32"))
            feats = ops.concatenate([ops.cast(hidden[:, 0], "float32"), weighted], axis=-1)
            x = self.null_dense(ops.cast(feats, self.compute_dtype))
            out["null_logit"] = ops.cast(ops.squeeze(self.null_logit(x), -1), "float32")
        return out


class FinetuningModel(keras.Model):
    """The `electra` encoder + a `task_specific` head: the batch dict in, float32 tensors out."""

    def __init__(self, config: ModelConfig, head: keras.layers.Layer, dtype=None,
                 name="electra_finetuning", **kwargs):
        super().__init__(name=name, dtype=dtype, **kwargs)
        config.check()
        self.config = config
        self.electra = build_discriminator_encoder(config, self.dtype_policy)
        self.head = head
        with keras.name_scope(HEAD_SCOPE):
            head.build()
        self.built = True

    def call(self, batch, training=False, seed=None):
        hidden = self.electra(batch["input_ids"], batch["input_mask"], batch["segment_ids"],
                              training=training, seed=seed)
        return self.head(hidden, batch, training=training, seed=rng.fold(seed, HEAD_STREAM))


def make_head(kind: str, config: ModelConfig, num_outputs: int = 1, beam: int = 20,
              answerable: bool = False, dtype=None) -> keras.layers.Layer:
    if kind in ("classification", "regression", "tagging"):
        return DenseHead(config, num_outputs, kind == "tagging", name="head", dtype=dtype)
    if kind == "qa":
        return QAHead(config, beam=beam, answerable=answerable, name="head", dtype=dtype)
    raise ValueError(f"unknown head kind {kind!r}")


# --------------------------------------------------------------------------- init

class InitError(ValueError):
    """An --init_checkpoint that does not fit the encoder, or none (unreadable: ConvertError)."""


class ModelMismatchError(InitError):
    """The init checkpoint holds a model of another size than the config."""


# assign_arrays' error for a checkpoint value of another shape than its variable.
_SHAPES = re.compile(r"(\S+): shape (\[[^\]]*\]) != variable shape (\[[^\]]*\])")


def init_encoder(encoder: Encoder, path: str) -> str:
    """Loads the discriminator encoder from any `conversion.source` checkpoint (ignoring
    the generator, the pooler and the pre-training heads); returns the checkpoint used."""
    from electra_tf.conversion import source  # TensorFlow's file layer and checkpoints
    from electra_tf.training.checkpoints import assign_arrays

    src = source.resolve(path, encoder.config, "--init_checkpoint")
    try:
        assign_arrays(encoder, src.arrays(tf1_variables(encoder)))
    except ValueError as e:
        mismatch = _SHAPES.search(str(e))
        if mismatch is None:
            raise InitError(f"--init_checkpoint {src.path}: {str(e).splitlines()[0]}") from None
        name, theirs, ours = mismatch.groups()
        config = encoder.config
        raise ModelMismatchError(
            f"--init_checkpoint {path} does not fit the model config: {name} is {theirs} in "
            f"the checkpoint but {ours} in the model (hidden_size={config.hidden_size}, "
            f"embedding_size={config.embedding_size}, "
            f"num_hidden_layers={config.num_hidden_layers})") from None
    if src.ignored:
        logging.info("--init_checkpoint %s: ignored %d parameters not in the encoder: %s",
                     path, len(src.ignored), ", ".join(src.ignored))
    return src.path


# --------------------------------------------------------------------------- layer-wise lr

_LAYER = re.compile(r"(?:^|/)encoder/layer_(\d+)/")


def layer_depth(path: str, num_layers: int, official_bug: bool = False) -> int:
    """Depth of a variable: 0 embeddings (and their projection), i + 1 encoder layer i,
    num_layers + 1 the task head (num_layers + 2 with `official_bug`, the official code's
    gap that gives the top encoder layer decay^2 instead of decay^1)."""
    match = _LAYER.search(path)
    if match:
        return int(match.group(1)) + 1
    if path.startswith(HEAD_SCOPE + "/") or f"/{HEAD_SCOPE}/" in path:
        return num_layers + (2 if official_bug else 1)
    if "/embeddings" in path or path.startswith("electra/embeddings"):
        return 0
    raise ValueError(f"no layer depth for variable {path!r}")


def layerwise_lr_multipliers(model: FinetuningModel, decay: float,
                             official_bug: bool = False) -> Dict[str, float]:
    """{variable path: decay ** (top - depth)}: the head at the full rate, below x decay a layer."""
    n = model.config.num_hidden_layers
    top = n + (2 if official_bug else 1)
    return {v.path: float(decay) ** (top - layer_depth(v.path, n, official_bug))
            for v in model.trainable_variables}

