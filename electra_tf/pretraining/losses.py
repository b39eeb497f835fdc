"""The ELECTRA objective as pure functions: masking, sampling, corruption, losses, metrics.

Tensors in, tensors out: no state, static shapes where the inputs have them, and every
function compiles with `tf.function(jit_compile=True)`.

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
from typing import Dict, Optional, Tuple

import tensorflow as tf

from electra_tf import rng

AUC_BUCKETS = 1000
_EPS = 1e-5
_DISALLOW_PENALTY = 1000.0


def _shape(x: tf.Tensor):
    """Static dims where known, dynamic scalars elsewhere."""
    static = x.shape.as_list()
    dynamic = tf.shape(x)
    return [d if d is not None else dynamic[i] for i, d in enumerate(static)]


def _runtime_zeros(like: tf.Tensor) -> tf.Tensor:
    """float32 zeros like `like`, made at run time: XLA's slow evaluator would constant-fold
    reductions over constant [B,P,V] logits (minutes of compile); it keeps float `0 * x`."""
    return 0.0 * tf.cast(like, tf.float32)


def _scatter_slots(ids: tf.Tensor, positions: tf.Tensor, values: tf.Tensor,
                   real: tf.Tensor) -> tf.Tensor:
    """ids [B,L] with ids[b, positions[b,j]] = values[b,j] wherever real[b,j]: one-hot sums,
    deterministic on every device (padding slots never collide with real ones). A position named by
    several real slots (`with_replacement`) gets the floor of their values' mean, as officially."""
    length = ids.shape[1] if ids.shape[1] is not None else tf.shape(ids)[1]
    hits = tf.one_hot(positions, length, dtype=tf.int32) * tf.cast(real, tf.int32)[..., None]
    times = tf.reduce_sum(hits, axis=1)                           # [B,L]
    new_values = tf.reduce_sum(hits * values[..., None], axis=1)  # [B,L]
    return tf.where(times > 0, new_values // tf.maximum(times, 1), ids)


def cross_replica_sum(x: tf.Tensor) -> tf.Tensor:
    """SUM of `x` (no gradient) over the current context's replicas: a global denominator."""
    x = tf.stop_gradient(tf.convert_to_tensor(x))
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync == 1:
        return x
    return ctx.all_reduce(tf.distribute.ReduceOp.SUM, x)


def num_to_mask(input_ids: tf.Tensor, input_mask: tf.Tensor, *, mask_prob: float,
                max_predictions: int, mask_id: int, cls_id: int, sep_id: int
                ) -> Tuple[tf.Tensor, tf.Tensor]:
    """(candidates [B,L] bool: real tokens other than [CLS], [SEP], [MASK]; count [B] int32
    = min(#candidates, max(1, min(P, round(sum(input_mask) * mask_prob)))), TF's round
    (half to even) as officially)."""
    input_ids = tf.cast(input_ids, tf.int32)
    real = tf.cast(input_mask, tf.int32) > 0
    candidates = real & tf.not_equal(input_ids, cls_id) & tf.not_equal(input_ids, sep_id) \
        & tf.not_equal(input_ids, mask_id)
    num_real = tf.reduce_sum(tf.cast(real, tf.float32), axis=-1)
    count = tf.cast(tf.round(num_real * mask_prob), tf.int32)
    count = tf.maximum(1, tf.minimum(max_predictions, count))
    count = tf.minimum(count, tf.reduce_sum(tf.cast(candidates, tf.int32), axis=-1))
    return candidates, count


def mask_tokens(input_ids: tf.Tensor, input_mask: tf.Tensor, seed, *, mask_prob: float,
                max_predictions: int, mask_id: int, cls_id: int, sep_id: int,
                vocab_size: int, mask_token_prob: float = 0.85,
                random_token_prob: float = 0.0, with_replacement: bool = False
                ) -> Dict[str, tf.Tensor]:
    """{`masked_input_ids [B,L]` (the generator's input), the slots (module docstring)}.
    `mask_token_prob` of the slots become [MASK] (ELECTRA 0.85, BERT 0.8), `random_token_prob` a
    token uniform on [0, V) (BERT 0.1); the rest keep theirs. Positions are uniform among the
    candidates without replacement (top-k of random scores), exactly `num_to_mask` per row.
    `with_replacement` draws each slot on its own, as the official code: a position may fill
    several slots, each counted by the MLM loss; it becomes [MASK] if any of its slots chose
    [MASK] (about 17.2 of 18.5 distinct tokens corrupted per 128-token sequence)."""
    input_ids = tf.cast(input_ids, tf.int32)
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
        ranks = tf.cumsum(tf.cast(candidates, tf.int32), axis=-1)           # [B,L]
        n = ranks[:, -1:]                                                    # [B,1]
        u = rng.uniform([batch, max_predictions], seeds[0])
        target = tf.minimum(tf.cast(u * tf.cast(n, tf.float32), tf.int32), n - 1)
        top = tf.reduce_sum(tf.cast(ranks[:, None, :] <= target[..., None], tf.int32), -1)
    else:
        # Uniform scores in [0,1) for candidates, -1 elsewhere: the top `count` are a
        # uniform sample without replacement of the candidates (count <= #candidates).
        scores = tf.where(candidates, rng.uniform([batch, length], seeds[0]), -1.0)
        if isinstance(length, int):
            k = min(k, length)
        _, top = tf.math.top_k(scores, k=k, sorted=True)           # [B,k]
    real = tf.range(k)[None, :] < count[:, None]
    positions = tf.sort(tf.where(real, top, length), axis=-1)   # real first, ascending
    real = positions < length
    positions = tf.where(real, positions, 0)
    if k < max_predictions:
        pad = [[0, 0], [0, max_predictions - k]]
        positions = tf.pad(positions, pad)
        real = tf.pad(real, pad)
    masked_ids = tf.where(real, tf.gather(input_ids, positions, batch_dims=1), 0)

    uniform = rng.uniform([batch, max_predictions], seeds[1])
    changed = uniform < mask_token_prob  # the slots that write a token (kept ones do not)
    new_values = tf.where(changed, mask_id, masked_ids)
    if random_token_prob > 0:
        random_ids = rng.uniform_int([batch, max_predictions], seeds[2], vocab_size)
        use_random = (uniform >= mask_token_prob) & \
            (uniform < mask_token_prob + random_token_prob)
        new_values = tf.where(use_random, random_ids, new_values)
        changed |= use_random

    return {
        "masked_input_ids": _scatter_slots(input_ids, positions, new_values,
                                           real & changed),
        "masked_positions": positions,
        "masked_ids": masked_ids,
        "masked_weights": tf.cast(real, tf.float32),
    }


SAMPLE_BLOCK = 256  # tokens per block of `categorical_sample`


def inclusive_cumsum(x: tf.Tensor) -> tf.Tensor:
    """Cumulative sum over the last (static) axis by log2(n) shifted adds: exact float32
    on every backend (a triangular matmul runs in bfloat16 passes on TPU), and XLA on CPU
    lowers `tf.cumsum` to an O(n^2) reduce-window."""
    n = x.shape[-1]
    pad = [[0, 0]] * (len(x.shape) - 1)
    k = 1
    while k < n:
        x = x + tf.pad(x[..., :n - k], pad + [[k, 0]])
        k *= 2
    return x


def _pick(cdf: tf.Tensor, target: tf.Tensor, weights: tf.Tensor) -> tf.Tensor:
    """Index of the first `cdf` entry above `target` [N, 1], never one of zero weight
    (float rounding at the top end falls back to the last entry of positive weight)."""
    n = cdf.shape[-1]
    index = tf.reduce_sum(tf.cast(cdf <= target, tf.int32), axis=-1)
    last = tf.reduce_max(tf.where(weights > 0, tf.range(n, dtype=tf.int32), 0), axis=-1)
    return tf.minimum(index, last)


def categorical_sample(logits: tf.Tensor, seed, temperature=1.0,
                       disallow_ids: Optional[tf.Tensor] = None) -> tf.Tensor:
    """One sample per row of `logits [..., V]` (V static) from softmax(logits / temperature):
    [...] int32, no gradient. Two-level inverse CDF, exact in law: a first uniform picks a
    block of `SAMPLE_BLOCK` tokens by its mass, a second a token inside it; one exp per
    logit, a tenth of Gumbel-max's work at V = 30522 on CPU. `disallow_ids [...]` lose 1000
    from their scaled logit: probability 0 in float32."""
    logits = tf.stop_gradient(tf.cast(logits, tf.float32)) / temperature
    vocab = logits.shape[-1]
    if vocab is None:
        raise ValueError("categorical_sample needs a static vocabulary size")
    if disallow_ids is not None:
        logits -= _DISALLOW_PENALTY * tf.one_hot(tf.cast(disallow_ids, tf.int32), vocab,
                                                 dtype=tf.float32)
    lead = _shape(logits)[:-1]
    block = min(SAMPLE_BLOCK, vocab)
    blocks = -(-vocab // block)
    x = tf.reshape(logits, [-1, vocab])
    p = tf.exp(x - tf.reduce_max(x, axis=-1, keepdims=True))  # the max token has p = 1
    p = tf.reshape(tf.pad(p, [[0, 0], [0, blocks * block - vocab]]), [-1, blocks, block])
    mass = tf.reduce_sum(p, axis=-1)                                      # [N, blocks]
    u = tf.reshape(rng.uniform(lead + [2], seed), [-1, 2])
    cdf = inclusive_cumsum(mass)
    b = _pick(cdf, u[:, :1] * cdf[:, -1:], mass)                          # [N]
    inside = tf.gather(p, b, batch_dims=1)                                # [N, block]
    cdf = inclusive_cumsum(inside)
    j = _pick(cdf, u[:, 1:] * cdf[:, -1:], inside)
    return tf.reshape(b * block + j, lead)


def scheduled_temperature(step, total_steps: int, shape: str, start: float, end: float
                          ) -> tf.Tensor:
    """The temperature at `step`, `start` at 0 to `end` at `total_steps`: "linear", "cosine"
    (half a cosine), "exponential" (Fast-ELECTRA's geometric curriculum) or "constant" (`start`)."""
    if shape == "constant":
        return tf.constant(start, tf.float32)
    frac = tf.clip_by_value(tf.cast(step, tf.float32) / float(max(total_steps, 1)), 0.0, 1.0)
    if shape == "linear":
        return start + (end - start) * frac
    if shape == "cosine":
        return end + (start - end) * 0.5 * (1.0 + tf.cos(math.pi * frac))
    if shape == "exponential":
        return start * tf.pow(end / start, frac)
    raise ValueError(f"temperature shape {shape!r}: expected constant, linear, cosine or "
                     "exponential")


def uniform_logits(like: tf.Tensor, vocab_size: int) -> tf.Tensor:
    """Zero logits [*like.shape, V]: the 'uniform' generator (sample with `categorical_sample`)."""
    return tf.broadcast_to(_runtime_zeros(like)[..., None], _shape(like) + [vocab_size])


def unigram_logits(like: tf.Tensor, counts) -> tf.Tensor:
    """log(counts [V]) logits [*like.shape, V]: the 'unigram' generator; count 0 gets -1e9."""
    counts = tf.cast(tf.convert_to_tensor(counts), tf.float32)
    logits = tf.where(counts > 0, tf.math.log(tf.maximum(counts, 1e-30)), -1e9)
    return logits + _runtime_zeros(like)[..., None]


def corrupt(input_ids: tf.Tensor, masked_positions: tf.Tensor, sampled_ids: tf.Tensor,
            masked_weights: tf.Tensor, label_all_slots: bool = False
            ) -> Tuple[tf.Tensor, tf.Tensor]:
    """(fake_input_ids, is_replaced) [B,L] int32: `sampled_ids [B,P]` written into the ORIGINAL
    `input_ids` at the real slots; label 1 where the token now differs (a sample equal to the
    original is real), or at every real slot with `label_all_slots` (ELECTRIC's labels)."""
    input_ids = tf.cast(input_ids, tf.int32)
    positions, real = tf.cast(masked_positions, tf.int32), masked_weights > 0
    fake = _scatter_slots(input_ids, positions, tf.cast(sampled_ids, tf.int32), real)
    if label_all_slots:
        ones = tf.ones_like(positions)
        return fake, _scatter_slots(tf.zeros_like(input_ids), positions, ones, real)
    return fake, tf.cast(tf.not_equal(fake, input_ids), tf.int32)


def electric_logits(energies: tf.Tensor, log_q: tf.Tensor, mask_prob: float) -> tf.Tensor:
    """ELECTRIC's logit [B,L] that a token is noise: with k = mask_prob / (1 - mask_prob)
    noise samples a token, P(noise) = k q / (k q + exp(-E)): E + log q + log k, log q constant."""
    return (tf.cast(energies, tf.float32) + tf.stop_gradient(tf.cast(log_q, tf.float32))
            + float(math.log(mask_prob / (1.0 - mask_prob))))


def pseudo_log_likelihood(energies: tf.Tensor, weights: tf.Tensor) -> tf.Tensor:
    """ELECTRIC's score [B]: -sum of the weighted energies (a pseudo-log-likelihood)."""
    return -tf.reduce_sum(tf.cast(energies, tf.float32) * tf.cast(weights, tf.float32), -1)


def focal_factor(log_p: tf.Tensor, gamma) -> tf.Tensor:
    """(1 - p)^gamma from log p: `gamma` >= 0, or "piecewise" (3 where p > 0.2, else 5, after
    Mukhoti et al.; the choice itself carries no gradient)."""
    if isinstance(gamma, str):
        if gamma != "piecewise":
            raise ValueError(f"focal gamma {gamma!r}: expected a number or 'piecewise'")
        p = tf.exp(log_p)
        gamma = tf.where(tf.stop_gradient(p) > 0.2, 3.0, 5.0)
    elif float(gamma) == 0.0:
        return tf.ones_like(log_p)
    # (1 - p)^gamma as exp(gamma * log1p(-p)), finite at p -> 1 (-expm1(log p) = 1 - p).
    return tf.exp(gamma * tf.math.log(tf.maximum(-tf.math.expm1(log_p), 1e-30)))


def mlm_loss_sums(logits: tf.Tensor, masked_ids: tf.Tensor, masked_weights: tf.Tensor,
                  gamma=0.0) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(sum of weighted losses, sum of weights, weighted per-slot loss [B,...]): float32
    softmax cross-entropy, each -log p times `focal_factor` when `gamma` != 0."""
    weights = tf.cast(masked_weights, tf.float32)
    nll = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.cast(masked_ids, tf.int32), logits=tf.cast(logits, tf.float32))
    if isinstance(gamma, str) or float(gamma) != 0.0:
        nll = focal_factor(-nll, gamma) * nll
    per_slot = nll * weights
    return tf.reduce_sum(per_slot), tf.reduce_sum(weights), per_slot


def disc_loss_sums(disc_logits: tf.Tensor, labels: tf.Tensor, input_mask: tf.Tensor
                   ) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(float32 sum of BCE over real tokens, [CLS] and [SEP] included, their number, BCE [B,L])."""
    weights = tf.cast(tf.cast(input_mask, tf.int32) > 0, tf.float32)
    per_token = tf.nn.sigmoid_cross_entropy_with_logits(
        labels=tf.cast(labels, tf.float32), logits=tf.cast(disc_logits, tf.float32)) * weights
    return tf.reduce_sum(per_token), tf.reduce_sum(weights), per_token


def gather_slots(values: tf.Tensor, masked_positions: tf.Tensor) -> tf.Tensor:
    """values [B,L,...] at the prediction slots -> [B,P,...]."""
    return tf.gather(values, tf.cast(masked_positions, tf.int32), axis=1, batch_dims=1)


def pick(values: tf.Tensor, ids: tf.Tensor) -> tf.Tensor:
    """values [..., V] at ids [...] -> [...]."""
    return tf.gather(values, tf.cast(ids, tf.int32), axis=-1, batch_dims=len(ids.shape))


def slot_disc_loss(disc_logits: tf.Tensor, labels: tf.Tensor, masked_positions: tf.Tensor,
                   masked_weights: tf.Tensor) -> tf.Tensor:
    """The discriminator's BCE [B,P] at the slots (0 at padding): electra_15's loss, the
    HP heads' target and the adversarial generator's reward."""
    logits = gather_slots(tf.cast(disc_logits, tf.float32), masked_positions)
    slot_labels = tf.cast(gather_slots(labels, masked_positions), tf.float32)
    return tf.nn.sigmoid_cross_entropy_with_logits(labels=slot_labels, logits=logits) * \
        tf.cast(masked_weights, tf.float32)


def copy_mlm_loss_sums(mlm_logits: tf.Tensor, copy_logits: tf.Tensor, input_ids: tf.Tensor,
                       target_ids: tf.Tensor, input_mask: tf.Tensor
                       ) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """All-Tokens MLM with the copy mechanism (ELECTRA paper 3.5): (sum of -log p over real
    tokens, their number, per-token loss [B,L]), p(target) = D 1[input == target] + (1 - D)
    softmax(mlm_logits)[target], D = sigmoid(copy_logits), `input_ids` the corrupted input."""
    weights = tf.cast(tf.cast(input_mask, tf.int32) > 0, tf.float32)
    copy_logits = tf.cast(copy_logits, tf.float32)
    log_vocab = -tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.cast(target_ids, tf.int32), logits=tf.cast(mlm_logits, tf.float32))
    same = tf.equal(tf.cast(input_ids, tf.int32), tf.cast(target_ids, tf.int32))
    from_vocab = tf.math.log_sigmoid(-copy_logits) + log_vocab        # log (1 - D) p_V
    from_copy = tf.math.log_sigmoid(copy_logits)                      # log D
    log_p = tf.where(same, tf.reduce_logsumexp(tf.stack([from_copy, from_vocab]), axis=0),
                     from_vocab)
    per_token = -log_p * weights
    return tf.reduce_sum(per_token), tf.reduce_sum(weights), per_token


def hp_loss_estimate(hp_logits: tf.Tensor, candidate_is_original: tf.Tensor) -> tf.Tensor:
    """HP_Loss's estimate L^_D of the discriminator's loss at each candidate from its
    "replaced" logit: softplus(logit) for the original token (real), else softplus(-logit)."""
    hp_logits = tf.cast(hp_logits, tf.float32)
    return tf.where(candidate_is_original, tf.nn.softplus(hp_logits),
                    tf.nn.softplus(-hp_logits))


def hp_loss_sampling_logits(gen_logits: tf.Tensor, hp_logits: tf.Tensor,
                            masked_ids: tf.Tensor) -> tf.Tensor:
    """Logits [B,P,V] of p_S proportional to p_G * L^_D (HP paper, HP_Loss); no gradient."""
    gen_logits = tf.stop_gradient(tf.cast(gen_logits, tf.float32))
    vocab = gen_logits.shape[-1]
    is_original = tf.one_hot(tf.cast(masked_ids, tf.int32), vocab, on_value=True,
                             off_value=False, dtype=tf.bool)
    estimate = hp_loss_estimate(tf.stop_gradient(hp_logits), is_original)
    return tf.nn.log_softmax(gen_logits) + tf.math.log(tf.maximum(estimate, 1e-30))


def hp_loss_head_sums(hp_logits_at_sample: tf.Tensor, disc_logits_at_slot: tf.Tensor,
                      masked_weights: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    """HP_Loss's head loss (sum, per slot [B,P]) of (D^(x') - D(x'))^2: the head's and the
    discriminator's probability at the sample, the latter a constant target."""
    target = tf.stop_gradient(tf.sigmoid(tf.cast(disc_logits_at_slot, tf.float32)))
    per_slot = tf.square(tf.sigmoid(tf.cast(hp_logits_at_sample, tf.float32)) - target) * \
        tf.cast(masked_weights, tf.float32)
    return tf.reduce_sum(per_slot), per_slot


def hp_dist_head_sums(sampling_logits: tf.Tensor, gen_logits: tf.Tensor,
                      sampled_ids: tf.Tensor, disc_loss_at_sample: tf.Tensor,
                      masked_weights: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    """HP_Dist's loss (sum, per slot [B,P]; HP paper Eq. 2):
    -(p_G(x') / p_S(x')) L_D(x') log p_S(x') for x' ~ p_S, minimised by p_S = p_G L_D / Z.
    The weight is a constant: only the sampling head gets a gradient."""
    log_s = tf.nn.log_softmax(tf.cast(sampling_logits, tf.float32))
    log_g = tf.nn.log_softmax(tf.stop_gradient(tf.cast(gen_logits, tf.float32)))
    log_s_x = pick(log_s, sampled_ids)
    weight = tf.stop_gradient(tf.exp(pick(log_g, sampled_ids) - log_s_x) *
                              tf.cast(disc_loss_at_sample, tf.float32))
    per_slot = -weight * log_s_x * tf.cast(masked_weights, tf.float32)
    return tf.reduce_sum(per_slot), per_slot


def reinforce_sums(gen_logits: tf.Tensor, sampled_ids: tf.Tensor, reward: tf.Tensor,
                   baseline_logits: tf.Tensor, masked_weights: tf.Tensor
                   ) -> Tuple[tf.Tensor, tf.Tensor]:
    """(policy loss sum, baseline loss sum) of the adversarial generator (ELECTRA paper,
    Appendix F). `reward [B,P]`: the discriminator's loss at the slot (a constant). The
    baseline sigmoid(baseline_logits) learns q = exp(-reward) by cross-entropy; in reward
    units b = -log sigmoid(logits). The policy loss is -(reward - b) log p_G(x')."""
    w = tf.cast(masked_weights, tf.float32)
    reward = tf.stop_gradient(tf.cast(reward, tf.float32))
    baseline_logits = tf.cast(baseline_logits, tf.float32)
    advantage = tf.stop_gradient(reward - tf.nn.softplus(-baseline_logits))
    log_p = pick(tf.nn.log_softmax(tf.cast(gen_logits, tf.float32)), sampled_ids)
    policy = -tf.reduce_sum(w * advantage * log_p)
    baseline = tf.reduce_sum(w * tf.nn.sigmoid_cross_entropy_with_logits(
        labels=tf.exp(-reward), logits=baseline_logits))
    return policy, baseline


def auc_histograms(disc_logits: tf.Tensor, labels: tf.Tensor, input_mask: tf.Tensor,
                   num_buckets: int = AUC_BUCKETS) -> Tuple[tf.Tensor, tf.Tensor]:
    """(pos_hist, neg_hist) [num_buckets] float32 of sigmoid(disc_logits) over real tokens
    (bucket i: [i/K, (i+1)/K))."""
    probs = tf.reshape(tf.sigmoid(tf.cast(disc_logits, tf.float32)), [-1])
    bucket = tf.clip_by_value(tf.cast(tf.floor(probs * num_buckets), tf.int32),
                              0, num_buckets - 1)
    weights = tf.reshape(tf.cast(tf.cast(input_mask, tf.int32) > 0, tf.float32), [-1])
    positive = tf.reshape(tf.cast(labels, tf.float32), [-1])
    pos = tf.math.unsorted_segment_sum(weights * positive, bucket, num_buckets)
    neg = tf.math.unsorted_segment_sum(weights * (1.0 - positive), bucket, num_buckets)
    return pos, neg


def auc_from_histograms(pos_hist, neg_hist) -> tf.Tensor:
    """ROC AUC from score histograms: P(pos > neg) + 0.5 P(same bucket), the trapezoidal
    area at the bucket edges; 0.5 without positives or negatives."""
    pos = tf.cast(tf.convert_to_tensor(pos_hist), tf.float32)  # float32: TPU has no float64
    neg = tf.cast(tf.convert_to_tensor(neg_hist), tf.float32)
    neg_below = tf.cumsum(neg, exclusive=True)
    pairs = tf.reduce_sum(pos) * tf.reduce_sum(neg)
    wins = tf.reduce_sum(pos * (neg_below + 0.5 * neg))
    return tf.where(pairs > 0, wins / tf.maximum(pairs, 1.0), 0.5)


MAX_PROB_BUCKETS = 10  # histogram of the sampling distribution's max probability


def _correlation_sums(x, y, groups: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
    """Additive sums (n, x, y, xx, yy, xy) of each weighted group, for Pearson's r."""
    x, y = tf.cast(x, tf.float32), tf.cast(y, tf.float32)
    out = {}
    for name, w in groups.items():
        w = tf.cast(w, tf.float32)
        for key, value in (("n", w), ("x", w * x), ("y", w * y), ("xx", w * x * x),
                           ("yy", w * y * y), ("xy", w * x * y)):
            out[f"hp_corr_{name}_{key}"] = tf.reduce_sum(value)
    return out


def metric_sums(*, input_mask: tf.Tensor, masked_ids: tf.Tensor, masked_weights: tf.Tensor,
                sampled_ids: Optional[tf.Tensor] = None,
                mlm_logits: Optional[tf.Tensor] = None,
                disc_logits: Optional[tf.Tensor] = None,
                disc_labels: Optional[tf.Tensor] = None,
                masked_positions: Optional[tf.Tensor] = None,
                sampling_logits: Optional[tf.Tensor] = None,
                main_loss: Optional[tf.Tensor] = None,
                main_correct: Optional[tf.Tensor] = None,
                main_weights: Optional[tf.Tensor] = None,
                hp_estimate: Optional[tf.Tensor] = None,
                hp_actual: Optional[tf.Tensor] = None,
                num_auc_buckets: int = AUC_BUCKETS) -> Dict[str, tf.Tensor]:
    """Additive float32 sums of one batch, each group when its inputs are given: the generator's
    `mlm_logits`; the discriminator's (replaced where its logit > 0; with `masked_positions` its
    accuracy at the slots, HP paper Table 5); the proposal `sampling_logits [B,P,V]` (histogram of
    the top probability); the per-item `main_*` of MLM-type objectives; the HP heads' estimated and
    actual losses [B,P] at the samples (Pearson sums; needs `sampled_ids`)."""
    w = tf.cast(masked_weights, tf.float32)
    masked_ids = tf.cast(masked_ids, tf.int32)
    sums = {"mlm_weight": tf.reduce_sum(w)}
    if sampled_ids is not None:
        is_original = tf.cast(tf.equal(tf.cast(sampled_ids, tf.int32), masked_ids), tf.float32)
        sums["sampled_correct"] = tf.reduce_sum(w * is_original)
    if mlm_logits is not None:
        loss_sum, _, _ = mlm_loss_sums(mlm_logits, masked_ids, w)
        preds = tf.argmax(mlm_logits, axis=-1, output_type=tf.int32)
        sums["mlm_correct"] = tf.reduce_sum(w * tf.cast(tf.equal(preds, masked_ids),
                                                        tf.float32))
        sums["mlm_loss_sum"] = loss_sum
    if disc_logits is not None:
        loss_sum, count, _ = disc_loss_sums(disc_logits, disc_labels, input_mask)
        m = tf.cast(tf.cast(input_mask, tf.int32) > 0, tf.float32)
        label = tf.cast(tf.cast(disc_labels, tf.float32) > 0.5, tf.float32)
        pred = tf.cast(tf.cast(disc_logits, tf.float32) > 0, tf.float32)
        right = tf.cast(tf.equal(pred, label), tf.float32)
        pos_hist, neg_hist = auc_histograms(disc_logits, label, input_mask, num_auc_buckets)
        sums.update({
            "disc_weight": count,
            "disc_loss_sum": loss_sum,
            "disc_correct": tf.reduce_sum(m * right),
            "disc_true_pos": tf.reduce_sum(m * pred * label),
            "disc_pred_pos": tf.reduce_sum(m * pred),
            "disc_label_pos": tf.reduce_sum(m * label),
            "auc_pos_hist": pos_hist,
            "auc_neg_hist": neg_hist,
        })
        if masked_positions is not None:
            sums["disc_masked_correct"] = tf.reduce_sum(w * gather_slots(right,
                                                                         masked_positions))
    if sampling_logits is not None:
        top = tf.reduce_max(tf.nn.softmax(tf.cast(sampling_logits, tf.float32)), axis=-1)
        bucket = tf.clip_by_value(tf.cast(tf.floor(top * MAX_PROB_BUCKETS), tf.int32),
                                  0, MAX_PROB_BUCKETS - 1)
        sums["sampling_max_prob_hist"] = tf.math.unsorted_segment_sum(
            tf.reshape(w, [-1]), tf.reshape(bucket, [-1]), MAX_PROB_BUCKETS)
    if main_loss is not None:
        sums.update({"main_loss_sum": tf.reduce_sum(tf.cast(main_loss, tf.float32)),
                     "main_correct": tf.reduce_sum(tf.cast(main_correct, tf.float32)),
                     "main_weight": tf.reduce_sum(tf.cast(main_weights, tf.float32))})
    if hp_estimate is not None:
        sums.update(_correlation_sums(hp_estimate, hp_actual, {
            "all": w, "original": w * is_original, "replaced": w * (1.0 - is_original)}))
    return sums


def _pearson(sums, group: str) -> tf.Tensor:
    """Pearson's r of a `_correlation_sums` group (0 when a variance is 0)."""
    n, x, y, xx, yy, xy = (tf.cast(sums[f"hp_corr_{group}_{k}"], tf.float32)
                           for k in ("n", "x", "y", "xx", "yy", "xy"))
    var = tf.maximum(n * xx - x * x, 0.0) * tf.maximum(n * yy - y * y, 0.0)
    return tf.where(var > 0, (n * xy - x * y) / tf.sqrt(tf.maximum(var, 1e-30)), 0.0)


def metrics_from_sums(sums: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
    """The reported float32 metrics of the groups in (accumulated) `metric_sums`."""
    def ratio(num, den):
        return tf.cast(sums[num], tf.float32) / tf.maximum(tf.cast(sums[den], tf.float32), _EPS)

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
        hist = tf.cast(sums["sampling_max_prob_hist"], tf.float32)
        hist = hist / tf.maximum(tf.reduce_sum(hist), _EPS)
        for i in range(MAX_PROB_BUCKETS):
            out[f"sampling_max_prob/{i / MAX_PROB_BUCKETS:.1f}-"
                f"{(i + 1) / MAX_PROB_BUCKETS:.1f}"] = hist[i]
    if "hp_corr_all_n" in sums:
        out["hp_loss_corr"] = _pearson(sums, "all")
        out["hp_loss_corr_original"] = _pearson(sums, "original")
        out["hp_loss_corr_replaced"] = _pearson(sums, "replaced")
    return out

