"""FLOP counts of pre-training: by hand in two conventions, and by TensorFlow's profiler.

Owns the transformer FLOP formulas, the paper's published figures, and the frozen-graph
profiling of our own model (`electra_tf.modeling`) that checks the formulas.

Conventions (what a count includes; `Convention` below):

* ``paper`` -- the ELECTRA paper, Appendix E, and google-research/electra's
  ``flops_computation.py``: an op is a mathematical op; a matmul costs 2*m*n*k; embedding
  lookups are dense one-hot matmuls (2*E*V per token for words, 2*E*(L + types) for
  positions and token types); per element, dropout costs 4, LayerNorm 5, GELU 8, softmax 5
  (biases, residuals and the attention scale 1). The MLM output (dense, GELU, LayerNorm,
  vocabulary logits, softmax 5V and target pick 2V) runs on ``output_frac`` = 0.15625 of
  the positions (1.0 for a left-to-right LM); the discriminator head on every position.
  Train = 2 x forward: the official script multiplies the summed forward count of every
  network by ``2 * batch * steps`` ("backward = forward", so this is forward + backward;
  no separate optimizer cost). ELECTRA = generator (sized by its multiplier, same depth)
  + discriminator, each with its own embedding pass. Our counts are within 0.07% of the
  script's: it omits the MLM output bias and the discriminator's logit bias, and counts
  the attention LayerNorm as 5 per token instead of 5 x hidden.
* ``hardware`` -- what model-FLOPs utilisation (MFU) divides by: only the matmuls our code
  really executes (2*m*n*k each, attention scores and context included), embedding
  lookups are gathers (0), generator logits only at the ``max_predictions_per_seq``
  slots `ElectraPretrainingModel.generator_mlm_logits` computes (19 of 128: padding
  slots included), no element-wise ops; train = 3 x forward (the backward pass of a
  matmul is two matmuls of the same size).
* ``graph`` -- what the frozen forward graphs contain, to check against the profiler:
  ``hardware`` plus the element-wise ops with the paper's per-element constants (the
  output bias instead of the loss's softmax, which is not part of the forward graphs).

`count_config` counts what a config's objective (`configs.OBJECTIVE_NAMES`) runs and
trains, per component: BERT's MLM has no generator; replace_mlm and all_tokens_mlm put an
MLM head on the discriminator-sized encoder (at every position for all_tokens_mlm);
hp_loss / hp_dist add a generator-width sampling head, adversarial a baseline; two_stage
runs in two `Phase`s (generator only, then the generator forward only while the
discriminator trains). `steps_for_budget` gives the steps that spend a FLOP budget.

`profile_forward` freezes the forward functions of our model's components at static
shapes and counts them with ``tf.compat.v1.profiler``, after registering FLOP statistics
for the op types the profiler leaves at zero (Einsum, Erf/Erfc, Exp, Tanh, RandomUniform,
...; `register_flop_stats`). Op types that have no statistics and are not pure data
movement are reported, never silently counted as zero.
"""

import collections
import dataclasses
import importlib
import math
from typing import Dict, List, Optional, Sequence, Tuple

# Per-element op counts of the paper's convention.
DROPOUT_FLOPS = 4  # random number, >=, mask multiply, 1/(1-p) multiply
LAYER_NORM_FLOPS = 5  # mean, variance (square + sum), scale, shift
GELU_FLOPS = 8
SOFTMAX_FLOPS = 5  # max-subtract, exp, sum, divide
OFFICIAL_OUTPUT_FRAC = 0.15625  # share of positions with an MLM output softmax

# Kinds of terms; a convention decides which it counts.
MATMUL, ELEMENTWISE, LOOKUP, LOSS = "matmul", "elementwise", "lookup", "loss"

ELECTRA_COMPONENTS = ("embeddings", "generator_encoder", "generator_mlm_head",
                      "discriminator_encoder", "discriminator_head")


@dataclasses.dataclass(frozen=True)
class Convention:
    """What a count includes (see the module docstring)."""
    name: str
    train_factor: float  # train FLOPs = train_factor x forward FLOPs
    one_hot_lookups: bool  # embedding lookups as dense one-hot matmuls
    elementwise: bool  # biases, activations, LayerNorm, dropout, softmax, residuals
    loss_softmax: bool  # the LM head's output softmax + target pick (5V + 2V a slot)
    actual_output_positions: bool  # LM logits at the slots our code computes, not frac*L

    def counts(self, kind: str) -> bool:
        return {MATMUL: True, LOOKUP: self.one_hot_lookups, ELEMENTWISE: self.elementwise,
                LOSS: self.loss_softmax}[kind]


PAPER = Convention("paper", 2.0, one_hot_lookups=True, elementwise=True, loss_softmax=True,
                   actual_output_positions=False)
HARDWARE = Convention("hardware", 3.0, one_hot_lookups=False, elementwise=False,
                      loss_softmax=False, actual_output_positions=True)
GRAPH = Convention("graph", 3.0, one_hot_lookups=False, elementwise=True, loss_softmax=False,
                   actual_output_positions=True)
CONVENTIONS = {c.name: c for c in (PAPER, HARDWARE, GRAPH)}


@dataclasses.dataclass(frozen=True)
class Transformer:
    """The sizes a FLOP count needs (defaults as the official script: FFN 4h,
    heads max(1, h // 64), embedding size h)."""
    hidden: int
    layers: int
    seq_len: int = 512
    vocab: int = 30522
    embedding_size: Optional[int] = None
    intermediate_size: Optional[int] = None
    num_heads: Optional[int] = None
    type_vocab: int = 2

    @property
    def e(self) -> int:
        return self.hidden if self.embedding_size is None else self.embedding_size

    @property
    def ffn(self) -> int:
        return 4 * self.hidden if self.intermediate_size is None else self.intermediate_size

    @property
    def heads(self) -> int:
        return max(1, self.hidden // 64) if self.num_heads is None else self.num_heads


Term = Tuple[str, str, float]  # (name, kind, FLOPs per sequence)


def embedding_terms(t: Transformer) -> List[Term]:
    """One embedding pass (word + position + type, sum, LayerNorm, dropout), per sequence."""
    s, e = t.seq_len, t.e
    return [("word_lookup", LOOKUP, 2 * e * t.vocab * s),
            ("position_and_type_lookup", LOOKUP, 2 * e * (s + t.type_vocab) * s),
            ("sum", ELEMENTWISE, 2 * e * s),
            ("layer_norm", ELEMENTWISE, LAYER_NORM_FLOPS * e * s),
            ("dropout", ELEMENTWISE, DROPOUT_FLOPS * e * s)]


def block_terms(t: Transformer) -> List[Term]:
    """One post-LN transformer block, per sequence."""
    s, h, f, n = t.seq_len, t.hidden, t.ffn, t.heads
    per_token = [
        ("qkv", MATMUL, 3 * 2 * h * h), ("qkv_bias", ELEMENTWISE, 3 * h),
        ("attention_scores", MATMUL, 2 * h * s), ("attention_scale", ELEMENTWISE, n * s),
        ("attention_softmax", ELEMENTWISE, SOFTMAX_FLOPS * n * s),
        ("attention_dropout", ELEMENTWISE, DROPOUT_FLOPS * n * s),
        ("attention_context", MATMUL, 2 * h * s),
        ("attention_output", MATMUL, 2 * h * h), ("attention_output_bias", ELEMENTWISE, h),
        ("attention_output_dropout", ELEMENTWISE, DROPOUT_FLOPS * h),
        ("attention_residual", ELEMENTWISE, h),
        ("attention_layer_norm", ELEMENTWISE, LAYER_NORM_FLOPS * h),
        ("intermediate", MATMUL, 2 * h * f), ("intermediate_bias", ELEMENTWISE, f),
        ("intermediate_gelu", ELEMENTWISE, GELU_FLOPS * f),
        ("output", MATMUL, 2 * f * h), ("output_bias", ELEMENTWISE, h),
        ("output_dropout", ELEMENTWISE, DROPOUT_FLOPS * h),
        ("output_residual", ELEMENTWISE, h),
        ("output_layer_norm", ELEMENTWISE, LAYER_NORM_FLOPS * h)]
    return [(name, kind, flops * s) for name, kind, flops in per_token]


def encoder_terms(t: Transformer) -> List[Term]:
    """`embeddings_project` (when E != H) and all blocks, per sequence (no embeddings)."""
    s, e, h = t.seq_len, t.e, t.hidden
    terms = []
    if e != h:
        terms += [("embeddings_project", MATMUL, 2 * e * h * s),
                  ("embeddings_project_bias", ELEMENTWISE, h * s)]
    return terms + [(f"layer_{i}/{name}", kind, flops) for i in range(t.layers)
                    for name, kind, flops in block_terms(t)]


def lm_head_terms(t: Transformer, positions: float) -> List[Term]:
    """dense(E, gelu) -> LayerNorm -> tied-embedding logits (+ softmax) at `positions`
    positions of a sequence."""
    e, h, v = t.e, t.hidden, t.vocab
    per_position = [("dense", MATMUL, 2 * h * e), ("dense_bias", ELEMENTWISE, e),
                    ("gelu", ELEMENTWISE, GELU_FLOPS * e),
                    ("layer_norm", ELEMENTWISE, LAYER_NORM_FLOPS * e),
                    ("logits", MATMUL, 2 * e * v), ("output_bias", ELEMENTWISE, v),
                    ("softmax", LOSS, SOFTMAX_FLOPS * v), ("target_word", LOSS, 2 * v)]
    return [(name, kind, flops * positions) for name, kind, flops in per_position]


def binary_head_terms(t: Transformer) -> List[Term]:
    """dense(H, gelu) -> dense(1) on every position (the discriminator / a classifier)."""
    s, h = t.seq_len, t.hidden
    per_token = [("dense", MATMUL, 2 * h * h), ("dense_bias", ELEMENTWISE, h),
                 ("gelu", ELEMENTWISE, GELU_FLOPS * h), ("logit", MATMUL, 2 * h),
                 ("logit_bias", ELEMENTWISE, 1)]
    return [(name, kind, flops * s) for name, kind, flops in per_token]


def baseline_head_terms(t: Transformer, positions: float) -> List[Term]:
    """dense(1) on the hidden states at `positions` positions of a sequence (the
    adversarial generator's learned baseline, paper Appendix F)."""
    return [("dense", MATMUL, 2 * t.hidden * positions),
            ("dense_bias", ELEMENTWISE, 1 * positions)]


def total(terms: Sequence[Term], convention: Convention) -> float:
    return float(sum(flops for _, kind, flops in terms if convention.counts(kind)))


@dataclasses.dataclass(frozen=True)
class PretrainingRun:
    """A pre-training run: an ELECTRA pair (`generator` set) or one MLM / LM network.

    `output_frac`: share of positions with an LM output as the paper counts it
    (0.15625 for MLM, 1.0 for a left-to-right LM); `output_positions`: LM output slots a
    sequence really computes (None: output_frac x seq_len).
    """
    model: Transformer
    batch_size: int
    train_steps: float
    generator: Optional[Transformer] = None
    output_frac: float = OFFICIAL_OUTPUT_FRAC
    output_positions: Optional[int] = None

    def head_positions(self, convention: Convention) -> float:
        if convention.actual_output_positions and self.output_positions is not None:
            return float(self.output_positions)
        return self.output_frac * self.model.seq_len

    def component_terms(self, convention: Convention) -> Dict[str, List[Term]]:
        """Per-sequence forward terms by component, in execution order."""
        positions = self.head_positions(convention)
        if self.generator is None:
            return collections.OrderedDict([
                ("embeddings", embedding_terms(self.model)),
                ("encoder", encoder_terms(self.model)),
                ("lm_head", lm_head_terms(self.model, positions))])
        gen, disc = self.generator, self.model
        return collections.OrderedDict([
            # Generator and discriminator each embed their own input.
            ("embeddings", embedding_terms(gen) + embedding_terms(disc)),
            ("generator_encoder", encoder_terms(gen)),
            ("generator_mlm_head", lm_head_terms(gen, positions)),
            ("discriminator_encoder", encoder_terms(disc)),
            ("discriminator_head", binary_head_terms(disc))])

    def forward_per_sequence(self, convention: Convention = PAPER) -> Dict[str, float]:
        return collections.OrderedDict(
            (name, total(terms, convention))
            for name, terms in self.component_terms(convention).items())

    def train_flops(self, convention: Convention = PAPER) -> float:
        """FLOPs of the whole run."""
        forward = sum(self.forward_per_sequence(convention).values())
        return convention.train_factor * self.batch_size * self.train_steps * forward


def infer_flops(t: Transformer, convention: Convention = PAPER) -> float:
    """One sequence through embeddings, encoder and a per-token binary head (the paper's
    "Infer FLOPs", at t.seq_len)."""
    return total(embedding_terms(t) + encoder_terms(t) + binary_head_terms(t), convention)


def electra_run(h_d: int, l_d: int, h_g: int, l_g: int, batch_size: int, train_steps: float,
                seq_len: int = 512, e: Optional[int] = None) -> PretrainingRun:
    """An ELECTRA run sized as the official script sizes it (tied embeddings of size e)."""
    e = h_d if e is None else e
    return PretrainingRun(Transformer(h_d, l_d, seq_len, embedding_size=e), batch_size,
                          train_steps, generator=Transformer(h_g, l_g, seq_len, embedding_size=e))


# The runs of google-research/electra's flops_computation.py and the train FLOPs it
# prints (REFERENCE section 8).
OFFICIAL_RUNS = {
    "electra_small": (electra_run(256, 12, 64, 12, 128, 1e6, seq_len=128, e=128), 1.294e18),
    "electra_base": (electra_run(768, 12, 256, 12, 256, 766000), 6.425e19),
    "electra_400k": (electra_run(1024, 24, 256, 24, 2048, 400000), 7.12e20),
    "electra_1.75M": (electra_run(1024, 24, 256, 24, 2048, 1.75e6), 3.11e21),
    "bert_small": (PretrainingRun(Transformer(256, 12, 128, embedding_size=128), 128, 1.45e6),
                   1.42e18),
    "bert_base": (PretrainingRun(Transformer(768, 12), 256, 1e6), 6.43e19),
    "bert_large": (PretrainingRun(Transformer(1024, 24), 256, 1e6), 1.92e20),
    "roberta": (PretrainingRun(Transformer(1024, 24, vocab=50265), 8000, 500000), 3.19e21),
    "gpt": (PretrainingRun(Transformer(768, 12, vocab=40000), 128, 960800, output_frac=1.0),
            3.97e19),
}

# Inference FLOPs of one length-128 input (REFERENCE section 8).
OFFICIAL_INFER = {
    "small": (Transformer(256, 12, 128, embedding_size=128), 3.68e9),
    "base": (Transformer(768, 12, 128), 2.86e10),
    "large": (Transformer(1024, 24, 128), 8.75e10),
}

# Train FLOPs as printed in the paper's Tables 1 and 2 (two significant digits), with the
# run we count for each. ELECTRA-Small's printed 1.4e18 is not the official script's
# 1.29e18 (1/4-size generator): with all its "x% trained" rows it fits a 128-wide
# generator (1.425e18). See `PAPER_TABLE_MISMATCHES`.
PAPER_TABLE_TRAIN = {
    "GPT": ("4.0e19", OFFICIAL_RUNS["gpt"][0]),
    "BERT-Small": ("1.4e18", OFFICIAL_RUNS["bert_small"][0]),
    "BERT-Base": ("6.4e19", OFFICIAL_RUNS["bert_base"][0]),
    "ELECTRA-Base": ("6.4e19", OFFICIAL_RUNS["electra_base"][0]),
    "BERT (Large)": ("1.9e20", OFFICIAL_RUNS["bert_large"][0]),
    "RoBERTa-100K": ("6.4e20", dataclasses.replace(OFFICIAL_RUNS["roberta"][0],
                                                   train_steps=100000)),
    "RoBERTa": ("3.2e21", OFFICIAL_RUNS["roberta"][0]),
    "ELECTRA (Large)": ("7.1e20", OFFICIAL_RUNS["electra_400k"][0]),
}
PAPER_TABLE_INFER = {
    "ELECTRA-Small": ("3.7e9", OFFICIAL_INFER["small"][0]),
    "ELECTRA-Base": ("2.9e10", OFFICIAL_INFER["base"][0]),
    "GPT": ("3.0e10", Transformer(768, 12, 128, vocab=40000)),
}
PAPER_TABLE_MISMATCHES = {"ELECTRA-Small": ("1.4e18", OFFICIAL_RUNS["electra_small"][0])}


def paper_rounding(x: float) -> str:
    """How the paper prints FLOPs: two significant digits, e.g. 6.4e19."""
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


# --- our own configs ------------------------------------------------------------------

# Components of the objective variants (`configs.OBJECTIVE_NAMES`) beyond
# `ELECTRA_COMPONENTS`: the MLM head of the discriminator-sized encoder (mlm, replace_mlm,
# all_tokens_mlm), hp_loss / hp_dist's sampling head on the generator, the adversarial
# generator's baseline; two_stage counts each network's embedding pass on its own, since
# only one of them trains in each stage.
OBJECTIVE_COMPONENTS = ("discriminator_mlm_head", "generator_sampling_head",
                        "generator_baseline_head", "generator_embeddings",
                        "discriminator_embeddings")

_GENERATOR_SIDE = ("generator_embeddings", "generator_encoder", "generator_mlm_head")
_DISCRIMINATOR_SIDE = ("discriminator_embeddings", "discriminator_encoder",
                       "discriminator_head")


@dataclasses.dataclass(frozen=True)
class Phase:
    """A stretch of a run whose steps all compute the same thing: `trained` components
    run forward and backward (train_factor x forward), `forward_only` ones forward only
    (1 x forward); the others do not run."""
    name: str
    steps: int
    trained: Tuple[str, ...]
    forward_only: Tuple[str, ...] = ()

    def factor(self, component: str, convention: Convention) -> float:
        if component in self.trained:
            return convention.train_factor
        return 1.0 if component in self.forward_only else 0.0


def config_run(cfg) -> PretrainingRun:
    """A `PretrainingConfig` -> the run it describes (sizes as `ElectraPretrainingModel`).

    objective=mlm has no generator network: the run is the BERT-style one network run of
    the discriminator-sized encoder. The objective's other heads are `count_config`'s."""
    m, tc = cfg.model, cfg.train
    s = tc.max_seq_length

    def transformer(hidden, layers, heads, ffn):
        return Transformer(hidden, layers, s, vocab=m.vocab_size,
                           embedding_size=m.embedding_size, intermediate_size=ffn,
                           num_heads=heads, type_vocab=m.type_vocab_size)

    disc = transformer(m.hidden_size, m.num_hidden_layers, m.num_attention_heads,
                       m.intermediate_size)
    if cfg.objective.generator != "masked_lm" or _objective(cfg) == "mlm":
        gen = None  # uniform / unigram proposals, or BERT's MLM: no generator network
    elif m.tie_all_weights:
        gen = disc
    else:
        gen = transformer(m.generator_hidden, m.generator_num_layers, m.generator_heads,
                          m.generator_intermediate)
    return PretrainingRun(disc, tc.train_batch_size, tc.num_train_steps, generator=gen,
                          output_positions=cfg.objective.predictions_per_seq(s))


def _objective(cfg) -> str:
    return getattr(cfg.objective, "objective", "electra")


def _config_plan(cfg, convention: Convention
                 ) -> Tuple[Dict[str, float], Optional[Tuple[Phase, ...]]]:
    """(forward FLOPs per sequence of each component the objective runs, in execution
    order; its phases, or None: one phase that trains every component)."""
    run = config_run(cfg)
    name = _objective(cfg)
    gen, disc = run.generator, run.model
    slots = run.head_positions(convention)  # generator / MLM output positions
    out = collections.OrderedDict()

    def add(key, terms):
        out[key] = total(terms, convention)

    if name == "mlm":  # BERT: the discriminator-sized encoder and its MLM head
        add("embeddings", embedding_terms(disc))
        add("discriminator_encoder", encoder_terms(disc))
        add("discriminator_mlm_head", lm_head_terms(disc, slots))
        return out, None
    if name == "two_stage":
        if gen is None:
            raise ValueError("objective.objective=two_stage needs the generator network "
                             "(objective.generator=masked_lm)")
        add("generator_embeddings", embedding_terms(gen))
        add("generator_encoder", encoder_terms(gen))
        add("generator_mlm_head", lm_head_terms(gen, slots))
        add("discriminator_embeddings", embedding_terms(disc))
        add("discriminator_encoder", encoder_terms(disc))
        add("discriminator_head", binary_head_terms(disc))
        steps = cfg.train.num_train_steps
        switch = min(max(cfg.objective.switch_step(steps), 0), steps)
        return out, (Phase("generator", switch, _GENERATOR_SIDE),
                     Phase("discriminator", steps - switch, _DISCRIMINATOR_SIDE,
                           forward_only=_GENERATOR_SIDE))
    # A generator (or uniform / unigram proposals: no network) and the discriminator.
    if gen is None:
        add("embeddings", embedding_terms(disc))
        out["generator_encoder"] = out["generator_mlm_head"] = 0.0
    else:
        # Generator and discriminator each embed their own input.
        add("embeddings", embedding_terms(gen) + embedding_terms(disc))
        add("generator_encoder", encoder_terms(gen))
        add("generator_mlm_head", lm_head_terms(gen, slots))
        if name in ("hp_loss", "hp_dist"):
            add("generator_sampling_head", lm_head_terms(gen, slots))
        elif name == "adversarial":
            add("generator_baseline_head", baseline_head_terms(gen, slots))
    add("discriminator_encoder", encoder_terms(disc))
    if name == "replace_mlm":
        add("discriminator_mlm_head", lm_head_terms(disc, slots))
    elif name == "all_tokens_mlm":  # MLM output at every position + the copy probability
        add("discriminator_mlm_head", lm_head_terms(disc, disc.seq_len))
        add("discriminator_head", binary_head_terms(disc))
    else:  # electra, electra_15, hp_loss, hp_dist, adversarial
        add("discriminator_head", binary_head_terms(disc))
    return out, None


def _config_components(cfg, convention: Convention) -> Dict[str, float]:
    return _config_plan(cfg, convention)[0]


@dataclasses.dataclass(frozen=True)
class Count:
    """FLOPs of a config in one convention, per component and in total.

    `phases` (two_stage's generator and discriminator stages) says which components run
    and train at which steps; empty: every step trains every component."""
    convention: Convention
    forward_per_sequence: Dict[str, float]
    batch_size: int
    num_train_steps: int
    phases: Tuple[Phase, ...] = ()

    def _with_total(self, scale: float, factors: Optional[Dict[str, float]] = None
                    ) -> Dict[str, float]:
        out = collections.OrderedDict(
            (k, v * scale * (1.0 if factors is None else factors[k]))
            for k, v in self.forward_per_sequence.items())
        out["total"] = sum(out.values())
        return out

    def phase(self, name: str) -> Phase:
        for p in self.phases:
            if p.name == name:
                return p
        raise KeyError(f"no phase {name!r}; phases: {[p.name for p in self.phases]}")

    def _phase_factors(self, phase: Phase) -> Dict[str, float]:
        return {k: phase.factor(k, self.convention) for k in self.forward_per_sequence}

    def forward(self) -> Dict[str, float]:
        """Forward FLOPs per sequence, per component and "total" (each component once)."""
        return self._with_total(1.0)

    def train_per_step(self, phase: Optional[str] = None) -> Dict[str, float]:
        """Train FLOPs of one step of the global batch: trained components forward +
        backward, forward-only ones forward. With phases: of a step of `phase`, or with
        None the average step of the run (`train_per_run` / `num_train_steps`)."""
        if phase is not None:
            return self._with_total(self.batch_size, self._phase_factors(self.phase(phase)))
        if not self.phases:
            return self._with_total(self.convention.train_factor * self.batch_size)
        per_run = self.train_per_run()
        return collections.OrderedDict((k, v / max(self.num_train_steps, 1))
                                       for k, v in per_run.items())

    def train_per_run(self) -> Dict[str, float]:
        """Train FLOPs of `num_train_steps` steps (phase by phase)."""
        if not self.phases:
            return self._with_total(self.convention.train_factor * self.batch_size *
                                    self.num_train_steps)
        out = collections.OrderedDict((k, 0.0) for k in self.forward_per_sequence)
        for p in self.phases:
            step = self.train_per_step(p.name)
            for k in out:
                out[k] += p.steps * step[k]
        out["total"] = sum(out.values())
        return out

    def train_at_step(self, step: float) -> float:
        """Total train FLOPs of the run's first `step` steps (the cost of the checkpoint
        at `step`)."""
        if not self.phases:
            return self.train_per_step()["total"] * step
        done, flops = 0.0, 0.0
        for p in self.phases:
            n = min(max(step - done, 0.0), p.steps)
            flops += n * self.train_per_step(p.name)["total"]
            done += p.steps
        return flops

    def step_at(self, flops: float) -> int:
        """The step whose `train_at_step` is nearest to `flops` (within the run)."""
        if flops <= 0:
            return 0
        done, spent = 0, 0.0
        phases = self.phases or (Phase("train", self.num_train_steps, ()),)
        for p in phases:
            per_step = (self.train_per_step(p.name) if self.phases else
                        self.train_per_step())["total"]
            if per_step > 0 and spent + p.steps * per_step >= flops:
                return done + int(round((flops - spent) / per_step))
            done, spent = done + p.steps, spent + p.steps * per_step
        return self.num_train_steps


def count_config(cfg, convention: Convention = PAPER) -> Count:
    """FLOPs of pre-training with `cfg` (a `configs.PretrainingConfig`) in `convention`,
    per component: what its objective really runs and trains (`ELECTRA_COMPONENTS` for
    electra; see `OBJECTIVE_COMPONENTS`), with two_stage's stages as `Count.phases`."""
    components, phases = _config_plan(cfg, convention)
    return Count(convention, components, cfg.train.train_batch_size,
                 cfg.train.num_train_steps, tuple(phases or ()))


def count_config_both(cfg) -> Dict[str, Count]:
    """{"paper": ..., "hardware": ...} for `cfg`."""
    return {c.name: count_config(cfg, c) for c in (PAPER, HARDWARE)}


def train_flops_per_step(cfg, convention: Convention = PAPER) -> float:
    """Train FLOPs of one step of `cfg`'s run, on average over the run (two_stage's
    stages differ)."""
    count = count_config(cfg, convention)
    if not count.phases:
        return count.train_per_step()["total"]
    return count.train_per_run()["total"] / max(cfg.train.num_train_steps, 1)


def train_flops(cfg, convention: Convention = PAPER) -> float:
    """Train FLOPs of the whole run `cfg` describes."""
    return count_config(cfg, convention).train_per_run()["total"]


def with_train_steps(cfg, steps: int):
    """`cfg` with `steps` train steps; an explicit two_stage switch step moves with the
    run so that it stays at the same fraction of it (0, half of the run, stays 0)."""
    steps = int(steps)
    o = cfg.objective
    objective = o
    if _objective(cfg) == "two_stage" and o.two_stage_switch_step:
        fraction = o.switch_step(cfg.train.num_train_steps) / cfg.train.num_train_steps
        switch = min(max(int(round(fraction * steps)), 1), max(steps - 1, 1))
        objective = dataclasses.replace(o, two_stage_switch_step=switch)
    return dataclasses.replace(cfg, objective=objective,
                               train=dataclasses.replace(cfg.train, num_train_steps=steps))


def steps_for_budget(cfg, flops: float, convention: Convention = PAPER) -> int:
    """The number of train steps whose run (`with_train_steps`) costs nearest to `flops`
    train FLOPs: at least 1 (2 for two_stage, which needs both stages)."""
    if not flops > 0:
        raise ValueError(f"a FLOP budget must be > 0, not {flops}")
    least = 2 if _objective(cfg) == "two_stage" else 1
    guess = flops / train_flops_per_step(cfg, convention)
    candidates = range(max(least, int(math.floor(guess)) - 2),
                       max(least, int(math.ceil(guess)) + 3))
    return min(candidates, key=lambda n: (
        abs(train_flops(with_train_steps(cfg, n), convention) - flops), n))


def format_table(cfg, name: str = "") -> str:
    """The --count_flops table: per component, forward FLOPs per sequence and train FLOPs
    per step and per run, in the paper and hardware conventions; for a run in stages
    (two_stage) the train/step columns are the run's average and each stage's step
    follows."""
    counts = count_config_both(cfg)
    paper, hw = counts["paper"], counts["hardware"]
    columns = [("fwd/seq paper", paper.forward()), ("fwd/seq hw", hw.forward()),
               ("train/step paper", paper.train_per_step()),
               ("train/step hw", hw.train_per_step()),
               ("run paper", paper.train_per_run()), ("run hw", hw.train_per_run())]
    tc = cfg.train
    lines = [f"FLOPs of {name or 'config'}: objective {_objective(cfg)}, batch "
             f"{tc.train_batch_size} x length {tc.max_seq_length}, {tc.num_train_steps} "
             f"steps, {cfg.objective.predictions_per_seq(tc.max_seq_length)} generator "
             "slots a sequence",
             "paper: one-hot lookups, MLM output at 0.15625 of positions, element-wise ops, "
             "train = 2 x forward",
             "hw: matmuls only, gathered embeddings, logits at the computed slots, "
             "train = 3 x forward",
             f"{'component':<26}" + "".join(f"{title:>18}" for title, _ in columns)]
    for key in list(paper.forward()):
        lines.append(f"{key:<26}" + "".join(f"{values[key]:>18.4e}" for _, values in columns))
    if paper.phases:
        lines.append("train/step columns: the run's average step; by stage (trained "
                     "components forward + backward, forward-only ones forward):")
        start = 0
        for p in paper.phases:
            rest = [k for k in paper.forward_per_sequence
                    if k not in p.trained and k not in p.forward_only]
            lines.append(
                f"  {p.name} stage, steps {start}-{start + p.steps} ({p.steps} steps): "
                f"train/step paper {paper.train_per_step(p.name)['total']:.4e}, hw "
                f"{hw.train_per_step(p.name)['total']:.4e}; trains {', '.join(p.trained)}"
                + (f"; forward only {', '.join(p.forward_only)}" if p.forward_only else "")
                + (f"; idle {', '.join(rest)}" if rest else ""))
            start += p.steps
    return "\n".join(lines)


# --- the profiler ---------------------------------------------------------------------

# Op types that move or reshape data, or compute no arithmetic the conventions count
# (Cast: a dtype change; GatherV2: an embedding lookup or a slot gather).
DATA_MOVEMENT_OPS = frozenset([
    "Placeholder", "Const", "Identity", "IdentityN", "NoOp", "Reshape", "Transpose",
    "StridedSlice", "Slice", "Pack", "Unpack", "ConcatV2", "Squeeze", "ExpandDims",
    "GatherV2", "GatherNd", "Shape", "Fill", "ZerosLike", "OnesLike", "BroadcastTo", "Tile",
    "StopGradient", "Cast", "Range", "OneHot", "Split", "SplitV", "PreventGradient"])

def _shape(graph, tensor_name: str):
    name = tensor_name if ":" in tensor_name else tensor_name + ":0"
    shape = graph.get_tensor_by_name(name).shape
    shape.assert_is_fully_defined()
    return shape.as_list()


def _data_inputs(node) -> List[str]:
    return [i for i in node.input if not i.startswith("^")]


def einsum_flops(equation: str, shapes: Sequence[Sequence[int]]) -> int:
    """FLOPs of `tf.einsum(equation, *operands)` with operand `shapes`.

    With a contraction (a label summed away): 2 x the product of every distinct dimension
    (one multiply and one add per term). Without one: one op per output element for two
    operands (a broadcast product), and for one operand the input size if it reduces
    (else 0: a transpose).
    """
    equation = equation.replace(" ", "")
    lhs, arrow, out = equation.partition("->")
    operands = lhs.split(",")
    if len(operands) != len(shapes):
        raise ValueError(f"einsum {equation!r}: {len(shapes)} shapes for "
                         f"{len(operands)} operands")
    sizes: Dict[str, int] = {}
    ell_rank = max((len(shape) - len(op.replace("...", "")))
                   for op, shape in zip(operands, shapes) if "..." in op) if "..." in lhs else 0
    expanded = []
    for op, shape in zip(operands, shapes):
        if "..." in op:
            n = len(shape) - len(op.replace("...", ""))
            op = op.replace("...", "".join(str(d) for d in range(ell_rank - n, ell_rank)))
        if len(op) != len(shape):
            raise ValueError(f"einsum {equation!r}: operand {op!r} vs shape {shape}")
        for label, dim in zip(op, shape):
            sizes[label] = max(sizes.get(label, 1), int(dim))
        expanded.append(op)
    if arrow:
        out = out.replace("...", "".join(str(d) for d in range(ell_rank)))
    else:  # implicit output: the labels that occur once, in order
        counts = collections.Counter("".join(expanded))
        out = "".join(str(d) for d in range(ell_rank)) + "".join(
            sorted(c for c, k in counts.items() if k == 1 and not c.isdigit()))
    contracted = set("".join(expanded)) - set(out)
    every = math.prod(sizes.values())
    if contracted:
        return 2 * every if len(expanded) > 1 else every
    return math.prod(sizes[c] for c in out) if len(expanded) > 1 else 0


def register_flop_stats() -> List[str]:
    """Registers profiler FLOP statistics for op types TensorFlow leaves uncounted.

    Idempotent: an op type that already has statistics (TensorFlow's own, or ours from an
    earlier call) is skipped. Returns the op types this call registered.
    """
    # Import TensorFlow's registry first so that ours never pre-empts its entries.
    from tensorflow.python.framework import ops
    importlib.import_module("tensorflow.python.profiler.internal.flops_registry")

    def per_output_element(k):
        def stat(graph, node):
            return ops.OpStats("flops", k * math.prod(_shape(graph, node.name)))
        return stat

    def per_input_element(k):
        def stat(graph, node):
            return ops.OpStats("flops", k * math.prod(_shape(graph, _data_inputs(node)[0])))
        return stat

    def einsum(graph, node):
        shapes = [_shape(graph, i) for i in _data_inputs(node)]
        return ops.OpStats("flops", einsum_flops(node.attr["equation"].s.decode(), shapes))

    stats = {"Einsum": einsum}
    for op in ("Erf", "Erfc", "Exp", "Expm1", "Log1p", "Tanh", "Sigmoid", "Sqrt", "Abs",
               "Sign", "Relu", "Softplus", "Floor", "Round", "Select", "SelectV2",
               "RandomUniform", "RandomStandardNormal", "StatelessRandomUniformV2",
               "StatelessRandomUniform", "LogicalAnd", "LogicalOr", "LogicalNot",
               "FloorDiv", "FloorMod", "DivNoNan"):
        stats[op] = per_output_element(1)
    for op in ("Max", "Min", "Prod", "All", "Any"):  # reductions: one op per input element
        stats[op] = per_input_element(1)
    stats["LogSoftmax"] = per_input_element(SOFTMAX_FLOPS)
    stats["Gelu"] = per_input_element(GELU_FLOPS)
    new = []
    for op, fn in stats.items():
        try:
            ops.RegisterStatistics(op, "flops")(fn)
        except KeyError:  # already registered (TensorFlow's own or an earlier call)
            continue
        new.append(op)
    return new


@dataclasses.dataclass
class Profiled:
    """Profiler FLOPs of one component's frozen forward graph."""
    flops: float  # per sequence (x calls / batch), as tf.compat.v1.profiler counts
    by_op: Dict[str, float]  # op type -> FLOPs per sequence
    unregistered: Dict[str, int]  # op type -> nodes with no FLOP statistics (not data movement)
    calls: int  # times a step runs this graph per sequence (embeddings: 2)

    @property
    def matmul_flops(self) -> float:
        return sum(v for k, v in self.by_op.items()
                   if k in ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum"))


def profile_graph(graph_def) -> Tuple[float, Dict[str, float], Dict[str, int]]:
    """(total FLOPs from tf.compat.v1.profiler, FLOPs by op type, unregistered op types)."""
    import tensorflow as tf
    from tensorflow.python.framework import ops
    register_flop_stats()
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    options = (tf.compat.v1.profiler.ProfileOptionBuilder(
        tf.compat.v1.profiler.ProfileOptionBuilder.float_operation())
        .with_empty_output().build())
    total_flops = tf.compat.v1.profiler.profile(graph, options=options).total_float_ops
    by_op, unregistered = collections.Counter(), collections.Counter()
    for node in graph_def.node:
        value = ops.get_stats_for_node_def(graph, node, "flops").value
        if value is None:
            if node.op not in DATA_MOVEMENT_OPS:
                unregistered[node.op] += 1
        else:
            by_op[node.op] += int(value)
    return float(total_flops), dict(by_op), dict(unregistered)


def _freeze(fn, specs):
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2)
    concrete = tf.function(fn).get_concrete_function(*specs)
    return convert_variables_to_constants_v2(concrete).graph.as_graph_def()


def profile_forward(cfg, batch_size: int = 1, training: bool = True,
                    model=None) -> Dict[str, Profiled]:
    """Profiler FLOPs per sequence of each component of our model, float32, at
    `batch_size` x `cfg.train.max_seq_length` and `predictions_per_seq` generator slots.

    Each component is its own frozen graph: the embeddings (one pass; `calls` = 2 with a
    generator), the generator encoder and the discriminator encoder (embeddings_project
    and the blocks of `modeling.Encoder`), the generator head on the gathered slots (up to
    the logits), the discriminator head. `training` keeps dropout in the graphs (the
    paper's convention counts it). Weights are frozen into the graph, so a large config
    needs memory for a copy of them.
    """
    import tensorflow as tf
    from electra_tf import modeling
    if model is None:
        model = modeling.ElectraPretrainingModel(cfg.model, dtype="float32")
    m, b = cfg.model, batch_size
    s = cfg.train.max_seq_length
    p = cfg.objective.predictions_per_seq(s)
    has_generator = cfg.objective.generator == "masked_lm"
    ids = tf.TensorSpec([b, s], tf.int32)

    def encoder_fn(encoder):
        def run(x, input_mask):  # `modeling.Encoder.call` after its embeddings
            if encoder.embeddings_project is not None:
                x = encoder.embeddings_project(x)
            for block in encoder.blocks:
                x = block(x, input_mask, training=training)
            return x
        return run

    def hidden(width):
        return tf.TensorSpec([b, s, width], tf.float32)

    graphs = collections.OrderedDict()
    graphs["embeddings"] = (
        lambda input_ids, segment_ids: model.embeddings(input_ids, segment_ids,
                                                        training=training),
        [ids, ids], 2 if has_generator else 1)
    if has_generator:
        graphs["generator_encoder"] = (encoder_fn(model.generator),
                                       [hidden(m.embedding_size), ids], 1)
        graphs["generator_mlm_head"] = (
            lambda h, positions: model.generator_predictions(
                modeling.gather_positions(h, positions)),
            [hidden(model.generator.hidden_size), tf.TensorSpec([b, p], tf.int32)], 1)
    graphs["discriminator_encoder"] = (encoder_fn(model.electra),
                                       [hidden(m.embedding_size), ids], 1)
    graphs["discriminator_head"] = (model.discriminator_predictions, [hidden(m.hidden_size)], 1)
    out = collections.OrderedDict()
    for name in ELECTRA_COMPONENTS:
        if name not in graphs:
            out[name] = Profiled(0.0, {}, {}, 0)
            continue
        fn, specs, calls = graphs[name]
        # The model's own LayerNorm reductions, whatever a CPU run in this process chose.
        matvec = modeling.use_matvec_means(False)
        try:
            frozen = _freeze(fn, specs)
        finally:
            modeling.use_matvec_means(matvec)
        flops, by_op, unregistered = profile_graph(frozen)
        scale = calls / b
        out[name] = Profiled(flops * scale, {k: v * scale for k, v in by_op.items()},
                             unregistered, calls)
    return out
