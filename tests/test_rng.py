"""electra_tf.rng: seeds, folding, and draws whose rows do not depend on how a batch is
split (a replica or micro-batch starting r rows in draws rows r.. of the global draw)."""

import numpy as np
import pytest
import tensorflow as tf

from electra_tf import rng
from electra_tf.kernels import tensorflow as tf_kernels

SEED = [1, 2]
FOLD_1 = [1909209740, 290893547, 0]  # rng.fold(SEED, 1)


def test_as_seed_adds_first_row_zero_and_casts_to_int32():
    seed = rng.as_seed(np.array([3, 4], np.int64))
    assert seed.dtype == tf.int32 and seed.numpy().tolist() == [3, 4, 0]
    assert rng.as_seed([3, 4, 5]).numpy().tolist() == [3, 4, 5]


def test_fold_is_deterministic_distinct_and_keeps_first_row():
    # Pinned (the JAX backend's are pinned to the same: test_backends.py); a change here
    # changes every run's randomness.
    assert rng.fold(SEED, 1).numpy().tolist() == FOLD_1
    assert rng.fold([1, 2, 7], 1).numpy().tolist() == FOLD_1[:2] + [7]
    assert rng.fold(SEED, 1).numpy().tolist() == rng.fold(SEED, tf.constant(1)).numpy().tolist()
    folded = {tuple(rng.fold(SEED, k).numpy()) for k in range(20)}
    assert len(folded) == 20
    assert tuple(rng.fold([1, 3], 1).numpy()) not in folded  # another seed, another key
    assert tuple(rng.fold([2, 2], 1).numpy()) not in folded
    assert rng.fold(None, 3) is None  # no randomness (inference) stays none
    # Both words of the new key move with either word of the old one and with the data.
    words = np.array([rng.fold([a, b], d).numpy()[:2] for a in range(8) for b in range(8)
                      for d in range(8)], np.int64)
    assert len({tuple(w) for w in words}) == 512
    assert len(set(words[:, 0])) == 512 and len(set(words[:, 1])) == 512
    for column in (0, 1):  # 32 hashed bits: each about half set, over the 512 keys
        bits = (words[:, column, None] >> np.arange(32)) & 1
        assert np.all(np.abs(bits.mean(0) - 0.5) < 0.1)


@pytest.mark.parametrize("mode", ["eager", "graph", pytest.param("xla", marks=pytest.mark.xla_cpu)])
def test_fold_and_dropout_draw_the_same_in_every_mode(mode):
    def draws(seed):
        return rng.fold(seed, 5), rng.dropout_uniform([3, 2, 5], seed)

    f = draws if mode == "eager" else tf.function(draws, jit_compile=mode == "xla")
    for seed in SEEDS:
        want = [x.numpy() for x in draws(tf.constant(seed + [4], tf.int32))]
        got = [x.numpy() for x in f(tf.constant(seed + [4], tf.int32))]
        for x, y in zip(want, got):
            np.testing.assert_array_equal(x, y)


SEEDS = [[1, 2], [0, 0], [-1, 7], [2**31 - 1, -2**31], [123456789, -987654321]]


@pytest.mark.parametrize("mode", ["eager", "graph", pytest.param("xla", marks=pytest.mark.xla_cpu)])
def test_philox_helpers_equal_tensorflows_stateless_ops(mode):
    """One op for the key and counter (CPU/GPU) gives TF's own Philox key and counter bit
    for bit, in eager, graph and XLA form: masking's and sampling's numbers stay TF's."""
    def ours(seed):
        return tf_kernels.philox_key_counter(seed)

    def reference(seed):
        from tensorflow.python.ops import random_ops_util
        key, counter, _ = random_ops_util.get_key_counter_alg(seed, "philox")
        return key, counter

    if mode != "eager":
        jit = mode == "xla"
        ours, reference = (tf.function(f, jit_compile=jit) for f in (ours, reference))
    for seed in SEEDS:
        seed = tf.constant(seed, tf.int32)
        a, b = ours(seed), reference(seed)
        for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b)):
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(x.numpy(), y.numpy())


def test_split_is_the_folds_of_0_to_num():
    seeds = rng.split([5, 6, 9], 3)
    assert seeds.shape == (3, 3)
    for i in range(3):
        assert seeds[i].numpy().tolist() == rng.fold([5, 6, 9], i).numpy().tolist()
    assert len({tuple(s) for s in seeds.numpy()}) == 3
    assert seeds[:, 2].numpy().tolist() == [9, 9, 9]


def test_offset_rows_moves_only_the_first_row():
    assert rng.offset_rows([1, 2, 3], 5).numpy().tolist() == [1, 2, 8]
    assert rng.offset_rows(SEED, 4).numpy().tolist() == [1, 2, 4]
    twice = rng.offset_rows(rng.offset_rows(SEED, 3), 4)
    assert twice.numpy().tolist() == rng.offset_rows(SEED, 7).numpy().tolist()


def test_step_seed_is_the_fold_of_the_step_at_first_row():
    seed = rng.step_seed(SEED, tf.constant(10, tf.int64), 4)
    assert seed.numpy().tolist() == rng.fold(SEED, 10).numpy()[:2].tolist() + [4]
    assert seed.numpy().tolist() == rng.offset_rows(rng.fold(SEED, 10), 4).numpy().tolist()
    assert rng.step_seed(SEED, 11, 4).numpy().tolist() != seed.numpy().tolist()


def test_bits_pinned():
    bits = rng.bits([2, 3], SEED)
    assert bits.dtype == tf.uint32
    assert bits.numpy().tolist() == [[1105988140, 1738052849, 3959391294],
                                     [10670227, 4048756165, 1066250331]]


@pytest.mark.parametrize("shape", [[8, 3], [8, 4], [8, 5, 3], [8, 1]])
def test_rows_of_a_split_batch_are_rows_of_the_global_draw(shape):
    """Whole Philox blocks (4 words) a row or not: a draw of rows [r, r + n) with
    first_row r is exactly those rows of the draw over the whole batch."""
    full = rng.bits(shape, SEED).numpy()
    assert full.shape == tuple(shape)
    for first, rows in ((0, 3), (3, 2), (5, 3), (7, 1)):
        part = rng.bits([rows] + shape[1:], rng.offset_rows(SEED, first)).numpy()
        np.testing.assert_array_equal(part, full[first:first + rows])
    # Two replicas of 4 rows, or four micro-batches of 2: the same numbers.
    halves = [rng.uniform([4] + shape[1:], rng.step_seed(SEED, 3, 4 * r)) for r in range(2)]
    quarters = [rng.uniform([2] + shape[1:], rng.step_seed(SEED, 3, 2 * r)) for r in range(4)]
    whole = rng.uniform(shape, rng.step_seed(SEED, 3)).numpy()
    np.testing.assert_array_equal(np.concatenate(halves), whole)
    np.testing.assert_array_equal(np.concatenate(quarters), whole)


@pytest.mark.xla_cpu
def test_bits_with_a_dynamic_shape_and_under_xla_equal_the_static_draw():
    static = rng.bits([4, 5], SEED).numpy()
    np.testing.assert_array_equal(rng.bits(tf.constant([4, 5]), SEED).numpy(), static)

    @tf.function(jit_compile=True)
    def compiled(shape, seed):
        return rng.bits(shape, seed)

    np.testing.assert_array_equal(
        compiled(tf.constant([4, 5]), tf.constant([1, 2, 0])).numpy(), static)
    np.testing.assert_array_equal(
        tf.function(lambda s: rng.bits([4, 5], s), jit_compile=True)(
            tf.constant(SEED)).numpy(), static)


def test_uniform_is_the_high_24_bits():
    u = rng.uniform([2, 3], SEED)
    assert u.dtype == tf.float32
    assert (u.numpy() * 2 ** 24).tolist() == [[4320266, 6789268, 15466372],
                                              [41680, 15815453, 4165040]]
    np.testing.assert_array_equal(u.numpy() * 2 ** 24, rng.bits([2, 3], SEED).numpy() >> 8)
    big = rng.uniform([1000, 100], [7, 8]).numpy()
    scaled = big * 2 ** 24
    assert np.array_equal(scaled, np.floor(scaled))  # multiples of 2**-24
    assert big.min() >= 0.0 and big.max() < 1.0
    assert abs(big.mean() - 0.5) < 0.005 and abs(big.var() - 1 / 12) < 0.002


def test_uniform_int_in_range_and_flat():
    assert rng.uniform_int([2, 5], SEED, 10).numpy().tolist() == [[2, 4, 9, 0, 0],
                                                                  [3, 3, 9, 8, 1]]
    draws = rng.uniform_int([1000, 100], [7, 8], 10)
    assert draws.dtype == tf.int32
    np.testing.assert_array_equal(
        draws.numpy(), np.floor(rng.uniform([1000, 100], [7, 8]).numpy() * 10))
    counts = np.bincount(draws.numpy().ravel(), minlength=10)
    assert len(counts) == 10 and counts.min() > 9_700 and counts.max() < 10_300
    assert set(np.unique(rng.uniform_int([64, 64], SEED, 3).numpy())) == {0, 1, 2}


DROPOUT_PINNED = [[0.5528677, 0.54613405, 0.42981207], [0.96852523, 0.4798724, 0.2893684]]


def test_dropout_uniform_pinned_row_exact_and_flat():
    """Dropout's hashed draw: pinned (the JAX backend's too: test_backends.py), rows of a
    split batch are rows of the global draw whatever the shape (a replica or micro-batch
    drops what one device drops), a static and a dynamic shape agree, and the numbers are
    24-bit uniforms with no visible structure along rows, columns or seeds."""
    u = rng.dropout_uniform([2, 3], SEED)
    assert u.dtype == tf.float32
    np.testing.assert_array_equal(u.numpy(), np.float32(DROPOUT_PINNED))
    for shape in ([8, 3], [8, 5, 3], [8, 1], [8, 2, 4, 4]):
        whole = rng.dropout_uniform(shape, rng.step_seed(SEED, 3)).numpy()
        for first, rows in ((0, 3), (3, 2), (5, 3), (7, 1)):
            part = rng.dropout_uniform([rows] + shape[1:], rng.step_seed(SEED, 3, first))
            np.testing.assert_array_equal(part.numpy(), whole[first:first + rows])
        dynamic = rng.dropout_uniform(tf.constant(shape), rng.step_seed(SEED, 3))
        np.testing.assert_array_equal(dynamic.numpy(), whole)
    big = rng.dropout_uniform([256, 64, 64], [7, 8]).numpy()
    scaled = big * 2 ** 24
    assert np.array_equal(scaled, np.floor(scaled)) and big.min() >= 0 and big.max() < 1
    assert abs(big.mean() - 0.5) < 0.002 and abs(big.var() - 1 / 12) < 0.001
    keep = big >= 0.1  # a dropout mask: kept at 0.9 per row, per column, per position
    assert np.all(np.abs(keep.mean((1, 2)) - 0.9) < 0.02)
    assert np.all(np.abs(keep.mean((0, 1)) - 0.9) < 0.07)
    assert abs(keep[:, :, 0].mean() - 0.9) < 0.01
    for a, b in ((big[:, :, :-1], big[:, :, 1:]), (big[:-1], big[1:])):  # neighbours
        assert abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) < 0.01
    other = rng.dropout_uniform([256, 64, 64], [7, 9]).numpy()  # a neighbouring seed
    assert abs(np.corrcoef(big.ravel(), other.ravel())[0, 1]) < 0.01
    assert abs((other >= 0.1).mean() - 0.9) < 0.002
