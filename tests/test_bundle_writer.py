"""Checkpoints written without TensorFlow (electra_tf.bundle.write_tensors and the
training checkpoints of `checkpoints.ArrayCheckpoint`) against TensorFlow's own: SaveV2's
bytes, `tf.train.Checkpoint`'s object graph and bytes, `tf.train.CheckpointManager`'s
state file and rotation; and a process with TensorFlow unimportable resuming a run of
the TensorFlow runtime, which then resumes the run that process wrote."""

import os
import pickle
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

from electra_tf import bundle
from electra_tf.training import checkpoints

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _write(path, chunks):
    with open(path, "wb") as f:
        for chunk in chunks:
            f.write(chunk)


def _files(prefix):
    return _read(prefix + ".index"), _read(prefix + ".data-00000-of-00001")


def _save_v2(prefix, arrays):
    names = list(arrays)
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=[tf.convert_to_tensor(arrays[n]) for n in names])


def _every_dtype():
    rng = np.random.default_rng(0)
    return {"f32": rng.normal(size=(3, 5)).astype(np.float32), "f64": rng.normal(size=2),
            "f16": rng.normal(size=4).astype(np.float16),
            "bf16": rng.normal(size=(2, 3)).astype(ml_dtypes.bfloat16),
            "i32": np.array([1, -2, 3], np.int32), "i64": np.int64(-(2 ** 40)),
            "i8": np.array([-128, 127], np.int8), "i16": np.array([-3], np.int16),
            "u8": np.array([0, 255], np.uint8), "u16": np.array([7], np.uint16),
            "b": np.array([True, False, True]), "scalar_f": np.float32(2.5),
            "empty": np.zeros([0, 4], np.float32), "empty_s": np.array([], dtype=object),
            "s": np.array([b"ab", b"", b"xyz" * 100]), "s_scalar": np.array(b"hello"),
            "s2d": np.array([["\u00e9", "x"], ["", "\u6f22\u5b57"]]),
            "nested/name.with/dots": np.arange(6, dtype=np.int64).reshape(2, 3, 1)}


def _index_blocks(index: bytes) -> int:
    """How many data blocks a table's index block points to."""
    footer = index[-48:]
    _, i = bundle.wire.varint(footer, 0)
    _, i = bundle.wire.varint(footer, i)
    return len(bundle._table_block(index, footer[i:]))


@pytest.mark.parametrize("case", ["every_dtype", "unsorted", "many_names"])
def test_write_tensors_is_savev2_byte_for_byte(tmp_path, case):
    """Every dtype, shape and string kind; names given out of order (written in the order
    given, as SaveV2 does); 9000 names, whose index takes two data blocks (256 KiB each,
    a restart every 16 keys)."""
    arrays = _every_dtype()
    if case == "every_dtype":
        arrays = dict(sorted(arrays.items()))
    elif case == "many_names":
        rng = np.random.default_rng(1)
        arrays = {f"electra/encoder/layer_{i:05d}/kernel/adam_m": rng.normal(
            size=(i % 3, 2)).astype(np.float32) for i in range(9000)}
    _save_v2(str(tmp_path / "tf"), arrays)
    bundle.write_tensors(str(tmp_path / "ours"), arrays, _write)
    want, got = _files(str(tmp_path / "tf")), _files(str(tmp_path / "ours"))
    assert got[1] == want[1]
    assert got[0] == want[0]
    if case == "many_names":
        assert _index_blocks(got[0]) == 2
    back = bundle.read_tensors(str(tmp_path / "ours"), _read)
    reader = tf.train.load_checkpoint(str(tmp_path / "ours"))
    for name, value in arrays.items():
        value = np.asarray(value)
        if value.dtype.kind in "OSU":
            want_list = [s.encode() if isinstance(s, str) else s for s in value.ravel()]
            assert back[name].ravel().tolist() == want_list, name
            continue
        if value.dtype.name == "bfloat16":
            value = value.astype(np.float32)
        assert back[name].dtype == value.dtype and back[name].shape == value.shape, name
        np.testing.assert_array_equal(back[name], value)
        np.testing.assert_array_equal(np.asarray(reader.get_tensor(name)).astype(value.dtype),
                                      value)


def test_the_table_of_a_changed_key_differs_and_a_bad_order_is_refused():
    """The writer's table is the reader's: a one-byte change of a key moves the bytes, the
    index reads back every key, keys out of order are an error."""
    items = [(b"", b"h"), (b"a/1", b"x"), (b"a/2", b"yy")]
    table = bundle.table(items)
    assert bundle.table([items[0], items[1], (b"a/3", b"yy")]) != table
    footer = table[-48:]
    _, i = bundle.wire.varint(footer, 0)
    _, i = bundle.wire.varint(footer, i)
    keys = [k for _, handle in bundle._table_block(table, footer[i:])
            for k, _ in bundle._table_block(table, handle)]
    assert keys == [b"", b"a/1", b"a/2"]
    with pytest.raises(ValueError, match="out of order"):
        bundle.table([(b"b", b""), (b"a", b"")])
    with pytest.raises(ValueError, match="repeated"):
        bundle.write_tensors("/nonexistent/x", {"": np.zeros(1)}, lambda p, c: list(c))


def test_reader_is_tensorflows_reader_interface(tmp_path):
    arrays = dict(sorted(_every_dtype().items()))
    prefix = str(tmp_path / "ckpt")
    bundle.write_tensors(prefix, arrays, _write)
    ours, theirs = bundle.Reader(prefix, _read), tf.train.load_checkpoint(prefix)
    assert ours.get_variable_to_shape_map() == theirs.get_variable_to_shape_map()
    assert ours.get_tensor("s_scalar") == theirs.get_tensor("s_scalar") == b"hello"
    assert ours.has_tensor("f32") and not ours.has_tensor("nope")
    dtypes = theirs.get_variable_to_dtype_map()
    for name, dtype in ours.get_variable_to_dtype_map().items():
        if dtypes[name] == tf.string:
            assert dtype == np.dtype(object)
        elif dtypes[name] != tf.bfloat16:
            assert dtype == dtypes[name].as_numpy_dtype, name
    np.testing.assert_array_equal(ours.get_tensor("f32"), theirs.get_tensor("f32"))


# --- training checkpoints -----------------------------------------------------------


def _entries():
    E = checkpoints.Entry
    model = [E("model/electra/embeddings/word_embeddings", (4, 3), np.float32,
               "electra/embeddings/word_embeddings"),
             E("model/electra/layer_0/query/_kernel", (3, 3), np.float32,
               "electra/layer_0/query/kernel"),
             E("model/electra/layer_0/query/bias", (3,), "float32", "electra/layer_0/query/bias"),
             E("model/electra/layer_0/dense.x/bias", (2,), np.float32,
               "electra/layer_0/dense.x/bias"),
             E("model/electra_b/q", (0, 2), np.float32, "electra_b/q")]
    slots = [E(checkpoints.slot_path(e.name, s), e.shape, e.dtype, f"{e.name}/{s}")
             for s in ("adam_m", "adam_v") for e in model]
    return model + slots + [E(n, (), d, n) for n, d in checkpoints.COUNTERS.items()]


class _Node(tf.__internal__.tracking.AutoTrackable):
    """One object of the reference object graph (attributes set by name)."""


def _tf_checkpoint(entries, data_position=True):
    """The object graph the JAX runtime wrote through TensorFlow before: tf.Variables in
    a tree of trackables at the entries' paths, the slot dicts, the counters at the root."""
    variables = {e.path: tf.Variable(np.zeros(e.shape, e.dtype), name=e.name)
                 for e in entries}
    root, nodes = _Node(), {}
    for path in sorted(p for p in variables if p.startswith("model/")):
        parts, parent = path.split("/"), None
        parent = root
        for i in range(1, len(parts) - 1):
            key = "/".join(parts[:i + 1])
            if key not in nodes:
                nodes[key] = _Node()
                setattr(parent, parts[i], nodes[key])
            parent = nodes[key]
        setattr(parent, parts[-1], variables[path])
    optimizer = _Node()
    for slot in ("adam_m", "adam_v"):
        head = f"optimizer/{slot}/"
        setattr(optimizer, slot, {p[len(head):]: v for p, v in variables.items()
                                  if p.startswith(head)})
    state = dict(model=root, optimizer=optimizer)
    for name in checkpoints.COUNTERS:
        if data_position or name != "data_batches":
            state[name] = variables[name]
    return tf.train.Checkpoint(**state), variables


def _values(entries, seed):
    rng = np.random.default_rng(seed)
    return {e.path: np.asarray(rng.normal(size=e.shape) * 100).astype(e.dtype)
            for e in entries}


def test_a_training_checkpoint_is_tensorflows_byte_for_byte(tmp_path):
    """The same values through `tf.train.Checkpoint` + CheckpointManager and through
    ArrayCheckpoint's manager: the same index and data bytes (object graph included),
    the same checkpoints kept under max_to_keep, the same state file but for its times."""
    entries = _entries()
    graph, variables = _tf_checkpoint(entries)
    theirs = tf.train.CheckpointManager(graph, str(tmp_path / "tf"), max_to_keep=2)
    ours = checkpoints.ArrayCheckpoint(entries).manager(str(tmp_path / "ours"), 2, None)
    for step in (3, 4, 5):
        values = _values(entries, step)
        for path, value in values.items():
            variables[path].assign(value)
        ours.values = lambda: values
        want, got = theirs.save(checkpoint_number=step), ours.save(step)
        assert _files(got) == _files(want)
        assert os.path.basename(got) == os.path.basename(want)
        assert ours.latest_checkpoint == got
    assert sorted(os.listdir(tmp_path / "ours")) == sorted(os.listdir(tmp_path / "tf"))
    assert "ckpt-3.index" not in os.listdir(tmp_path / "ours")
    state = tf.train.get_checkpoint_state(str(tmp_path / "ours"))
    assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == [
        "ckpt-4", "ckpt-5"]
    assert len(state.all_model_checkpoint_timestamps) == 2
    assert 0 < state.last_preserved_timestamp < state.all_model_checkpoint_timestamps[0]
    ours_state = checkpoints.read_checkpoint_state(str(tmp_path / "ours"))
    assert ours_state.all_model_checkpoint_paths == list(state.all_model_checkpoint_paths)
    assert ours_state.all_model_checkpoint_timestamps == list(
        state.all_model_checkpoint_timestamps)
    assert ours_state.last_preserved_timestamp == state.last_preserved_timestamp
    # read back: every entry, in its dtype; TensorFlow restores the same values
    back = checkpoints.ArrayCheckpoint(entries).read(ours.latest_checkpoint)
    for path, value in _values(entries, 5).items():
        assert back[path].dtype == value.dtype and back[path].shape == value.shape
        np.testing.assert_array_equal(back[path], value)
    graph2, variables2 = _tf_checkpoint(entries)
    graph2.restore(ours.latest_checkpoint).assert_existing_objects_matched()
    for path, value in _values(entries, 5).items():
        np.testing.assert_array_equal(variables2[path].numpy(), value)


def test_a_checkpoint_without_data_position_reads_without_it(tmp_path):
    entries = _entries()
    graph, variables = _tf_checkpoint(entries, data_position=False)
    values = _values(entries, 0)
    for path, value in values.items():
        variables[path].assign(value)
    prefix = graph.write(str(tmp_path / "old"))
    back = checkpoints.ArrayCheckpoint(entries).read(prefix)
    assert "data_batches" not in back and int(back["global_step"]) == int(
        values["global_step"])
    missing = [e for e in entries if e.path != "model/electra_b/q"] + [
        checkpoints.Entry("model/electra/extra", (2,), np.float32, "electra/extra")]
    with pytest.raises(checkpoints.CheckpointError, match="no model/electra/extra"):
        checkpoints.ArrayCheckpoint(missing).read(prefix)
    wrong = [checkpoints.Entry(e.path, (5,) if e.path == "global_step" else e.shape,
                               e.dtype, e.name) for e in entries]
    with pytest.raises(checkpoints.CheckpointError, match="global_step has shape"):
        checkpoints.ArrayCheckpoint(wrong).read(prefix)


def test_write_tf1_is_savev2_and_the_state_file(tmp_path):
    arrays = {"electra/b": np.ones(3, np.float32), "global_step": np.int64(9),
              "electra/a": np.arange(4, dtype=np.float32).reshape(2, 2)}
    checkpoints.write_tf1(arrays, str(tmp_path / "ours" / "model.ckpt"))
    _save_v2(str(tmp_path / "tf"), dict(sorted(arrays.items())))
    assert _files(str(tmp_path / "ours" / "model.ckpt")) == _files(str(tmp_path / "tf"))
    assert tf.train.latest_checkpoint(str(tmp_path / "ours")) == str(
        tmp_path / "ours" / "model.ckpt")
    assert sorted(os.listdir(tmp_path / "ours")) == [
        "checkpoint", "model.ckpt.data-00000-of-00001", "model.ckpt.index"]


# --- either side without TensorFlow -------------------------------------------------

WITHOUT_TF = r"""
import os, pickle, sys
sys.modules["tensorflow"] = None
sys.modules["tensorflow_text"] = None
import numpy as np
from electra_tf.training import checkpoints
from electra_tf.conversion import source
case_path, out_path = sys.argv[1:]
with open(case_path, "rb") as f:
    case = pickle.load(f)
entries = [checkpoints.Entry(*e) for e in case["entries"]]
directory = case["dir"]
latest = checkpoints.newest_complete(directory)
checkpoint = checkpoints.ArrayCheckpoint(entries)
restored = checkpoint.read(latest)
moved = {p: (v + 1).astype(v.dtype) for p, v in restored.items()}
moved.update(global_step=np.int64(3), data_batches=np.int64(30))
manager = checkpoint.manager(directory, 2, lambda: moved)
assert manager.latest_checkpoint == latest
saved = manager.save(3)
reader = checkpoints.checkpoint_reader(directory)
run = source.resolve(directory)
tf1 = checkpoints.write_tf1({"a": np.ones(2, np.float32), "global_step": np.int64(1)},
                            os.path.join(directory, "tf1", "model.ckpt"))
with open(out_path, "wb") as f:
    pickle.dump({"restored": restored, "latest": latest, "saved": saved,
                 "reader": type(reader).__module__, "kind": run.kind,
                 "names": sorted(run.shapes), "tf1": checkpoints.read_tf1(tf1),
                 "modules": sorted(m for m in sys.modules if m.startswith("tensorflow")
                                   and sys.modules[m] is not None)}, f)
"""


@pytest.mark.subprocess
def test_tensorflow_runtime_and_a_process_without_tensorflow_resume_each_other(tmp_path):
    """The TensorFlow runtime saves steps 1 and 2 (max_to_keep 2); a process with
    TensorFlow unimportable finds the newest, reads every array of it as TensorFlow wrote
    it, saves step 3 (+1 on every array) in the same directory, which deletes step 1 under
    its max_to_keep, and reads the run as convert / fine-tuning do; the TensorFlow runtime
    restores step 3 (object graph matched) and its manager's next save deletes step 2."""
    import backend_parity as cases
    from electra_tf.configs import load_config
    from runtimes import tf_pretrainer
    cfg = load_config("tiny", {**cases.SMALL, "objective.objective": "electra"})
    trainer = tf_pretrainer(cfg, tf.distribute.get_strategy(), None,
                            np.arange(cases.V, dtype=np.float64) % 17, jit_compile=False)
    cases.set_weights(trainer.model)
    trainer.optimizer.build(trainer.model.trainable_variables)
    for i, slot in enumerate(trainer.optimizer.slot_variables().values()):
        slot.assign(tf.fill(slot.shape, 0.001 * (i + 1)))
    directory = str(tmp_path / "run")
    manager = trainer.checkpoint_manager(directory, 2)
    for step in (1, 2):
        trainer.global_step.assign(step)
        trainer.data_batches.assign(10 * step)
        manager.save(checkpoint_number=step)
    paths = checkpoints.object_paths(trainer.model, "model")
    variables = trainer.model.trainable_variables
    entries = [(paths[id(v)], tuple(v.shape), v.dtype, v.path) for v in trainer.model.weights]
    entries += [(checkpoints.slot_path(v.path, s), tuple(v.shape), v.dtype, f"{v.path}/{s}")
                for s in ("adam_m", "adam_v") for v in variables]
    entries += [(n, (), d, n) for n, d in checkpoints.COUNTERS.items()]
    before = {p: np.asarray(v.numpy()) for p, v in zip(
        [e[0] for e in entries], list(trainer.model.weights) + [
            trainer.optimizer.slot_variables()[f"{v.path}/{s}"]
            for s in ("adam_m", "adam_v") for v in variables])}
    case_path, out_path = tmp_path / "case.pkl", tmp_path / "out.pkl"
    with open(case_path, "wb") as f:
        pickle.dump({"entries": entries, "dir": directory}, f)
    done = subprocess.run([sys.executable, "-c", WITHOUT_TF, str(case_path), str(out_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "KERAS_BACKEND": "jax",
                               "PYTHONPATH": os.path.join(REPO, "tests")})
    assert done.returncode == 0, done.stderr[-3000:]
    with open(out_path, "rb") as f:
        out = pickle.load(f)
    assert out["modules"] == [] and out["reader"] == "electra_tf.bundle"
    assert out["latest"] == os.path.join(directory, "ckpt-2")
    assert out["saved"] == os.path.join(directory, "ckpt-3")
    assert len(before) > 50
    for path, value in before.items():
        np.testing.assert_array_equal(out["restored"][path], value, err_msg=path)
    assert (int(out["restored"]["global_step"]), int(out["restored"]["data_batches"])) == (2, 20)
    assert out["kind"] == "model_dir" and "electra/embeddings/word_embeddings" in out["names"]
    assert "electra/embeddings/word_embeddings/adam_m" in out["names"]
    np.testing.assert_array_equal(out["tf1"]["a"], np.ones(2, np.float32))
    assert sorted(n for n in os.listdir(directory) if n.endswith(".index")) == [
        "ckpt-2.index", "ckpt-3.index"]
    # the TensorFlow runtime resumes the run that process wrote
    trainer.restore(tf.train.latest_checkpoint(directory))
    assert (trainer.step, trainer.data_position) == (3, 30)
    for path, weight in zip([e[0] for e in entries], trainer.model.weights):
        np.testing.assert_array_equal(weight.numpy(), before[path] + 1, err_msg=path)
    slots = trainer.optimizer.slot_variables()
    m = slots[f"{variables[0].path}/adam_m"]
    np.testing.assert_array_equal(m.numpy(), before[
        checkpoints.slot_path(variables[0].path, "adam_m")] + 1)
    trainer.checkpoint_manager(directory, 2).save(checkpoint_number=4)
    assert sorted(n for n in os.listdir(directory) if n.endswith(".index")) == [
        "ckpt-3.index", "ckpt-4.index"]


def test_the_state_file_reads_as_tensorflow_reads_it(tmp_path, caplog):
    """Paths joined to the directory, a non-ASCII name (raw, as TensorFlow writes it, or
    octal-escaped), times; no file is None, a line that does not parse is None with a
    warning."""
    directory = str(tmp_path)
    assert checkpoints.read_checkpoint_state(directory) is None
    tf.compat.v1.train.update_checkpoint_state(
        directory, "ckpt-\u00e9-2", ["ckpt-1", "ckpt-\u00e9-2"],
        all_model_checkpoint_timestamps=[1.5, 2.25], last_preserved_timestamp=0.5)
    want = tf.train.get_checkpoint_state(directory)
    got = checkpoints.read_checkpoint_state(directory)
    assert got.model_checkpoint_path == want.model_checkpoint_path
    assert got.all_model_checkpoint_paths == list(want.all_model_checkpoint_paths)
    assert got.all_model_checkpoint_timestamps == [1.5, 2.25]
    assert got.last_preserved_timestamp == 0.5
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "ckpt-\\303\\251-2"\n')
    assert checkpoints.read_checkpoint_state(directory).model_checkpoint_path == \
        want.model_checkpoint_path  # as the protobuf text format escapes it
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "a"\nbroken\n')
    assert checkpoints.read_checkpoint_state(directory) is None
    assert "cannot parse the line 'broken'" in caplog.text
