"""FLOP counts of pre-training, by hand: the transformer formulas and what a config's
objective runs and trains (`count_config`, from its spec), for the train loop's MFU and
`run_pretraining.py --count_flops`. Conventions (`Convention`):

* ``paper`` -- the ELECTRA paper, Appendix E, and google-research/electra's
  ``flops_computation.py``: a matmul costs 2*m*n*k; embedding lookups are one-hot matmuls
  (2*E*V per token for words, 2*E*(L + types) for positions and token types); per
  element, dropout 4, LayerNorm 5, GELU 8, softmax 5, biases, residuals and the attention
  scale 1. The MLM output (dense, GELU, LayerNorm, logits, softmax 5V, target pick 2V)
  runs on ``output_frac`` = 0.15625 of the positions, the discriminator head on all.
  Train = 2 x forward ("backward = forward", no optimizer cost); ELECTRA = generator +
  discriminator, each with its own embedding pass. Within 0.07% of the script's figures
  (tests/test_flops.py): it omits the MLM output bias and the discriminator's logit bias,
  and counts the attention LayerNorm as 5 per token instead of 5 x hidden.
* ``hardware`` -- what MFU divides by: the matmuls our code executes (attention included),
  gathered embeddings (0), generator logits at the ``max_predictions_per_seq`` slots it
  computes (padding slots included), no element-wise ops; train = 3 x forward.
* ``graph`` -- the frozen forward graphs, to check against TensorFlow's profiler
  (tests/flops_profiler.py): ``hardware`` plus the paper's element-wise ops (the output
  bias instead of the loss's softmax).

ELECTRIC's one-sided towers are counted with full attention, as computed; a fixed
generator (Fast-ELECTRA) and two_stage's stages are `Phase`s in which the generator side
runs forward only."""

import collections
import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

from electra_tf.objective_specs import SPECS

# Per-element op counts of the paper's convention.
DROPOUT_FLOPS = 4  # random number, >=, mask multiply, 1/(1-p) multiply
LAYER_NORM_FLOPS = 5  # mean, variance (square + sum), scale, shift
GELU_FLOPS = 8
SOFTMAX_FLOPS = 5  # max-subtract, exp, sum, divide
OFFICIAL_OUTPUT_FRAC = 0.15625  # share of positions with an MLM output softmax

# Kinds of terms; a convention decides which it counts.
MATMUL, ELEMENTWISE, LOOKUP, LOSS = "matmul", "elementwise", "lookup", "loss"


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
    """The sizes a FLOP count needs (official defaults: E = h, FFN 4h, h // 64 heads)."""
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
    """dense(E, gelu) -> LayerNorm -> tied-embedding logits (+ softmax), `positions` a sequence."""
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
    """dense(1) at `positions` hidden states a sequence: the adversarial generator's baseline."""
    return [("dense", MATMUL, 2 * t.hidden * positions),
            ("dense_bias", ELEMENTWISE, 1 * positions)]


def total(terms: Sequence[Term], convention: Convention) -> float:
    return float(sum(flops for _, kind, flops in terms if convention.counts(kind)))


# --- our own configs ------------------------------------------------------------------

_GENERATOR_SIDE = ("generator_embeddings", "generator_encoder", "generator_mlm_head")
_DISCRIMINATOR_SIDE = ("discriminator_embeddings", "discriminator_encoder",
                       "discriminator_head")


@dataclasses.dataclass(frozen=True)
class Phase:
    """A stretch of a run whose steps all compute the same: `trained` components run forward and
    backward (train_factor x forward), `forward_only` ones forward only; the rest not at all."""
    name: str
    steps: int
    trained: Tuple[str, ...]
    forward_only: Tuple[str, ...] = ()

    def factor(self, component: str, convention: Convention) -> float:
        if component in self.trained:
            return convention.train_factor
        return 1.0 if component in self.forward_only else 0.0


def config_networks(cfg) -> Tuple[Optional[Transformer], Transformer]:
    """(generator, discriminator) of a `PretrainingConfig`, sized as `ElectraPretrainingModel`
    builds them; no generator for uniform / unigram proposals or objective=mlm."""
    m = cfg.model

    def transformer(hidden, layers, heads, ffn):
        return Transformer(hidden, layers, cfg.train.max_seq_length, vocab=m.vocab_size,
                           embedding_size=m.embedding_size, intermediate_size=ffn,
                           num_heads=heads, type_vocab=m.type_vocab_size)

    disc = transformer(m.hidden_size, m.num_hidden_layers, m.num_attention_heads,
                       m.intermediate_size)
    if cfg.objective.generator not in ("masked_lm", "fixed") or \
            not SPECS[cfg.objective.objective].generator_towers:
        return None, disc
    if m.tie_all_weights:
        return disc, disc
    return transformer(m.generator_hidden, m.generator_num_layers, m.generator_heads,
                       m.generator_intermediate), disc


def _config_plan(cfg, convention: Convention
                 ) -> Tuple[Dict[str, float], Optional[Tuple[Phase, ...]]]:
    """(forward FLOPs per sequence of each component the objective runs, in execution order; its
    phases, or None: one phase that trains everything), from its spec. A run in stages or with a
    fixed generator counts each network's embedding pass apart, as only one of them trains."""
    gen, disc = config_networks(cfg)
    spec = SPECS[cfg.objective.objective]
    fixed = gen is not None and cfg.objective.generator == "fixed"
    s = cfg.train.max_seq_length
    # Generator / MLM output positions: the slots our code computes, or the paper's share.
    slots = (float(cfg.objective.predictions_per_seq(s)) if convention.actual_output_positions
             else OFFICIAL_OUTPUT_FRAC * s)
    positions = {"slots": slots, "all": s}
    out = collections.OrderedDict()

    def add(key, terms):
        out[key] = total(terms, convention)

    if gen is None and spec.trains_generator:
        raise ValueError(f"objective.objective={spec.name} needs the generator network "
                         "(objective.generator=masked_lm)")
    if gen is None:  # no generator network: BERT, or uniform / unigram proposals
        add("embeddings", embedding_terms(disc))
        if spec.generator_towers:
            out["generator_encoder"] = out["generator_mlm_head"] = 0.0
    else:
        towers = spec.generator_towers  # each embeds the input; the LM head reads them all
        if spec.phases:  # each stage's network with its own embedding pass
            add("generator_embeddings", towers * embedding_terms(gen))
        elif fixed:  # the fixed generator's pass apart: it runs forward only
            add("generator_embeddings", towers * embedding_terms(gen))
            add("discriminator_embeddings", embedding_terms(disc))
        else:
            add("embeddings", towers * embedding_terms(gen) + embedding_terms(disc))
        add("generator_encoder", towers * encoder_terms(gen))
        add("generator_mlm_head", lm_head_terms(
            dataclasses.replace(gen, hidden=towers * gen.hidden),
            positions[spec.generator_positions]))
        if "sampling" in spec.heads:
            add("generator_sampling_head", lm_head_terms(gen, slots))
        if "baseline" in spec.heads:
            add("generator_baseline_head", baseline_head_terms(gen, slots))
        if spec.phases:
            add("discriminator_embeddings", embedding_terms(disc))
    add("discriminator_encoder", encoder_terms(disc))
    if "mlm" in spec.heads:
        add("discriminator_mlm_head", lm_head_terms(disc, positions[spec.mlm_positions]))
    if spec.discriminator_head:
        add("discriminator_head", binary_head_terms(disc))
    if spec.phases:  # the generator alone, then the discriminator with it forward only
        steps = cfg.train.num_train_steps
        switch = min(max(cfg.objective.switch_step(steps), 0), steps)
        first, second = spec.phases
        return out, (Phase(first, switch, _GENERATOR_SIDE),
                     Phase(second, steps - switch, _DISCRIMINATOR_SIDE,
                           forward_only=_GENERATOR_SIDE))
    if fixed:  # Fast-ELECTRA: the generator forward only, every step
        trained = tuple(k for k in out if k not in _GENERATOR_SIDE)
        return out, (Phase("fixed_generator", cfg.train.num_train_steps, trained,
                           forward_only=_GENERATOR_SIDE),)
    return out, None


@dataclasses.dataclass(frozen=True)
class Count:
    """FLOPs of a config in one convention, per component and in total; `phases` say
    which components run and train at which steps (none: every step trains all)."""
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

    def forward(self) -> Dict[str, float]:
        """Forward FLOPs per sequence, per component and "total" (each component once)."""
        return self._with_total(1.0)

    def train_per_step(self, phase: Optional[str] = None) -> Dict[str, float]:
        """Train FLOPs of one step of the global batch: trained components forward +
        backward, forward-only ones forward. With phases: of a step of `phase`, or with
        None the average step of the run (`train_per_run` / `num_train_steps`)."""
        if phase is not None:
            p = self.phase(phase)
            return self._with_total(self.batch_size, {
                k: p.factor(k, self.convention) for k in self.forward_per_sequence})
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


def count_config(cfg, convention: Convention = PAPER) -> Count:
    """FLOPs of pre-training with `cfg` (a `configs.PretrainingConfig`) in `convention`."""
    components, phases = _config_plan(cfg, convention)
    return Count(convention, components, cfg.train.train_batch_size,
                 cfg.train.num_train_steps, tuple(phases or ()))


def format_table(cfg, name: str = "") -> str:
    """The --count_flops table: per component, forward FLOPs per sequence and train FLOPs per
    step and per run, in the paper and hardware conventions; for a run in stages (two_stage) the
    train/step columns are the run's average and each stage's step follows."""
    paper, hw = count_config(cfg, PAPER), count_config(cfg, HARDWARE)
    columns = [("fwd/seq paper", paper.forward()), ("fwd/seq hw", hw.forward()),
               ("train/step paper", paper.train_per_step()),
               ("train/step hw", hw.train_per_step()),
               ("run paper", paper.train_per_run()), ("run hw", hw.train_per_run())]
    tc = cfg.train
    lines = [f"FLOPs of {name or 'config'}: objective {cfg.objective.objective}, batch "
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
