"""electra_tf.training.checkpoints: name-based (TF1) checkpoints read and written as arrays or
from / into a model, torn-write cleanup, and the one-line error of a failed save."""

import os
import uuid

import numpy as np
import pytest
import tensorflow as tf

from electra_tf import fileio
from electra_tf.model import modeling
from electra_tf.training import checkpoints
from electra_tf.configs import ModelConfig
from electra_tf.conversion.formats import expected_shapes

# E=16 != H=32 (an embeddings projection), generator half as wide.
TINY = ModelConfig(vocab_size=60, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                   num_attention_heads=2, intermediate_size=64, max_position_embeddings=24,
                   generator_hidden_size=0.5)
STATE = 'model_checkpoint_path: "model.ckpt"\nall_model_checkpoint_paths: "model.ckpt"\n'


@pytest.fixture(scope="module")
def model():
    tf.keras.utils.set_random_seed(4)
    return modeling.ElectraPretrainingModel(TINY)


def _inputs():
    rng = np.random.RandomState(0)
    ids = rng.randint(5, TINY.vocab_size, size=(2, 12)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 9:] = 0
    seg = np.zeros_like(ids)
    seg[:, 6:] = 1
    positions = np.array([[1, 4, 7], [0, 2, 8]], np.int32)
    return ids, mask, seg, positions


def _ram_root(name):
    return f"ram://{name}_{uuid.uuid4().hex}"


def test_model_round_trip(model, tmp_path):
    ids, mask, seg, pos = _inputs()
    prefix = checkpoints.save_tf1_checkpoint(model, str(tmp_path / "full" / "model.ckpt"))
    assert prefix == str(tmp_path / "full" / "model.ckpt")
    listed = {name: tuple(shape) for name, shape in tf.train.list_variables(prefix)}
    assert listed == expected_shapes(TINY) and len(listed) == 80
    # The state file, as a TF1 Saver writes it: latest_checkpoint finds the prefix.
    assert fileio.read_text(str(tmp_path / "full" / "checkpoint")) == STATE
    assert tf.train.latest_checkpoint(str(tmp_path / "full")) == prefix
    assert sorted(os.listdir(tmp_path / "full")) == [
        "checkpoint", "model.ckpt.data-00000-of-00001", "model.ckpt.index"]

    fresh = modeling.ElectraPretrainingModel(TINY)
    assert checkpoints.assign_arrays(fresh, checkpoints.read_tf1(prefix)) == []
    for v in fresh.trainable_variables:
        np.testing.assert_array_equal(v.numpy(), tf.train.load_variable(prefix, v.path),
                                      err_msg=v.path)
    np.testing.assert_array_equal(fresh.discriminator(ids, mask, seg).numpy(),
                                  model.discriminator(ids, mask, seg).numpy())
    np.testing.assert_array_equal(fresh.generator_mlm_logits(ids, mask, seg, pos).numpy(),
                                  model.generator_mlm_logits(ids, mask, seg, pos).numpy())
    # The directory works as well as the prefix.
    again = modeling.ElectraPretrainingModel(TINY)
    assert checkpoints.assign_arrays(again, checkpoints.read_tf1(str(tmp_path / "full"))) == []
    np.testing.assert_array_equal(again.discriminator(ids, mask, seg).numpy(),
                                  model.discriminator(ids, mask, seg).numpy())


def test_discriminator_only_file_and_missing_names(model, tmp_path):
    ids, mask, seg, _ = _inputs()
    disc_vars = modeling.discriminator_variables(model)
    prefix = checkpoints.save_tf1_checkpoint(model, str(tmp_path / "disc" / "model.ckpt"),
                                             disc_vars)
    names = {name for name, _ in tf.train.list_variables(prefix)}
    assert names == set(expected_shapes(TINY, generator=False)) and len(names) == 43
    encoder = modeling.build_discriminator_encoder(TINY)
    assert checkpoints.assign_arrays(encoder, checkpoints.read_tf1(prefix)) == []
    np.testing.assert_array_equal(encoder(ids, mask, seg).numpy(),
                                  model.discriminator_hidden(ids, mask, seg).numpy())
    # Into the whole model: the 37 generator-only variables are missing.
    fresh = modeling.ElectraPretrainingModel(TINY)
    generator_only = [n for n in modeling.tf1_variables(fresh) if n not in names]
    assert len(generator_only) == 37
    arrays = checkpoints.read_tf1(prefix)
    with pytest.raises(ValueError) as e:
        checkpoints.assign_arrays(fresh, arrays)
    assert str(e.value) == f"37 variables missing (first: {generator_only[0]})"
    assert checkpoints.assign_arrays(fresh, arrays, allow_missing=True) == generator_only
    np.testing.assert_array_equal(fresh.discriminator(ids, mask, seg).numpy(),
                                  model.discriminator(ids, mask, seg).numpy())


def test_load_refuses_a_shape_mismatch(model, tmp_path):
    arrays = modeling.released_arrays(model)
    name = "electra/encoder/layer_1/intermediate/dense/kernel"
    arrays[name] = np.zeros((32, 65), np.float32)
    prefix = checkpoints.write_tf1(arrays, str(tmp_path / "bad" / "model.ckpt"))
    fresh = modeling.ElectraPretrainingModel(TINY)
    with pytest.raises(ValueError) as e:
        checkpoints.assign_arrays(fresh, checkpoints.read_tf1(prefix))
    assert str(e.value) == f"{name}: shape [32, 65] != variable shape [32, 64]"


def test_arrays_round_trip_keeps_values_and_dtypes(tmp_path):
    arrays = {"b/kernel": np.arange(6, dtype=np.float32).reshape(2, 3),
              "a/bias": np.array([0.5, -1.25], np.float32),
              "global_step": np.int64(1234),
              "c/half": np.array([1.5, 2.0], np.float16)}
    prefix = checkpoints.write_tf1(arrays, str(tmp_path / "x" / "model.ckpt"))
    assert fileio.read_text(str(tmp_path / "x" / "checkpoint")) == STATE
    got = checkpoints.read_tf1(prefix)
    assert sorted(got) == ["a/bias", "b/kernel", "c/half", "global_step"]
    for name, value in arrays.items():
        assert got[name].dtype == np.asarray(value).dtype, name
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    assert int(got["global_step"]) == 1234
    # Read back from the directory (its state file) too.
    assert sorted(checkpoints.read_tf1(str(tmp_path / "x"))) == sorted(got)


def test_released_arrays_and_assign_arrays(model):
    arrays = modeling.released_arrays(model)
    assert arrays.keys() == expected_shapes(TINY).keys()
    for name, v in modeling.tf1_variables(model).items():
        np.testing.assert_array_equal(arrays[name], v.numpy(), err_msg=name)
    disc = modeling.released_arrays(model, modeling.discriminator_variables(model))
    assert disc.keys() == expected_shapes(TINY, generator=False).keys()

    fresh = modeling.ElectraPretrainingModel(TINY)
    assert checkpoints.assign_arrays(fresh, arrays) == []
    for name, v in modeling.tf1_variables(fresh).items():
        np.testing.assert_array_equal(v.numpy(), arrays[name], err_msg=name)
    # Only the listed variables are assigned.
    other = modeling.ElectraPretrainingModel(TINY)
    bias = other.discriminator_predictions.dense_1.bias
    before = other.electra.embeddings.word_embeddings.numpy()
    assert checkpoints.assign_arrays(other, arrays, [bias]) == []
    np.testing.assert_array_equal(bias.numpy(), arrays["discriminator_predictions/dense_1/bias"])
    np.testing.assert_array_equal(other.electra.embeddings.word_embeddings.numpy(), before)


def test_assign_arrays_errors(model):
    arrays = modeling.released_arrays(model, modeling.discriminator_variables(model))
    fresh = modeling.ElectraPretrainingModel(TINY)
    with pytest.raises(ValueError) as e:
        checkpoints.assign_arrays(fresh, arrays)
    first = next(n for n in modeling.tf1_variables(fresh) if n not in arrays)
    assert str(e.value) == f"37 variables missing (first: {first})"
    missing = checkpoints.assign_arrays(fresh, arrays, allow_missing=True)
    assert len(missing) == 37 and missing[0] == first
    assert all(n.startswith("generator") for n in missing)
    arrays["electra/embeddings/word_embeddings"] = np.zeros((61, 16), np.float32)
    with pytest.raises(ValueError) as e:
        checkpoints.assign_arrays(fresh, arrays, allow_missing=True)
    assert str(e.value) == ("electra/embeddings/word_embeddings: shape [61, 16] != "
                            "variable shape [60, 16]")


def test_round_trip_on_ram(model, tmp_path, monkeypatch):
    """With the prefix on TensorFlow's in-memory filesystem, where `isdir` is true of a
    prefix too (it matches names by prefix); nothing local named after the path."""
    monkeypatch.chdir(tmp_path)
    root = _ram_root("checkpoints")
    ids, mask, seg, _ = _inputs()
    prefix = checkpoints.save_tf1_checkpoint(model, f"{root}/disc/model.ckpt",
                                             modeling.discriminator_variables(model))
    assert prefix == f"{root}/disc/model.ckpt" and tf.io.gfile.isdir(prefix)
    assert sorted(tf.io.gfile.listdir(f"{root}/disc")) == [
        "checkpoint", "model.ckpt.data-00000-of-00001", "model.ckpt.index"]
    shapes = checkpoints.checkpoint_reader(prefix).get_variable_to_shape_map()
    assert {k: tuple(v) for k, v in shapes.items()} == expected_shapes(TINY, generator=False)
    assert checkpoints.read_tf1(prefix).keys() == shapes.keys()
    encoder = modeling.build_discriminator_encoder(TINY)
    assert checkpoints.assign_arrays(encoder, checkpoints.read_tf1(prefix)) == []
    np.testing.assert_array_equal(encoder(ids, mask, seg).numpy(),
                                  model.discriminator_hidden(ids, mask, seg).numpy())
    with pytest.raises(ValueError, match="^37 variables missing "):
        checkpoints.assign_arrays(modeling.ElectraPretrainingModel(TINY),
                                  checkpoints.read_tf1(prefix))
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith("ram:")]


def test_checkpoint_reader_without_a_checkpoint(tmp_path):
    with pytest.raises(checkpoints.CheckpointError,
                       match=f"^no checkpoint in directory {tmp_path}$"):
        checkpoints.checkpoint_reader(str(tmp_path))
    with pytest.raises(checkpoints.CheckpointError,
                       match=f"^--flag={tmp_path}/nope does not exist \\(neither a directory"):
        checkpoints.checkpoint_reader(str(tmp_path / "nope"), "--flag")


# --- complete or damaged ----------------------------------------------------------------

def _training_run(root, steps=(2, 4, 6), shards=1):
    """A directory of training checkpoints ckpt-2/4/6 as a CheckpointManager writes them
    (`shards` data files each), with a string tensor among the variables."""
    step = tf.Variable(0, dtype=tf.int64)
    weights = tf.Variable(tf.reshape(tf.range(3000, dtype=tf.float32), [30, 100]))
    name = tf.Variable("a string tensor")
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(step=step, w=weights, n=name),
                                         root, max_to_keep=None)
    options = None
    if shards > 1:  # one data file per device: two CPU devices are not available here,
        options = tf.train.CheckpointOptions(experimental_sharding_callback=  # noqa: E251
                                             tf.train.experimental.MaxShardSizePolicy(4000))
    for s in steps:
        step.assign(s)
        weights.assign_add(tf.ones_like(weights))
        manager.save(checkpoint_number=s, options=options)
    return manager


def test_index_entries_give_every_tensor_and_the_data_sizes(tmp_path):
    _training_run(str(tmp_path))
    num_shards, tensors = checkpoints.index_entries(
        fileio.read_bytes(str(tmp_path / "ckpt-6.index")))
    assert num_shards == 1
    names = {n for n, _ in tf.train.list_variables(str(tmp_path / "ckpt-6"))}
    assert set(tensors) == names
    w = tensors["w/.ATTRIBUTES/VARIABLE_VALUE"]
    assert w.shard == 0 and w.size == 30 * 100 * 4 and w.shape == (30, 100)  # float32
    data = tmp_path / "ckpt-6.data-00000-of-00001"
    assert max(e.offset + e.size for e in tensors.values()) == data.stat().st_size
    with pytest.raises(ValueError, match="no table footer"):
        checkpoints.index_entries(fileio.read_bytes(str(tmp_path / "ckpt-6.index"))[:-1])


def test_checkpoint_problem_names_what_is_wrong(tmp_path):
    _training_run(str(tmp_path))
    assert [checkpoints.checkpoint_problem(str(tmp_path / f"ckpt-{s}")) for s in (2, 4, 6)] \
        == [None, None, None]
    data = tmp_path / "ckpt-6.data-00000-of-00001"
    full = data.stat().st_size
    with open(data, "r+b") as f:
        f.truncate(full - 1)  # the last byte of the last tensor
    assert checkpoints.checkpoint_problem(str(tmp_path / "ckpt-6")) == \
        f"ckpt-6.data-00000-of-00001 has {full - 1} of its {full} bytes"
    os.remove(data)
    assert checkpoints.checkpoint_problem(str(tmp_path / "ckpt-6")) == \
        "no ckpt-6.data-00000-of-00001"
    os.remove(tmp_path / "ckpt-4.index")
    assert checkpoints.checkpoint_problem(str(tmp_path / "ckpt-4")) == "no ckpt-4.index"
    index = tmp_path / "ckpt-2.index"
    index.write_bytes(index.read_bytes()[:100])
    assert checkpoints.checkpoint_problem(str(tmp_path / "ckpt-2")) == \
        "ckpt-2.index is unreadable: no table footer at its end"


def test_several_data_shards_are_each_checked(tmp_path):
    _training_run(str(tmp_path), steps=(1,), shards=3)
    data = sorted(p.name for p in tmp_path.glob("ckpt-1.data-*"))
    assert len(data) > 1, data
    assert checkpoints.checkpoint_problem(str(tmp_path / "ckpt-1")) is None
    os.remove(tmp_path / data[-1])
    assert checkpoints.checkpoint_problem(str(tmp_path / "ckpt-1")) == f"no {data[-1]}"


@pytest.mark.parametrize("damage", ["index", "data"])
def test_newest_complete_skips_and_sets_aside_a_damaged_newest(tmp_path, damage, caplog):
    root = str(tmp_path)
    _training_run(root)
    if damage == "index":  # a deleted index: tf.train.latest_checkpoint sees no checkpoint
        os.remove(tmp_path / "ckpt-6.index")
    else:
        with open(tmp_path / "ckpt-6.data-00000-of-00001", "r+b") as f:
            f.truncate(1000)
    # A reader (fine-tuning, conversion) uses the one before and moves nothing.
    assert checkpoints.newest_complete(root, "--init_checkpoint") == str(tmp_path / "ckpt-4")
    assert (tmp_path / "ckpt-6.data-00000-of-00001").exists()
    warning = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()][-1]
    assert warning.startswith(f"--init_checkpoint: the checkpoint {root}/ckpt-6 is damaged (")
    assert warning.endswith("; using ckpt-4")
    # The run's owner sets it aside, whole, and points the state file at ckpt-4.
    kept = sorted(p.name for p in tmp_path.glob("ckpt-6.*"))
    assert checkpoints.newest_complete(root, set_aside=True) == str(tmp_path / "ckpt-4")
    assert not list(tmp_path.glob("ckpt-6.*"))
    aside = list((tmp_path / checkpoints.DAMAGED_DIR).iterdir())
    assert len(aside) == 1 and sorted(p.name for p in aside[0].iterdir()) == kept
    assert tf.train.latest_checkpoint(root) == str(tmp_path / "ckpt-4")
    assert tf.train.get_checkpoint_state(root).all_model_checkpoint_paths == [
        str(tmp_path / "ckpt-2"), str(tmp_path / "ckpt-4")]
    # Now the step can be written again, and a second look finds nothing wrong.
    assert checkpoints.newest_complete(root, set_aside=True) == str(tmp_path / "ckpt-4")
    assert len(list((tmp_path / checkpoints.DAMAGED_DIR).iterdir())) == 1
    # A manager on the rewritten state keeps managing the older checkpoints: saving two more
    # with max_to_keep=2 deletes ckpt-2 and ckpt-4 (a listed checkpoint without a
    # timestamp would be kept for good).
    step = tf.Variable(0, dtype=tf.int64)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(step=step), root, max_to_keep=2)
    for s in (6, 8):
        manager.save(checkpoint_number=s)
    assert sorted(p.name for p in tmp_path.glob("ckpt-*.index")) == ["ckpt-6.index",
                                                                     "ckpt-8.index"]


def test_no_complete_checkpoint_is_an_error_listing_them(tmp_path):
    root = str(tmp_path)
    _training_run(root, steps=(2, 4))
    os.remove(tmp_path / "ckpt-4.index")
    os.remove(tmp_path / "ckpt-2.data-00000-of-00001")
    before = sorted(os.listdir(root))
    with pytest.raises(checkpoints.CheckpointError) as e:
        checkpoints.newest_complete(root, set_aside=True)
    assert str(e.value) == (
        f"no complete checkpoint in {root}: ckpt-4 (no ckpt-4.index); ckpt-2 (no "
        "ckpt-2.data-00000-of-00001). Nothing was changed; restore the missing files, or "
        "move them away to start this run over")
    assert sorted(os.listdir(root)) == before
    assert checkpoints.newest_complete(str(tmp_path / "empty")) is None
    os.makedirs(tmp_path / "empty")
    assert checkpoints.newest_complete(str(tmp_path / "empty")) is None


def test_checkpoint_reader_refuses_a_damaged_prefix_before_reading(tmp_path):
    root = str(tmp_path)
    _training_run(root)
    with open(tmp_path / "ckpt-6.data-00000-of-00001", "r+b") as f:
        f.truncate(10)
    with pytest.raises(checkpoints.CheckpointError,
                       match=f"^{root}/ckpt-6: the checkpoint is damaged \\("
                             "ckpt-6.data-00000-of-00001 has 10 of its "):
        checkpoints.checkpoint_reader(f"{root}/ckpt-6")
    # A directory gives its newest complete one.
    reader = checkpoints.checkpoint_reader(root)
    assert reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE") == 4


def test_damage_is_found_on_a_remote_filesystem():
    root = _ram_root("damaged")
    local = _training_run(root)
    assert local.latest_checkpoint == f"{root}/ckpt-6"
    fileio.remove(f"{root}/ckpt-6.index")
    assert checkpoints.newest_complete(root, set_aside=True) == f"{root}/ckpt-4"
    assert fileio.listdir(f"{root}/{checkpoints.DAMAGED_DIR}")


# --- torn writes and failed saves ------------------------------------------------------

TORN = {"ckpt-4_temp/part-0": 100, "ckpt-4_temp/sub/part-1": 23, "checkpoint.tmp1a2b": 7,
        "config.json.0123456789ab.tmp": 11, "eval_results.json.abcdefabcdef.tmp": 5}
KEPT = {"ckpt-4.index": 10, "checkpoint": 3, "config.json": 2, "config.json.0123.tmp": 4,
        "ckpt-x_temp": 6, "checkpoint.tmpxyz": 8, "notes_temp/a": 9,
        "results.json.0123456789ab.tmp": 12}


def _put(root, files):
    for rel, size in files.items():
        path = fileio.join(root, *rel.split("/"))
        fileio.makedirs(os.path.dirname(path))
        with tf.io.gfile.GFile(path, "wb") as f:
            f.write(b"x" * size)


@pytest.mark.parametrize("where", ["local", "ram"])
def test_remove_torn_checkpoints_counts_the_bytes(tmp_path, where):
    root = str(tmp_path / "run") if where == "local" else _ram_root("torn")
    _put(root, TORN)
    _put(root, KEPT)
    assert checkpoints.remove_torn_checkpoints(root) == 100 + 23 + 7 + 11 + 5
    assert fileio.listdir(root) == sorted({rel.split("/")[0] for rel in KEPT})
    assert sum(fileio.size(p) for p in fileio.walk_files(root)) == sum(KEPT.values())
    assert checkpoints.remove_torn_checkpoints(root) == 0
    assert checkpoints.remove_torn_checkpoints(fileio.join(root, "missing")) == 0


class _Manager:
    directory = "/runs/x"

    def __init__(self, error=None, latest="/runs/x/ckpt-3"):
        self.error, self.latest_checkpoint, self.saved = error, latest, []

    def save(self, checkpoint_number):
        if self.error:
            raise self.error
        self.saved.append(checkpoint_number)
        return f"{self.directory}/ckpt-{checkpoint_number}"


def test_save_checkpoint_errors_are_one_line():
    manager = _Manager()
    assert checkpoints.save_checkpoint(manager, 7) == "/runs/x/ckpt-7"
    assert manager.saved == [7]
    full = tf.errors.ResourceExhaustedError(None, None, "No space left on device\nmore")
    with pytest.raises(checkpoints.CheckpointError) as e:
        checkpoints.save_checkpoint(_Manager(full), 5)
    assert str(e.value) == ("could not write the step-5 checkpoint to /runs/x (No space left "
                            "on device); last good checkpoint: /runs/x/ckpt-3; free space and "
                            "rerun the same command")
    with pytest.raises(checkpoints.CheckpointError) as e:
        checkpoints.save_checkpoint(_Manager(OSError("bucket gone"), latest=None), 1)
    assert str(e.value) == ("could not write the step-1 checkpoint to /runs/x (bucket gone); "
                            "last good checkpoint: none; free space and rerun the same command")


def test_save_checkpoint_writes_the_step(tmp_path):
    step = tf.Variable(0, dtype=tf.int64)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(step=step), str(tmp_path), 2)
    step.assign(9)
    assert checkpoints.save_checkpoint(manager, 9) == str(tmp_path / "ckpt-9")
    assert tf.train.load_variable(str(tmp_path / "ckpt-9"),
                                  "step/.ATTRIBUTES/VARIABLE_VALUE") == 9
