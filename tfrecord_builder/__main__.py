"""`python -m tfrecord_builder [build|learn_vocab] --flags`."""
from absl import flags

from tfrecord_builder import cli

flags.adopt_module_key_flags(cli)  # --help lists the builder's flags, not only --helpfull's

if __name__ == "__main__":
    cli.run()
