"""electra_tf.bundle (TensorFlow checkpoints read without TensorFlow) against
`tf.train.load_checkpoint`: a training checkpoint of the pre-training runtime and one of
every dtype, every tensor bit for bit; a damaged shard named with its tensor."""

import os

import numpy as np
import pytest
import tensorflow as tf

from electra_tf import bundle


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _assert_same(prefix, got):
    reader = tf.train.load_checkpoint(prefix)
    names = sorted(reader.get_variable_to_shape_map())
    assert sorted(got) == names
    for name in names:
        want = reader.get_tensor(name)
        if isinstance(want, bytes) or getattr(want, "dtype", None) == object:
            assert np.asarray(got[name]).tolist() == np.asarray(want).tolist(), name
            continue
        want = np.asarray(want)
        if want.dtype.name == "bfloat16":
            want = want.astype(np.float32)
        assert got[name].shape == want.shape, name
        np.testing.assert_array_equal(got[name], want, err_msg=name)
        assert got[name].dtype == want.dtype, name


def test_every_dtype_of_a_checkpoint_reads_as_tensorflow_reads_it(tmp_path):
    rng = np.random.default_rng(0)
    values = dict(
        f32=tf.Variable(rng.normal(size=(3, 5)).astype(np.float32)),
        f64=tf.Variable(rng.normal(size=(2,))),
        f16=tf.Variable(rng.normal(size=(4,)).astype(np.float16)),
        bf16=tf.Variable(tf.cast(rng.normal(size=(2, 3)), tf.bfloat16)),
        i32=tf.Variable(np.array([1, -2, 3], np.int32)),
        i64=tf.Variable(np.int64(-(2 ** 40))),
        b=tf.Variable([True, False]),
        u8=tf.Variable(np.array([0, 255], np.uint8)),
        empty=tf.Variable(np.zeros([0, 4], np.float32)))
    prefix = tf.train.Checkpoint(**values).save(str(tmp_path / "ckpt"))
    _assert_same(prefix, bundle.read_tensors(prefix, _read))


def test_a_training_checkpoint_reads_as_tensorflow_reads_it(tmp_path):
    import backend_parity as cases
    from electra_tf.configs import load_config
    from runtimes import tf_pretrainer
    cfg = load_config("tiny", {**cases.SMALL, "objective.objective": "electra"})
    trainer = tf_pretrainer(cfg, tf.distribute.get_strategy(), None,
                            np.arange(cases.V, dtype=np.float64) % 17, jit_compile=False)
    cases.set_weights(trainer.model)
    prefix = trainer.checkpoint_manager(str(tmp_path / "run"), 1).save(7)
    got = bundle.read_tensors(prefix, _read)
    _assert_same(prefix, got)
    assert int(got["global_step/.ATTRIBUTES/VARIABLE_VALUE"]) == 0
    assert len(got) > 100
    # the index: every tensor's shape as TensorFlow's reader gives it
    num_shards, entries = bundle.index_entries(_read(prefix + ".index"))
    assert num_shards == 1
    reader = tf.train.load_checkpoint(prefix)
    for name, shape in reader.get_variable_to_shape_map().items():
        assert list(entries[name].shape) == list(shape), name


def test_a_damaged_shard_is_named_with_its_tensor(tmp_path):
    prefix = tf.train.Checkpoint(a=tf.Variable(np.arange(64, dtype=np.float32)),
                                 b=tf.Variable(np.ones(8, np.float32))).save(
        str(tmp_path / "ckpt"))
    _, entries = bundle.index_entries(_read(prefix + ".index"))
    name = "a/.ATTRIBUTES/VARIABLE_VALUE"
    data = prefix + ".data-00000-of-00001"
    raw = bytearray(_read(data))
    raw[entries[name].offset + 5] ^= 0x10
    with open(data, "wb") as f:
        f.write(bytes(raw))
    with pytest.raises(ValueError) as e:
        bundle.read_tensors(prefix, _read)
    assert str(e.value) == f"{prefix}: tensor {name!r}: checksum mismatch (damaged data)"
    unchecked = bundle.read_tensors(prefix, _read, names=[name], verify=False)
    assert unchecked[name][1] != 1.0  # the flipped bit, read without its check
    ok = bundle.read_tensors(prefix, _read, names=["b/.ATTRIBUTES/VARIABLE_VALUE"])
    np.testing.assert_array_equal(ok["b/.ATTRIBUTES/VARIABLE_VALUE"], np.ones(8))
    with pytest.raises(KeyError):
        bundle.read_tensors(prefix, _read, names=["c"])
    os.remove(data)
    with pytest.raises(FileNotFoundError):
        bundle.read_tensors(prefix, _read)


def test_a_tensor_saved_in_slices_is_refused_by_name(tmp_path):
    """A checkpoint split by a shard-size policy saves a large tensor in slices: the index
    reads, the small tensors read, the sliced one is one clear error."""
    w = tf.Variable(tf.reshape(tf.range(3000, dtype=tf.float32), [30, 100]))
    options = tf.train.CheckpointOptions(
        experimental_sharding_callback=tf.train.experimental.MaxShardSizePolicy(4000))
    prefix = tf.train.Checkpoint(w=w, step=tf.Variable(5, dtype=tf.int64)).save(
        str(tmp_path / "ckpt"), options=options)
    num_shards, entries = bundle.index_entries(_read(prefix + ".index"))
    assert num_shards > 1 and entries["w/.ATTRIBUTES/VARIABLE_VALUE"].sliced
    step = bundle.read_tensors(prefix, _read, names=["step/.ATTRIBUTES/VARIABLE_VALUE"])
    assert int(step["step/.ATTRIBUTES/VARIABLE_VALUE"]) == 5
    with pytest.raises(ValueError, match="'w/.ATTRIBUTES/VARIABLE_VALUE' is saved in slices"):
        bundle.read_tensors(prefix, _read, names=["w/.ATTRIBUTES/VARIABLE_VALUE"])
