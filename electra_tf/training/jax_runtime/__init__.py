"""The JAX runtime: one `jax.jit` step over a device mesh (`step.py`), its host loop and
counters (`trainer.JaxRuntime`), its devices and cluster (`devices.py`). No TensorFlow
state: TensorFlow is touched by tf.data (the input) and by `training/checkpoints.py`
(the checkpoint files) only."""
