"""`python -m tfrecord_builder [build|learn_vocab] --flags`."""
from tfrecord_builder.cli import run

if __name__ == "__main__":
    run()
