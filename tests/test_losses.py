"""Numbers checks of electra_tf.pretraining.losses: masking, sampling, corruption, losses,
metrics, and the pure loss and metric functions of the objective variants."""

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.pretraining import losses as obj
from electra_tf.compat import xla_cpu_available
from electra_tf import rng

CLS, SEP, MASK, PAD = 101, 102, 103, 0
VOCAB = 30522
L, P = 128, 16
MASK_PROB = 0.15
KW = dict(mask_prob=MASK_PROB, max_predictions=P, mask_id=MASK, cls_id=CLS, sep_id=SEP,
          vocab_size=VOCAB)


def jit(fn):
    """XLA where this TensorFlow build compiles for the CPU; a graph under the TPU build."""
    return tf.function(fn, jit_compile=xla_cpu_available())


def mlm_loss(logits, ids, weights, global_denominator=None):
    """(mean MLM loss over the real slots, or over a global denominator; per-slot loss)."""
    num, den, per_slot = obj.mlm_loss_sums(logits, ids, weights)
    den = den if global_denominator is None else global_denominator
    return num / tf.maximum(den, 1e-5), per_slot


def disc_loss(logits, labels, input_mask, global_denominator=None):
    """The discriminator's mean BCE over real tokens (or over a global denominator)."""
    num, den, _ = obj.disc_loss_sums(logits, labels, input_mask)
    return num / tf.maximum(den if global_denominator is None else global_denominator, 1e-5)


def _row(tokens):
    row = np.zeros(L, np.int32)
    row[:len(tokens)] = tokens
    return row


def _base_rows():
    rng = np.random.default_rng(0)
    words = lambda n: list(rng.integers(1000, 30000, n))
    return np.stack([
        _row([CLS] + words(L - 2) + [SEP]),                    # full: 128*.15=19.2 -> cap 16
        _row([CLS] + words(30) + [SEP] + words(27) + [SEP]),   # 60 real -> 9
        _row([CLS] + words(20) + [SEP]),                       # 22 -> 3 (positions test)
        _row([CLS] + words(8) + [SEP]),                        # 10 -> round(1.5) = 2
        _row([CLS] + words(1) + [SEP]),                        # 3 -> max(1, 0) = 1
        _row([CLS, SEP]),                                      # no candidate -> 0
        _row([]),                                              # all padding -> 0
        _row([CLS] + [MASK] * 5 + words(2) + [SEP]),           # 9 -> 1, never a [MASK]
    ])


BASE = _base_rows()
REPS = 512
IDS = np.tile(BASE, (REPS, 1))          # 4096 rows; each copy draws its own positions
INPUT_MASK = (IDS != PAD).astype(np.int32)


def _expected_counts(ids, mask):
    n = mask.sum(1).astype(np.float32)
    cands = ((mask == 1) & (ids != CLS) & (ids != SEP) & (ids != MASK)).sum(1)
    k = np.round(n * np.float32(MASK_PROB)).astype(np.int64)   # half to even, like tf.round
    return np.minimum(cands, np.maximum(1, np.minimum(P, k)))


@pytest.fixture(scope="module")
def electra_masks():
    fn = jit(lambda i, m, s: obj.mask_tokens(i, m, s, **KW))
    a = {k: v.numpy() for k, v in fn(IDS, INPUT_MASK, tf.constant([1, 2])).items()}
    a2 = {k: v.numpy() for k, v in fn(IDS, INPUT_MASK, tf.constant([1, 2])).items()}
    b = {k: v.numpy() for k, v in fn(IDS, INPUT_MASK, tf.constant([1, 3])).items()}
    return a, a2, b


def test_mask_counts_and_valid_positions(electra_masks):
    out = electra_masks[0]
    pos, mids, w, mii = (out[k] for k in ("masked_positions", "masked_ids", "masked_weights",
                                          "masked_input_ids"))
    assert pos.shape == (len(IDS), P) and pos.dtype == np.int32
    assert mids.shape == (len(IDS), P) and mids.dtype == np.int32
    assert w.shape == (len(IDS), P) and w.dtype == np.float32
    assert mii.shape == IDS.shape and mii.dtype == np.int32
    expected = _expected_counts(IDS, INPUT_MASK)
    assert list(expected[:8]) == [16, 9, 3, 2, 1, 0, 0, 1]
    np.testing.assert_array_equal(w.sum(1), expected)
    for b in range(len(IDS)):
        n = int(expected[b])
        np.testing.assert_array_equal(w[b], [1.0] * n + [0.0] * (P - n))   # real slots first
        real = pos[b, :n]
        assert np.all(np.diff(real) > 0)                 # ascending, so no duplicates
        assert np.all(INPUT_MASK[b, real] == 1)
        assert not np.isin(IDS[b, real], [CLS, SEP, MASK, PAD]).any()
        np.testing.assert_array_equal(mids[b, :n], IDS[b, real])
        assert np.all(pos[b, n:] == 0) and np.all(mids[b, n:] == 0)
        changed = np.flatnonzero(mii[b] != IDS[b])
        assert set(changed) <= set(real)
        assert np.all((mii[b, real] == MASK) | (mii[b, real] == IDS[b, real]))


def test_positions_uniform_over_candidates(electra_masks):
    out = electra_masks[0]
    rows = np.arange(2, len(IDS), len(BASE))             # the 20-candidate row, 512 copies
    hits = np.zeros(L)
    for b in rows:
        hits[out["masked_positions"][b, :3]] += 1
    freq = hits[1:21] / len(rows)                       # candidates are positions 1..20
    assert hits[0] == 0 and hits[21:].sum() == 0
    np.testing.assert_allclose(freq, 3 / 20, atol=0.06)  # binomial sd 0.016 per position
    assert abs(freq.mean() - 0.15) < 1e-9


def test_mask_85_15_split(electra_masks):
    out = electra_masks[0]
    real = out["masked_weights"] > 0
    rows = np.nonzero(real)[0]
    pos = out["masked_positions"][real]
    new = out["masked_input_ids"][rows, pos]
    assert real.sum() >= 10_000
    frac_mask = np.mean(new == MASK)
    assert abs(frac_mask - 0.85) < 0.02, frac_mask
    np.testing.assert_array_equal(new[new != MASK], out["masked_ids"][real][new != MASK])


def test_mask_bert_80_10_10():
    fn = jit(lambda i, m, s: obj.mask_tokens(i, m, s, **dict(KW, mask_token_prob=0.8,
                                                               random_token_prob=0.1)))
    out = {k: v.numpy() for k, v in fn(IDS, INPUT_MASK, tf.constant([5, 6])).items()}
    real = out["masked_weights"] > 0
    rows = np.nonzero(real)[0]
    new = out["masked_input_ids"][rows, out["masked_positions"][real]]
    orig = out["masked_ids"][real]
    assert real.sum() >= 10_000
    assert abs(np.mean(new == MASK) - 0.8) < 0.02
    assert abs(np.mean(new == orig) - 0.1) < 0.015
    other = new[(new != MASK) & (new != orig)]
    assert abs(len(other) / len(new) - 0.1) < 0.015
    assert other.min() >= 0 and other.max() < VOCAB and len(np.unique(other)) > 0.9 * len(other)
    unchanged = np.ones_like(IDS, bool)
    unchanged[rows, out["masked_positions"][real]] = False
    np.testing.assert_array_equal(out["masked_input_ids"][unchanged], IDS[unchanged])


def test_mask_seeds_reproducible(electra_masks):
    a, a2, b = electra_masks
    for k in a:
        np.testing.assert_array_equal(a[k], a2[k])
    np.testing.assert_array_equal(a["masked_weights"], b["masked_weights"])  # counts fixed
    rich = np.tile(np.arange(len(BASE)) < 4, REPS)     # rows with >= 2 slots to place
    differ = np.any(a["masked_positions"] != b["masked_positions"], axis=1)
    assert differ[rich].mean() > 0.95
    assert not np.array_equal(a["masked_input_ids"], b["masked_input_ids"])
    # Eager execution draws exactly the same as XLA (Philox bits, own float conversion).
    eager = obj.mask_tokens(IDS[:64], INPUT_MASK[:64], tf.constant([1, 2]), **KW)
    for k in a:
        np.testing.assert_array_equal(eager[k].numpy(), a[k][:64])


def test_static_shapes():
    fn = jit(lambda i, m, s: obj.mask_tokens(i, m, s, **KW))
    conc = fn.get_concrete_function(tf.TensorSpec([4, L], tf.int64),
                                    tf.TensorSpec([4, L], tf.int64),
                                    tf.TensorSpec([2], tf.int32))
    shapes = {k: v.shape.as_list() for k, v in conc.structured_outputs.items()}
    assert shapes == {"masked_input_ids": [4, L], "masked_positions": [4, P],
                      "masked_ids": [4, P], "masked_weights": [4, P]}
    # More slots than positions: still [B, P], padded.
    out = obj.mask_tokens(IDS[:8, :6], INPUT_MASK[:8, :6], [0, 0], **dict(KW, mask_prob=0.9))
    assert out["masked_positions"].shape == (8, P)
    np.testing.assert_array_equal(out["masked_weights"].numpy().sum(1)[:2], [5, 5])  # 5 words


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _freqs(ids, vocab):
    return np.bincount(ids.ravel(), minlength=vocab) / ids.size


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_sampling_matches_softmax(temperature):
    rows = np.array([[1.0, 0.0, -1.0, 2.0, 0.5], [-2.0, 3.0, 0.0, 0.0, 1.0]], np.float32)
    n = 50_000
    logits = np.broadcast_to(rows[:, None, :], (2, n, 5))
    ids = jit(obj.categorical_sample)(logits, tf.constant([7, 8]), tf.constant(temperature)).numpy()
    assert ids.shape == (2, n) and ids.dtype == np.int32
    for r in range(2):
        p = _softmax(rows[r] / temperature)
        f = _freqs(ids[r], 5)
        chi2 = n * np.sum((f - p) ** 2 / p)
        assert chi2 < 18.47, (chi2, f, p)               # df=4, p=0.001
        assert np.max(np.abs(f - p)) < 0.01


def test_sampling_disallow_correct_and_helpers():
    vocab = 8
    originals = np.random.default_rng(1).integers(0, vocab, (64, 100)).astype(np.int32)
    logits = 10.0 * np.eye(vocab, dtype=np.float32)[originals]      # peaked at the original
    sample = jit(obj.categorical_sample)
    free = sample(logits, tf.constant([1, 1]), tf.constant(1.0)).numpy()
    assert np.mean(free == originals) > 0.99
    banned = sample(logits, tf.constant([1, 1]), tf.constant(1.0), originals).numpy()
    assert not np.any(banned == originals)
    uni = sample(obj.uniform_logits(tf.constant(originals), vocab), tf.constant([2, 2]),
                 tf.constant(1.0)).numpy()
    np.testing.assert_allclose(_freqs(uni, vocab), 1 / vocab, atol=0.01)
    counts = np.array([0, 1, 3, 6], np.float32)
    uni_logits = obj.unigram_logits(tf.constant(originals), counts)
    assert uni_logits.shape == (64, 100, 4)
    gram = sample(uni_logits, tf.constant([3, 3]), tf.constant(1.0)).numpy()
    f = _freqs(gram, 4)
    assert f[0] == 0
    np.testing.assert_allclose(f, counts / counts.sum(), atol=0.015)


def test_two_level_sampling_over_many_blocks():
    """V = 1000: four blocks of 256, the last one padded; heavy tokens in every block and
    at the last id. Frequencies follow the softmax (chi-square over the 20 likeliest
    tokens + the rest), and a disallowed token is never drawn."""
    vocab = 1000
    row = np.random.default_rng(0).normal(0.0, 2.0, vocab).astype(np.float32)
    row[[3, 300, 700, 999]] += 6.0
    n = 40_000
    logits = np.broadcast_to(row, (n, vocab))
    sample = jit(obj.categorical_sample)
    ids = sample(logits, tf.constant([5, 6]), tf.constant(1.0)).numpy()
    assert ids.shape == (n,) and 0 <= ids.min() and ids.max() < vocab
    p = _softmax(row)
    top = np.argsort(-p)[:20]
    assert {3, 300, 700, 999} <= set(top.tolist())
    f = _freqs(ids, vocab)
    observed, expected = np.append(f[top], 1 - f[top].sum()), np.append(p[top], 1 - p[top].sum())
    chi2 = n * np.sum((observed - expected) ** 2 / expected)
    assert chi2 < 45.31, (chi2, observed, expected)     # df=20, p=0.001
    best = int(np.argmax(p))
    banned = sample(logits, tf.constant([5, 6]), tf.constant(1.0),
                    np.full([n], best, np.int32)).numpy()
    assert not np.any(banned == best)
    q = np.delete(p, best) / (1 - p[best])
    g = np.delete(_freqs(banned, vocab), best)
    assert np.max(np.abs(g - q)) < 0.01


def test_inclusive_cumsum():
    x = np.random.default_rng(0).random((3, 257)).astype(np.float32)
    np.testing.assert_allclose(jit(obj.inclusive_cumsum)(x).numpy(), np.cumsum(x, -1),
                               rtol=1e-5)


def test_corrupt_hand_made():
    ids = np.array([[CLS, 5, 6, 7, SEP, PAD],
                    [CLS, 8, 9, SEP, PAD, PAD],
                    [4, 5, 6, 7, 8, 9]], np.int32)      # no [CLS]: a real slot at position 0
    positions = np.array([[1, 3, 0], [2, 0, 0], [0, 2, 0]], np.int32)
    weights = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 0]], np.float32)
    samples = np.array([[5, 42, 77],                    # 5 == original: stays "real"
                        [13, 55, 66],
                        [70, 6, 99]], np.int32)         # padding slots at 0 must not win
    fake, labels = jit(obj.corrupt)(ids, positions, samples, weights)
    np.testing.assert_array_equal(fake.numpy(), [[CLS, 5, 6, 42, SEP, PAD],
                                                 [CLS, 8, 13, SEP, PAD, PAD],
                                                 [70, 5, 6, 7, 8, 9]])
    np.testing.assert_array_equal(labels.numpy(), [[0, 0, 0, 1, 0, 0],
                                                   [0, 0, 1, 0, 0, 0],
                                                   [1, 0, 0, 0, 0, 0]])


def test_mask_with_replacement_as_the_official_code(electra_masks):
    """objective.mask_with_replacement: each slot an independent uniform candidate
    (duplicates kept, each a real slot); a position is [MASK] if any of its slots chose
    [MASK]; `corrupt` writes the floor of the mean of a position's samples."""
    fn = jit(lambda i, m, s: obj.mask_tokens(i, m, s, with_replacement=True, **KW))
    out = {k: v.numpy() for k, v in fn(IDS, INPUT_MASK, tf.constant([1, 2])).items()}
    w, pos = out["masked_weights"] > 0, out["masked_positions"]
    # The same slot counts as without replacement; real slots first, ascending.
    np.testing.assert_array_equal(w.sum(1), electra_masks[0]["masked_weights"].sum(1))
    assert np.all(np.diff(np.where(w, pos, L), axis=1) >= 0)
    cands = (INPUT_MASK == 1) & (IDS != CLS) & (IDS != SEP) & (IDS != MASK)
    assert np.all(cands[np.arange(len(IDS))[:, None].repeat(P, 1)[w], pos[w]])
    # Full rows (126 candidates, 16 slots): duplicates at the birthday rate, and the
    # expected number of distinct positions 126 (1 - (125/126)^16) = 15.10.
    full = np.arange(0, len(IDS), len(BASE))
    distinct = np.array([len(set(pos[r][w[r]])) for r in full])
    assert distinct.mean() == pytest.approx(126 * (1 - (125 / 126) ** 16), abs=0.1)
    assert np.all(distinct <= 16) and np.any(distinct < 16)
    # Slots are uniform over the candidates (row 0 copies: 512 x 16 slots on 126).
    hist = np.bincount(pos[full][w[full]], minlength=L)[1:127]
    assert hist.sum() == 512 * 16 and hist.min() > 30 and hist.max() < 110
    # [MASK] wherever a slot chose it: ~1 - 0.15^2 of duplicated positions, and the
    # generator input differs from the input only at chosen positions.
    changed = out["masked_input_ids"] != IDS
    chosen = np.zeros_like(changed)
    for r in range(len(IDS)):
        chosen[r, pos[r][w[r]]] = True
    assert not np.any(changed & ~chosen)
    assert np.all(out["masked_input_ids"][changed] == MASK)
    share = changed[chosen].mean()
    assert 0.85 < share < 0.88  # 0.85 per distinct position, more where duplicated
    ids = np.array([[CLS, 5, 6, 7, SEP]], np.int32)
    fake, labels = jit(obj.corrupt)(ids, np.array([[2, 2, 3]], np.int32),
                                    np.array([[40, 51, 7]], np.int32),
                                    np.array([[1, 1, 1]], np.float32))
    np.testing.assert_array_equal(fake.numpy(), [[CLS, 5, 45, 7, SEP]])  # (40+51)//2
    np.testing.assert_array_equal(labels.numpy(), [[0, 0, 1, 0, 0]])


def test_mlm_loss_values():
    rng = np.random.default_rng(2)
    ids = rng.integers(0, VOCAB, (3, 4)).astype(np.int32)
    w = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], np.float32)
    loss, per_slot = jit(mlm_loss)(np.zeros((3, 4, VOCAB), np.float32), ids, w)
    np.testing.assert_allclose(loss.numpy(), np.log(VOCAB), rtol=1e-6)
    np.testing.assert_allclose(per_slot.numpy(), w * np.log(VOCAB), rtol=1e-6)
    logits = rng.normal(size=(3, 4, 50)).astype(np.float32)
    ids50 = ids % 50
    direct = -np.log(_softmax(logits.astype(np.float64)))[
        np.arange(3)[:, None], np.arange(4)[None], ids50]
    loss, _ = mlm_loss(logits, ids50, w)
    np.testing.assert_allclose(loss.numpy(), (direct * w).sum() / w.sum(), rtol=1e-5)
    noisy, noisy_ids = logits.copy(), ids50.copy()       # padding slots contribute nothing
    noisy[w == 0] = rng.normal(size=(int((w == 0).sum()), 50)) * 30
    noisy_ids[w == 0] = 0
    np.testing.assert_allclose(mlm_loss(noisy, noisy_ids, w)[0].numpy(), loss.numpy(),
                               rtol=1e-6)


def test_disc_loss_values():
    mask = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]], np.int32)
    labels = np.array([[0, 1, 0, 0, 1, 1], [0, 0, 1, 0, 1, 0]], np.int32)
    loss = jit(disc_loss)(np.zeros((2, 6), np.float32), labels, mask)
    np.testing.assert_allclose(loss.numpy(), np.log(2.0), rtol=1e-6)
    logits = np.random.default_rng(3).normal(size=(2, 6)).astype(np.float32)
    p = 1 / (1 + np.exp(-logits.astype(np.float64)))
    bce = -(labels * np.log(p) + (1 - labels) * np.log(1 - p))
    np.testing.assert_allclose(disc_loss(logits, labels, mask).numpy(),
                               (bce * mask).sum() / mask.sum(), rtol=1e-5)
    noisy = np.where(mask == 1, logits, 50.0).astype(np.float32)
    np.testing.assert_allclose(disc_loss(noisy, labels, mask).numpy(),
                               disc_loss(logits, labels, mask).numpy(), rtol=1e-6)


def test_replicas_with_global_denominator_match_one_device():
    """Two 'replicas' with unequal slot / token counts give the one-device loss and grads."""
    rng = np.random.default_rng(4)
    mlm_logits = tf.constant(rng.normal(size=(4, 3, 20)).astype(np.float32))
    ids = rng.integers(0, 20, (4, 3)).astype(np.int32)
    w = np.array([[1, 1, 1], [1, 1, 0], [1, 0, 0], [0, 0, 0]], np.float32)
    d_logits = tf.constant(rng.normal(size=(4, 5)).astype(np.float32))
    labels = rng.integers(0, 2, (4, 5))
    mask = np.array([[1] * 5, [1] * 5, [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]], np.int32)

    def total(ml, dl, sl, mlm_den=None, disc_den=None):
        return (mlm_loss(ml, ids[sl], w[sl], mlm_den)[0] +
                50.0 * disc_loss(dl, labels[sl], mask[sl], disc_den))

    with tf.GradientTape(persistent=True) as tape:
        tape.watch([mlm_logits, d_logits])
        full = total(mlm_logits, d_logits, slice(0, 4))
        mlm_den = sum(obj.mlm_loss_sums(mlm_logits[s], ids[s], w[s])[1]
                      for s in (slice(0, 2), slice(2, 4)))
        disc_den = sum(obj.disc_loss_sums(d_logits[s], labels[s], mask[s])[1]
                       for s in (slice(0, 2), slice(2, 4)))
        parts = [total(mlm_logits[s], d_logits[s], s, mlm_den, disc_den)
                 for s in (slice(0, 2), slice(2, 4))]
        naive = 0.5 * sum(total(mlm_logits[s], d_logits[s], s) for s in (slice(0, 2),
                                                                          slice(2, 4)))
    np.testing.assert_allclose((parts[0] + parts[1]).numpy(), full.numpy(), rtol=1e-6)
    assert abs(naive.numpy() - full.numpy()) > 1e-3          # local means would be biased
    for var in (mlm_logits, d_logits):
        g_full = tape.gradient(full, var).numpy()
        g_sum = tape.gradient(parts[0], var).numpy() + tape.gradient(parts[1], var).numpy()
        np.testing.assert_allclose(g_sum, g_full, rtol=1e-5, atol=1e-7)
    assert float(obj.cross_replica_sum(tf.constant(3.0))) == 3.0   # one replica: identity


def _direct_auc(scores, labels):
    pos, neg = scores[labels == 1], scores[labels == 0]
    greater = (pos[:, None] > neg[None, :]).sum()
    ties = (pos[:, None] == neg[None, :]).sum()
    return (greater + 0.5 * ties) / (len(pos) * len(neg))


def test_auc_from_histograms_vs_direct():
    rng = np.random.default_rng(5)
    k = 50
    scores = rng.integers(0, k, 3000)                       # discrete scores: exact match
    labels = (rng.random(3000) < 0.2 + 0.6 * scores / k).astype(np.int64)
    pos = np.bincount(scores[labels == 1], minlength=k)
    neg = np.bincount(scores[labels == 0], minlength=k)
    np.testing.assert_allclose(obj.auc_from_histograms(pos, neg).numpy(),
                               _direct_auc(scores, labels), atol=1e-6)
    # Continuous logits through auc_histograms, with padding that must be ignored.
    logits = rng.normal(size=(20, 200)).astype(np.float32)
    labels = (rng.random((20, 200)) < 1 / (1 + np.exp(-2 * logits))).astype(np.int32)
    mask = (rng.random((20, 200)) < 0.8).astype(np.int32)
    padded_logits = np.where(mask == 1, logits, 9.0).astype(np.float32)
    pos_h, neg_h = jit(obj.auc_histograms)(padded_logits, labels, mask)
    assert pos_h.shape == (obj.AUC_BUCKETS,) and float(pos_h.numpy().sum() +
                                                       neg_h.numpy().sum()) == mask.sum()
    probs = 1 / (1 + np.exp(-logits.astype(np.float64)))
    direct = _direct_auc(probs[mask == 1], labels[mask == 1])
    assert 0.6 < direct < 0.9
    assert abs(obj.auc_from_histograms(pos_h, neg_h).numpy() - direct) < 2e-3
    # Histograms add up across batches.
    h1 = obj.auc_histograms(padded_logits[:10], labels[:10], mask[:10])
    h2 = obj.auc_histograms(padded_logits[10:], labels[10:], mask[10:])
    np.testing.assert_array_equal(h1[0].numpy() + h2[0].numpy(), pos_h.numpy())
    assert float(obj.auc_from_histograms(np.zeros(4), np.ones(4))) == 0.5


def test_metrics_hand_made_and_accumulable():
    disc_logits = np.array([[2.0, -1.0, 0.5, -3.0, 1.0, 5.0],
                            [-2.0, 1.5, -0.5, 0.0, -1.0, 4.0]], np.float32)
    labels = np.array([[0, 0, 1, 0, 1, 1], [0, 1, 1, 0, 0, 1]], np.int32)
    mask = np.array([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]], np.int32)
    masked_ids = np.array([[3, 4, 0], [5, 0, 0]], np.int32)
    w = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
    sampled = np.array([[3, 9, 3], [5, 1, 0]], np.int32)
    mlm_logits = np.zeros((2, 3, 10), np.float32)
    mlm_logits[0, 0, 3] = mlm_logits[0, 1, 7] = mlm_logits[1, 0, 5] = 4.0
    args = dict(disc_logits=disc_logits, disc_labels=labels, input_mask=mask,
                masked_ids=masked_ids, masked_weights=w, sampled_ids=sampled,
                mlm_logits=mlm_logits)
    m = {k: float(v) for k, v in jit(lambda a: obj.metrics_from_sums(obj.metric_sums(**a)))(args).items()}
    # Real tokens: preds (logit > 0) 1 0 1 0 1 | 0 1 0 0 ; labels 0 0 1 0 1 | 0 1 1 0
    assert m["disc_accuracy"] == pytest.approx(7 / 9)
    assert m["disc_precision"] == pytest.approx(3 / 4)
    assert m["disc_recall"] == pytest.approx(3 / 4)
    assert m["replaced_fraction"] == pytest.approx(4 / 9)
    assert m["masked_lm_accuracy"] == pytest.approx(2 / 3)
    assert m["sampled_masked_lm_accuracy"] == pytest.approx(2 / 3)
    assert m["disc_loss"] == pytest.approx(float(disc_loss(disc_logits, labels, mask)))
    assert m["masked_lm_loss"] == pytest.approx(float(mlm_loss(mlm_logits, masked_ids, w)[0]))
    pos_scores = 1 / (1 + np.exp(-disc_logits[(mask == 1)]))
    assert m["disc_auc"] == pytest.approx(_direct_auc(pos_scores, labels[mask == 1]), abs=1e-6)
    # Sums over two half-batches give the metrics of the whole batch.
    halves = [obj.metric_sums(**{k: v[s] for k, v in args.items()})
              for s in (slice(0, 1), slice(1, 2))]
    acc = {k: halves[0][k] + halves[1][k] for k in halves[0]}
    for k, v in obj.metrics_from_sums(acc).items():
        assert float(v) == pytest.approx(m[k], abs=1e-6), k


def test_full_step_under_xla_matches_eager():
    """mask -> sample (uniform generator, disallow) -> corrupt -> losses -> metrics."""
    ids, mask = IDS[:16], INPUT_MASK[:16]

    def step(ids, mask, seed):
        mask_seed, sample_seed = tf.unstack(rng.split(seed, 2))
        m = obj.mask_tokens(ids, mask, mask_seed, **KW)
        logits = obj.uniform_logits(m["masked_ids"], VOCAB)
        sampled = obj.categorical_sample(logits, sample_seed, 1.0, m["masked_ids"])
        fake, labels = obj.corrupt(ids, m["masked_positions"], sampled, m["masked_weights"])
        disc_logits = tf.cast(fake % 7, tf.float32) - 3.0
        mlm, _ = mlm_loss(logits, m["masked_ids"], m["masked_weights"])
        disc = disc_loss(disc_logits, labels, mask)
        return dict(m, fake=fake, labels=labels, mlm=mlm, disc=disc,
                    **obj.metrics_from_sums(obj.metric_sums(
                        disc_logits=disc_logits, disc_labels=labels, input_mask=mask,
                        masked_ids=m["masked_ids"], masked_weights=m["masked_weights"],
                        sampled_ids=sampled, mlm_logits=logits)))

    seed = rng.step_seed(tf.constant([0, 1]), tf.constant(10, tf.int64), 3)
    assert not np.array_equal(seed.numpy(), rng.step_seed([0, 1], 10, 2).numpy())
    out = {k: v.numpy() for k, v in jit(step)(ids, mask, seed).items()}
    ref = {k: v.numpy() for k, v in step(ids, mask, seed).items()}
    for k in ("masked_input_ids", "masked_positions", "fake", "labels"):
        np.testing.assert_array_equal(out[k], ref[k])
    for k in ("mlm", "disc", "disc_auc", "disc_accuracy"):
        np.testing.assert_allclose(out[k], ref[k], rtol=1e-5)
    np.testing.assert_allclose(out["mlm"], np.log(VOCAB), rtol=1e-6)
    # With disallow_correct every real slot is replaced: labels == real slots exactly.
    assert out["sampled_masked_lm_accuracy"] == 0
    assert out["labels"].sum() == out["masked_weights"].sum()
    assert out["replaced_fraction"] == pytest.approx(out["labels"].sum() / mask.sum())


_MIRRORED = r'''
import numpy as np, tensorflow as tf
from electra_tf.pretraining import losses as obj
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
rng = np.random.default_rng(6)
feats = rng.normal(size=(4, 3, 20)).astype(np.float32)
ids = rng.integers(0, 20, (4, 3)).astype(np.int32)
w = np.array([[1, 1, 1], [1, 1, 0], [1, 0, 0], [0, 0, 0]], np.float32)
dfeats = rng.normal(size=(4, 5)).astype(np.float32)
labels = rng.integers(0, 2, (4, 5)).astype(np.int32)
mask = np.array([[1] * 5, [1] * 5, [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]], np.int32)

def loss_and_grads(bias, scale, f, i, ww, d, lab, m, replicated):
    with tf.GradientTape() as tape:
        num, den, _ = obj.mlm_loss_sums(f + bias, i, ww)
        dnum, dden, _ = obj.disc_loss_sums(d * scale, lab, m)
        if replicated:
            den, dden = obj.cross_replica_sum(den), obj.cross_replica_sum(dden)
        loss = num / den + 50.0 * dnum / dden
    grads = tape.gradient(loss, [bias, scale])
    if replicated:
        ctx = tf.distribute.get_replica_context()
        loss, grads = ctx.all_reduce("sum", loss), ctx.all_reduce("sum", grads)
    return [loss] + grads

strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    bias = tf.Variable(tf.zeros([20]))
    scale = tf.Variable(1.5)
data = (feats, ids, w, dfeats, labels, mask)
one = loss_and_grads(bias, scale, *data, replicated=False)
dist = strategy.experimental_distribute_values_from_function(
    lambda ctx: tuple(x[2 * ctx.replica_id_in_sync_group:][:2] for x in data))
per = strategy.run(tf.function(lambda *a: loss_and_grads(bias, scale, *a, replicated=True)),
                   args=dist)
assert strategy.num_replicas_in_sync == 2
for a, b in zip(one, per):
    for r in strategy.experimental_local_results(b):
        np.testing.assert_allclose(r.numpy(), a.numpy(), rtol=1e-5, atol=1e-7)
print("MIRRORED_OK", float(one[0]))
'''


@pytest.mark.subprocess
def test_two_mirrored_replicas_equal_one_device():
    """Real MirroredStrategy over 2 logical CPUs (another process: devices are set at start)."""
    import forked_cli
    run = forked_cli.run(["-c", _MIRRORED], timeout=120)
    assert "MIRRORED_OK" in run.stdout, run.stdout[-2000:] + run.stderr[-4000:]


# --- ELECTRIC ---------------------------------------------------------------------------

def test_electric_nce_loss_against_the_noise_posterior_by_hand():
    """The logit of "noise" is E + log q + log(p/(1-p)): its BCE must equal -log of the NCE
    posterior k q / (k q + exp(-E)) (label 1) or of its complement (label 0), k = p/(1-p)."""
    energies = np.array([[0.5, -1.0, 2.0]], np.float32)
    q = np.array([[0.2, 0.5, 0.1]], np.float32)
    labels = np.array([[1, 0, 1]], np.int32)
    p = 0.25
    k = p / (1 - p)
    posterior = k * q / (k * q + np.exp(-energies.astype(np.float64)))
    by_hand = -np.mean(np.where(labels == 1, np.log(posterior), np.log(1 - posterior)))
    assert by_hand == pytest.approx(1.331073, abs=1e-6)  # the value by hand, 6 digits
    logits = obj.electric_logits(energies, np.log(q), p)
    total, count, _ = obj.disc_loss_sums(logits, labels, tf.ones_like(labels))
    assert float(total / count) == pytest.approx(by_hand, rel=1e-6)
    np.testing.assert_allclose(logits.numpy(), [[-2.208050, -2.791759, -1.401197]],
                               atol=1e-5)


def test_electric_logits_pass_no_gradient_to_log_q():
    e, log_q = tf.Variable([[0.3, -0.2]]), tf.Variable([[-1.0, -2.0]])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(obj.electric_logits(e, log_q, 0.15))
    ge, gq = tape.gradient(loss, [e, log_q])
    np.testing.assert_array_equal(ge.numpy(), [[1.0, 1.0]])
    assert gq is None


def test_corrupt_labels_every_real_slot_for_electric():
    ids = tf.constant([[101, 7, 8, 9, 102]])
    positions, sampled = tf.constant([[1, 3, 0]]), tf.constant([[7, 5, 0]])
    weights = tf.constant([[1.0, 1.0, 0.0]])  # slot 1 samples the original token
    fake, usual = obj.corrupt(ids, positions, sampled, weights)
    fake2, nce = obj.corrupt(ids, positions, sampled, weights, label_all_slots=True)
    np.testing.assert_array_equal(fake.numpy(), [[101, 7, 8, 5, 102]])
    np.testing.assert_array_equal(fake2.numpy(), fake.numpy())
    np.testing.assert_array_equal(usual.numpy(), [[0, 0, 0, 1, 0]])
    np.testing.assert_array_equal(nce.numpy(), [[0, 1, 0, 1, 0]])


def test_pseudo_log_likelihood_sums_the_weighted_energies():
    e = tf.constant([[1.0, 2.0, 4.0], [0.5, 0.5, 8.0]])
    w = tf.constant([[0, 1, 1], [1, 1, 0]])
    np.testing.assert_allclose(obj.pseudo_log_likelihood(e, w).numpy(), [-6.0, -1.0])


# --- the sampling temperature schedule (Fast-ELECTRA) -----------------------------------

@pytest.mark.parametrize("shape,half", [("linear", 2.5), ("cosine", 2.5),
                                        ("exponential", 2.0)])
def test_scheduled_temperature_descends_from_start_to_end(shape, half):
    at = lambda step: float(obj.scheduled_temperature(step, 100, shape, 4.0, 1.0))
    assert at(0) == pytest.approx(4.0)
    assert at(50) == pytest.approx(half, rel=1e-6)
    assert at(100) == pytest.approx(1.0) and at(250) == pytest.approx(1.0)
    values = [at(s) for s in range(0, 101, 10)]
    assert all(a > b for a, b in zip(values, values[1:]))
    if shape == "cosine":  # flat at both ends
        assert 4.0 - at(5) < at(45) - at(55)
    if shape == "exponential":  # geometric: a constant ratio per step
        assert at(25) / at(0) == pytest.approx(at(75) / at(50), rel=1e-5)
    assert float(obj.scheduled_temperature(tf.constant(30, tf.int64), 100, "constant",
                                           1.5, 1.5)) == 1.5


# ----------------------------------------------------------------------------- the objective variants' losses

def _np(x):
    return np.asarray(x, np.float64)


def test_focal_loss_is_cross_entropy_at_gamma_zero_and_weights_by_one_minus_p():
    logits = tf.constant(np.random.default_rng(0).normal(size=(2, 3, 7)) * 3, tf.float32)
    ids = tf.constant([[1, 2, 3], [4, 5, 6]])
    w = tf.constant([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    ce_sum, _, ce = obj.mlm_loss_sums(logits, ids, w)
    f0_sum, _, f0 = obj.mlm_loss_sums(logits, ids, w, gamma=0.0)
    np.testing.assert_array_equal(f0.numpy(), ce.numpy())
    assert float(f0_sum) == float(ce_sum)

    p = np.take_along_axis(tf.nn.softmax(logits).numpy(), ids.numpy()[..., None], -1)[..., 0]
    _, _, f2 = obj.mlm_loss_sums(logits, ids, w, gamma=2.0)
    np.testing.assert_allclose(f2.numpy(), -(1 - p) ** 2 * np.log(p) * w.numpy(), rtol=1e-5)
    _, _, fp = obj.mlm_loss_sums(logits, ids, w, gamma="piecewise")
    gamma = np.where(p > 0.2, 3.0, 5.0)
    np.testing.assert_allclose(fp.numpy(), -(1 - p) ** gamma * np.log(p) * w.numpy(),
                               rtol=1e-5)
    assert (p > 0.2).any() and (p <= 0.2).any()  # both branches exercised
    # A confident right answer costs (almost) nothing; the gradient still flows.
    with tf.GradientTape() as tape:
        x = tf.Variable([[[5.0, 0.0, 0.0]]])
        loss, _, _ = obj.mlm_loss_sums(x, tf.constant([[0]]), tf.constant([[1.0]]), gamma=2.0)
    assert float(loss) < 1e-5 and np.all(np.isfinite(tape.gradient(loss, x).numpy()))
    with pytest.raises(ValueError, match="piecewise"):
        obj.focal_factor(tf.constant([-1.0]), "cubic")


def test_hp_dist_loss_is_minimised_at_pg_times_ld_over_z():
    """E_{x ~ p_S}[L_S(x)] = -sum_x p_G L_D log p_S: its minimum over the sampling head's
    logits is p_S = p_G * L_D / Z (HP paper, Eq. 2), found here by gradient descent on a
    toy vocabulary of 6 tokens."""
    p_g = np.array([0.5, 0.2, 0.1, 0.1, 0.05, 0.05])
    l_d = np.array([0.05, 0.7, 2.0, 0.3, 1.5, 0.9])  # discriminator loss per candidate
    target = p_g * l_d / np.sum(p_g * l_d)
    gen_logits = tf.constant(np.tile(np.log(p_g), (6, 1)), tf.float32)
    s = tf.Variable(tf.zeros([1, 6]))

    @tf.function
    def expected_loss():
        # Every candidate x as the sampled token of its own row, weighted by p_S(x)
        # (the sampling law: a constant).
        p_s = tf.stop_gradient(tf.nn.softmax(s))[0]
        total, _ = obj.hp_dist_head_sums(tf.tile(s, [6, 1]), gen_logits, tf.range(6),
                                         tf.constant(l_d, tf.float32), p_s)
        return total

    # The closed form of the expectation, checked at the start.
    p0 = np.full(6, 1 / 6)
    assert float(expected_loss()) == pytest.approx(-np.sum(p_g * l_d * np.log(p0)), rel=1e-5)
    @tf.function
    def descend():
        for _ in tf.range(400):
            with tf.GradientTape() as tape:
                loss = expected_loss()
            s.assign_sub(1.0 * tape.gradient(loss, s))

    descend()
    np.testing.assert_allclose(tf.nn.softmax(s)[0].numpy(), target, atol=2e-3)
    # ... and the gradient vanishes there.
    s.assign(np.log(target)[None])
    with tf.GradientTape() as tape:
        loss = expected_loss()
    assert np.abs(tape.gradient(loss, s).numpy()).max() < 1e-5


def test_hp_loss_sampling_law_is_pg_times_estimated_loss():
    rng = np.random.default_rng(1)
    gen = rng.normal(size=(1, 2, 5)).astype(np.float32)
    hp = rng.normal(size=(1, 2, 5)).astype(np.float32)
    original = np.array([[3, 0]])
    logits = obj.hp_loss_sampling_logits(tf.constant(gen), tf.constant(hp),
                                         tf.constant(original))
    p_g = np.exp(gen) / np.exp(gen).sum(-1, keepdims=True)
    d_hat = 1 / (1 + np.exp(-hp.astype(np.float64)))  # estimated P(replaced)
    is_orig = np.arange(5)[None, None] == original[..., None]
    l_hat = np.where(is_orig, -np.log(1 - d_hat), -np.log(d_hat))
    want = p_g * l_hat / (p_g * l_hat).sum(-1, keepdims=True)
    np.testing.assert_allclose(tf.nn.softmax(logits).numpy(), want, rtol=1e-5)
    # The head's loss: squared error against the discriminator's probability, whose
    # gradient stays out of the discriminator.
    hp_at, disc_at = tf.Variable([[0.3, -1.0]]), tf.Variable([[2.0, 0.0]])
    with tf.GradientTape(persistent=True) as tape:
        total, per = obj.hp_loss_head_sums(hp_at, disc_at, tf.constant([[1.0, 1.0]]))
    sig = lambda x: 1 / (1 + np.exp(-np.asarray(x)))
    np.testing.assert_allclose(per.numpy(), (sig([[0.3, -1.0]]) - sig([[2.0, 0.0]])) ** 2,
                               rtol=1e-5)
    assert tape.gradient(total, disc_at) is None
    assert tape.gradient(total, hp_at) is not None


def test_copy_mechanism_loss_on_a_hand_made_batch():
    # V = 4. Token 0: input == target (copy possible); token 1: replaced (vocab only);
    # token 2: padding.
    mlm_logits = tf.constant([[[0.0, 1.0, 2.0, 3.0], [1.0, 1.0, 1.0, 1.0], [9.0, 0, 0, 0]]])
    copy_logits = tf.constant([[0.5, -1.0, 4.0]])
    inputs = tf.constant([[2, 3, 0]])
    targets = tf.constant([[2, 1, 0]])
    mask = tf.constant([[1, 1, 0]])
    total, count, per = obj.copy_mlm_loss_sums(mlm_logits, copy_logits, inputs, targets, mask)
    sm = tf.nn.softmax(mlm_logits).numpy()[0]
    d = 1 / (1 + np.exp(-np.array([0.5, -1.0])))
    want = [-np.log(d[0] + (1 - d[0]) * sm[0, 2]), -np.log((1 - d[1]) * sm[1, 1]), 0.0]
    np.testing.assert_allclose(per.numpy()[0], want, rtol=1e-5)
    assert float(count) == 2.0 and float(total) == pytest.approx(sum(want), rel=1e-5)


def test_reinforce_gradient_and_baseline_target():
    """Policy gradient: d/dlogits = -(r - b) * d log p(x'); the baseline's cross-entropy
    is smallest where sigmoid(b) = exp(-reward)."""
    logits = tf.Variable([[[0.2, -0.3, 1.0]]])
    base = tf.Variable([[0.4]])
    reward = tf.constant([[1.3]])
    with tf.GradientTape(persistent=True) as tape:
        policy, baseline = obj.reinforce_sums(logits, tf.constant([[2]]), reward, base,
                                              tf.constant([[1.0]]))
    p = tf.nn.softmax(logits).numpy()[0, 0]
    b = np.log1p(np.exp(-0.4))  # -log sigmoid(0.4)
    want = -(1.3 - b) * (np.eye(3)[2] - p)
    np.testing.assert_allclose(tape.gradient(policy, logits).numpy()[0, 0], want, rtol=1e-5)
    assert float(policy) == pytest.approx(-(1.3 - b) * np.log(p[2]), rel=1e-5)
    q = np.exp(-1.3)
    np.testing.assert_allclose(tape.gradient(baseline, base).numpy(),
                               [[1 / (1 + np.exp(-0.4)) - q]], rtol=1e-5)
    # No gradient through the reward (the discriminator's loss).
    r = tf.Variable([[1.3]])
    with tf.GradientTape() as tape:
        policy, baseline = obj.reinforce_sums(logits, tf.constant([[2]]), r, base,
                                              tf.constant([[1.0]]))
        total = policy + baseline
    assert tape.gradient(total, r) is None


def test_slot_disc_loss_and_masked_accuracy_on_a_hand_made_batch():
    disc_logits = tf.constant([[3.0, -2.0, 1.0, -1.0, 0.5]])
    labels = tf.constant([[0, 0, 1, 1, 0]])
    positions = tf.constant([[2, 3, 0]])
    weights = tf.constant([[1.0, 1.0, 0.0]])
    per = obj.slot_disc_loss(disc_logits, labels, positions, weights).numpy()[0]
    sp = lambda x: np.log1p(np.exp(x))
    np.testing.assert_allclose(per, [sp(-1.0), sp(1.0), 0.0], rtol=1e-6)
    sums = obj.metric_sums(input_mask=tf.ones([1, 5], tf.int32), masked_ids=tf.constant(
        [[7, 8, 0]]), masked_weights=weights, sampled_ids=tf.constant([[7, 9, 0]]),
        disc_logits=disc_logits, disc_labels=labels, masked_positions=positions)
    m = {k: float(v) for k, v in obj.metrics_from_sums(sums).items()}
    # predictions (logit > 0): 1 0 1 0 1 vs labels 0 0 1 1 0 -> 2 of 5 right overall,
    # at the slots (positions 2, 3): right, wrong.
    assert m["disc_accuracy"] == pytest.approx(2 / 5)
    assert m["disc_masked_accuracy"] == pytest.approx(1 / 2)
    assert m["sampled_masked_lm_accuracy"] == pytest.approx(1 / 2)


def test_max_probability_histogram_and_hp_correlation():
    # Slot 0: a peaked distribution (max ~0.97), slot 1 uniform over 4 (0.25), slot 2
    # padding (not counted).
    sampling = tf.constant([[[6.0, 0, 0, 0], [0.0, 0, 0, 0], [9.0, 0, 0, 0]]])
    rng = np.random.default_rng(3)
    est = rng.normal(size=(1, 3)).astype(np.float32)
    act = (2 * est + rng.normal(size=(1, 3))).astype(np.float32)
    w = tf.constant([[1.0, 1.0, 0.0]])
    sums = obj.metric_sums(input_mask=tf.ones([1, 4], tf.int32),
                           masked_ids=tf.constant([[0, 1, 0]]), masked_weights=w,
                           sampled_ids=tf.constant([[0, 2, 0]]), sampling_logits=sampling,
                           hp_estimate=tf.constant(est), hp_actual=tf.constant(act))
    np.testing.assert_array_equal(sums["sampling_max_prob_hist"].numpy(),
                                  [0, 0, 1, 0, 0, 0, 0, 0, 0, 1])
    m = obj.metrics_from_sums(sums)
    assert float(m["sampling_max_prob/0.9-1.0"]) == 0.5
    assert float(m["sampling_max_prob/0.2-0.3"]) == 0.5
    # Two real slots: r = +-1; each group has one point: r = 0 (no variance).
    want = np.corrcoef(est[0, :2], act[0, :2])[0, 1]
    assert float(m["hp_loss_corr"]) == pytest.approx(want, abs=1e-5)
    assert float(m["hp_loss_corr_original"]) == 0.0

    # Many points, accumulated over two batches, equal numpy's Pearson r.
    x = rng.normal(size=(2, 40)).astype(np.float32)
    y = (0.5 * x + rng.normal(size=(2, 40))).astype(np.float32)
    sampled = rng.integers(0, 2, size=(2, 40))
    halves = [obj.metric_sums(
        input_mask=tf.ones([1, 4], tf.int32), masked_ids=tf.zeros([1, 40], tf.int32),
        masked_weights=tf.ones([1, 40]), sampled_ids=tf.constant(sampled[half]),
        hp_estimate=tf.constant(x[half]), hp_actual=tf.constant(y[half]))
        for half in (slice(0, 1), slice(1, 2))]
    m = obj.metrics_from_sums({k: halves[0][k] + halves[1][k] for k in halves[0]})
    assert float(m["hp_loss_corr"]) == pytest.approx(np.corrcoef(x.ravel(), y.ravel())[0, 1],
                                                      abs=1e-4)
    orig = sampled.ravel() == 0
    assert float(m["hp_loss_corr_original"]) == pytest.approx(
        np.corrcoef(x.ravel()[orig], y.ravel()[orig])[0, 1], abs=1e-4)
    assert float(m["hp_loss_corr_replaced"]) == pytest.approx(
        np.corrcoef(x.ravel()[~orig], y.ravel()[~orig])[0, 1], abs=1e-4)
