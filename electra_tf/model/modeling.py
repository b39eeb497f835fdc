"""The ELECTRA generator and discriminator as Keras 3 layers, in `keras.ops`: the same code
runs under the TensorFlow and the JAX backend (`KERAS_BACKEND`); what differs per backend is
in `electra_tf.kernels`.

Layout and initialisation follow the released TF1 code, and the layers are *named* so
that every Keras ``variable.path`` IS the variable's name in the released TF1
checkpoints, e.g.::

    electra/embeddings/word_embeddings                       [V, E]
    electra/embeddings_project/kernel                        [E, H]   (E != H only)
    electra/encoder/layer_3/attention/self/query/kernel      [H, H]
    generator/encoder/layer_3/intermediate/dense/kernel      [h, 4h]
    generator_predictions/output_bias                        [V]
    discriminator_predictions/dense_1/kernel                 [H, 1]
    generator_ltr/encoder/layer_0/attention/self/key/kernel  [h, h]   (two-tower generator)
    cloze_predictions/dense/kernel                           [2h, E]  (two-tower generator)

(`tf1_variables` returns that map; the paths are the same on every backend.) Variables are
created on construction (every size is in the config): on TensorFlow, construct the model
inside ``strategy.scope()``.

Numerics: Dense layers and attention matmuls run in the compute dtype (the Keras dtype
policy, e.g. ``mixed_bfloat16``); LayerNorm, the embedding sum, the attention mask and
softmax run in float32; all logits are float32. `dropout` is a function of a seed
(`electra_tf.rng`), not Keras' ``Dropout``, whose per-layer SeedGenerator state variable is
awkward under tf.distribute and would make a step's masks depend on state."""

import math
import re
import weakref
from typing import Dict, List, Optional, Sequence, Tuple

import keras
import numpy as np
from keras import ops

from electra_tf import kernels as K
from electra_tf import rng
from electra_tf.configs import ModelConfig
from electra_tf.kernels import gelu  # the backend's exact GELU (also the heads')

# First path component of every pre-training variable (the released checkpoints' scopes).
TF1_ROOTS = ("electra", "generator", "generator_predictions", "discriminator_predictions",
             "mlm_predictions", "sampling_predictions", "adversarial_baseline",  # `HEADS`
             "generator_ltr", "generator_rtl", "cloze_predictions")  # two-tower generator
HEADS = ("mlm", "sampling", "baseline")  # optional heads (`ElectraPretrainingModel`)

_MASK_ADDER = -10000.0  # as the TF1 code; applied in float32, so safe for fp16 too


def dropout(x, rate: float, training: bool, seed=None, rows_of=None):
    """Inverted dropout, the mask drawn in float32 and applied in x's dtype. With a `seed`
    ([3] int32, `electra_tf.rng`) the mask is a pure function of it (a step is reproducible,
    a resumed run redraws the same masks); without one, the backend's global random state.
    `rows_of` (batch, length): x is the [B * L, H] rows of a [B, L] batch, whose mask is
    drawn per example as for [B, L, H] (the draw is keyed by the batch's rows)."""
    if not training or rate <= 0.0:
        return x
    if seed is None:
        u = K.unseeded_uniform(K.dynamic_shape(x))
    elif rows_of is not None:
        dims = [*rows_of, x.shape[-1]]
        if not all(isinstance(d, int) for d in dims):
            dims = ops.stack([ops.cast(d, "int32") for d in dims])
        u = ops.reshape(rng.dropout_uniform(dims, seed), K.dynamic_shape(x))
    else:
        u = rng.dropout_uniform(K.dynamic_shape(x), seed)
    keep = u >= rate
    return x * ops.cast(keep, x.dtype) * ops.cast(1.0 / (1.0 - rate), x.dtype)


def reference_attention(q, k, v, bias, seed=None, rate: float = 0.0, training: bool = False):
    """The attention of `TransformerLayer`: softmax(q k^T + bias) in float32, dropout on
    the probabilities (its draw from `seed`), times v; q already scaled, [B, N, L, D];
    bias [B, 1, 1, L] or [B, 1, L, L]. A backend's fused kernel (`K.fused_attention`) is
    held to it."""
    scores = K.matmul_nt(q, k)  # [B, N, L, L]
    probs = ops.softmax(ops.cast(scores, "float32") + bias, axis=-1)
    probs = dropout(ops.cast(probs, v.dtype), rate, training, seed)
    return ops.matmul(probs, v)  # [B, N, L, D]


def truncated_normal(stddev: float):
    return keras.initializers.TruncatedNormal(stddev=stddev)


class LayerNorm(keras.layers.Layer):
    """LayerNorm over the last axis with TF1 names `gamma`/`beta`, computed in float32:
    `call(x, residual=None)` normalises `x + residual` (summed in float32) -> compute dtype."""

    def __init__(self, size: int, epsilon: float = 1e-12, **kwargs):
        kwargs.setdefault("name", "LayerNorm")
        super().__init__(autocast=False, **kwargs)
        self.size = int(size)
        self.epsilon = float(epsilon)

    def build(self, input_shape=None):
        self.gamma = self.add_weight(name="gamma", shape=(self.size,), initializer="ones",
                                     autocast=False)
        self.beta = self.add_weight(name="beta", shape=(self.size,), initializer="zeros",
                                    autocast=False)

    def call(self, x, residual=None):
        x = ops.cast(x, "float32")
        if residual is not None:
            x = x + ops.cast(residual, "float32")
        mean = K.mean_last(x)
        centered = x - mean
        variance = K.mean_last(ops.square(centered))
        y = centered * ops.rsqrt(variance + self.epsilon)
        y = y * ops.convert_to_tensor(self.gamma) + ops.convert_to_tensor(self.beta)
        return ops.cast(y, self.compute_dtype)


TABLES = ("word_embeddings", "position_embeddings", "token_type_embeddings")
DELTA_SUFFIX = "_delta"


class Embeddings(keras.layers.Layer):
    """Token + position + token-type embeddings, LayerNorm, dropout -> [B, L, E] in the
    compute dtype; the tables are float32 (gathered, summed and normalised in float32).
    `word_embeddings` doubles as the generator's output matrix (`GeneratorPredictions`)."""

    def __init__(self, config: ModelConfig, **kwargs):
        kwargs.setdefault("name", "embeddings")
        super().__init__(**kwargs)
        self.config = config
        self.layer_norm = LayerNorm(config.embedding_size, config.layer_norm_eps,
                                    name="LayerNorm", dtype=self.dtype_policy)

    def build(self, input_shape=None, suffix="", initializer=None):
        c = self.config
        initializer = initializer or truncated_normal(c.initializer_range)
        rows = (c.vocab_size, c.max_position_embeddings, c.type_vocab_size)
        for name, n in zip(TABLES, rows):  # attributes: tf.train.Checkpoint tracks them
            setattr(self, name + suffix, self.add_weight(
                name=name + suffix, shape=(n, c.embedding_size), initializer=initializer,
                autocast=False))
        self.layer_norm.build((None, None, c.embedding_size))

    def tables(self) -> Tuple:
        """(word, position, token-type) tables as used, float32."""
        return tuple(ops.convert_to_tensor(getattr(self, name)) for name in TABLES)

    def call(self, input_ids, segment_ids=None, training=False, seed=None):
        input_ids = ops.cast(input_ids, "int32")
        seq_len = ops.shape(input_ids)[1]
        word, position, token_type = self.tables()
        x = K.take_rows(word, input_ids)
        x = x + position[None, :seq_len, :]
        if segment_ids is None:
            segment_ids = ops.zeros_like(input_ids)
        x = x + K.take_rows(token_type, ops.cast(segment_ids, "int32"))
        x = self.layer_norm(x)
        return dropout(x, self.config.hidden_dropout_prob, training, seed)


class DisentangledEmbeddings(Embeddings):
    """The discriminator's side of gradient-disentangled embedding sharing (GDES, DeBERTaV3,
    He et al. 2021): each table is stop_gradient(the generator's table) + its own delta
    (`word_embeddings_delta`, ...; zero at init), so the discriminator's loss moves only the
    deltas. The LayerNorm is its own; `released_arrays` writes `tables()`. `source` is held
    by a weak reference: the generator's variables are not among `discriminator_variables`."""

    def __init__(self, config: ModelConfig, source: Embeddings, **kwargs):
        super().__init__(config, **kwargs)
        self._source = weakref.ref(source)

    def build(self, input_shape=None):
        super().build(suffix=DELTA_SUFFIX, initializer="zeros")

    @property
    def deltas(self) -> Tuple:
        return tuple(getattr(self, name + DELTA_SUFFIX) for name in TABLES)

    def tables(self):
        return tuple(ops.stop_gradient(table) + ops.convert_to_tensor(delta)
                     for table, delta in zip(self._source().tables(), self.deltas))


DIRECTIONS = (None, "ltr", "rtl")


def attention_bias(input_mask, dtype="float32", direction=None):
    """[B, L] 1/0 mask -> additive bias (0 or -10000), float32 by default: [B, 1, 1, L],
    or [B, 1, L, L] with a `direction`: "ltr" lets position i see positions <= i, "rtl"
    positions >= i (the towers of the two-tower generator)."""
    mask = ops.cast(input_mask, "float32")[:, None, None, :]
    if direction is not None:
        length = ops.shape(input_mask)[-1]
        square = ops.ones([length, length], "float32")
        one_sided = ops.tril if direction == "ltr" else ops.triu
        mask = mask * one_sided(square)  # [query, key]
    return ops.cast((1.0 - mask) * _MASK_ADDER, dtype)


class TransformerLayer(keras.layers.Layer):
    """One post-LN BERT block, variables named as TF1's `layer_{i}/...`: plain `Dense` with
    [in, out] kernels, heads split by reshaping their outputs, so kernels map 1:1 to TF1's."""

    def __init__(self, hidden_size: int, num_heads: int, intermediate_size: int,
                 config: ModelConfig, direction: Optional[str] = None, **kwargs):
        super().__init__(**kwargs)
        if hidden_size % num_heads:
            raise ValueError(f"hidden size {hidden_size} is not a multiple of {num_heads} heads")
        if direction not in DIRECTIONS:
            raise ValueError(f"direction {direction!r}: expected one of {DIRECTIONS}")
        self.direction = direction
        self.hidden_size = int(hidden_size)
        self.num_heads = int(num_heads)
        self.head_size = self.hidden_size // self.num_heads
        self.intermediate_size = int(intermediate_size)
        self.config = config
        policy = self.dtype_policy

        def dense(units, name, activation=None):
            return keras.layers.Dense(
                units, activation=activation, name=name, dtype=policy,
                kernel_initializer=truncated_normal(config.initializer_range),
                bias_initializer="zeros")

        self.query = dense(self.hidden_size, "query")
        self.key = dense(self.hidden_size, "key")
        self.value = dense(self.hidden_size, "value")
        self.attention_output = dense(self.hidden_size, "dense")
        self.attention_layer_norm = LayerNorm(self.hidden_size, config.layer_norm_eps,
                                              name="LayerNorm", dtype=policy)
        self.intermediate = dense(self.intermediate_size, "dense", activation=gelu)
        self.output_dense = dense(self.hidden_size, "dense")
        self.output_layer_norm = LayerNorm(self.hidden_size, config.layer_norm_eps,
                                           name="LayerNorm", dtype=policy)

    def build(self, input_shape=None):
        h, f = self.hidden_size, self.intermediate_size
        with keras.name_scope("attention"):
            with keras.name_scope("self"):
                for layer in (self.query, self.key, self.value):
                    layer.build((None, None, h))
            with keras.name_scope("output"):
                self.attention_output.build((None, None, h))
                self.attention_layer_norm.build((None, None, h))
        with keras.name_scope("intermediate"):
            self.intermediate.build((None, None, h))
        with keras.name_scope("output"):
            self.output_dense.build((None, None, f))
            self.output_layer_norm.build((None, None, h))

    def _split_heads(self, x, batch, seq_len):
        x = ops.reshape(x, [batch, seq_len, self.num_heads, self.head_size])
        return ops.transpose(x, [0, 2, 1, 3])  # [B, N, L, D]

    def call(self, x, input_mask, training=False, seed=None):
        """x [B, L, H] or [B * L, H] rows (compute dtype; the output takes the same form),
        input_mask [B, L] 1 = real token, 0 = padding;
        `seed` (optional [2] int32) makes the three dropout masks stateless. (The mask is
        passed as ints so that Keras' input casting cannot turn the float32 bias into the
        compute dtype; XLA folds the per-layer copies.)"""
        bias = attention_bias(input_mask, direction=self.direction)
        batch, seq_len = _batch_and_length(input_mask)
        rows = len(x.shape) == 2
        scale = ops.cast(1.0 / math.sqrt(self.head_size), x.dtype)
        q = self._split_heads(self.query(x), batch, seq_len) * scale
        k = self._split_heads(self.key(x), batch, seq_len)
        v = self._split_heads(self.value(x), batch, seq_len)
        seeds = [None] * 3 if seed is None else ops.unstack(rng.split(seed, 3))
        rate = self.config.attention_probs_dropout_prob if training else 0.0
        # The backend's fused kernel where it has one and it is asked for (the same
        # numbers, the same dropout draw, no [B, N, L, L] arrays kept), else the reference.
        context = K.fused_attention(q, k, v, input_mask, seeds[0], rate, self.direction)
        if context is None:
            context = reference_attention(q, k, v, bias, seeds[0],
                                          self.config.attention_probs_dropout_prob, training)
        context = ops.reshape(ops.transpose(context, [0, 2, 1, 3]),
                             [-1, self.hidden_size] if rows else [batch, seq_len, self.hidden_size])
        rows_of = (batch, seq_len) if rows else None
        attn = dropout(self.attention_output(context), self.config.hidden_dropout_prob,
                       training, seeds[1], rows_of)
        x = self.attention_layer_norm(attn, residual=x)
        y = self.output_dense(self.intermediate(x))
        y = dropout(y, self.config.hidden_dropout_prob, training, seeds[2], rows_of)
        return self.output_layer_norm(y, residual=x)


def _batch_and_length(input_mask):
    """(B, L) of a [B, L] tensor: Python ints where static, else scalar tensors."""
    dims = list(input_mask.shape)
    if None in dims:
        shape = ops.shape(input_mask)
        dims = [shape[i] if n is None else n for i, n in enumerate(dims)]
    return tuple(dims)


class Encoder(keras.layers.Layer):
    """Embeddings (own or shared) -> optional `embeddings_project` -> `encoder/layer_{i}`,
    named `electra` or `generator` (the TF1 scopes). Shared `embeddings` already built keep
    their paths (`electra/embeddings/...`); unbuilt ones are built under this encoder's
    name. `direction` ("ltr" / "rtl") makes every block's attention one-sided."""

    def __init__(self, config: ModelConfig, hidden_size: int, num_layers: int, num_heads: int,
                 intermediate_size: int, embeddings: Optional[Embeddings] = None,
                 direction: Optional[str] = None, **kwargs):
        super().__init__(**kwargs)
        self.config = config
        self.hidden_size = int(hidden_size)
        self.num_layers = int(num_layers)
        policy = self.dtype_policy
        self.embeddings = embeddings if embeddings is not None else Embeddings(
            config, name="embeddings", dtype=policy)
        self.embeddings_project = None
        if config.embedding_size != self.hidden_size:
            # No initializer in the TF1 code: tf.layers' default Glorot-uniform.
            self.embeddings_project = keras.layers.Dense(
                self.hidden_size, name="embeddings_project", dtype=policy,
                kernel_initializer="glorot_uniform", bias_initializer="zeros")
        self.blocks = [TransformerLayer(hidden_size, num_heads, intermediate_size, config,
                                        direction, name=f"layer_{i}", dtype=policy)
                       for i in range(self.num_layers)]
        # Keras' tracked lists are invisible to tf.train.Checkpoint: also hold each block
        # as an attribute so that object-based checkpoints contain the encoder layers.
        for i, block in enumerate(self.blocks):
            setattr(self, f"layer_{i}", block)

    def build(self, input_shape=None):
        if not self.embeddings.built:
            self.embeddings.build()
        if self.embeddings_project is not None:
            self.embeddings_project.build((None, None, self.config.embedding_size))
        with keras.name_scope("encoder"):
            for block in self.blocks:
                block.build((None, None, self.hidden_size))

    def call(self, input_ids, input_mask=None, segment_ids=None, training=False, seed=None):
        """-> sequence output [B, L, hidden] in the compute dtype (`seed`: see dropout)."""
        if input_mask is None:
            input_mask = ops.ones_like(input_ids)
        seeds = ([None] * (len(self.blocks) + 1) if seed is None
                 else ops.unstack(rng.split(seed, len(self.blocks) + 1)))
        x = self.embeddings(input_ids, segment_ids, training=training, seed=seeds[0])
        if self.embeddings_project is not None:
            x = self.embeddings_project(x)
        input_mask = ops.cast(input_mask, "int32")
        rows = K.rows_only()  # TensorFlow's inference outside XLA: [B * L, H] rows
        if rows:
            x = ops.reshape(x, [-1, self.hidden_size])
        for i, block in enumerate(self.blocks):
            x = block(x, input_mask, training=training, seed=seeds[i + 1])
        if rows:
            x = ops.reshape(x, [*_batch_and_length(input_mask), self.hidden_size])
        return x


class TwoTowerGenerator(keras.layers.Layer):
    """ELECTRIC's noise model: generator-sized left-to-right and right-to-left encoders
    (`generator_ltr`, `generator_rtl`) read the UNMASKED input; position t gets [ltr at t-1 ;
    rtl at t+1], every token but t (the ends wrap around: [CLS], [SEP] / padding are never
    predicted). `hidden_size` is twice the towers'. Shared embeddings serve both towers;
    else each has its own and `embeddings` (tied to the cloze head) is the ltr tower's."""

    def __init__(self, config: ModelConfig, embeddings: Optional[Embeddings] = None,
                 **kwargs):
        super().__init__(**kwargs)
        policy = self.dtype_policy
        self.towers = []
        for direction in ("ltr", "rtl"):
            tower = Encoder(config, config.generator_hidden, config.generator_num_layers,
                            config.generator_heads, config.generator_intermediate,
                            embeddings=embeddings, direction=direction,
                            name=f"generator_{direction}", dtype=policy)
            setattr(self, f"generator_{direction}", tower)
            self.towers.append(tower)
        self.embeddings = self.towers[0].embeddings
        self.hidden_size = 2 * config.generator_hidden

    def build(self, input_shape=None):
        for tower in self.towers:
            if not tower.built:
                tower.build()

    def call(self, input_ids, input_mask=None, segment_ids=None, training=False, seed=None):
        """-> [B, L, 2h] in the compute dtype: each position's context without itself."""
        ltr, rtl = (tower(input_ids, input_mask, segment_ids, training=training,
                          seed=rng.fold(seed, i)) for i, tower in enumerate(self.towers))
        return ops.concatenate([ops.roll(ltr, 1, axis=1), ops.roll(rtl, -1, axis=1)], axis=-1)


class DiscriminatorPredictions(keras.layers.Layer):
    """dense(H, gelu) -> dense_1(1) -> squeeze: per-token "replaced" logits, float32."""

    def __init__(self, config: ModelConfig, hidden_size: int, **kwargs):
        kwargs.setdefault("name", "discriminator_predictions")
        super().__init__(**kwargs)
        self.hidden_size = int(hidden_size)
        self.dense = keras.layers.Dense(
            self.hidden_size, activation=gelu, name="dense", dtype=self.dtype_policy,
            kernel_initializer=truncated_normal(config.initializer_range))
        # No initializer in the TF1 code: Glorot-uniform.
        self.dense_1 = keras.layers.Dense(1, name="dense_1", dtype=self.dtype_policy,
                                          kernel_initializer="glorot_uniform")

    def build(self, input_shape=None):
        self.dense.build((None, None, self.hidden_size))
        self.dense_1.build((None, None, self.hidden_size))

    def call(self, hidden):
        logits = self.dense_1(self.dense(hidden))
        return ops.cast(ops.squeeze(logits, -1), "float32")


class GeneratorPredictions(keras.layers.Layer):
    """dense(E, gelu) -> LayerNorm -> x @ word_embeddings^T + output_bias -> float32 logits
    (the matmul in the compute dtype, cast to float32 before the float32 bias is added)."""

    def __init__(self, config: ModelConfig, hidden_size: int, embeddings: Embeddings,
                 **kwargs):
        kwargs.setdefault("name", "generator_predictions")
        super().__init__(**kwargs)
        self.config = config
        self.hidden_size = int(hidden_size)
        self.embeddings = embeddings  # tracked; its variables are deduplicated by Keras
        self.dense = keras.layers.Dense(
            config.embedding_size, activation=gelu, name="dense", dtype=self.dtype_policy,
            kernel_initializer=truncated_normal(config.initializer_range))
        self.layer_norm = LayerNorm(config.embedding_size, config.layer_norm_eps,
                                    name="LayerNorm", dtype=self.dtype_policy)

    def build(self, input_shape=None):
        self.dense.build((None, None, self.hidden_size))
        self.layer_norm.build((None, None, self.config.embedding_size))
        self.output_bias = self.add_weight(name="output_bias", shape=(self.config.vocab_size,),
                                           initializer="zeros", autocast=False)

    def call(self, hidden):
        x = self.layer_norm(self.dense(hidden))
        table = ops.cast(self.embeddings.tables()[0], x.dtype)
        # One 2-D matmul: an einsum over [B, P, E] makes the table's gradient a batched
        # product with a [B, E, V] intermediate, ~20x slower on CPU.
        rows = ops.reshape(x, [-1, self.config.embedding_size])
        logits = K.matmul_nt(rows, table)
        logits = ops.reshape(logits, [*ops.shape(x)[:-1], self.config.vocab_size])
        return K.add_bias(ops.cast(logits, "float32"), ops.convert_to_tensor(self.output_bias))


def build_discriminator_encoder(config: ModelConfig, dtype=None) -> Encoder:
    """A built discriminator encoder (`electra/...`, the TF1 names) with its own embeddings."""
    encoder = Encoder(config, config.hidden_size, config.num_hidden_layers,
                      config.num_attention_heads, config.intermediate_size,
                      name="electra", dtype=dtype)
    encoder.build()
    return encoder


class ElectraPretrainingModel(keras.Model):
    """Generator + discriminator of ELECTRA, sharing embeddings as configured.

    Layers: `embeddings` (the discriminator's; shared with the generator when
    `tie_embeddings`; with GDES a `DisentangledEmbeddings` over the generator's), `electra`,
    `generator` (`electra` itself when `tie_all_weights`; a `TwoTowerGenerator`, whose head
    is `cloze_predictions`, when `two_tower_generator`), `discriminator_predictions`,
    `generator_predictions`. `heads` (`HEADS`) adds "mlm" -> `mlm_predictions` (the
    discriminator's width, tied to its embeddings), "sampling" -> `sampling_predictions` (tied
    to the generator's) and "baseline" -> `adversarial_baseline` (dense(1) on the generator's
    hidden states). `dtype`: a Keras dtype policy; None takes the global one.
    """

    def __init__(self, config: ModelConfig, dtype=None, name="electra_pretraining",
                 heads: Sequence[str] = (), **kwargs):
        super().__init__(name=name, dtype=dtype, **kwargs)
        config.check()
        unknown = sorted(set(heads) - set(HEADS))
        if unknown:
            raise ValueError(f"unknown heads {unknown}; expected some of {HEADS}")
        self.config = config
        self.heads = tuple(h for h in HEADS if h in heads)
        policy = self.dtype_policy
        # GDES: the generator owns the tables, the discriminator reads them through deltas.
        generator_embeddings = disc_embeddings = None
        if config.disentangled_embeddings:
            generator_embeddings = Embeddings(config, name="embeddings", dtype=policy)
            disc_embeddings = DisentangledEmbeddings(config, generator_embeddings,
                                                     name="embeddings", dtype=policy)
        self.electra = Encoder(config, config.hidden_size, config.num_hidden_layers,
                               config.num_attention_heads, config.intermediate_size,
                               embeddings=disc_embeddings, name="electra", dtype=policy)
        self.embeddings = self.electra.embeddings
        if config.tie_embeddings and not config.disentangled_embeddings:
            generator_embeddings = self.embeddings
        # (config.check(): GDES has neither two towers nor tied weights.)
        if config.two_tower_generator:
            self.generator = TwoTowerGenerator(config, embeddings=generator_embeddings,
                                               name="two_tower_generator", dtype=policy)
        elif config.tie_all_weights:
            self.generator = self.electra
        else:
            self.generator = Encoder(
                config, config.generator_hidden, config.generator_num_layers,
                config.generator_heads, config.generator_intermediate,
                embeddings=generator_embeddings, name="generator", dtype=policy)
        self.discriminator_predictions = DiscriminatorPredictions(
            config, config.hidden_size, name="discriminator_predictions", dtype=policy)
        self.generator_predictions = GeneratorPredictions(
            config, self.generator.hidden_size, self.generator.embeddings,
            name="cloze_predictions" if config.two_tower_generator else
            "generator_predictions", dtype=policy)
        # Build order fixes the paths (the discriminator first: shared embeddings live under
        # `electra/embeddings`) and the initial values (seeds are drawn in this order).
        self.electra.build()
        for tower in getattr(self.generator, "towers", ()):
            tower.build()  # here, not inside the container: paths generator_ltr/...
        if not self.generator.built:
            self.generator.build()
        self.discriminator_predictions.build()
        self.generator_predictions.build()
        if "mlm" in self.heads:
            self.mlm_predictions = GeneratorPredictions(
                config, config.hidden_size, self.embeddings, name="mlm_predictions",
                dtype=policy)
            self.mlm_predictions.build()
        if "sampling" in self.heads:
            self.sampling_predictions = GeneratorPredictions(
                config, self.generator.hidden_size, self.generator.embeddings,
                name="sampling_predictions", dtype=policy)
            self.sampling_predictions.build()
        if "baseline" in self.heads:
            self.adversarial_baseline = keras.layers.Dense(
                1, name="adversarial_baseline", dtype=policy,
                kernel_initializer=truncated_normal(config.initializer_range))
            self.adversarial_baseline.build((None, None, self.generator.hidden_size))
        self.built = True

    # --- discriminator -------------------------------------------------------------
    def discriminator_hidden(self, input_ids, input_mask, segment_ids, training=False,
                             seed=None):
        """-> discriminator sequence output [B, L, H] (compute dtype)."""
        return self.electra(input_ids, input_mask, segment_ids, training=training, seed=seed)

    def discriminator(self, input_ids, input_mask, segment_ids, training=False, seed=None):
        """-> per-token replaced-token logits [B, L], float32. `seed` ([2] int32, optional)
        makes dropout stateless (reproducible steps, exact resume)."""
        hidden = self.discriminator_hidden(input_ids, input_mask, segment_ids, training, seed)
        return self.discriminator_predictions(hidden)

    # --- generator -----------------------------------------------------------------
    def generator_hidden(self, input_ids, input_mask, segment_ids, training=False, seed=None):
        """-> generator sequence output [B, L, generator hidden] (compute dtype)."""
        return self.generator(input_ids, input_mask, segment_ids, training=training, seed=seed)

    def generator_mlm_logits(self, input_ids, input_mask, segment_ids, masked_positions,
                             training=False, seed=None):
        """-> MLM logits [B, P, V], float32, only at `masked_positions` [B, P]."""
        hidden = self.generator_hidden(input_ids, input_mask, segment_ids, training, seed)
        return self.generator_predictions(K.gather_slots(hidden, masked_positions))

    def baseline_logits(self, generator_hidden):
        """The adversarial baseline's logits [...] from generator hidden states [..., h]."""
        return ops.cast(ops.squeeze(self.adversarial_baseline(generator_hidden), -1), "float32")

    def call(self, inputs, training=False):
        """inputs: dict with input_ids, input_mask, segment_ids -> discriminator logits."""
        return self.discriminator(inputs["input_ids"], inputs["input_mask"],
                                  inputs["segment_ids"], training=training)


# --- variable groups and TF1 names ---------------------------------------------------

def _unique(variables) -> List:
    return list({id(v): v for v in variables}.values())  # first-seen order


def discriminator_variables(model: ElectraPretrainingModel) -> List:
    """Trainable variables the discriminator uses (shared embeddings included)."""
    return _unique(model.electra.trainable_variables +
                   model.discriminator_predictions.trainable_variables)


def tf1_name(path: str) -> str:
    """A Keras variable path -> the TF1 checkpoint name (drops ':0' and any scope before
    the first TF1 root component, e.g. an outer model name)."""
    name = re.sub(r":\d+$", "", path)
    parts = name.split("/")
    for i, part in enumerate(parts):
        if part in TF1_ROOTS and i + 1 < len(parts):
            return "/".join(parts[i:])
    raise ValueError(f"variable {path!r} is not under any of {TF1_ROOTS}")


def tf1_variables(model, variables: Optional[Sequence] = None) -> Dict[str, object]:
    """{TF1 name: variable} for `variables` (default: every trainable variable of `model`,
    any layer), in their order, each variable once. Raises if two would get the same name."""
    out = {}
    for v in _unique(model.trainable_variables if variables is None else variables):
        name = tf1_name(v.path)
        if name in out:
            raise ValueError(f"variables {out[name].path!r} and {v.path!r} both map to {name!r}")
        out[name] = v
    return out


def released_arrays(model, variables: Optional[Sequence] = None) -> Dict[str, np.ndarray]:
    """{TF1 name: array} of `variables` (default: every trainable variable of `model`) in
    the released layout: GDES deltas (`electra/embeddings/*_delta`) are written as the
    full tables the discriminator computes with (the generator's table + delta) under the
    table's name, which is the layout of untied embeddings (`ModelConfig.released()`)."""
    embeddings = getattr(model, "embeddings", None)
    folded = {}
    if isinstance(embeddings, DisentangledEmbeddings):
        folded = {id(d): t for d, t in zip(embeddings.deltas, embeddings.tables())}
    out = {}
    for name, v in tf1_variables(model, variables).items():
        if id(v) in folded:
            out[name[:-len(DELTA_SUFFIX)]] = ops.convert_to_numpy(folded[id(v)])
        else:
            out[name] = np.asarray(v.numpy())
    return out

