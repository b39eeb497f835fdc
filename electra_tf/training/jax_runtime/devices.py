"""The JAX runtime's devices (`runtime.Devices`): a 1-D mesh of every device JAX sees (every
process's, under `jax.distributed`), the process's place among them, and the cluster the
environment describes (`jax_cluster`: TF_CONFIG, or JAX's own variables). JAX is imported
where it is used: `jax_cluster` reads the environment only."""

import json
import logging as std_logging
import os
import sys
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
from absl import logging

from electra_tf import quiet
from electra_tf.backend import require_jax
from electra_tf.training import runtime
from electra_tf.training.jax_runtime import compile_cache, guard
from electra_tf.training.runtime import StrategyError


class JaxDevices(runtime.Devices):
    """The devices of a JAX run: the mesh the step is split over and this process's place
    among `jax.distributed`'s processes."""

    backend = "jax"
    host_input = True
    chief_logs_steps = True

    def __init__(self, devices: Optional[List] = None):
        import jax
        from electra_tf.training.jax_runtime.step import make_mesh
        self.mesh = make_mesh(devices)
        devices = list(self.mesh.devices.flat)
        self.num_replicas = len(devices)
        self.process_index, self.process_count = jax.process_index(), jax.process_count()
        self._platform = devices[0].platform.upper()
        self.device_kind = devices[0].device_kind

    @property
    def platform(self) -> str:
        return self._platform

    @property
    def hosts(self) -> int:
        return self.process_count

    def accelerator_name(self) -> Optional[str]:
        if self.platform == "GPU":
            return self.device_kind
        if self.platform == "TPU":
            import os
            for var in ("TPU_ACCELERATOR_TYPE", "ACCELERATOR_TYPE"):
                if os.environ.get(var):
                    return os.environ[var]
            from electra_tf.training import gce
            return gce.attribute("accelerator-type")
        return None

    def tf32_enabled(self) -> bool:
        """JAX's default matmul precision unless set to 'highest' or 'float32'."""
        import jax
        return str(jax.config.jax_default_matmul_precision or "default").lower() not in (
            "highest", "float32")

    def task(self):
        """('worker', i) under several processes, else (None, None)."""
        return ("worker", self.process_index) if self.process_count > 1 else (None, None)

    def is_chief(self) -> bool:
        """Process 0 writes."""
        return self.process_index == 0

    def worker_dir(self, model_dir: str) -> str:
        """Every process reads the run where process 0 writes it (the same `model_dir`, a
        bucket on a slice): the others save nothing (`ReadOnlyManager`)."""
        return model_dir

    def sum_over_workers(self, value: int) -> int:
        if self.process_count == 1:
            return int(value)
        from jax.experimental import multihost_utils
        return int(np.sum(multihost_utils.process_allgather(np.int32(value))))

    def compile_mark(self):
        return compile_cache.CompileWatch.mark()

    def compiles_since(self, mark) -> Optional[str]:
        return compile_cache.CompileWatch.since(mark)

    def describe(self) -> str:
        import jax
        return (f"JAX {jax.__version__}: {self.num_replicas} {self.platform} "
                f"device(s) ({self.device_kind}), {self.process_count} process(es)")

    def dataset(self, make):
        """This process's rows of each global batch, from its own input pipeline of host
        arrays (`host_input`: `data.dataset.InputContext` makes `make_input` take the
        NumPy pipeline, no TensorFlow)."""
        from electra_tf.data.dataset import InputContext
        n, i = self.process_count, self.process_index
        return make(InputContext(n, i, n))

    def distribute(self, dataset):
        """An in-memory split's global batches (NumPy, the same in every process) -> this
        process's rows of each: process i sends the i-th of `process_count` equal shares,
        so the batch on the devices is the global batch itself."""
        if self.process_count == 1:
            return dataset
        return _share_of_each(dataset, self.process_index, self.process_count)

    def profiler_start(self, logdir: str):
        import jax
        jax.profiler.start_trace(logdir)

    def profiler_stop(self):
        import jax
        jax.profiler.stop_trace()

    def runtime(self, job, jit_compile: Optional[bool] = None):
        """The JAX runtime's trainer; its step is always one XLA program, so
        `jit_compile=False` is ignored (a TensorFlow command line runs unchanged)."""
        if jit_compile is False:
            logging.warning("--jit_compile=false: ignored on the JAX backend, whose step is "
                            "always one XLA program")
        from electra_tf.training.jax_runtime.trainer import JaxRuntime
        return JaxRuntime(job, self)


def _share_of_each(batches, index: int, count: int):
    for batch in batches:
        share = len(next(iter(batch.values()))) // count
        yield {k: v[index * share:(index + 1) * share] for k, v in batch.items()}


def _keep_tensorflow_off_accelerators():
    """The JAX runtime needs no TensorFlow (input, checkpoints, logs and files are its
    own); where something has loaded TensorFlow into the process already, it must not
    claim an accelerator."""
    tf = sys.modules.get("tensorflow")
    if tf is None or not hasattr(tf, "config"):
        return
    try:
        tf.config.set_visible_devices([], "GPU")
        tf.config.set_visible_devices([], "TPU")
    except (RuntimeError, ValueError) as e:  # its devices were initialised already
        logging.info("TensorFlow's devices stay visible to it (%s): it holds no "
                     "accelerator memory unless it runs ops there", e)


def jax_cluster(environ) -> Dict[str, Any]:
    """`jax.distributed.initialize`'s arguments for --strategy=multi_worker from the
    environment: TF_CONFIG, as the TensorFlow runtime reads it (the chief, then the
    workers, in order: process i is the i-th task, the coordinator the first task's
    address), else JAX_COORDINATOR_ADDRESS + JAX_NUM_PROCESSES + JAX_PROCESS_ID, else {}
    (JAX finds the cluster itself: Cloud TPU slices, SLURM, Open MPI, Kubernetes)."""
    if environ.get("TF_CONFIG"):
        try:
            spec = json.loads(environ["TF_CONFIG"])
            cluster, task = spec["cluster"], spec["task"]
            tasks = [(kind, i) for kind in ("chief", "worker")
                     for i in range(len(cluster.get(kind, [])))]
            addresses = [cluster[kind][i] for kind, i in tasks]
            process_id = tasks.index((task["type"], int(task["index"])))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise StrategyError(f"TF_CONFIG: not a cluster with this task among its chief "
                                f"and workers ({type(e).__name__}: {e})") from None
        return dict(coordinator_address=addresses[0], num_processes=len(addresses),
                    process_id=process_id)
    given = [environ.get(k) for k in ("JAX_NUM_PROCESSES", "JAX_PROCESS_ID")]
    if any(given):
        if not all(given) or not environ.get("JAX_COORDINATOR_ADDRESS"):
            raise StrategyError("--strategy=multi_worker: set JAX_COORDINATOR_ADDRESS, "
                                "JAX_NUM_PROCESSES and JAX_PROCESS_ID together")
        try:
            num, index = int(given[0]), int(given[1])
        except ValueError:
            raise StrategyError(f"JAX_NUM_PROCESSES={given[0]!r}, JAX_PROCESS_ID="
                                f"{given[1]!r}: expected integers") from None
        return dict(coordinator_address=environ["JAX_COORDINATOR_ADDRESS"],
                    num_processes=num, process_id=index)
    return {}


# How long a worker waits for the coordinator (process 0) to listen: JAX's own default
# for jax.distributed.initialize. ELECTRA_TF_COORDINATOR_TIMEOUT (seconds) sets another.
COORDINATOR_TIMEOUT_S = 300.0


def wait_for_coordinator(address: str, timeout: Optional[float] = None):
    """Returns once `address` (HOST:PORT, process 0's coordination service) accepts a TCP
    connection; a StrategyError naming it after `timeout` seconds. jax.distributed
    aborts the whole process with a C++ stack dump when the coordinator cannot be
    reached, so a worker checks first."""
    import socket
    import time
    if timeout is None:
        timeout = float(os.environ.get("ELECTRA_TF_COORDINATOR_TIMEOUT", COORDINATOR_TIMEOUT_S))
    host, _, port = address.rpartition(":")
    try:
        port_number = int(port)
    except ValueError:
        raise StrategyError(f"JAX coordinator address {address!r}: expected HOST:PORT") from None
    deadline = time.monotonic() + timeout
    reason = "no answer"
    while True:
        try:
            with socket.create_connection((host.strip("[]"), port_number), timeout=2.0):
                return
        except OSError as e:
            reason = e.strerror or type(e).__name__
        if time.monotonic() >= deadline:
            raise StrategyError(
                f"--strategy=multi_worker: the JAX coordinator (process 0) at {address} did "
                f"not answer within {timeout:g} s ({reason}): start process 0 first, or check "
                "JAX_COORDINATOR_ADDRESS / TF_CONFIG and the network between the hosts")
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


# JAX's cluster detection (`jax._src.clusters`) by the name of its class: what found it.
DETECTORS = {"SlurmCluster": "found by JAX: SLURM",
             "GceTpuCluster": "found by JAX: the Cloud TPU VM's metadata server",
             "GkeTpuCluster": "found by JAX: GKE's TPU_WORKER_HOSTNAMES and TPU_WORKER_ID",
             "OmpiCluster": "found by JAX: Open MPI", "K8sCluster": "found by JAX: Kubernetes"}


def detected_cluster() -> Tuple[Dict[str, Any], str]:
    """Where neither TF_CONFIG nor JAX_* describe the cluster: what JAX's own detection
    finds in the environment the platform sets (a Cloud TPU slice's metadata server, GKE's
    TPU variables, SLURM, Open MPI, Kubernetes), as `jax.distributed.initialize`'s
    arguments, and what found it; ({}, "") where it finds nothing, or where this JAX has
    no such detection API (then `initialize()` detects it itself, unnamed)."""
    try:
        from jax._src.clusters import ClusterEnv
        env = next((e for e in ClusterEnv._cluster_types
                    if not e.opt_in_only_method and e.is_env_present()), None)
        if env is None:
            return {}, ""
        timeout = int(float(os.environ.get("ELECTRA_TF_COORDINATOR_TIMEOUT",
                                           COORDINATOR_TIMEOUT_S)))
        address, count, index, local = ClusterEnv.auto_detect_unset_distributed_params(
            None, None, None, None, None, timeout)
    except (ImportError, AttributeError, TypeError) as e:
        logging.info("JAX's cluster detection is not the one this code knows (%s): "
                     "jax.distributed.initialize() looks for the cluster itself", e)
        return {}, ""
    found = dict(coordinator_address=address, num_processes=int(count), process_id=int(index))
    if local is not None:
        found["local_device_ids"] = list(local)
    return found, DETECTORS.get(env.__name__, f"found by JAX: {env.__name__}")


def jax_devices(name: str):
    """--strategy under JAX: auto (every device JAX sees: its TPU or GPU, else the CPU),
    cpu, gpu or tpu (those devices, or one line if there are none), multi_worker
    (`jax.distributed.initialize()` first, with the cluster of `jax_cluster`: TF_CONFIG as
    on TensorFlow, or JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID; Cloud
    TPU slices and SLURM describe it themselves). -> `JaxDevices`."""
    jax = require_jax()
    _keep_tensorflow_off_accelerators()
    try:  # before anything compiles (compile_cache.py)
        logging.info("JAX compilation cache: %s", compile_cache.configure(jax))
    except compile_cache.CacheSettingError as e:
        raise StrategyError(str(e)) from None
    compile_cache.CompileWatch.start(jax)
    if not quiet.shown():  # "Unable to initialize backend 'tpu'" on every non-TPU machine
        std_logging.getLogger("jax._src.xla_bridge").setLevel(std_logging.WARNING)
    cluster = jax_cluster(os.environ) if name in ("auto", "multi_worker") else {}
    if name == "auto" and cluster.get("num_processes", 1) > 1:
        name = "multi_worker"  # a cluster in TF_CONFIG, as on TensorFlow
    if name == "multi_worker":
        source = ("TF_CONFIG" if os.environ.get("TF_CONFIG") else
                  "JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID")
        if not cluster:
            cluster, source = detected_cluster()
        if cluster:
            logging.info("JAX cluster: process %d of %d, coordinator %s (%s)",
                         cluster["process_id"], cluster["num_processes"],
                         cluster["coordinator_address"], source)
            if cluster["process_id"] != 0:
                wait_for_coordinator(cluster["coordinator_address"])
        if guard.enabled():  # a lost process: one line, not JAX's crash dump (guard.py)
            guard.start(cluster.get("process_id"), cluster.get("num_processes"))
        timeout = os.environ.get("ELECTRA_TF_HEARTBEAT_TIMEOUT")
        if timeout:
            cluster["heartbeat_timeout_seconds"] = int(timeout)
        try:
            jax.distributed.initialize(**cluster)
        except (RuntimeError, ValueError) as e:
            raise StrategyError(f"--strategy=multi_worker: jax.distributed.initialize() "
                                f"failed: {str(e).splitlines()[0]}") from None
        name = "auto"
    devices = None
    if name in ("cpu", "gpu", "tpu"):
        try:
            devices = jax.devices(name)
        except RuntimeError:
            devices = []
        if not devices:
            raise StrategyError(f"--strategy={name}: JAX sees no {name.upper()} device "
                                f"(it has: {', '.join(sorted({d.platform for d in jax.devices()}))})")
    found = JaxDevices(devices)
    logging.info("JAX devices: %s", found.describe())
    return found


