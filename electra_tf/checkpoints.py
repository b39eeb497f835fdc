"""Training checkpoints on any filesystem: saving with a one-line error, and cleaning up
what a killed write left behind.
"""

import re

import tensorflow as tf
from absl import logging

from electra_tf import fileio


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
