"""`saved_model_cli` with the tensorflow-text ops our exports' in-graph tokenizer needs registered:
`python -m electra_tf.conversion.saved_model_cli run --dir ... ...`. (TensorFlow Serving links them
in; in Python, `import tensorflow_text` before `tf.saved_model.load` suffices.)"""

import sys

import tensorflow_text
from tensorflow.python.tools import saved_model_cli

_OPS = tensorflow_text  # imported for its side effect: NormalizeUTF8, FastWordpieceTokenize...


def main():
    sys.argv[0] = "saved_model_cli"
    saved_model_cli.main()


if __name__ == "__main__":
    main()
