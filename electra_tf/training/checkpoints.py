"""Checkpoints on any filesystem: training checkpoints (saving with a one-line error,
cleaning up what a killed write left behind) and name-based checkpoints in the released
TF1 layout, read and written as {TF1 name: array} or straight from / into a model.
"""

import os
import re
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf
from absl import logging

from electra_tf import fileio
from electra_tf.model.modeling import released_arrays, tf1_variables


class CheckpointError(ValueError):
    """A checkpoint could not be written: one line naming the directory and the last good
    checkpoint."""


# A checkpoint write's staging directory, the checkpoint index's temporary file, and the
# temporary file of a killed `fileio.write_atomic` of config.json / eval_results.json.
_TORN_CHECKPOINT = re.compile(r"(ckpt-\d+_temp|checkpoint\.tmp[0-9a-f]+|"
                              r"(config|eval_results)\.json\.[0-9a-f]{12}"
                              + re.escape(fileio.TMP_SUFFIX) + ")$")


def remove_torn_checkpoints(directory: str) -> int:
    """Deletes what a killed checkpoint write left in `directory` (its `ckpt-N_temp/`
    staging directories and `checkpoint.tmp<hex>` index files; a checkpoint only becomes
    visible once complete, so these are never loaded; also the temp files of a killed
    config.json / eval_results.json write) and returns the bytes freed. `directory` may be
    on any filesystem (gs://...). Call before writing there."""
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


def save_checkpoint(manager: tf.train.CheckpointManager, step: int) -> str:
    """manager.save at `step`; a failed write (a full disk, a lost bucket) is one RunError
    naming the directory and the last good checkpoint, which stays the newest one (the
    checkpoint index is only updated after a complete write)."""
    try:
        return manager.save(checkpoint_number=step)
    except (tf.errors.OpError, OSError) as e:
        reason = (getattr(e, "message", None) or str(e)).strip().splitlines()[0]
        raise CheckpointError(f"could not write the step-{step} checkpoint to {manager.directory} "
                       f"({reason}); last good checkpoint: "
                       f"{manager.latest_checkpoint or 'none'}; free space and rerun the "
                       "same command") from None


# --- name-based checkpoints in the released TF1 layout --------------------------------

def checkpoint_reader(path: str):
    """A reader of the checkpoint `path`: a prefix (`<path>.index` exists) or a directory
    with a `checkpoint` state file; any filesystem (gs://...). Raises ValueError when
    there is none.

    The prefix is tried first: `tf.train.load_checkpoint` asks `isdir` first, which on
    filesystems that match names by prefix (ram://) is true of a prefix too."""
    if tf.io.gfile.exists(path + ".index"):
        return tf.compat.v1.train.NewCheckpointReader(path)
    return tf.train.load_checkpoint(path)


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
    base = os.path.basename(prefix)
    # The state file, which makes the checkpoint visible to latest_checkpoint, comes last.
    state = f'model_checkpoint_path: "{base}"\nall_model_checkpoint_paths: "{base}"\n'
    fileio.write_atomic(fileio.join(directory, "checkpoint"), state)
    return prefix


def model_arrays(model, variables: Optional[Sequence] = None) -> Dict[str, np.ndarray]:
    """{TF1 name: array} of `variables` (default: every trainable variable of `model`), in
    the released layout (`modeling.released_arrays`: GDES deltas folded)."""
    return released_arrays(model, variables)


def save_tf1_checkpoint(model, prefix: str, variables: Optional[Sequence] = None) -> str:
    """`write_tf1(model_arrays(model, variables), prefix)`: the released names, no optimizer
    slots, and the `checkpoint` state file; pass `discriminator_variables(model)` for a
    discriminator-only file. Returns `prefix`. Runs eagerly (call outside tf.function)."""
    return write_tf1(model_arrays(model, variables), prefix)


def _assign(model, variables, shapes: Mapping[str, Sequence[int]],
            read: Callable[[str], np.ndarray], allow_missing: bool,
            source: Optional[str]) -> List[str]:
    """Assigns each of `variables` the tensor of its TF1 name (shapes must match);
    returns the names `shapes` lacks. `source` names a checkpoint in the errors."""
    missing = []
    for name, v in tf1_variables(model, variables).items():
        if name not in shapes:
            missing.append(name)
            continue
        if tuple(shapes[name]) != tuple(v.shape):
            what = "checkpoint shape" if source else "shape"
            raise ValueError(f"{name}: {what} {list(shapes[name])} != variable shape "
                             f"{list(v.shape)}")
        v.assign(read(name))
    if missing and not allow_missing:
        if source:
            raise ValueError(f"{len(missing)} variables not in {source}: {missing[:5]}")
        raise ValueError(f"{len(missing)} variables missing (first: {missing[0]})")
    return missing


def assign_arrays(model, arrays: Dict[str, np.ndarray], variables: Optional[Sequence] = None,
                  allow_missing: bool = False) -> List[str]:
    """Assigns {TF1 name: array} to `variables` (default: every trainable variable of
    `model`); returns the names not in `arrays` (a ValueError unless `allow_missing`)."""
    shapes = {name: np.shape(a) for name, a in arrays.items()}
    return _assign(model, variables, shapes, arrays.__getitem__, allow_missing, None)


def load_tf1_checkpoint(model, ckpt_path: str, variables: Optional[Sequence] = None,
                        allow_missing: bool = False) -> List[str]:
    """Assigns variables from a name-based (TF1) checkpoint, e.g. a released one, reading
    only the tensors it needs.

    Shapes must match exactly. Returns the names not found in the checkpoint (an error
    unless `allow_missing`). Extra checkpoint entries (global_step, adam slots) are ignored.
    """
    reader = checkpoint_reader(ckpt_path)
    return _assign(model, variables, reader.get_variable_to_shape_map(), reader.get_tensor,
                   allow_missing, ckpt_path)
