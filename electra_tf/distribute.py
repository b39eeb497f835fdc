"""Choosing the tf.distribute strategy and the numeric precision for a run.

`--strategy=auto|tpu|gpu|multi_worker|cpu` maps to TPUStrategy, MirroredStrategy,
MultiWorkerMirroredStrategy or OneDeviceStrategy; `auto` takes what the machine has.
"""

import json
import os
from typing import Optional

import tensorflow as tf
from absl import logging

STRATEGIES = ("auto", "tpu", "gpu", "multi_worker", "cpu")


class StrategyError(ValueError):
    """The requested strategy cannot run here; the message is one line."""


def _tpu_strategy(tpu: Optional[str], zone: Optional[str], project: Optional[str]):
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
            tpu=tpu or "", zone=zone, project=project)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, tf.errors.OpError) as e:
        raise StrategyError(f"--strategy=tpu: cannot reach TPU {tpu or '(local)'}: "
                            f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    return tf.distribute.TPUStrategy(resolver)


def make_strategy(name: str = "auto", tpu: Optional[str] = None, tpu_zone: Optional[str] = None,
                  gcp_project: Optional[str] = None) -> tf.distribute.Strategy:
    """Builds the strategy; call once, before creating any variable."""
    if name not in STRATEGIES:
        raise StrategyError(f"--strategy={name}: expected one of {', '.join(STRATEGIES)}")
    if name == "auto":
        if tpu or os.environ.get("TPU_NAME") or tf.config.list_logical_devices("TPU"):
            name = "tpu"
        elif os.environ.get("TF_CONFIG") and len(
                json.loads(os.environ["TF_CONFIG"]).get("cluster", {}).get("worker", [])) > 1:
            name = "multi_worker"
        elif tf.config.list_physical_devices("GPU"):
            name = "gpu"
        else:
            name = "cpu"
    if name == "tpu":
        strategy = _tpu_strategy(tpu or os.environ.get("TPU_NAME"), tpu_zone, gcp_project)
    elif name == "multi_worker":
        if not os.environ.get("TF_CONFIG"):
            raise StrategyError("--strategy=multi_worker needs TF_CONFIG describing the cluster")
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    elif name == "gpu":
        gpus = tf.config.list_logical_devices("GPU")
        if not gpus:
            raise StrategyError("--strategy=gpu: no GPU is visible to TensorFlow")
        strategy = tf.distribute.MirroredStrategy([d.name for d in gpus])
    else:
        cpus = tf.config.list_logical_devices("CPU")
        if len(cpus) > 1:  # several logical CPU devices: mirror over them (tests, demos)
            strategy = tf.distribute.MirroredStrategy([d.name for d in cpus])
        else:
            strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    logging.info("Strategy %s with %d replica(s)", type(strategy).__name__,
                 strategy.num_replicas_in_sync)
    return strategy


def task(strategy: tf.distribute.Strategy):
    """(task_type, task_id) of this process in a multi-worker cluster, else (None, None)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return None, None
    return resolver.task_type, resolver.task_id


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """Whether this process writes the run's outputs: the chief, or worker 0 of a cluster
    without one; always true outside multi-worker training (TPU: the one host program)."""
    task_type, task_id = task(strategy)
    return task_type in (None, "chief") or (task_type == "worker" and task_id == 0 and
                                            not _has_chief(strategy))


def _has_chief(strategy) -> bool:
    spec = strategy.cluster_resolver.cluster_spec().as_dict()
    return bool(spec.get("chief"))


def worker_dir(model_dir: str, strategy: tf.distribute.Strategy) -> str:
    """Where this process saves checkpoints: `model_dir` for the chief; a scratch
    directory for the other workers, which must take part in every save (it is a
    collective) but whose copies nobody reads."""
    if is_chief(strategy):
        return model_dir
    task_type, task_id = task(strategy)
    return os.path.join(model_dir, ".workers", f"{task_type}_{task_id}")


def default_precision(strategy: tf.distribute.Strategy) -> str:
    """bfloat16 on TPU, float32 elsewhere."""
    return "bfloat16" if isinstance(strategy, tf.distribute.TPUStrategy) else "float32"


def set_precision(precision: str):
    """Sets the Keras dtype policy: variables stay float32, compute in the given type."""
    import keras
    policy = {"float32": "float32", "bfloat16": "mixed_bfloat16",
              "float16": "mixed_float16"}[precision]
    keras.mixed_precision.set_dtype_policy(policy)


def is_cpu_only(strategy: tf.distribute.Strategy) -> bool:
    """Whether every replica of `strategy` runs on a CPU device."""
    try:
        devices = strategy.extended.worker_devices
    except RuntimeError:  # the default strategy: wherever TensorFlow places ops
        return not tf.config.list_logical_devices("GPU") + tf.config.list_logical_devices("TPU")
    return all("CPU" in d.upper() for d in devices)

