"""The TensorFlow runtime: `tf.function` steps under `tf.distribute` (`trainer.TfRuntime`),
the optimizer's slot variables and fused per-variable kernel (`optimizer.py`), the
strategies and TPU resolution (`distribute.py`, `TfDevices`)."""
