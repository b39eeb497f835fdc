"""The ELECTRA objective as pure functions: masking, sampling, corruption, losses, metrics.

Tensors in, tensors out, in `keras.ops` (the backend's primitives from `electra_tf.kernels`):
no state, static shapes where the inputs have them; every function compiles with
`tf.function(jit_compile=True)` on TensorFlow and `jax.jit` on JAX.

* Ids are int32 (int64 inputs are cast). B batch, L length, P prediction slots
  (`max_predictions`), V vocabulary. Slots: `masked_positions`, `masked_ids` (the original
  tokens) [B,P] int32 and `masked_weights` [B,P] float32 (1 real, 0 padding); real slots
  first in increasing position order, padding slots at position 0 with id 0.
* Randomness: stateless ops with an explicit `seed` (`electra_tf.rng`), so a replica's
  rows draw what the same rows of the global batch would, eagerly and under XLA alike.
  Give every call its own seed (`rng.split`).
* Replicas: each loss has a `*_sums` form (numerator, denominator, per item). A replica
  divides its local numerator by the denominator summed over replicas and micro-batches
  (`cross_replica_sum`; it needs no randomness), so SUM-reduced gradients equal one
  device's on the global batch. Do not also divide by the number of replicas.
* Metrics: `metric_sums` are float32 sums that add over steps and replicas;
  `metrics_from_sums` turns them into the reported values."""

import math
from typing import Dict, Tuple

from keras import ops

from electra_tf import kernels as K
from electra_tf import rng

AUC_BUCKETS = 1000
_EPS = 1e-5
_DISALLOW_PENALTY = 1000.0


def _shape(x):
    """Static dims where known, dynamic scalars elsewhere."""
    return list(ops.shape(x))


def _runtime_zeros(like):
    """float32 zeros like `like`, made at run time: XLA's slow evaluator would constant-fold
    reductions over constant [B,P,V] logits (minutes of compile); it keeps float `0 * x`."""
    return 0.0 * ops.cast(like, "float32")


def _scatter_slots(ids, positions, values, real):
    """ids [B,L] with ids[b, positions[b,j]] = values[b,j] wherever real[b,j]: one-hot sums,
    deterministic on every device (padding slots never collide with real ones). A position named by
    several real slots (`with_replacement`) gets the floor of their values' mean, as officially."""
    length = ops.shape(ids)[1]
    hits = ops.one_hot(positions, length, dtype="int32") * ops.cast(real, "int32")[..., None]
    times = ops.sum(hits, axis=1)                           # [B,L]
    new_values = ops.sum(hits * values[..., None], axis=1)  # [B,L]
    return ops.where(times > 0, new_values // ops.maximum(times, 1), ids)


# SUM of `x` (no gradient) over the current context's replicas: a global denominator.
cross_replica_sum = K.cross_replica_sum


def num_to_mask(input_ids, input_mask, *, mask_prob: float,
                max_predictions: int, mask_id: int, cls_id: int, sep_id: int
                ) -> Tuple:
    """(candidates [B,L] bool: real tokens other than [CLS], [SEP], [MASK]; count [B] int32
    = min(#candidates, max(1, min(P, round(sum(input_mask) * mask_prob)))), TF's round
    (half to even) as officially)."""
    input_ids = ops.cast(input_ids, "int32")
    real = ops.cast(input_mask, "int32") > 0
    candidates = real & ops.not_equal(input_ids, cls_id) & ops.not_equal(input_ids, sep_id) \
        & ops.not_equal(input_ids, mask_id)
    num_real = ops.sum(ops.cast(real, "float32"), axis=-1)
    count = ops.cast(ops.round(num_real * mask_prob), "int32")
    count = ops.maximum(1, ops.minimum(max_predictions, count))
    count = ops.minimum(count, ops.sum(ops.cast(candidates, "int32"), axis=-1))
    return candidates, count


def mask_tokens(input_ids, input_mask, seed, *, mask_prob: float,
                max_predictions: int, mask_id: int, cls_id: int, sep_id: int,
                vocab_size: int, mask_token_prob: float = 0.85,
                random_token_prob: float = 0.0, with_replacement: bool = False
                ) -> Dict:
    """{`masked_input_ids [B,L]` (the generator's input), the slots (module docstring)}.
    `mask_token_prob` of the slots become [MASK] (ELECTRA 0.85, BERT 0.8), `random_token_prob` a
    token uniform on [0, V) (BERT 0.1); the rest keep theirs. Positions are uniform among the
    candidates without replacement (top-k of random scores), exactly `num_to_mask` per row.
    `with_replacement` draws each slot on its own, as the official code: a position may fill
    several slots, each counted by the MLM loss; it becomes [MASK] if any of its slots chose
    [MASK] (about 17.2 of 18.5 distinct tokens corrupted per 128-token sequence)."""
    input_ids = ops.cast(input_ids, "int32")
    batch, length = _shape(input_ids)
    if max_predictions < 1:
        raise ValueError(f"max_predictions={max_predictions} must be >= 1")
    candidates, count = num_to_mask(input_ids, input_mask, mask_prob=mask_prob,
                                    max_predictions=max_predictions, mask_id=mask_id,
                                    cls_id=cls_id, sep_id=sep_id)
    seeds = rng.split(seed, 3)
    k = max_predictions
    if with_replacement:
        # Slot j picks the candidate of rank floor(u * #candidates): uniform, independent.
        ranks = ops.cumsum(ops.cast(candidates, "int32"), axis=-1)           # [B,L]
        n = ranks[:, -1:]                                                    # [B,1]
        u = rng.uniform([batch, max_predictions], seeds[0])
        target = ops.minimum(ops.cast(u * ops.cast(n, "float32"), "int32"), n - 1)
        top = ops.sum(ops.cast(ranks[:, None, :] <= target[..., None], "int32"), -1)
    else:
        # Uniform scores in [0,1) for candidates, -1 elsewhere: the top `count` are a
        # uniform sample without replacement of the candidates (count <= #candidates).
        scores = ops.where(candidates, rng.uniform([batch, length], seeds[0]), -1.0)
        if isinstance(length, int):
            k = min(k, length)
        _, top = ops.top_k(scores, k=k, sorted=True)           # [B,k]
    real = ops.arange(k)[None, :] < count[:, None]
    positions = ops.sort(ops.where(real, top, length), axis=-1)   # real first, ascending
    real = positions < length
    positions = ops.where(real, positions, 0)
    if k < max_predictions:
        pad = [[0, 0], [0, max_predictions - k]]
        positions = ops.pad(positions, pad)
        real = ops.pad(real, pad)
    masked_ids = ops.where(real, K.gather_slots(input_ids, positions), 0)

    uniform = rng.uniform([batch, max_predictions], seeds[1])
    changed = uniform < mask_token_prob  # the slots that write a token (kept ones do not)
    new_values = ops.where(changed, mask_id, masked_ids)
    if random_token_prob > 0:
        random_ids = rng.uniform_int([batch, max_predictions], seeds[2], vocab_size)
        use_random = (uniform >= mask_token_prob) & \
            (uniform < mask_token_prob + random_token_prob)
        new_values = ops.where(use_random, random_ids, new_values)
        changed |= use_random

    return {
        "masked_input_ids": _scatter_slots(input_ids, positions, new_values,
                                           real & changed),
        "masked_positions": positions,
        "masked_ids": masked_ids,
        "masked_weights": ops.cast(real, "float32"),
    }


SAMPLE_BLOCK = 256  # tokens per block of `categorical_sample`


def inclusive_cumsum(x):
    """Cumulative sum over the last (static) axis by log2(n) shifted adds: exact float32
    on every backend (a triangular matmul runs in bfloat16 passes on TPU), and XLA on CPU
    lowers `tf.cumsum` to an O(n^2) reduce-window."""
    n = x.shape[-1]
    pad = [[0, 0]] * (len(x.shape) - 1)
    k = 1
    while k < n:
        x = x + ops.pad(x[..., :n - k], pad + [[k, 0]])
        k *= 2
    return x


def _pick(cdf, target, weights):
    """Index of the first `cdf` entry above `target` [N, 1], never one of zero weight
    (float rounding at the top end falls back to the last entry of positive weight)."""
    n = cdf.shape[-1]
    index = ops.sum(ops.cast(cdf <= target, "int32"), axis=-1)
    last = ops.max(ops.where(weights > 0, ops.arange(n, dtype="int32"), 0), axis=-1)
    return ops.minimum(index, last)


def categorical_sample(logits, seed, temperature=1.0,
                       disallow_ids=None):
    """One sample per row of `logits [..., V]` (V static) from softmax(logits / temperature):
    [...] int32, no gradient. Two-level inverse CDF, exact in law: a first uniform picks a
    block of `SAMPLE_BLOCK` tokens by its mass, a second a token inside it; one exp per
    logit, a tenth of Gumbel-max's work at V = 30522 on CPU. `disallow_ids [...]` lose 1000
    from their scaled logit: probability 0 in float32."""
    logits = ops.stop_gradient(ops.cast(logits, "float32")) / temperature
    vocab = logits.shape[-1]
    if vocab is None:
        raise ValueError("categorical_sample needs a static vocabulary size")
    if disallow_ids is not None:
        logits -= _DISALLOW_PENALTY * ops.one_hot(ops.cast(disallow_ids, "int32"), vocab,
                                                 dtype="float32")
    lead = _shape(logits)[:-1]
    block = min(SAMPLE_BLOCK, vocab)
    blocks = -(-vocab // block)
    x = ops.reshape(logits, [-1, vocab])
    p = ops.exp(x - ops.max(x, axis=-1, keepdims=True))  # the max token has p = 1
    p = ops.reshape(ops.pad(p, [[0, 0], [0, blocks * block - vocab]]), [-1, blocks, block])
    mass = ops.sum(p, axis=-1)                                      # [N, blocks]
    u = ops.reshape(rng.uniform(lead + [2], seed), [-1, 2])
    cdf = inclusive_cumsum(mass)
    b = _pick(cdf, u[:, :1] * cdf[:, -1:], mass)                          # [N]
    inside = K.gather_slots(p, b)                                        # [N, block]
    cdf = inclusive_cumsum(inside)
    j = _pick(cdf, u[:, 1:] * cdf[:, -1:], inside)
    return ops.reshape(b * block + j, lead)


def scheduled_temperature(step, total_steps: int, shape: str, start: float, end: float
                          ):
    """The temperature at `step`, `start` at 0 to `end` at `total_steps`: "linear", "cosine"
    (half a cosine), "exponential" (Fast-ELECTRA's geometric curriculum) or "constant" (`start`)."""
    if shape == "constant":
        return ops.convert_to_tensor(start, "float32")
    frac = ops.clip(ops.cast(step, "float32") / float(max(total_steps, 1)), 0.0, 1.0)
    if shape == "linear":
        return start + (end - start) * frac
    if shape == "cosine":
        return end + (start - end) * 0.5 * (1.0 + ops.cos(math.pi * frac))
    if shape == "exponential":
        return start * ops.power(end / start, frac)
    raise ValueError(f"temperature shape {shape!r}: expected constant, linear, cosine or "
                     "exponential")


def uniform_logits(like, vocab_size: int):
    """Zero logits [*like.shape, V]: the 'uniform' generator (sample with `categorical_sample`)."""
    return ops.broadcast_to(_runtime_zeros(like)[..., None], _shape(like) + [vocab_size])


def unigram_logits(like, counts):
    """log(counts [V]) logits [*like.shape, V]: the 'unigram' generator; count 0 gets -1e9."""
    counts = ops.cast(ops.convert_to_tensor(counts), "float32")
    logits = ops.where(counts > 0, ops.log(ops.maximum(counts, 1e-30)), -1e9)
    return logits + _runtime_zeros(like)[..., None]


def corrupt(input_ids, masked_positions, sampled_ids,
            masked_weights, label_all_slots: bool = False
            ) -> Tuple:
    """(fake_input_ids, is_replaced) [B,L] int32: `sampled_ids [B,P]` written into the ORIGINAL
    `input_ids` at the real slots; label 1 where the token now differs (a sample equal to the
    original is real), or at every real slot with `label_all_slots` (ELECTRIC's labels)."""
    input_ids = ops.cast(input_ids, "int32")
    positions, real = ops.cast(masked_positions, "int32"), masked_weights > 0
    fake = _scatter_slots(input_ids, positions, ops.cast(sampled_ids, "int32"), real)
    if label_all_slots:
        ones = ops.ones_like(positions)
        return fake, _scatter_slots(ops.zeros_like(input_ids), positions, ones, real)
    return fake, ops.cast(ops.not_equal(fake, input_ids), "int32")


def electric_logits(energies, log_q, mask_prob: float):
    """ELECTRIC's logit [B,L] that a token is noise: with k = mask_prob / (1 - mask_prob)
    noise samples a token, P(noise) = k q / (k q + exp(-E)): E + log q + log k, log q constant."""
    return (ops.cast(energies, "float32") + ops.stop_gradient(ops.cast(log_q, "float32"))
            + float(math.log(mask_prob / (1.0 - mask_prob))))


def pseudo_log_likelihood(energies, weights):
    """ELECTRIC's score [B]: -sum of the weighted energies (a pseudo-log-likelihood)."""
    return -ops.sum(ops.cast(energies, "float32") * ops.cast(weights, "float32"), -1)


def focal_factor(log_p, gamma):
    """(1 - p)^gamma from log p: `gamma` >= 0, or "piecewise" (3 where p > 0.2, else 5, after
    Mukhoti et al.; the choice itself carries no gradient)."""
    if isinstance(gamma, str):
        if gamma != "piecewise":
            raise ValueError(f"focal gamma {gamma!r}: expected a number or 'piecewise'")
        p = ops.exp(log_p)
        gamma = ops.where(ops.stop_gradient(p) > 0.2, 3.0, 5.0)
    elif float(gamma) == 0.0:
        return ops.ones_like(log_p)
    # (1 - p)^gamma as exp(gamma * log1p(-p)), finite at p -> 1 (-expm1(log p) = 1 - p).
    return ops.exp(gamma * ops.log(ops.maximum(-ops.expm1(log_p), 1e-30)))


def mlm_loss_sums(logits, masked_ids, masked_weights,
                  gamma=0.0) -> Tuple:
    """(sum of weighted losses, sum of weights, weighted per-slot loss [B,...]): float32
    softmax cross-entropy, each -log p times `focal_factor` when `gamma` != 0."""
    weights = ops.cast(masked_weights, "float32")
    nll = K.softmax_xent(labels=ops.cast(masked_ids, "int32"),
                         logits=ops.cast(logits, "float32"))
    if isinstance(gamma, str) or float(gamma) != 0.0:
        nll = focal_factor(-nll, gamma) * nll
    per_slot = nll * weights
    return ops.sum(per_slot), ops.sum(weights), per_slot


def disc_loss_sums(disc_logits, labels, input_mask
                   ) -> Tuple:
    """(float32 sum of BCE over real tokens, [CLS] and [SEP] included, their number, BCE [B,L])."""
    weights = ops.cast(ops.cast(input_mask, "int32") > 0, "float32")
    per_token = K.sigmoid_xent(labels=ops.cast(labels, "float32"),
                               logits=ops.cast(disc_logits, "float32")) * weights
    return ops.sum(per_token), ops.sum(weights), per_token


def gather_slots(values, masked_positions):
    """values [B,L,...] at the prediction slots -> [B,P,...]."""
    return K.gather_slots(values, ops.cast(masked_positions, "int32"))


def pick(values, ids):
    """values [..., V] at ids [...] -> [...]."""
    return K.pick(values, ops.cast(ids, "int32"))


def slot_disc_loss(disc_logits, labels, masked_positions,
                   masked_weights):
    """The discriminator's BCE [B,P] at the slots (0 at padding): electra_15's loss, the
    HP heads' target and the adversarial generator's reward."""
    logits = gather_slots(ops.cast(disc_logits, "float32"), masked_positions)
    slot_labels = ops.cast(gather_slots(labels, masked_positions), "float32")
    return K.sigmoid_xent(labels=slot_labels, logits=logits) * \
        ops.cast(masked_weights, "float32")


def copy_mlm_loss_sums(mlm_logits, copy_logits, input_ids,
                       target_ids, input_mask
                       ) -> Tuple:
    """All-Tokens MLM with the copy mechanism (ELECTRA paper 3.5): (sum of -log p over real
    tokens, their number, per-token loss [B,L]), p(target) = D 1[input == target] + (1 - D)
    softmax(mlm_logits)[target], D = sigmoid(copy_logits), `input_ids` the corrupted input."""
    weights = ops.cast(ops.cast(input_mask, "int32") > 0, "float32")
    copy_logits = ops.cast(copy_logits, "float32")
    log_vocab = -K.softmax_xent(labels=ops.cast(target_ids, "int32"),
                                logits=ops.cast(mlm_logits, "float32"))
    same = ops.equal(ops.cast(input_ids, "int32"), ops.cast(target_ids, "int32"))
    from_vocab = ops.log_sigmoid(-copy_logits) + log_vocab        # log (1 - D) p_V
    from_copy = ops.log_sigmoid(copy_logits)                      # log D
    log_p = ops.where(same, ops.logsumexp(ops.stack([from_copy, from_vocab]), axis=0),
                     from_vocab)
    per_token = -log_p * weights
    return ops.sum(per_token), ops.sum(weights), per_token


def hp_loss_estimate(hp_logits, candidate_is_original):
    """HP_Loss's estimate L^_D of the discriminator's loss at each candidate from its
    "replaced" logit: softplus(logit) for the original token (real), else softplus(-logit)."""
    hp_logits = ops.cast(hp_logits, "float32")
    return ops.where(candidate_is_original, ops.softplus(hp_logits),
                    ops.softplus(-hp_logits))


def hp_loss_sampling_logits(gen_logits, hp_logits,
                            masked_ids):
    """Logits [B,P,V] of p_S proportional to p_G * L^_D (HP paper, HP_Loss); no gradient."""
    gen_logits = ops.stop_gradient(ops.cast(gen_logits, "float32"))
    vocab = gen_logits.shape[-1]
    is_original = ops.one_hot(ops.cast(masked_ids, "int32"), vocab, dtype="bool")
    estimate = hp_loss_estimate(ops.stop_gradient(hp_logits), is_original)
    return ops.log_softmax(gen_logits) + ops.log(ops.maximum(estimate, 1e-30))


def hp_loss_head_sums(hp_logits_at_sample, disc_logits_at_slot,
                      masked_weights) -> Tuple:
    """HP_Loss's head loss (sum, per slot [B,P]) of (D^(x') - D(x'))^2: the head's and the
    discriminator's probability at the sample, the latter a constant target."""
    target = ops.stop_gradient(ops.sigmoid(ops.cast(disc_logits_at_slot, "float32")))
    per_slot = ops.square(ops.sigmoid(ops.cast(hp_logits_at_sample, "float32")) - target) * \
        ops.cast(masked_weights, "float32")
    return ops.sum(per_slot), per_slot


def hp_dist_head_sums(sampling_logits, gen_logits,
                      sampled_ids, disc_loss_at_sample,
                      masked_weights) -> Tuple:
    """HP_Dist's loss (sum, per slot [B,P]; HP paper Eq. 2):
    -(p_G(x') / p_S(x')) L_D(x') log p_S(x') for x' ~ p_S, minimised by p_S = p_G L_D / Z.
    The weight is a constant: only the sampling head gets a gradient."""
    log_s = ops.log_softmax(ops.cast(sampling_logits, "float32"))
    log_g = ops.log_softmax(ops.stop_gradient(ops.cast(gen_logits, "float32")))
    log_s_x = pick(log_s, sampled_ids)
    weight = ops.stop_gradient(ops.exp(pick(log_g, sampled_ids) - log_s_x) *
                              ops.cast(disc_loss_at_sample, "float32"))
    per_slot = -weight * log_s_x * ops.cast(masked_weights, "float32")
    return ops.sum(per_slot), per_slot


def reinforce_sums(gen_logits, sampled_ids, reward,
                   baseline_logits, masked_weights
                   ) -> Tuple:
    """(policy loss sum, baseline loss sum) of the adversarial generator (ELECTRA paper,
    Appendix F). `reward [B,P]`: the discriminator's loss at the slot (a constant). The
    baseline sigmoid(baseline_logits) learns q = exp(-reward) by cross-entropy; in reward
    units b = -log sigmoid(logits). The policy loss is -(reward - b) log p_G(x')."""
    w = ops.cast(masked_weights, "float32")
    reward = ops.stop_gradient(ops.cast(reward, "float32"))
    baseline_logits = ops.cast(baseline_logits, "float32")
    advantage = ops.stop_gradient(reward - ops.softplus(-baseline_logits))
    log_p = pick(ops.log_softmax(ops.cast(gen_logits, "float32")), sampled_ids)
    policy = -ops.sum(w * advantage * log_p)
    baseline = ops.sum(w * K.sigmoid_xent(labels=ops.exp(-reward), logits=baseline_logits))
    return policy, baseline


def auc_histograms(disc_logits, labels, input_mask,
                   num_buckets: int = AUC_BUCKETS) -> Tuple:
    """(pos_hist, neg_hist) [num_buckets] float32 of sigmoid(disc_logits) over real tokens
    (bucket i: [i/K, (i+1)/K))."""
    probs = ops.reshape(ops.sigmoid(ops.cast(disc_logits, "float32")), [-1])
    bucket = ops.clip(ops.cast(ops.floor(probs * num_buckets), "int32"),
                              0, num_buckets - 1)
    weights = ops.reshape(ops.cast(ops.cast(input_mask, "int32") > 0, "float32"), [-1])
    positive = ops.reshape(ops.cast(labels, "float32"), [-1])
    pos = ops.segment_sum(weights * positive, bucket, num_buckets)
    neg = ops.segment_sum(weights * (1.0 - positive), bucket, num_buckets)
    return pos, neg


def auc_from_histograms(pos_hist, neg_hist):
    """ROC AUC from score histograms: P(pos > neg) + 0.5 P(same bucket), the trapezoidal
    area at the bucket edges; 0.5 without positives or negatives."""
    pos = ops.cast(ops.convert_to_tensor(pos_hist), "float32")  # float32: TPU has no float64
    neg = ops.cast(ops.convert_to_tensor(neg_hist), "float32")
    neg_below = ops.cumsum(neg) - neg  # exact: the histograms hold whole counts
    pairs = ops.sum(pos) * ops.sum(neg)
    wins = ops.sum(pos * (neg_below + 0.5 * neg))
    return ops.where(pairs > 0, wins / ops.maximum(pairs, 1.0), 0.5)


MAX_PROB_BUCKETS = 10  # histogram of the sampling distribution's max probability


def _correlation_sums(x, y, groups: Dict) -> Dict:
    """Additive sums (n, x, y, xx, yy, xy) of each weighted group, for Pearson's r."""
    x, y = ops.cast(x, "float32"), ops.cast(y, "float32")
    out = {}
    for name, w in groups.items():
        w = ops.cast(w, "float32")
        for key, value in (("n", w), ("x", w * x), ("y", w * y), ("xx", w * x * x),
                           ("yy", w * y * y), ("xy", w * x * y)):
            out[f"hp_corr_{name}_{key}"] = ops.sum(value)
    return out


def metric_sums(*, input_mask, masked_ids, masked_weights,
                sampled_ids=None,
                mlm_logits=None,
                disc_logits=None,
                disc_labels=None,
                masked_positions=None,
                sampling_logits=None,
                main_loss=None,
                main_correct=None,
                main_weights=None,
                hp_estimate=None,
                hp_actual=None,
                num_auc_buckets: int = AUC_BUCKETS) -> Dict:
    """Additive float32 sums of one batch, each group when its inputs are given: the generator's
    `mlm_logits`; the discriminator's (replaced where its logit > 0; with `masked_positions` its
    accuracy at the slots, HP paper Table 5); the proposal `sampling_logits [B,P,V]` (histogram of
    the top probability); the per-item `main_*` of MLM-type objectives; the HP heads' estimated and
    actual losses [B,P] at the samples (Pearson sums; needs `sampled_ids`)."""
    w = ops.cast(masked_weights, "float32")
    masked_ids = ops.cast(masked_ids, "int32")
    sums = {"mlm_weight": ops.sum(w)}
    if sampled_ids is not None:
        is_original = ops.cast(ops.equal(ops.cast(sampled_ids, "int32"), masked_ids), "float32")
        sums["sampled_correct"] = ops.sum(w * is_original)
    if mlm_logits is not None:
        loss_sum, _, _ = mlm_loss_sums(mlm_logits, masked_ids, w)
        preds = K.argmax(mlm_logits)
        sums["mlm_correct"] = ops.sum(w * ops.cast(ops.equal(preds, masked_ids),
                                                        "float32"))
        sums["mlm_loss_sum"] = loss_sum
    if disc_logits is not None:
        loss_sum, count, _ = disc_loss_sums(disc_logits, disc_labels, input_mask)
        m = ops.cast(ops.cast(input_mask, "int32") > 0, "float32")
        label = ops.cast(ops.cast(disc_labels, "float32") > 0.5, "float32")
        pred = ops.cast(ops.cast(disc_logits, "float32") > 0, "float32")
        right = ops.cast(ops.equal(pred, label), "float32")
        pos_hist, neg_hist = auc_histograms(disc_logits, label, input_mask, num_auc_buckets)
        sums.update({
            "disc_weight": count,
            "disc_loss_sum": loss_sum,
            "disc_correct": ops.sum(m * right),
            "disc_true_pos": ops.sum(m * pred * label),
            "disc_pred_pos": ops.sum(m * pred),
            "disc_label_pos": ops.sum(m * label),
            "auc_pos_hist": pos_hist,
            "auc_neg_hist": neg_hist,
        })
        if masked_positions is not None:
            sums["disc_masked_correct"] = ops.sum(w * gather_slots(right,
                                                                         masked_positions))
    if sampling_logits is not None:
        top = ops.max(ops.softmax(ops.cast(sampling_logits, "float32")), axis=-1)
        bucket = ops.clip(ops.cast(ops.floor(top * MAX_PROB_BUCKETS), "int32"),
                                  0, MAX_PROB_BUCKETS - 1)
        sums["sampling_max_prob_hist"] = ops.segment_sum(
            ops.reshape(w, [-1]), ops.reshape(bucket, [-1]), MAX_PROB_BUCKETS)
    if main_loss is not None:
        sums.update({"main_loss_sum": ops.sum(ops.cast(main_loss, "float32")),
                     "main_correct": ops.sum(ops.cast(main_correct, "float32")),
                     "main_weight": ops.sum(ops.cast(main_weights, "float32"))})
    if hp_estimate is not None:
        sums.update(_correlation_sums(hp_estimate, hp_actual, {
            "all": w, "original": w * is_original, "replaced": w * (1.0 - is_original)}))
    return sums


def _pearson(sums, group: str):
    """Pearson's r of a `_correlation_sums` group (0 when a variance is 0)."""
    n, x, y, xx, yy, xy = (ops.cast(sums[f"hp_corr_{group}_{k}"], "float32")
                           for k in ("n", "x", "y", "xx", "yy", "xy"))
    var = ops.maximum(n * xx - x * x, 0.0) * ops.maximum(n * yy - y * y, 0.0)
    return ops.where(var > 0, (n * xy - x * y) / ops.sqrt(ops.maximum(var, 1e-30)), 0.0)


def metrics_from_sums(sums: Dict) -> Dict:
    """The reported float32 metrics of the groups in (accumulated) `metric_sums`."""
    def ratio(num, den):
        return ops.cast(sums[num], "float32") / ops.maximum(ops.cast(sums[den], "float32"), _EPS)

    out = {}
    if "mlm_correct" in sums:
        out["masked_lm_accuracy"] = ratio("mlm_correct", "mlm_weight")
        out["masked_lm_loss"] = ratio("mlm_loss_sum", "mlm_weight")
    if "sampled_correct" in sums:
        out["sampled_masked_lm_accuracy"] = ratio("sampled_correct", "mlm_weight")
    if "disc_weight" in sums:
        out.update({
            "disc_loss": ratio("disc_loss_sum", "disc_weight"),
            "disc_accuracy": ratio("disc_correct", "disc_weight"),
            "disc_precision": ratio("disc_true_pos", "disc_pred_pos"),
            "disc_recall": ratio("disc_true_pos", "disc_label_pos"),
            "disc_auc": auc_from_histograms(sums["auc_pos_hist"], sums["auc_neg_hist"]),
            "replaced_fraction": ratio("disc_label_pos", "disc_weight"),
        })
    if "disc_masked_correct" in sums:
        out["disc_masked_accuracy"] = ratio("disc_masked_correct", "mlm_weight")
    if "main_weight" in sums:
        out["main_lm_loss"] = ratio("main_loss_sum", "main_weight")
        out["main_lm_accuracy"] = ratio("main_correct", "main_weight")
    if "sampling_max_prob_hist" in sums:
        hist = ops.cast(sums["sampling_max_prob_hist"], "float32")
        hist = hist / ops.maximum(ops.sum(hist), _EPS)
        for i in range(MAX_PROB_BUCKETS):
            out[f"sampling_max_prob/{i / MAX_PROB_BUCKETS:.1f}-"
                f"{(i + 1) / MAX_PROB_BUCKETS:.1f}"] = hist[i]
    if "hp_corr_all_n" in sums:
        out["hp_loss_corr"] = _pearson(sums, "all")
        out["hp_loss_corr_original"] = _pearson(sums, "original")
        out["hp_loss_corr_replaced"] = _pearson(sums, "replaced")
    return out

