"""Checkpoints on any filesystem: the newest complete one of a directory, training checkpoints
(save, torn-write cleanup) and name-based ones in the released TF1 layout ({TF1 name: array}).
TensorFlow's format throughout, written and read without TensorFlow (`bundle.py`); where
TensorFlow is loaded its reader reads name-based checkpoints, as before."""

import codecs
import collections
import dataclasses
import datetime
import os
import re
import struct
import sys
import time
from typing import Dict, Iterator, List, Optional, Sequence

import numpy as np
from absl import logging

from electra_tf import bundle, fileio, wire
from electra_tf.bundle import index_entries  # noqa: F401 (the index, re-exported)
from electra_tf.model.modeling import released_arrays, tf1_variables


def _loaded_tensorflow():
    """TensorFlow where this process has imported it, else None (never imports it)."""
    tf = sys.modules.get("tensorflow")
    return tf if tf is not None and hasattr(tf, "compat") else None


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
    state = read_checkpoint_state(directory) if by_prefix else None
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
# temporary file of a killed `fileio.write_atomic` of config.json / eval_results.json or
# of a checkpoint file written without TensorFlow (`bundle.write_tensors`).
_TORN_CHECKPOINT = re.compile(r"(ckpt-\d+_temp|checkpoint\.tmp[0-9a-f]+|"
                              r"((config|eval_results)\.json|"
                              r"ckpt-\d+\.(index|data-\d{5}-of-\d{5}))\.[0-9a-f]{12}"
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
            freed += sum(fileio.size(f) for f in fileio.walk_files(path))
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
    tf = _loaded_tensorflow()
    try:
        return manager.save(checkpoint_number=step)
    except (OSError, *((tf.errors.OpError,) if tf else ())) as e:
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


# The object graph written without TensorFlow, as `tf.train.Checkpoint(model=..., optimizer=
# ..., <counters>)` records it (TrackableObjectGraph): the root's children by name, the
# model's objects in the order of their sorted paths, the optimizer's two slot dicts in the
# entries' order, `save_counter` at the root; nodes numbered breadth-first, every variable
# a VARIABLE_VALUE attribute under its escaped path; the tensors in node order, the graph
# last. tests/test_bundle_writer.py holds it to TensorFlow's bytes.

GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
_VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"
_SLOTS = ("adam_m", "adam_v")


def _escape(name: str) -> str:
    """An object's name in a checkpoint key ('.' -> '..', '/' -> '.S')."""
    return name.replace(".", "..").replace("/", ".S")


def _edges(path: str) -> List[str]:
    """The names from the root to the object at `path` (a slot dict's key holds '/')."""
    parts = path.split("/")
    if len(parts) > 2 and parts[0] == "optimizer" and parts[1] in _SLOTS:
        return parts[:2] + ["/".join(parts[2:])]
    return parts


def checkpoint_key(path: str) -> str:
    """The tensor key of the variable at object path `path`."""
    return "/".join(_escape(e) for e in _edges(path)) + _VALUE_SUFFIX


class _Object:
    """A node of the object graph: children by name, or a variable (its name)."""

    def __init__(self, variable: Optional[str] = None):
        self.children: Dict[str, "_Object"] = {}
        self.variable = variable

    def child(self, name: str) -> "_Object":
        return self.children.setdefault(name, _Object())


def _graph_bytes(nodes: List[_Object], keys: Dict[int, str]) -> bytes:
    """The TrackableObjectGraph of `nodes` (breadth-first, the root first)."""
    number = {id(n): i for i, n in enumerate(nodes)}
    has_values: Dict[int, bool] = {}
    for node in reversed(nodes):  # children come after their parent
        has_values[id(node)] = node.variable is not None or any(
            has_values[id(c)] for c in node.children.values())
    field = wire.encode_bytes_field
    out = b""
    for node in nodes:
        body = b"".join(field(1, wire.encode_varint_field(1, number[id(c)]) + field(2, name))
                        for name, c in node.children.items())
        if node.variable is not None:  # SerializedTensor: name, full name, checkpoint key
            body += field(2, field(1, "VARIABLE_VALUE") + field(2, node.variable)
                          + field(3, keys[id(node)]))
        # has_checkpoint_values: a BoolValue, empty for false
        body += field(5, wire.encode_varint_field(1, 1) if has_values[id(node)] else b"")
        out += field(1, body)
    return out


@dataclasses.dataclass(frozen=True)
class Entry:
    """One array of a training checkpoint: its object path, shape, dtype and variable name
    (readers that build no model go by the names the TensorFlow runtime's variables have)."""
    path: str
    shape: tuple
    dtype: object
    name: str


class ArrayCheckpoint:
    """The training checkpoint's object graph over host arrays: `entries` (model weights at
    their object paths, the slots at `slot_path`, the counters at the root), written from
    {path: array} and read back into one, in TensorFlow's format without TensorFlow."""

    def __init__(self, entries: Sequence[Entry]):
        self.entries = list(entries)
        self.by_path = {e.path: e for e in self.entries}
        if "save_counter" in self.by_path:
            raise ValueError("save_counter is the checkpoint's own counter, not an entry")

    def _nodes(self, data_position: bool = True) -> List[_Object]:
        """The graph's nodes breadth-first (the root first); without `data_position`,
        that of checkpoints written before `data_batches` existed."""
        root = _Object()
        counters = [n for n in COUNTERS if n in self.by_path
                    and (data_position or n != "data_batches")]
        for name in sorted(counters + ["model", "optimizer", "save_counter"]):
            root.children[name] = _Object(
                name if name in counters or name == "save_counter" else None)
        model = root.children["model"]
        for path in sorted(p for p in self.by_path if p.startswith("model/")):
            parent = model
            for name in path.split("/")[1:-1]:
                parent = parent.child(name)
            parent.children[path.split("/")[-1]] = _Object(self.by_path[path].name)
        optimizer = root.children["optimizer"]
        for slot in _SLOTS:
            slots = optimizer.child(slot)
            for e in self.entries:
                if e.path.startswith(f"optimizer/{slot}/"):
                    slots.children[_edges(e.path)[2]] = _Object(e.name)
        nodes = [root]
        for node in nodes:  # grows as it goes: breadth-first
            nodes.extend(node.children.values())
        return nodes

    def tensors(self, values: Dict[str, np.ndarray], save_counter: int,
                data_position: bool = True) -> Dict[str, np.ndarray]:
        """{tensor key: array} of a checkpoint of `values` {object path: array}, in the
        order TensorFlow writes them, the object graph last."""
        nodes = self._nodes(data_position)
        paths: Dict[int, str] = {}
        for parent in nodes:
            for name, child in parent.children.items():
                paths[id(child)] = (f"{paths[id(parent)]}/{name}" if id(parent) in paths
                                    else name)
        keys = {i: checkpoint_key(p) for i, p in paths.items()}
        out = {}
        for node in nodes[1:]:
            if node.variable is None:
                continue
            path = paths[id(node)]
            if path == "save_counter":
                out[keys[id(node)]] = np.int64(save_counter)
                continue
            e = self.by_path[path]
            value = np.asarray(values[path], dtype=np.dtype(e.dtype))
            if value.shape != tuple(e.shape):
                raise CheckpointError(f"{path}: shape {list(value.shape)} != its "
                                      f"checkpoint entry's {list(e.shape)}")
            out[keys[id(node)]] = value
        out[GRAPH_KEY] = np.array(_graph_bytes(nodes, keys), dtype=object)
        return out

    def write(self, prefix: str, values: Dict[str, np.ndarray], save_counter: int) -> str:
        """Writes the checkpoint `prefix` (any filesystem; data shard, then index)."""
        fileio.makedirs(os.path.dirname(prefix) or ".")
        bundle.write_tensors(prefix, self.tensors(values, save_counter), _write_file)
        return prefix

    def read(self, path: str) -> Dict[str, np.ndarray]:
        """A training checkpoint of either runtime -> {object path: array}, each variable
        found as TensorFlow's restore finds it (through the saved object graph); one
        written before data positions existed has no `data_batches` (the caller resumes
        the input at the step)."""
        reader = bundle.Reader(path, fileio.read_bytes)
        try:
            graph = reader.get_tensor(GRAPH_KEY)
        except KeyError:
            raise CheckpointError(f"{path} is not a training checkpoint (no object graph)"
                                  ) from None
        children, variables = saved_object_graph(graph)
        keys = {}
        for e in self.entries:
            node = 0
            for name in _edges(e.path):
                node = children[node].get(name)
                if node is None:
                    break
            if node is None or node not in variables:
                if e.path == "data_batches":
                    continue
                raise CheckpointError(f"{path}: no {e.path} in the checkpoint")
            keys[e.path] = variables[node][1]
        saved = reader.get_tensors(list(keys.values()))
        out = {}
        for e in self.entries:
            if e.path not in keys:
                continue
            value = saved[keys[e.path]]
            if tuple(value.shape) != tuple(e.shape):
                raise CheckpointError(f"{path}: {e.path} has shape {list(value.shape)}, the "
                                      f"model's is {list(e.shape)}")
            out[e.path] = value.astype(np.dtype(e.dtype), copy=False)
        return out

    def manager(self, directory: str, max_to_keep: int, values) -> "ArrayCheckpointManager":
        return ArrayCheckpointManager(self, directory, max_to_keep, values)


def saved_object_graph(graph: bytes):
    """A saved TrackableObjectGraph (the `GRAPH_KEY` tensor) -> ([{child name: node} per
    node], {node: (its variable's full name, the checkpoint key of its VARIABLE_VALUE)})."""
    children, keys = [], {}
    for number, kind, s, e in wire.fields(graph):
        if number != 1 or kind != 2:
            continue
        node, mine = len(children), {}
        for n2, k2, s2, e2 in wire.fields(graph, s, e):
            if k2 != 2 or n2 not in (1, 2):
                continue
            sub = {n3: (s3, e3) for n3, _, s3, e3 in wire.fields(graph, s2, e2)}
            text = lambda f: graph[sub[f][0]:sub[f][1]].decode() if f in sub else ""  # noqa
            if n2 == 1:
                child = wire.varint_field(graph, *sub[1]) if 1 in sub else 0
                mine[text(2)] = child
            elif text(1) == "VARIABLE_VALUE":
                keys[node] = (text(2), text(3))
        children.append(mine)
    return children, keys


def _write_file(path: str, chunks: Iterator[bytes]):
    """A checkpoint file through the file layer, under a temporary name until complete."""
    with fileio.atomic_output(path) as tmp:
        with fileio.open_file(tmp, "wb") as f:
            for chunk in chunks:
                f.write(chunk)


class ArrayCheckpointManager:
    """`tf.train.CheckpointManager`'s `save`, `latest_checkpoint` and `directory` for an
    `ArrayCheckpoint`, without TensorFlow: `values()` -> {object path: array} is read at
    every save; the `checkpoint` state file is written as that manager writes it (each
    checkpoint's time, the last preserved time), so either manager keeps the other's
    `max_to_keep` newest and deletes the older ones."""

    def __init__(self, checkpoint: ArrayCheckpoint, directory: str, max_to_keep: int, values):
        if max_to_keep is not None and max_to_keep <= 0:
            raise ValueError(f"max_to_keep must be positive or None, not {max_to_keep}")
        self.checkpoint, self.values, self.max_to_keep = checkpoint, values, max_to_keep
        self.directory = directory
        self._saves = 0  # tf.train.Checkpoint's save_counter: this manager's saves
        self._kept: "collections.OrderedDict[str, float]" = collections.OrderedDict()
        now = time.time()
        state = read_checkpoint_state(directory)
        if state is None:
            self.latest_checkpoint, self._preserved = None, now - 1.0
            return
        self.latest_checkpoint = state.model_checkpoint_path
        self._preserved = min(state.last_preserved_timestamp, now)
        stamps = state.all_model_checkpoint_timestamps or (
            [self._preserved] * len(state.all_model_checkpoint_paths))
        for path, stamp in zip(state.all_model_checkpoint_paths, stamps):
            if min(stamp, now) > self._preserved:
                self._kept[path] = min(stamp, now)

    def save(self, checkpoint_number: int) -> str:
        self._saves += 1
        prefix = fileio.join(self.directory, f"ckpt-{int(checkpoint_number)}")
        self.checkpoint.write(prefix, self.values(), self._saves)
        self._kept.pop(prefix, None)
        self._kept[prefix] = time.time()
        self.latest_checkpoint = prefix
        # The state names the new checkpoint before older ones are deleted, and again after.
        self._record_state()
        while self.max_to_keep and len(self._kept) > self.max_to_keep:
            old, _ = self._kept.popitem(last=False)
            for name in [old + ".index"] + fileio.glob(old + ".data-?????-of-?????"):
                fileio.remove(name, missing_ok=True)
        self._record_state()
        return prefix

    def _record_state(self):
        write_checkpoint_state(self.directory, [_relative(self.directory, p) for p in self._kept],
                               timestamps=list(self._kept.values()),
                               last_preserved=self._preserved)


class ReadOnlyManager:
    """The checkpoint manager of a process that does not write the run (a JAX process
    other than 0: the state it holds is process 0's, replicated): `save` writes nothing and
    names process 0's checkpoint of that step, which every process reads on resume."""

    def __init__(self, directory: str):
        self.directory = directory
        state = read_checkpoint_state(directory)
        self.latest_checkpoint = state.model_checkpoint_path if state else None

    def save(self, checkpoint_number: int) -> str:
        self.latest_checkpoint = fileio.join(self.directory, f"ckpt-{int(checkpoint_number)}")
        return self.latest_checkpoint


def _relative(directory: str, path: str) -> str:
    head = directory.rstrip("/") + "/"
    return path[len(head):] if path.startswith(head) else path


@dataclasses.dataclass
class CheckpointState:
    """A `checkpoint` state file's fields, paths joined to its directory (as TensorFlow's
    `get_checkpoint_state` gives them)."""
    model_checkpoint_path: str
    all_model_checkpoint_paths: List[str]
    all_model_checkpoint_timestamps: List[float]
    last_preserved_timestamp: float


_STATE_LINE = re.compile(r'^\s*(\w+)\s*:\s*(?:"((?:[^"\\]|\\.)*)"|([-+0-9.eEinfINFa]+))\s*$')


def read_checkpoint_state(directory: str) -> Optional[CheckpointState]:
    """The `checkpoint` state file of `directory` (any filesystem), or None where there is
    none or it does not parse (a warning line, as TensorFlow's reader does)."""
    path = fileio.join(directory, "checkpoint")
    try:
        text = fileio.read_bytes(path).decode("latin-1")  # bytes as they are: escapes below
    except FileNotFoundError:
        return None
    fields: Dict[str, list] = collections.defaultdict(list)
    for line in text.splitlines():
        if not line.strip():
            continue
        match = _STATE_LINE.match(line)
        if not match:
            logging.warning("%s: cannot parse the line %r; ignoring the file", path, line)
            return None
        name, quoted, number = match.groups()
        if quoted is not None:
            fields[name].append(codecs.escape_decode(quoted.encode("latin-1"))[0]
                                .decode("utf-8", "replace"))
        else:
            fields[name].append(float(number))
    if not fields.get("model_checkpoint_path"):
        raise ValueError(f"Invalid checkpoint state loaded from {directory}")
    full = lambda p: p if os.path.isabs(p) or fileio.is_remote(p) else fileio.join(  # noqa
        directory, p)
    return CheckpointState(full(fields["model_checkpoint_path"][-1]),
                           [full(p) for p in fields["all_model_checkpoint_paths"]],
                           list(fields["all_model_checkpoint_timestamps"]),
                           (fields.get("last_preserved_timestamp") or [0.0])[-1])


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
    """A reader (`get_tensor`, `has_tensor`, `get_variable_to_shape_map`) of
    `checkpoint_prefix(path, what, subdirs)`: TensorFlow's where it is loaded, else
    `bundle.Reader`; unreadable, a CheckpointError."""
    prefix = checkpoint_prefix(path, what, subdirs)
    tf = _loaded_tensorflow()
    try:
        if tf is not None:
            return tf.compat.v1.train.NewCheckpointReader(prefix)
        return bundle.Reader(prefix, fileio.read_bytes)
    except (OSError, ValueError, IndexError, struct.error,
            *((tf.errors.OpError,) if tf else ())) as e:
        raise CheckpointError(f"{what + ': ' if what else ''}cannot read checkpoint {prefix}: "
                              f"{str(e).splitlines()[0]}") from None


def read_tf1(ckpt_path: str) -> Dict[str, np.ndarray]:
    """Every tensor of a name-based checkpoint (slots and global_step included)."""
    reader = checkpoint_reader(ckpt_path)
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()}


def write_tf1(arrays: Dict[str, np.ndarray], prefix: str) -> str:
    """Writes {name: array} as a name-based checkpoint (what a TF1 Saver writes, readable by
    tf.train.load_checkpoint) plus a `checkpoint` state file. Returns `prefix`."""
    directory = os.path.dirname(prefix) or "."
    fileio.makedirs(directory)
    # SaveV2's bytes (the names sorted), written without TensorFlow.
    bundle.write_tensors(prefix, {n: arrays[n] for n in sorted(arrays)}, _write_file)
    # The state file, which makes the checkpoint visible to latest_checkpoint, comes last.
    write_checkpoint_state(directory, [os.path.basename(prefix)])
    return prefix


def write_checkpoint_state(directory: str, names: Sequence[str], managed: bool = False,
                           timestamps: Optional[Sequence[float]] = None,
                           last_preserved: Optional[float] = None):
    """The `checkpoint` state file of `directory` (atomically): `names` (prefixes relative
    to it), oldest first; the last is the latest. `managed` (training checkpoints): each
    gets a timestamp (now, in order), since a CheckpointManager treats a listed checkpoint
    without one as preserved for good and would never delete it under max_to_keep.
    `timestamps` and `last_preserved` (`ArrayCheckpointManager`): those times, written as
    TensorFlow's manager writes its own."""
    now = time.time()
    state = f'model_checkpoint_path: "{names[-1]}"\n' + "".join(
        f'all_model_checkpoint_paths: "{name}"\n' for name in names)
    if timestamps is not None:
        state += "".join(f"all_model_checkpoint_timestamps: {float(t)!r}\n" for t in timestamps)
    elif managed:
        state += "".join(f"all_model_checkpoint_timestamps: {now - (len(names) - i) / 1e3:.6f}"
                         "\n" for i in range(1, len(names) + 1))
    if last_preserved is not None:
        state += f"last_preserved_timestamp: {float(last_preserved)!r}\n"
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
