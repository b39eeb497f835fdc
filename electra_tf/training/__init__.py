"""The training core both jobs share: the runtime contract (`runtime.py`), the update
(`update.py`), the schedule, the host loop (`loop.py`), checkpoints, the lease and
preemption; each runtime in a package of its own (`tf_runtime/`, `jax_runtime/`), chosen
once by `backends.py`."""
