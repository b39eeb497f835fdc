"""The TensorFlow runtime's devices (`runtime.Devices`): a `tf.distribute.Strategy`
(`distribute.make_strategy`) and what the host loop asks of it."""

import os
from typing import Optional

import tensorflow as tf
from absl import logging

from electra_tf.training import gce, runtime
from electra_tf.training.tf_runtime import distribute
from electra_tf.training.tf_runtime.trainer import TfRuntime


class TfDevices(runtime.Devices):
    """A `tf.distribute.Strategy` as the runtime contract's devices (`runtime.Devices`)."""

    backend = "tensorflow"
    saved_model_in_process = True

    def __init__(self, strategy: tf.distribute.Strategy):
        self.strategy = strategy
        task_type, _ = distribute.task(strategy)
        if task_type is not None:
            spec = strategy.cluster_resolver.cluster_spec().as_dict()
            tasks = [(kind, i) for kind in ("chief", "worker")
                     for i in range(len(spec.get(kind, [])))]
            self.process_count = len(tasks)
            self.process_index = tasks.index(distribute.task(strategy))
        self._count_workers = None

    @property
    def num_replicas(self) -> int:
        return self.strategy.num_replicas_in_sync

    @property
    def worker_devices(self):
        try:
            return list(self.strategy.extended.worker_devices)
        except RuntimeError:  # the default strategy: wherever TensorFlow places ops
            return []

    @property
    def platform(self) -> str:
        if isinstance(self.strategy, tf.distribute.TPUStrategy):
            return "TPU"
        devices = " ".join(self.worker_devices).upper()
        if not devices and not distribute.is_cpu_only(self.strategy):
            return "GPU" if tf.config.list_logical_devices("GPU") else "TPU"
        return next((t for t in ("TPU", "GPU") if f"{t}:" in devices), "CPU")

    @property
    def hosts(self) -> int:
        """A host's logical CPU devices (its `worker_devices`) share its cores."""
        return max(1, self.num_replicas // max(1, len(self.worker_devices)))

    def accelerator_name(self) -> Optional[str]:
        kind = self.platform
        if kind == "GPU":
            gpus = tf.config.list_physical_devices("GPU")
            return tf.config.experimental.get_device_details(gpus[0]).get("device_name") \
                if gpus else None
        if kind == "TPU":
            return tpu_accelerator_type(self.strategy)
        return None

    def tf32_enabled(self) -> bool:
        return bool(tf.config.experimental.tensor_float_32_execution_enabled())

    def task(self):
        return distribute.task(self.strategy)

    def is_chief(self) -> bool:
        return distribute.is_chief(self.strategy)

    def sum_over_workers(self, value: int) -> int:
        if self.task()[0] is None:
            return int(value)
        if self._count_workers is None:
            strategy = self.strategy
            self._count_workers = tf.function(lambda flag: strategy.reduce(
                tf.distribute.ReduceOp.SUM, strategy.run(tf.identity, args=(flag,)),
                axis=None))
        return int(self._count_workers(tf.constant(int(value))))

    def describe(self) -> str:
        return (f"TensorFlow {tf.__version__}: {type(self.strategy).__name__} with "
                f"{self.num_replicas} replica(s)")

    def dataset(self, make):
        """On one CPU device the step reads the pipeline itself (the same batches, as its one
        input pipeline) instead of through a strategy's multi-device iterator."""
        if self.num_replicas == 1 and distribute.is_cpu_only(self.strategy):
            return make(tf.distribute.InputContext(1, 0, 1))
        return self.strategy.distribute_datasets_from_function(make)

    def distribute(self, dataset):
        """Without tf.data's autotuner: the splits are in memory and the pipelines have
        nothing to tune. Where a strategy's multi-device iterator owns a pipeline, releasing
        the iterator waits for the autotuner's thread to wake by itself (up to a minute:
        5-56 s after the last step in 7 of 12 fine-tuning runs measured)."""
        options = tf.data.Options()
        options.autotune.enabled = False
        return self.strategy.experimental_distribute_dataset(dataset.with_options(options))

    def profiler_start(self, logdir: str):
        try:
            tf.profiler.experimental.start(logdir)
        except tf.errors.AlreadyExistsError as e:  # the contract's "a trace is under way"
            raise RuntimeError(str(e)) from None

    def profiler_stop(self):
        tf.profiler.experimental.stop()

    def runtime(self, job, jit_compile: Optional[bool] = None):
        return TfRuntime(job, self, jit_compile)


def tpu_accelerator_type(strategy) -> Optional[str]:
    """The accelerator type of a TPU ('v4-8'): the TPU VM's environment, the Cloud TPU
    API of the strategy's resolver, or the GCE metadata server."""
    for var in ("TPU_ACCELERATOR_TYPE", "ACCELERATOR_TYPE"):
        if os.environ.get(var):
            return os.environ[var]
    client = getattr(getattr(strategy, "cluster_resolver", None), "_cloud_tpu_client", None)
    try:
        if client is not None and client.api_available():
            return client.accelerator_type()
    except Exception as e:  # noqa: BLE001 - no API access: try the next source
        logging.info("Cloud TPU API gave no accelerator type: %s", e)
    return gce.attribute("accelerator-type")
