"""Test helper for trees on TensorFlow's in-memory filesystem (ram://)."""

import tensorflow as tf


def forget(root: str):
    """Best-effort removal of a ram:// tree: ram:// cannot delete directories it was never
    asked to create, and the tree is only memory of this process anyway."""
    try:
        if tf.io.gfile.exists(root):
            tf.io.gfile.rmtree(root)
    except tf.errors.OpError:
        pass  # what is left is freed with the process
