"""Checkpoints on any filesystem: the newest complete one of a directory, training checkpoints
(save, torn-write cleanup) and name-based ones in the released TF1 layout ({TF1 name: array})."""

import dataclasses
import datetime
import os
import re
import struct
import time
from typing import Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf
from absl import logging

from electra_tf import fileio
from electra_tf.bundle import index_entries  # noqa: F401 (the index, re-exported)
from electra_tf.model.modeling import released_arrays, tf1_variables


class CheckpointError(ValueError):
    """A checkpoint could not be written or read: one line naming the directory or file
    (and, for a write, the last good checkpoint)."""


# --- which checkpoint: complete or damaged ----------------------------------------------
# A checkpoint `P` is `P.index` (every tensor's shard, offset and size) plus the shards
# `P.data-0000i-of-0000n`. A torn upload or a deleted file leaves one that TensorFlow does
# not see (no index: the run starts over) or fails to read after minutes of restoring;
# `checkpoint_problem` finds both from the index and one stat per shard.

_DATA_NAME = re.compile(r"^(.+)\.data-(\d{5})-of-(\d{5})$")
_STEP = re.compile(r"-(\d+)$")
DAMAGED_DIR = "damaged_checkpoints"  # where a run sets aside what it cannot read


def checkpoint_problem(prefix: str) -> Optional[str]:
    """None when the checkpoint `prefix` is complete (its index reads, and every data
    shard it names exists with at least the bytes its tensors are recorded to take), else
    what is wrong, in a few words naming the file. Any filesystem (gs://...)."""
    index = prefix + ".index"
    if not fileio.exists(index):
        return f"no {os.path.basename(index)}"
    try:
        num_shards, tensors = index_entries(fileio.read_bytes(index))
    except (ValueError, IndexError, struct.error) as e:
        return f"{os.path.basename(index)} is unreadable: {e}"
    needed = [0] * num_shards
    for e in tensors.values():
        if e.shard >= num_shards:
            return f"{os.path.basename(index)} names data shard {e.shard} of {num_shards}"
        needed[e.shard] = max(needed[e.shard], e.offset + e.size)
    for shard, want in enumerate(needed):
        path = f"{prefix}.data-{shard:05d}-of-{num_shards:05d}"
        if not fileio.exists(path):
            return f"no {os.path.basename(path)}"
        have = fileio.size(path)
        if have < want:
            return f"{os.path.basename(path)} has {have} of its {want} bytes"
    return None


@dataclasses.dataclass
class FoundCheckpoint:
    """A checkpoint prefix seen in a directory, with the files that make it up there."""
    prefix: str
    files: List[str]

    @property
    def step(self) -> Optional[int]:
        match = _STEP.search(os.path.basename(self.prefix))
        return int(match.group(1)) if match else None


def find_checkpoints(directory: str) -> List[FoundCheckpoint]:
    """Every checkpoint prefix with a file (`.index` or a data shard) in `directory`,
    newest first: numbered ones (`ckpt-N`) by number, then the others with the one the
    `checkpoint` state file names first."""
    by_prefix: Dict[str, List[str]] = {}
    for name in fileio.listdir(directory):
        data = _DATA_NAME.match(name)
        base = name[:-len(".index")] if name.endswith(".index") else (
            data.group(1) if data else None)
        if base:
            by_prefix.setdefault(base, []).append(name)
    state = tf.train.get_checkpoint_state(directory) if by_prefix else None
    named = os.path.basename(state.model_checkpoint_path) if state else None
    found = [FoundCheckpoint(fileio.join(directory, base), sorted(names))
             for base, names in by_prefix.items()]
    return sorted(found, key=lambda f: (f.step is not None, f.step or 0,
                                        os.path.basename(f.prefix) == named), reverse=True)


def _set_aside(directory: str, found: FoundCheckpoint) -> str:
    """Moves a damaged checkpoint's files into DIRECTORY/damaged_checkpoints/<time>/ (never
    deleted: they may still be repaired by hand), so that the run can write that step
    again. Returns the folder."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    aside = fileio.join(directory, DAMAGED_DIR, stamp)
    fileio.makedirs(aside)
    for name in found.files:
        fileio.rename(fileio.join(directory, name), fileio.join(aside, name), overwrite=False)
    return aside


_REPORTED = set()  # damaged checkpoints this process has warned of


def newest_complete(directory: str, what: str = "", set_aside: bool = False
                    ) -> Optional[str]:
    """The prefix of the newest complete checkpoint in `directory` (any filesystem), or
    None when it holds no checkpoint file. Each newer damaged one is a warning line; with
    `set_aside` (the run that owns the directory) its files move to `damaged_checkpoints/`
    and the state file names the one returned. Checkpoint files none of which is complete
    are a CheckpointError listing them (never a silent start-over). `what` (e.g.
    "--init_checkpoint") leads the messages."""
    if not fileio.isdir(directory):
        return None
    found = find_checkpoints(directory)
    lead = f"{what}: " if what else ""
    damaged = []
    for candidate in found:
        problem = checkpoint_problem(candidate.prefix)
        if problem is None:
            break
        damaged.append((candidate, problem))
    else:
        if not found:
            return None
        listing = "; ".join(f"{os.path.basename(c.prefix)} ({p})" for c, p in damaged)
        raise CheckpointError(
            f"{lead}no complete checkpoint in {directory}: {listing}. Nothing was changed; "
            "restore the missing files, or move them away to start this run over")
    for bad, problem in damaged:
        if not set_aside and bad.prefix in _REPORTED:  # a reader (a fine-tuning trial) once
            continue
        note = f"; moved to {_set_aside(directory, bad)}" if set_aside else ""
        _REPORTED.add(bad.prefix)
        logging.warning("%sthe checkpoint %s is damaged (%s)%s; using %s", lead, bad.prefix,
                        problem, note, os.path.basename(candidate.prefix))
    if damaged and set_aside:  # the state file named a checkpoint that is now aside
        gone = {bad.prefix for bad, _ in damaged}
        write_checkpoint_state(directory, [os.path.basename(c.prefix) for c in reversed(found)
                                           if c.prefix not in gone], managed=True)
    return candidate.prefix


# A checkpoint write's staging directory, the checkpoint index's temporary file, and the
# temporary file of a killed `fileio.write_atomic` of config.json / eval_results.json.
_TORN_CHECKPOINT = re.compile(r"(ckpt-\d+_temp|checkpoint\.tmp[0-9a-f]+|"
                              r"(config|eval_results)\.json\.[0-9a-f]{12}"
                              + re.escape(fileio.TMP_SUFFIX) + ")$")


def remove_torn_checkpoints(directory: str) -> int:
    """Deletes what killed writes left in `directory` (any filesystem; `_TORN_CHECKPOINT`:
    never loaded, a checkpoint is visible only once complete) and returns the bytes
    freed. Call before writing there."""
    if not fileio.isdir(directory):
        return 0
    freed = 0
    for name in fileio.listdir(directory):
        if not _TORN_CHECKPOINT.match(name):
            continue
        path = fileio.join(directory, name)
        if fileio.isdir(path):
            for root, _, files in tf.io.gfile.walk(path):
                freed += sum(fileio.size(fileio.join(root, f)) for f in files)
            fileio.rmtree(path)
        else:
            freed += fileio.size(path)
            fileio.remove(path)
    if freed:
        logging.info("Removed %d bytes of torn checkpoint writes from %s", freed, directory)
    return freed


def save_checkpoint(manager, step: int) -> str:
    """manager.save at `step`; a failed write (a full disk, a lost bucket) is one
    CheckpointError naming the directory and the last good checkpoint, which stays the
    newest (the checkpoint index is only updated after a complete write)."""
    try:
        return manager.save(checkpoint_number=step)
    except (tf.errors.OpError, OSError) as e:
        reason = (getattr(e, "message", None) or str(e)).strip().splitlines()[0]
        raise CheckpointError(f"could not write the step-{step} checkpoint to {manager.directory} "
                              f"({reason}); last good checkpoint: "
                              f"{manager.latest_checkpoint or 'none'}; free space and rerun the "
                              "same command") from None


# --- training checkpoints of host arrays (a runtime without TensorFlow state) -----------
# The object graph of a training checkpoint (the TensorFlow runtime's `tf.train.Checkpoint`
# of model, optimizer slots and counters) written from and read into {object path: array}:
# the JAX runtime keeps its state on its devices and hands it here, so either runtime
# resumes the other's run and every reader of a run reads both.

# Keras' own bookkeeping attributes of a layer: not part of its object graph (TensorFlow's
# tracking of Keras 3 layers leaves them out too).
_KERAS_INTERNALS = frozenset({
    "_layers", "_trainable_variables", "_non_trainable_variables", "_metrics",
    "_seed_generators", "_tracker", "_inbound_nodes", "_outbound_nodes"})

# The counters of a training checkpoint, as the TensorFlow runtime keeps them.
COUNTERS = {"global_step": np.int64, "loss_scale": np.float32,
            "loss_scale_good_steps": np.int64, "data_batches": np.int64}


def object_paths(root, prefix: str) -> Dict[int, str]:
    """{id(variable): its path in TensorFlow's object graph of `root`}, e.g.
    `model/electra/layer_0/query/_kernel`: the attribute names from `root` to the variable
    along the shortest path, the first in attribute order among equals (the breadth-first
    walk of `tf.train.Checkpoint`). Read from the Keras objects, on any backend."""
    import collections
    import keras
    out: Dict[int, str] = {}
    seen = {id(root)}
    queue = collections.deque([(root, prefix)])
    tracked = lambda v: isinstance(v, (keras.Variable, keras.layers.Layer))  # noqa: E731

    def children(obj):
        if isinstance(obj, (list, tuple)):
            items = [(str(i), v) for i, v in enumerate(obj)]
        elif isinstance(obj, dict):
            items = list(obj.items())
        else:
            items = [(k, v) for k, v in vars(obj).items() if k not in _KERAS_INTERNALS]
        for name, value in items:
            if tracked(value):
                yield name, value
            elif isinstance(value, (list, tuple, dict)) and value and all(
                    tracked(v) for v in (value.values() if isinstance(value, dict) else value)):
                yield name, value

    while queue:
        obj, path = queue.popleft()
        for name, value in children(obj):
            if id(value) in seen:
                continue
            seen.add(id(value))
            if isinstance(value, keras.Variable):
                out[id(value)] = f"{path}/{name}"
            else:
                queue.append((value, f"{path}/{name}"))
    return out


def slot_path(variable_path: str, slot: str) -> str:
    """The object path of an optimizer slot ('adam_m', 'adam_v') of a variable."""
    return f"optimizer/{slot}/{variable_path}/{slot}"


class _Node(tf.__internal__.tracking.AutoTrackable):
    """One object of the checkpoint's object graph (attributes set by name)."""


def _tree(paths: Dict[str, tf.Variable]) -> _Node:
    """A tree of `_Node`s holding `paths` {'root/a/b': variable} at those object paths
    below the root."""
    root = _Node()
    nodes = {}
    for path in sorted(paths):
        parts = path.split("/")
        parent = root
        for i in range(1, len(parts) - 1):
            key = "/".join(parts[:i + 1])
            if key not in nodes:
                nodes[key] = _Node()
                setattr(parent, parts[i], nodes[key])
            parent = nodes[key]
        setattr(parent, parts[-1], paths[path])
    return root


@dataclasses.dataclass(frozen=True)
class Entry:
    """One array of a training checkpoint: its object path, shape, dtype and variable name
    (readers that build no model go by the names the TensorFlow runtime's variables have)."""
    path: str
    shape: tuple
    dtype: object
    name: str


class ArrayCheckpoint:
    """The training checkpoint's object graph over host copies: `entries` (model weights at
    their object paths, the slots at `slot_path`, the counters at the root), written from
    {path: array} and read back into one."""

    def __init__(self, entries: Sequence[Entry]):
        self.entries = list(entries)
        self.variables = {e.path: tf.Variable(np.zeros(e.shape, e.dtype), trainable=False,
                                              name=e.name) for e in self.entries}

    def graph(self, data_position: bool = True) -> tf.train.Checkpoint:
        """The object graph; without `data_position`, that of checkpoints written before
        `data_batches` existed."""
        items = self.variables.items()
        optimizer = _Node()
        for slot in ("adam_m", "adam_v"):
            head = f"optimizer/{slot}/"
            setattr(optimizer, slot, {p[len(head):]: v for p, v in items if p.startswith(head)})
        state = dict(model=_tree({p: v for p, v in items if p.startswith("model/")}),
                     optimizer=optimizer)
        for name in COUNTERS:
            if name in self.variables and (data_position or name != "data_batches"):
                state[name] = self.variables[name]
        return tf.train.Checkpoint(**state)

    def assign(self, values: Dict[str, np.ndarray]):
        for path, value in values.items():
            self.variables[path].assign(value)

    def read(self, path: str) -> Dict[str, np.ndarray]:
        """A training checkpoint of either runtime -> {object path: array}; one written
        before data positions existed has none (the caller resumes the input at the step)."""
        reader = tf.compat.v1.train.NewCheckpointReader(path)
        saved = {name.split("/")[0] for name in reader.get_variable_to_shape_map()}
        data_position = "data_batches" in saved
        self.graph(data_position).restore(path).assert_existing_objects_matched()
        return {p: v.numpy() for p, v in self.variables.items()
                if p != "data_batches" or data_position}

    def manager(self, directory: str, max_to_keep: int, values) -> "ArrayCheckpointManager":
        return ArrayCheckpointManager(self, directory, max_to_keep, values)


class ArrayCheckpointManager:
    """`tf.train.CheckpointManager`'s `save`, `latest_checkpoint` and `directory` for an
    `ArrayCheckpoint`: `values()` -> {object path: array} is read at every save."""

    def __init__(self, checkpoint: ArrayCheckpoint, directory: str, max_to_keep: int, values):
        self.checkpoint, self.values = checkpoint, values
        self._manager = tf.train.CheckpointManager(
            checkpoint.graph(), directory, max_to_keep=max_to_keep,
            step_counter=checkpoint.variables["global_step"])

    @property
    def directory(self) -> str:
        return self._manager.directory

    @property
    def latest_checkpoint(self) -> Optional[str]:
        return self._manager.latest_checkpoint

    def save(self, checkpoint_number: int) -> str:
        self.checkpoint.assign(self.values())
        return self._manager.save(checkpoint_number=checkpoint_number)


# --- name-based checkpoints in the released TF1 layout --------------------------------

def checkpoint_prefix(path: str, what: str = "", subdirs: Sequence[str] = ()) -> str:
    """The checkpoint `path` names (any filesystem): a prefix, asked first (on ram://
    `isdir` is true of a prefix too), else the newest complete one in directory `path` or
    its `subdirs` (a damaged newer one is a warning line). A damaged prefix, or none there,
    is a CheckpointError before a byte is read; `what` (a flag) leads its message."""
    label = f"{what}={path}" if what else path
    if fileio.exists(path + ".index"):
        problem = checkpoint_problem(path)
        if problem:
            raise CheckpointError(f"{label}: the checkpoint is damaged ({problem})")
        return path
    if not fileio.isdir(path):
        raise CheckpointError(f"{label} does not exist (neither a directory nor a checkpoint "
                              f"prefix with {path}.index)")
    for directory in (path, *(fileio.join(path, d) for d in subdirs)):
        latest = newest_complete(directory, what)
        if latest is not None:
            return latest
    raise CheckpointError(f"{what + ': ' if what else ''}no checkpoint in directory {path}")


def checkpoint_reader(path: str, what: str = "", subdirs: Sequence[str] = ()):
    """A reader of `checkpoint_prefix(path, what, subdirs)`; unreadable, a CheckpointError."""
    prefix = checkpoint_prefix(path, what, subdirs)
    try:
        return tf.compat.v1.train.NewCheckpointReader(prefix)
    except (tf.errors.OpError, ValueError) as e:
        raise CheckpointError(f"{what + ': ' if what else ''}cannot read checkpoint {prefix}: "
                              f"{str(e).splitlines()[0]}") from None


def read_tf1(ckpt_path: str) -> Dict[str, np.ndarray]:
    """Every tensor of a name-based checkpoint (slots and global_step included)."""
    reader = checkpoint_reader(ckpt_path)
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()}


def write_tf1(arrays: Dict[str, np.ndarray], prefix: str) -> str:
    """Writes {name: array} as a name-based checkpoint (what a TF1 Saver writes, readable by
    tf.train.load_checkpoint) plus a `checkpoint` state file. Returns `prefix`."""
    names = sorted(arrays)
    directory = os.path.dirname(prefix) or "."
    fileio.makedirs(directory)
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=[tf.convert_to_tensor(arrays[n]) for n in names])
    # The state file, which makes the checkpoint visible to latest_checkpoint, comes last.
    write_checkpoint_state(directory, [os.path.basename(prefix)])
    return prefix


def write_checkpoint_state(directory: str, names: Sequence[str], managed: bool = False):
    """The `checkpoint` state file of `directory` (atomically): `names` (prefixes relative
    to it), oldest first; the last is the latest. `managed` (training checkpoints): each
    gets a timestamp (now, in order), since a CheckpointManager treats a listed checkpoint
    without one as preserved for good and would never delete it under max_to_keep."""
    now = time.time()
    state = f'model_checkpoint_path: "{names[-1]}"\n' + "".join(
        f'all_model_checkpoint_paths: "{name}"\n' for name in names)
    if managed:
        state += "".join(f"all_model_checkpoint_timestamps: {now - (len(names) - i) / 1e3:.6f}"
                         "\n" for i in range(1, len(names) + 1))
    fileio.write_atomic(fileio.join(directory, "checkpoint"), state)


def save_tf1_checkpoint(model, prefix: str, variables: Optional[Sequence] = None) -> str:
    """`write_tf1(released_arrays(model, variables), prefix)`: the released names, no optimizer
    slots, and the `checkpoint` state file; pass `discriminator_variables(model)` for a
    discriminator-only file. Returns `prefix`. Runs eagerly (call outside tf.function)."""
    return write_tf1(released_arrays(model, variables), prefix)


def assign_arrays(model, arrays: Dict[str, np.ndarray], variables: Optional[Sequence] = None,
                  allow_missing: bool = False) -> List[str]:
    """Assigns {TF1 name: array} to `variables` (default: every trainable variable of
    `model`; shapes must match exactly); returns the names not in `arrays` (a ValueError
    unless `allow_missing`). Extra arrays (global_step, Adam slots) are ignored."""
    missing = []
    for name, v in tf1_variables(model, variables).items():
        if name not in arrays:
            missing.append(name)
            continue
        if tuple(np.shape(arrays[name])) != tuple(v.shape):
            raise ValueError(f"{name}: shape {list(np.shape(arrays[name]))} != variable shape "
                             f"{list(v.shape)}")
        v.assign(arrays[name])
    if missing and not allow_missing:
        raise ValueError(f"{len(missing)} variables missing (first: {missing[0]})")
    return missing
