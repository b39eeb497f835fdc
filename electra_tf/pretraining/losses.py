"""The ELECTRA objective as pure functions: masking, sampling, corruption, losses, metrics.

Every function takes tensors and returns tensors: no variables, no hidden state, static
shapes when the inputs have them, and all of them compile with
`tf.function(jit_compile=True)` (TPU / XLA first).

Conventions
-----------
* Token ids are int32 (int64 inputs are cast). `B` batch, `L` sequence length,
  `P` prediction slots per sequence (`max_predictions`), `V` vocabulary size.
* Prediction slots: `masked_positions [B,P]` int32, `masked_ids [B,P]` int32 (the original
  tokens) and `masked_weights [B,P]` float32 (1.0 real slot, 0.0 padding slot). Real slots
  come first, in increasing position order; padding slots point at position 0 with id 0.
* Randomness: only stateless ops with an explicit `seed` (`electra_tf.rng`: a `[3]` int32
  key + the global index of the batch's first row; `[2]` means row 0), so a replica's rows
  draw what the same rows of the whole global batch would, and a seed gives identical
  draws eagerly and under XLA (Philox bits turned into floats here; tested on CPU).
  Give every call its own seed (`rng.split`), every step its own stream (`rng.step_seed`).
* Replica aggregation (losses): each loss has a `*_sums` form returning
  `(numerator, denominator, per_item)`. Each replica computes
  `local_numerator / global_denominator`, the denominator summed over replicas (and
  micro-batches), e.g. `cross_replica_sum(denominator)`; it needs no randomness (MLM:
  `sum(num_to_mask(...)[1])`, discriminator: `sum(input_mask)`). With SUM-reduced
  gradients the replicas then give exactly one device's loss and gradients on the global
  batch. `mlm_loss` / `disc_loss` take it as `global_denominator=` (default: the local
  mean). Do not divide by the number of replicas on top of this.
* Metrics: `metric_sums` returns float32 sums (counts, loss sums, AUC histograms) that add
  up across steps and replicas; `metrics_from_sums` turns them into the reported values.
"""

import math
from typing import Dict, Optional, Tuple

import tensorflow as tf

from electra_tf import rng

AUC_BUCKETS = 1000
_EPS = 1e-5
_DISALLOW_PENALTY = 1000.0


# ----------------------------------------------------------------------------- helpers

def _shape(x: tf.Tensor):
    """Static dims where known, dynamic scalars elsewhere."""
    static = x.shape.as_list()
    dynamic = tf.shape(x)
    return [d if d is not None else dynamic[i] for i, d in enumerate(static)]


def _runtime_zeros(like: tf.Tensor) -> tf.Tensor:
    """float32 zeros shaped like `like`, computed at run time from it.

    Constant generator logits ([B,P,V] zeros) let XLA constant-fold every reduction over
    them (softmax, argmax, ...) with its slow HLO evaluator: minutes of compile time at
    real sizes. XLA does not simplify float `0 * x`, so this keeps the logits opaque.
    """
    return 0.0 * tf.cast(like, tf.float32)


def _scatter_slots(ids: tf.Tensor, positions: tf.Tensor, values: tf.Tensor,
                   real: tf.Tensor) -> tf.Tensor:
    """ids [B,L] with ids[b, positions[b,j]] = values[b,j] wherever real[b,j].

    One-hot reductions instead of a scatter: padding slots (all at position 0) never
    collide with a real slot, results are deterministic on every device, and XLA fuses it.
    A position that several real slots name (`mask_tokens(with_replacement=True)`) gets
    the floor of their values' mean, as the official code's scatter does.
    """
    length = ids.shape[1] if ids.shape[1] is not None else tf.shape(ids)[1]
    hits = tf.one_hot(positions, length, dtype=tf.int32) * tf.cast(real, tf.int32)[..., None]
    times = tf.reduce_sum(hits, axis=1)                           # [B,L]
    new_values = tf.reduce_sum(hits * values[..., None], axis=1)  # [B,L]
    return tf.where(times > 0, new_values // tf.maximum(times, 1), ids)


# ----------------------------------------------------------------------------- seeds

def cross_replica_sum(x: tf.Tensor) -> tf.Tensor:
    """SUM of `x` over the replicas of the current replica context (identity with one).

    Use it on loss denominators to get `global_denominator`; it carries no gradient.
    """
    x = tf.stop_gradient(tf.convert_to_tensor(x))
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync == 1:
        return x
    return ctx.all_reduce(tf.distribute.ReduceOp.SUM, x)


# ----------------------------------------------------------------------------- masking

def num_to_mask(input_ids: tf.Tensor, input_mask: tf.Tensor, *, mask_prob: float,
                max_predictions: int, mask_id: int, cls_id: int, sep_id: int
                ) -> Tuple[tf.Tensor, tf.Tensor]:
    """(candidates [B,L] bool, count [B] int32) as used by `mask_tokens`.

    Candidates: input_mask == 1 and the token is not [CLS], [SEP] or [MASK].
    count = min(#candidates, max(1, min(P, round(num_real_tokens * mask_prob)))) with
    num_real_tokens = sum(input_mask) and TF's round (half to even), as officially.
    """
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
    """Chooses prediction positions and builds the generator's input.

    Args:
      input_ids: [B,L] int32/int64 token ids. input_mask: [B,L] 1 real token, 0 padding.
      seed: [2] int32 stateless seed.
      mask_prob, max_predictions (P), mask_id, cls_id, sep_id, vocab_size: see the config.
      mask_token_prob: share of chosen positions that become [MASK] (ELECTRA 0.85, BERT 0.8).
      random_token_prob: share that get a token uniform on [0, vocab_size) (BERT 0.1);
        the rest keep their original token.

    Positions are drawn uniformly among the candidates WITHOUT replacement (top-k of
    random scores), so the count per row (`num_to_mask`) is exact and no position repeats.
    `with_replacement` draws each slot independently, as the official code does
    (`objective.mask_with_replacement`): a position may fill several slots, each counted
    by the MLM loss; it becomes [MASK] if any of its slots chose [MASK], and `corrupt`
    writes the floor of its samples' mean there, both as the official scatter does. Fewer
    distinct tokens are then corrupted (about 17.2 of 18.5 per 128-token sequence).

    Returns a dict of `masked_input_ids [B,L]` int32, `masked_positions [B,P]` int32,
    `masked_ids [B,P]` int32 (original tokens), `masked_weights [B,P]` float32; real slots
    first in increasing position order, padding slots at position 0 with id 0.
    """
    input_ids = tf.cast(input_ids, tf.int32)
    batch, length = _shape(input_ids)
    if max_predictions < 1:
        raise ValueError(f"max_predictions={max_predictions} must be >= 1")
    candidates, count = num_to_mask(input_ids, input_mask, mask_prob=mask_prob,
                                    max_predictions=max_predictions, mask_id=mask_id,
                                    cls_id=cls_id, sep_id=sep_id)
    seeds = rng.split(seed, 3)

    if with_replacement:
        # Slot j picks the candidate of rank floor(u * #candidates): uniform, independent.
        ranks = tf.cumsum(tf.cast(candidates, tf.int32), axis=-1)           # [B,L]
        n = ranks[:, -1:]                                                    # [B,1]
        u = rng.uniform([batch, max_predictions], seeds[0])
        target = tf.minimum(tf.cast(u * tf.cast(n, tf.float32), tf.int32), n - 1)
        top = tf.reduce_sum(tf.cast(ranks[:, None, :] <= target[..., None], tf.int32), -1)
        k = max_predictions
    else:
        # Uniform scores in [0,1) for candidates, -1 elsewhere: the top `count` are a
        # uniform sample without replacement of the candidates (count <= #candidates).
        scores = tf.where(candidates, rng.uniform([batch, length], seeds[0]), -1.0)
        k = max_predictions
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
    new_values = tf.where(uniform < mask_token_prob, mask_id, masked_ids)
    changed = uniform < mask_token_prob  # the slots that write a token (kept ones do not)
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


# ----------------------------------------------------------------------------- sampling

# Tokens per block of the two-level sampler: the vocabulary is cut into blocks of this many
# tokens; a row draws a block, then a token inside it.
SAMPLE_BLOCK = 256


def inclusive_cumsum(x: tf.Tensor) -> tf.Tensor:
    """Cumulative sum over the last (static) axis by log2(n) shifted adds.

    Exact float32 adds on every backend (a matmul with a triangular matrix would run in
    bfloat16 passes on TPU), and vectorised elementwise work on CPU, where XLA lowers
    `tf.cumsum` to a reduce-window that costs O(n^2).
    """
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
    """One sample per row of `logits [..., V]` from softmax(logits / temperature): [...] int32.

    Inverse-CDF sampling in two levels, exact in law: with p = exp(logits - max) in
    float32, a first uniform picks a block of `SAMPLE_BLOCK` tokens with probability
    proportional to its mass, a second picks a token inside it proportional to p. Two
    uniforms per row (from `seed`, split-invariant over rows) and one exp per logit, where
    Gumbel-max would draw and take two logs of one uniform per logit (10x the work at
    V = 30522 on CPU). `disallow_ids [...]` (e.g. `masked_ids` for `disallow_correct`) get
    1000 subtracted from their (temperature-scaled) logit, so their probability is 0 in
    float32 and they are never drawn. No gradient flows. V must be static.
    """
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
    """The sampling temperature at `step` (float32 scalar): from `start` at step 0 to `end`
    at step `total_steps` and after, along `shape`: "linear"; "cosine" (half a cosine,
    flat at both ends); "exponential" (geometric, start * (end / start)^(step / total),
    fast first: the descending curriculum of Fast-ELECTRA); "constant": `start`."""
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
    """log(counts) logits [*like.shape, V]: the 'unigram' generator (token frequencies).

    `counts [V]` need not be normalised; tokens with count 0 get -1e9 (never drawn).
    """
    counts = tf.cast(tf.convert_to_tensor(counts), tf.float32)
    logits = tf.where(counts > 0, tf.math.log(tf.maximum(counts, 1e-30)), -1e9)
    return logits + _runtime_zeros(like)[..., None]


def corrupt(input_ids: tf.Tensor, masked_positions: tf.Tensor, sampled_ids: tf.Tensor,
            masked_weights: tf.Tensor, label_all_slots: bool = False
            ) -> Tuple[tf.Tensor, tf.Tensor]:
    """The discriminator's input and labels.

    Args: the ORIGINAL input_ids [B,L] (not the [MASK]ed ones), the slots of
      `mask_tokens`, and `sampled_ids [B,P]` from the generator.
    Returns (fake_input_ids [B,L] int32, is_replaced [B,L] int32): samples written at real
      slots; the label is 1 only where the token now differs from the original (a sample
      equal to the original is "real", label 0), or with `label_all_slots` at every real
      slot (ELECTRIC's noise-contrastive labels: a noise sample is noise even when it
      equals the original).
    """
    input_ids = tf.cast(input_ids, tf.int32)
    positions, real = tf.cast(masked_positions, tf.int32), masked_weights > 0
    fake = _scatter_slots(input_ids, positions, tf.cast(sampled_ids, tf.int32), real)
    if label_all_slots:
        ones = tf.ones_like(positions)
        return fake, _scatter_slots(tf.zeros_like(input_ids), positions, ones, real)
    return fake, tf.cast(tf.not_equal(fake, input_ids), tf.int32)


def electric_logits(energies: tf.Tensor, log_q: tf.Tensor, mask_prob: float) -> tf.Tensor:
    """ELECTRIC's noise-contrastive logit that a token is a noise sample, float32 [B,L].

    With k = mask_prob / (1 - mask_prob) noise samples per data token and the noise
    model's log-probability `log_q` of the token in its context, the posterior of "noise"
    is k q / (k q + exp(-E)): its logit is E + log q + log k. `energies` E [B,L] are the
    discriminator's outputs (trained); `log_q` gets no gradient.
    """
    return (tf.cast(energies, tf.float32) + tf.stop_gradient(tf.cast(log_q, tf.float32))
            + float(math.log(mask_prob / (1.0 - mask_prob))))


def pseudo_log_likelihood(energies: tf.Tensor, weights: tf.Tensor) -> tf.Tensor:
    """ELECTRIC's sentence score [B]: -sum of the energies over the weighted tokens (an
    unnormalised pseudo-log-likelihood, from one pass without masking)."""
    return -tf.reduce_sum(tf.cast(energies, tf.float32) * tf.cast(weights, tf.float32), -1)


# ----------------------------------------------------------------------------- losses

def focal_factor(log_p: tf.Tensor, gamma) -> tf.Tensor:
    """(1 - p)^gamma of the focal loss from log p (float32).

    `gamma`: a number >= 0 (0 gives 1: cross-entropy), or "piecewise" for gamma = 3 where
    p > 0.2 and 5 elsewhere (the HP/focal paper's choice, after Mukhoti et al.). The
    gradient flows through (1 - p) as in the focal loss; the piecewise choice is a constant.
    """
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
    """(sum of weighted losses, sum of weights, per-slot loss [B,...]) of an MLM head.

    Softmax cross-entropy in float32 of `logits [B,P,V]` against `masked_ids`; per-slot
    losses are multiplied by `masked_weights`, so padding slots are 0. With a focal
    `gamma` (see `focal_factor`) each slot's -log p is weighted by (1 - p)^gamma; gamma = 0
    is exactly the cross-entropy.
    """
    weights = tf.cast(masked_weights, tf.float32)
    nll = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.cast(masked_ids, tf.int32), logits=tf.cast(logits, tf.float32))
    if isinstance(gamma, str) or float(gamma) != 0.0:
        nll = focal_factor(-nll, gamma) * nll
    per_slot = nll * weights
    return tf.reduce_sum(per_slot), tf.reduce_sum(weights), per_slot


def mlm_loss(logits: tf.Tensor, masked_ids: tf.Tensor, masked_weights: tf.Tensor,
             global_denominator: Optional[tf.Tensor] = None
             ) -> Tuple[tf.Tensor, tf.Tensor]:
    """(mean MLM loss over real slots, per-slot loss [B,P]).

    mean = sum(w * loss) / max(denominator, 1e-5), denominator = sum(w) here, or the
    `global_denominator` (sum of w over all replicas) for the multi-replica convention
    described in the module docstring.
    """
    numerator, denominator, per_slot = mlm_loss_sums(logits, masked_ids, masked_weights)
    if global_denominator is not None:
        denominator = tf.cast(global_denominator, tf.float32)
    return numerator / tf.maximum(denominator, _EPS), per_slot


def disc_loss_sums(disc_logits: tf.Tensor, labels: tf.Tensor, input_mask: tf.Tensor
                   ) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(sum of BCE over real tokens, number of real tokens, per-token BCE [B,L]).

    Real tokens: input_mask == 1 ([CLS] and [SEP] included); per-token losses of padding
    are 0. Computed in float32.
    """
    weights = tf.cast(tf.cast(input_mask, tf.int32) > 0, tf.float32)
    per_token = tf.nn.sigmoid_cross_entropy_with_logits(
        labels=tf.cast(labels, tf.float32), logits=tf.cast(disc_logits, tf.float32)) * weights
    return tf.reduce_sum(per_token), tf.reduce_sum(weights), per_token


def disc_loss(disc_logits: tf.Tensor, labels: tf.Tensor, input_mask: tf.Tensor,
              global_denominator: Optional[tf.Tensor] = None) -> tf.Tensor:
    """Mean BCE of the discriminator over real tokens (scalar float32).

    Local mean by default; pass `global_denominator` (number of real tokens summed over
    replicas) for the multi-replica convention of the module docstring.
    """
    numerator, denominator, _ = disc_loss_sums(disc_logits, labels, input_mask)
    if global_denominator is not None:
        denominator = tf.cast(global_denominator, tf.float32)
    return numerator / tf.maximum(denominator, _EPS)


def gather_slots(values: tf.Tensor, masked_positions: tf.Tensor) -> tf.Tensor:
    """values [B,L,...] at the prediction slots -> [B,P,...]."""
    return tf.gather(values, tf.cast(masked_positions, tf.int32), axis=1, batch_dims=1)


def pick(values: tf.Tensor, ids: tf.Tensor) -> tf.Tensor:
    """values [..., V] at ids [...] -> [...] (one entry per row)."""
    return tf.gather(values, tf.cast(ids, tf.int32), axis=-1, batch_dims=len(ids.shape))


def slot_disc_loss(disc_logits: tf.Tensor, labels: tf.Tensor, masked_positions: tf.Tensor,
                   masked_weights: tf.Tensor) -> tf.Tensor:
    """Per-slot discriminator BCE [B,P] at the prediction slots (0 at padding slots).

    What `electra_15` trains on, what the HP heads estimate and the adversarial
    generator's reward.
    """
    logits = gather_slots(tf.cast(disc_logits, tf.float32), masked_positions)
    slot_labels = tf.cast(gather_slots(labels, masked_positions), tf.float32)
    return tf.nn.sigmoid_cross_entropy_with_logits(labels=slot_labels, logits=logits) * \
        tf.cast(masked_weights, tf.float32)


def copy_mlm_loss_sums(mlm_logits: tf.Tensor, copy_logits: tf.Tensor, input_ids: tf.Tensor,
                       target_ids: tf.Tensor, input_mask: tf.Tensor
                       ) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """All-Tokens MLM with the copy mechanism (ELECTRA paper 3.5).

    For every real token t, p(target_t) = D_t * 1[input_t == target_t]
    + (1 - D_t) * softmax(mlm_logits_t)[target_t], with the copy probability
    D_t = sigmoid(copy_logits_t). Args: `mlm_logits [B,L,V]`, `copy_logits [B,L]`, the
    model's (corrupted) `input_ids [B,L]`, the original `target_ids [B,L]`, `input_mask`.
    Returns (sum of -log p over real tokens, number of real tokens, per-token loss [B,L]).
    """
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
    """The HP_Loss head's estimated discriminator loss L^_D of candidate replacements.

    `hp_logits` estimate the discriminator's "replaced" logit of each candidate; a
    candidate equal to the original token is labelled real (loss -log(1 - D^) =
    softplus(logit)), any other replaced (-log D^ = softplus(-logit)).
    """
    hp_logits = tf.cast(hp_logits, tf.float32)
    return tf.where(candidate_is_original, tf.nn.softplus(hp_logits),
                    tf.nn.softplus(-hp_logits))


def hp_loss_sampling_logits(gen_logits: tf.Tensor, hp_logits: tf.Tensor,
                            masked_ids: tf.Tensor) -> tf.Tensor:
    """Logits [B,P,V] of p_S proportional to p_G * L^_D (HP paper, HP_Loss).

    `gen_logits`, `hp_logits` [B,P,V]: the generator's MLM logits and the sampling head's
    per-candidate logits; `masked_ids [B,P]` the original tokens. No gradient flows.
    """
    gen_logits = tf.stop_gradient(tf.cast(gen_logits, tf.float32))
    vocab = gen_logits.shape[-1]
    is_original = tf.one_hot(tf.cast(masked_ids, tf.int32), vocab, on_value=True,
                             off_value=False, dtype=tf.bool)
    estimate = hp_loss_estimate(tf.stop_gradient(hp_logits), is_original)
    return tf.nn.log_softmax(gen_logits) + tf.math.log(tf.maximum(estimate, 1e-30))


def hp_loss_head_sums(hp_logits_at_sample: tf.Tensor, disc_logits_at_slot: tf.Tensor,
                      masked_weights: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    """(sum over slots of (D^(x') - D(x'))^2, per-slot [B,P]): HP_Loss's head loss.

    D^ = sigmoid of the head's logit for the sampled token, D = the discriminator's
    probability at that slot (a target: no gradient reaches the discriminator).
    """
    target = tf.stop_gradient(tf.sigmoid(tf.cast(disc_logits_at_slot, tf.float32)))
    per_slot = tf.square(tf.sigmoid(tf.cast(hp_logits_at_sample, tf.float32)) - target) * \
        tf.cast(masked_weights, tf.float32)
    return tf.reduce_sum(per_slot), per_slot


def hp_dist_head_sums(sampling_logits: tf.Tensor, gen_logits: tf.Tensor,
                      sampled_ids: tf.Tensor, disc_loss_at_sample: tf.Tensor,
                      masked_weights: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    """(sum over slots, per-slot [B,P]) of HP_Dist's importance-weighted loss (HP paper
    Eq. 2): -(p_G(x') / p_S(x')) * L_D(x') * log p_S(x') for x' drawn from p_S.

    Its expectation over x' ~ p_S is -sum_x p_G(x) L_D(x) log p_S(x), minimised by
    p_S = p_G * L_D / Z. The weight p_G / p_S * L_D is a constant (no gradient to the
    generator's MLM head or the discriminator); the gradient reaches the sampling head.
    """
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
    """(policy-gradient loss sum, baseline loss sum) of the adversarial generator
    (ELECTRA paper, Appendix F), one sample per slot.

    `reward [B,P]` is the discriminator's loss at the slot (what the generator maximises;
    no gradient). The learned baseline predicts the discriminator's probability of the
    right label, q = exp(-reward), as sigmoid(baseline_logits), trained by cross-entropy
    against q; its value in reward units is b = -log sigmoid(baseline_logits). The policy
    loss -(reward - b) * log p_G(x') has the REINFORCE gradient of -E[reward].
    """
    w = tf.cast(masked_weights, tf.float32)
    reward = tf.stop_gradient(tf.cast(reward, tf.float32))
    baseline_logits = tf.cast(baseline_logits, tf.float32)
    advantage = tf.stop_gradient(reward - tf.nn.softplus(-baseline_logits))
    log_p = pick(tf.nn.log_softmax(tf.cast(gen_logits, tf.float32)), sampled_ids)
    policy = -tf.reduce_sum(w * advantage * log_p)
    baseline = tf.reduce_sum(w * tf.nn.sigmoid_cross_entropy_with_logits(
        labels=tf.exp(-reward), logits=baseline_logits))
    return policy, baseline


# ----------------------------------------------------------------------------- metrics

def auc_histograms(disc_logits: tf.Tensor, labels: tf.Tensor, input_mask: tf.Tensor,
                   num_buckets: int = AUC_BUCKETS) -> Tuple[tf.Tensor, tf.Tensor]:
    """(pos_hist, neg_hist) [num_buckets] float32 of sigmoid(disc_logits) over real tokens.

    Bucket i holds probabilities in [i/K, (i+1)/K). Sum them over steps / replicas and
    call `auc_from_histograms`.
    """
    probs = tf.reshape(tf.sigmoid(tf.cast(disc_logits, tf.float32)), [-1])
    bucket = tf.clip_by_value(tf.cast(tf.floor(probs * num_buckets), tf.int32),
                              0, num_buckets - 1)
    weights = tf.reshape(tf.cast(tf.cast(input_mask, tf.int32) > 0, tf.float32), [-1])
    positive = tf.reshape(tf.cast(labels, tf.float32), [-1])
    pos = tf.math.unsorted_segment_sum(weights * positive, bucket, num_buckets)
    neg = tf.math.unsorted_segment_sum(weights * (1.0 - positive), bucket, num_buckets)
    return pos, neg


def auc_from_histograms(pos_hist, neg_hist) -> tf.Tensor:
    """ROC AUC (float32 scalar) from bucketed positive / negative score histograms.

    = P(score_pos > score_neg) + 0.5 * P(same bucket), i.e. the trapezoidal ROC area with
    thresholds at the bucket edges (exact when no two different scores share a bucket).
    0.5 when there are no positives or no negatives.
    """
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
    """Additive float32 statistics of one batch (sum them over steps and replicas).

    Each group is present when its inputs are given:
    * always: mlm_weight (real prediction slots);
    * `sampled_ids`: sampled_correct (samples equal to the original token);
    * `mlm_logits` (the generator's): mlm_correct, mlm_loss_sum (cross-entropy);
    * `disc_logits`, `disc_labels`: disc_weight, disc_loss_sum, disc_correct,
      disc_true_pos, disc_pred_pos, disc_label_pos, auc_pos_hist / auc_neg_hist
      [num_auc_buckets]; with `masked_positions` also disc_masked_correct (accuracy at the
      prediction slots, HP paper Table 5). A token is predicted "replaced" when its
      logit is > 0;
    * `sampling_logits [B,P,V]` (the distribution replacements are drawn from):
      sampling_max_prob_hist [MAX_PROB_BUCKETS], slots by their maximum probability;
    * `main_loss`, `main_correct`, `main_weights` (per-item, [B,...], of the main model
      of MLM-type objectives): main_loss_sum, main_correct, main_weight;
    * `hp_estimate`, `hp_actual` [B,P] (estimated and actual discriminator loss of the
      sampled token, needs `sampled_ids`): Pearson sums hp_corr_{all,original,replaced}_*.
    """
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
    """The reported metrics (float32 scalars) from (accumulated) `metric_sums`.

    As their groups are present: masked_lm_accuracy, masked_lm_loss (the generator's);
    sampled_masked_lm_accuracy (share of sampled replacements equal to the original);
    disc_loss, disc_accuracy (all real tokens), disc_masked_accuracy (prediction slots),
    disc_precision, disc_recall, disc_auc, replaced_fraction (share of real tokens
    labelled replaced); main_lm_loss, main_lm_accuracy (MLM-type objectives' main model);
    sampling_max_prob/<lo>-<hi> (share of slots whose sampling distribution's top
    probability falls in that tenth); hp_loss_corr, hp_loss_corr_original,
    hp_loss_corr_replaced (HP heads: estimated vs actual discriminator loss).
    """
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

