"""Fine-tuning: tasks (data, head, loss, metrics), the compiled fine-tuning step and
SavedModel export. `run_finetuning.py` is the CLI."""


class DataError(ValueError):
    """A malformed task data file; the one-line message names the file and line."""


def read_bytes(path: str) -> bytes:
    """The bytes of a task data file on any filesystem TensorFlow knows (gs://...);
    DataError names it. TensorFlow is imported here: squad.py must not import it."""
    import tensorflow as tf
    from electra_tf import fileio
    try:
        return fileio.read_bytes(path)
    except (OSError, tf.errors.OpError) as e:
        raise DataError(f"{path}: cannot read: {fileio.error_reason(e)}") from None
