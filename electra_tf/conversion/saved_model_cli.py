"""`saved_model_cli` with the tensorflow-text ops our exports' in-graph tokenizer needs registered:
`python -m electra_tf.conversion.saved_model_cli run --dir ... ...`. (TensorFlow Serving links them
in; in Python, `import tensorflow_text` before `tf.saved_model.load` suffices.)"""

import sys


def main():
    from electra_tf import backend
    try:
        backend.require_tensorflow("saved_model_cli (SavedModels are TensorFlow graphs)")
        import tensorflow_text  # noqa: F401  (registers NormalizeUTF8, FastWordpieceTokenize...)
    except (backend.BackendError, ImportError) as e:
        sys.exit(f"saved_model_cli: error: {e}")
    from tensorflow.python.tools import saved_model_cli
    sys.argv[0] = "saved_model_cli"
    saved_model_cli.main()


if __name__ == "__main__":
    main()
