"""Offline builder: raw text -> WordPiece/SentencePiece ids -> packed, sharded TFRecords.

The output (features `input_ids`, `input_mask`, `segment_ids`, int64[max_seq_length])
is the official ELECTRA pre-training format, plus a `manifest.json` the trainer checks.
Where TensorFlow is installed the builder loads it (its filesystem layer, tf-text's
tokenizers); without it the same bytes come from the TensorFlow-free tokenizers
(`electra_tf.text`) and filesystem layer (`electra_tf.fileio`).
"""

import gc
import importlib
import importlib.util
import sys
import types

from electra_tf.compat import require_supported_versions

__version__ = "0.2.0"


# TensorFlow 2.20 or 2.21 with matching tensorflow-text (or JAX without TensorFlow), or
# one line and exit; nothing is imported here.
require_supported_versions()


class BuildError(Exception):
    """A problem with the user's input or flags, reported as one line without a traceback."""


class _KerasLayersStandIn(types.ModuleType):
    """tf-text's Keras layers while tf-text is imported; afterwards the real module,
    imported (with Keras) on first use."""

    def __getattr__(self, name):
        if sys.modules.get(self.__name__) is self:
            raise AttributeError(name)
        return getattr(importlib.import_module(self.__name__), name)


def tensorflow_installed() -> bool:
    """Whether TensorFlow and tf-text can be imported (neither blocked nor missing)."""
    for name in ("tensorflow", "tensorflow_text"):
        if name in sys.modules:
            if sys.modules[name] is None:
                return False
            continue
        try:
            if importlib.util.find_spec(name) is None:
                return False
        except (ImportError, ValueError):
            return False
    return True


def import_tensorflow() -> bool:
    """Imports TensorFlow and tf-text for a builder process (the CLI, its workers,
    `import tfrecord_builder.build`) without Keras, which both import eagerly and the
    builder never uses (~1.2 s, and scikit-learn through it): stand-ins for those two
    imports during the import only, so a later `import keras` works. Nothing where
    TensorFlow is already imported; the normal import where the stand-ins fail; nothing
    where they are not installed (the builder then runs without them). -> whether
    TensorFlow is loaded."""
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"] is not None
    if not tensorflow_installed():
        return False
    layers = "tensorflow_text.python.keras"
    stand_ins = {k: v for k, v in {"keras.src.optimizers": None, "tf_keras.src.optimizers": None,
                                   layers: _KerasLayersStandIn(layers)}.items()
                 if k not in sys.modules}
    sys.modules.update(stand_ins)
    try:
        import tensorflow, tensorflow_text  # noqa: F401,E401
    except Exception:  # pylint: disable=broad-except
        pass  # another TensorFlow or tf-text: the normal import below
    finally:
        for name, module in stand_ins.items():
            if sys.modules.get(name, 0) is module:
                del sys.modules[name]
    import tensorflow, tensorflow_text  # noqa: F401,E401,F811
    return True


def start_worker(vocab_fields: dict, vocab_data: bytes):
    """A builder worker process's initializer. Here, and with the vocabulary as plain
    fields, so that a spawned worker imports nothing of TensorFlow before it runs."""
    import_tensorflow()
    from electra_tf.text import VocabInfo
    from tfrecord_builder.build import _init_worker
    _init_worker(VocabInfo(**vocab_fields), vocab_data)
    gc.freeze()  # as the CLI does (cli.main): TensorFlow's objects out of the collector's way
