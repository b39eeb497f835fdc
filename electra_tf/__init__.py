"""electra_tf: ELECTRA pre-training (replaced-token detection) in TensorFlow 2 / Keras 3.

TPU first; the data stage lives in `tfrecord_builder`, the trainer side in this package.
"""
