"""electra_tf: ELECTRA pre-training (replaced-token detection) in TensorFlow 2 / Keras 3.

TPU first; the data stage lives in `tfrecord_builder`, the trainer side in this package.
"""

from electra_tf.compat import configure_tpu_library, require_supported_versions

# TensorFlow 2.20 or 2.21 with matching tensorflow-text and Keras 3, or one line and exit
# (from package metadata; TensorFlow itself is not imported here).
require_supported_versions()
# The TPU build of TensorFlow on a host without TPU chips: leave its TPU runtime unloaded.
configure_tpu_library()
