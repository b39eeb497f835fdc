"""What tests/test_flops.py checks `electra_tf.pretraining.flops` against: the official script's and
the paper's published figures, and TensorFlow's profiler run on our own model.

Test-only. `PretrainingRun` counts a run of the official script by its own rule (the
summed forward count of every network x train_factor x batch x steps). `profile_forward`
freezes the forward functions of our model's components at static shapes and counts them
with ``tf.compat.v1.profiler``, after registering FLOP statistics for the op types the
profiler leaves at zero (Einsum, Erf/Erfc, Exp, Tanh, RandomUniform, ...;
`register_flop_stats`). Op types that have no statistics and are not pure data movement
are reported, never silently counted as zero.
"""

import collections
import dataclasses
import math
from typing import Dict, List, Optional, Sequence, Tuple

import tensorflow as tf
from tensorflow.python.framework import ops
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2
# Imported before `register_flop_stats` registers ours, so that ours never pre-empts
# TensorFlow's own entries.
from tensorflow.python.profiler.internal import flops_registry  # noqa: F401

from electra_tf import kernels
from electra_tf.model import modeling
from electra_tf.pretraining import flops
from electra_tf.pretraining.flops import PAPER, Convention, Transformer

ELECTRA_COMPONENTS = ("embeddings", "generator_encoder", "generator_mlm_head",
                      "discriminator_encoder", "discriminator_head")


# --- the official script's and the paper's figures ------------------------------------

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
    output_frac: float = flops.OFFICIAL_OUTPUT_FRAC
    output_positions: Optional[int] = None

    def train_flops(self, convention: Convention = PAPER) -> float:
        """FLOPs of the whole run."""
        if convention.actual_output_positions and self.output_positions is not None:
            positions = float(self.output_positions)
        else:
            positions = self.output_frac * self.model.seq_len
        m, g = self.model, self.generator
        if g is None:
            components = [flops.embedding_terms(m), flops.encoder_terms(m),
                          flops.lm_head_terms(m, positions)]
        else:  # generator and discriminator each embed their own input
            components = [flops.embedding_terms(g) + flops.embedding_terms(m),
                          flops.encoder_terms(g), flops.lm_head_terms(g, positions),
                          flops.encoder_terms(m), flops.binary_head_terms(m)]
        forward = sum(flops.total(terms, convention) for terms in components)
        return convention.train_factor * self.batch_size * self.train_steps * forward


def infer_flops(t: Transformer, convention: Convention = PAPER) -> float:
    """One sequence through embeddings, encoder and a per-token binary head (the paper's
    "Infer FLOPs", at t.seq_len)."""
    return flops.total(flops.embedding_terms(t) + flops.encoder_terms(t) +
                       flops.binary_head_terms(t), convention)


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
    stats["LogSoftmax"] = per_input_element(flops.SOFTMAX_FLOPS)
    stats["Gelu"] = per_input_element(flops.GELU_FLOPS)
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
                tf.gather(h, positions, axis=1, batch_dims=1)),
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
        matvec = kernels.use_matvec_means(False)
        try:
            frozen = _freeze(fn, specs)
        finally:
            kernels.use_matvec_means(matvec)
        count, by_op, unregistered = profile_graph(frozen)
        scale = calls / b
        out[name] = Profiled(count * scale, {k: v * scale for k, v in by_op.items()},
                             unregistered, calls)
    return out
