"""The tf.distribute strategy (`--strategy`; `auto` takes what the machine has) and the
numeric precision of a run. Which TPU, and how it is reached, is `resolve_tpu_target`, a pure
function of the flags, the environment and `probe_tpu_host`; a multi-host TPU VM slice is
driven by ONE program on worker 0 (the chief). Every refusal is a one-line `StrategyError`.
"""

import dataclasses
import json
import math
import os
import re
from typing import Mapping, Optional

import tensorflow as tf
from absl import logging

from electra_tf import quiet
from electra_tf.compat import module_exists, tpu_chips  # TensorFlow-free probes of this host
from electra_tf.training import gce
from electra_tf.training.runtime import StrategyError  # noqa: F401 (re-exported)
from electra_tf.training.options import STRATEGIES  # the --strategy values

# resolve_tpu_target's kinds
NO_TPU = "none"          # no TPU: MultiWorkerMirrored, Mirrored or OneDevice as before
TPU_VM = "tpu_vm"        # this host's chips: TPUClusterResolver(tpu="local")
TPU_POD = "tpu_vm_pod"   # a multi-host TPU VM slice, driven from worker 0 by its name
TPU_NODE = "tpu_node"    # a TPU reached by name through the Cloud TPU API (a TPU Node)
TPU_GRPC = "tpu_grpc"    # a TPU worker address, grpc://HOST:PORT

# Accelerator types count 8 units per host for every generation: TensorCores on v2-v4 and
# v5p (4 chips of 2), chips on v5e and v6e (8 of 1); a smaller slice is one host.
_ACCELERATOR_TYPE = re.compile(r"^v(\d+)([a-z]*)-(\d+)$")
_UNITS_PER_HOST = 8


@dataclasses.dataclass(frozen=True)
class TpuHost:
    """What this machine says about TPUs (`probe_tpu_host`)."""
    chips: int = 0                       # TPU chips attached to this host
    tf_tpu_devices: int = 0              # TPU devices TensorFlow already lists
    accelerator_type: Optional[str] = None  # the slice this TPU VM belongs to, e.g. v4-32
    worker_id: Optional[int] = None      # this TPU VM's index in its slice
    on_gce: bool = False                 # a GCE VM (the metadata server answers here)
    api_client: bool = True              # the Cloud TPU API client TensorFlow needs by name

    @property
    def tpu_vm(self) -> bool:
        return self.chips > 0 or self.tf_tpu_devices > 0

    @property
    def hosts(self) -> Optional[int]:
        """Hosts of the slice, or None when its accelerator type is unknown."""
        return slice_hosts(self.accelerator_type)


@dataclasses.dataclass(frozen=True)
class TpuTarget:
    """resolve_tpu_target's answer: `kind` and the TPUClusterResolver keyword arguments."""
    kind: str
    resolver_args: Mapping[str, Optional[str]] = dataclasses.field(default_factory=dict)
    source: str = ""  # what chose it, for the log and the messages

    def describe(self) -> str:
        where = {TPU_VM: "this TPU VM's chips", TPU_POD: "TPU VM slice",
                 TPU_NODE: "Cloud TPU", TPU_GRPC: "TPU worker"}.get(self.kind, "no TPU")
        name = self.resolver_args.get("tpu")
        return f"{where}{'' if name in (None, 'local') else ' ' + name} ({self.source})"


def slice_hosts(accelerator_type: Optional[str]) -> Optional[int]:
    """Hosts of a TPU slice from its accelerator type ('v4-8' -> 1, 'v4-32' -> 4,
    'v5litepod-16' -> 2, 'v5litepod-4' -> 1), or None if it is not one."""
    match = _ACCELERATOR_TYPE.match((accelerator_type or "").strip().lower())
    if not match:
        return None
    return max(1, math.ceil(int(match.group(3)) / _UNITS_PER_HOST))


def _tpu_from_env(env: Mapping[str, str]):
    """The TPU the environment names, as TensorFlow's Cloud TPU client reads it:
    (value, variable) or (None, None)."""
    for var in ("KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS", "TPU_NAME"):
        if env.get(var, "").strip():
            return env[var].strip(), var
    return None, None


def resolve_tpu_target(strategy: str, tpu: Optional[str], tpu_zone: Optional[str],
                       gcp_project: Optional[str], env: Mapping[str, str],
                       host: TpuHost) -> TpuTarget:
    """Whether and how the run uses a TPU, from the flags (None or '' when not given), the
    environment (TPU_NAME, KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS, TPU_LOAD_LIBRARY) and `host`;
    StrategyError for contradictions and for a TPU that cannot be used from here."""
    tpu, tpu_zone, gcp_project = (v.strip() if v else None for v in (tpu, tpu_zone, gcp_project))
    location = " ".join(f"--{k}" for k, v in (("tpu_zone", tpu_zone),
                                             ("gcp_project", gcp_project)) if v)
    if strategy not in ("auto", "tpu"):
        given = " ".join(f"--{k}={v}" for k, v in (("tpu", tpu), ("tpu_zone", tpu_zone),
                                                 ("gcp_project", gcp_project)) if v)
        if given:
            raise StrategyError(f"--strategy={strategy} contradicts {given}: those flags "
                                "choose a TPU (use --strategy=tpu or auto, or drop them)")
        return TpuTarget(NO_TPU, source=f"--strategy={strategy}")
    source = "--tpu"
    if not tpu:
        tpu, source = _tpu_from_env(env)
    load_library = env.get("TPU_LOAD_LIBRARY", "").strip()

    if tpu and tpu.lower() == "local":
        if location:
            raise StrategyError(f"--tpu=local uses the TPU attached to this machine; {location} "
                                "only locate a TPU by name (drop them)")
        if not host.tpu_vm:
            raise StrategyError(
                f"{_flag(source, 'local')}: no TPU is attached to this machine (no /dev/accel* "
                "or TPU /dev/vfio devices): run on a Cloud TPU VM, or give a TPU Node's name "
                "with --tpu=NAME")
        return _local(host, load_library, _flag(source, "local"))
    if tpu and tpu.startswith("grpc://"):
        if location:
            raise StrategyError(f"--tpu={tpu} is an address; {location} only locate a TPU by "
                                "name (drop them)")
        return TpuTarget(TPU_GRPC, {"tpu": tpu}, _flag(source, tpu))
    if tpu:  # a TPU's name
        named = _flag(source, tpu)
        if host.tpu_vm:
            if host.hosts == 1 and source != "--tpu":  # e.g. a TPU_NAME left in the shell
                return _local(host, load_library, f"this TPU VM ({host.accelerator_type}); "
                                                  f"{source} ignored")
            if host.hosts == 1:
                raise StrategyError(
                    f"--tpu={tpu}: this TPU VM ({host.accelerator_type}) is a single host: "
                    "use --tpu=local (or no --tpu); a name is for a multi-host slice (from its "
                    "worker 0) or a TPU Node")
            _check_worker_0(host, named)
            if load_library != "0":
                raise StrategyError(
                    f"{named}: driving a multi-host slice from worker 0 needs "
                    "TPU_LOAD_LIBRARY=0 (export it before starting) so that this program "
                    "leaves the chips to the TPU runtime; for this host's chips alone use "
                    "--tpu=local")
            _check_api(host, named)
            return TpuTarget(TPU_POD, {"tpu": tpu, "zone": tpu_zone, "project": gcp_project},
                             f"{named} from worker 0 of "
                             f"{host.accelerator_type or 'a multi-host slice'}")
        _check_api(host, named)
        if not host.on_gce and not (tpu_zone and gcp_project):
            raise StrategyError(
                f"{named}: outside Google Cloud give --tpu_zone and --gcp_project "
                "(TensorFlow otherwise asks the GCE metadata server), or --tpu=grpc://HOST:8470")
        return TpuTarget(TPU_NODE, {"tpu": tpu, "zone": tpu_zone, "project": gcp_project},
                         named)

    # No TPU named: what is attached to this machine.
    if host.tpu_vm:
        if host.hosts is not None and host.hosts > 1:
            _check_worker_0(host, "auto-detected TPU VM slice")
            raise StrategyError(
                f"this TPU VM is worker 0 of a {host.hosts}-host {host.accelerator_type} slice: "
                "give the TPU's name (--tpu=NAME or TPU_NAME) so that one program drives every "
                "host, with TPU_LOAD_LIBRARY=0 (README: Cloud TPU quickstart)")
        if location:
            raise StrategyError(f"{location} locate a TPU by name: give --tpu=NAME too, or drop "
                                "them to use this TPU VM's own chips")
        return _local(host, load_library, "auto-detected TPU VM")
    if location:
        raise StrategyError(f"{location} locate a TPU by name: give --tpu=NAME too")
    if strategy == "tpu":
        raise StrategyError(
            "--strategy=tpu: no TPU here: none is attached to this machine (no /dev/accel* "
            "or TPU /dev/vfio devices) and neither --tpu nor TPU_NAME names one")
    return TpuTarget(NO_TPU, source="no TPU attached or named")


def _flag(source: str, value: str) -> str:
    return f"--tpu={value}" if source == "--tpu" else f"{source}={value}"


def _local(host: TpuHost, load_library: str, source: str) -> TpuTarget:
    if host.hosts is not None and host.hosts > 1:
        worker = "?" if host.worker_id is None else host.worker_id
        raise StrategyError(
            f"{source}: this TPU VM is worker {worker} of a {host.hosts}-host "
            f"{host.accelerator_type} slice and 'local' drives one host: "
            "on worker 0 run with --tpu=<the TPU's name> and TPU_LOAD_LIBRARY=0 "
            "(README: Cloud TPU quickstart)")
    if load_library == "0":
        raise StrategyError(f"{source}: TPU_LOAD_LIBRARY=0 keeps TensorFlow from loading the TPU "
                            "library this host's chips need (unset it)")
    return TpuTarget(TPU_VM, {"tpu": "local"}, source)


def _check_worker_0(host: TpuHost, what: str):
    if host.worker_id not in (None, 0):
        raise StrategyError(
            f"{what}: this is worker {host.worker_id} of a multi-host TPU slice; with "
            "TensorFlow one program on worker 0 drives every host: run it there only "
            "(gcloud compute tpus tpu-vm ssh NAME --worker=0)")


def _check_api(host: TpuHost, what: str):
    if not host.api_client:
        raise StrategyError(f"{what}: finding a TPU by name needs the Cloud TPU API client: "
                            "pip install cloud-tpu-client")


# ---------------------------------------------------------------------- the machine


def probe_tpu_host(env: Optional[Mapping[str, str]] = None) -> TpuHost:
    """What this machine has: TPU chips from /dev (no network); on a TPU VM, the slice's
    type and this host's worker number from TPU_ACCELERATOR_TYPE / TPU_WORKER_ID (GKE) or
    the GCE metadata server."""
    env = os.environ if env is None else env
    chips = tpu_chips()
    tf_devices = 0 if chips else len(tf.config.list_logical_devices("TPU"))
    on_gce = gce.on_gce()
    accelerator_type = env.get("TPU_ACCELERATOR_TYPE") or None
    worker = env.get("TPU_WORKER_ID") or None
    if (chips or tf_devices) and on_gce:
        accelerator_type = accelerator_type or gce.attribute("accelerator-type")
        if worker is None:
            worker = gce.attribute("agent-worker-number")
    api = module_exists("cloud_tpu_client") or (
        module_exists("googleapiclient") and module_exists("oauth2client"))
    return TpuHost(chips=chips, tf_tpu_devices=tf_devices, accelerator_type=accelerator_type,
                   worker_id=int(worker) if worker and worker.isdigit() else None,
                   on_gce=on_gce, api_client=api)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


def _tpu_strategy(target: TpuTarget) -> tf.distribute.TPUStrategy:
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(**target.resolver_args)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, RuntimeError, OSError, ImportError, tf.errors.OpError) as e:
        raise StrategyError(f"cannot start the TPU: {target.describe()}: "
                            f"{_first_line(e)}") from None
    return tf.distribute.TPUStrategy(resolver)


def make_strategy(name: str = "auto", tpu: Optional[str] = None, tpu_zone: Optional[str] = None,
                  gcp_project: Optional[str] = None) -> tf.distribute.Strategy:
    """Builds the strategy; call once, before creating any variable."""
    if name not in STRATEGIES:
        raise StrategyError(f"--strategy={name}: expected one of {', '.join(STRATEGIES)}")
    with quiet.quiet_native_stderr():  # TensorFlow's first look for devices (quiet.py)
        tf.config.list_physical_devices()
    host = probe_tpu_host() if name in ("auto", "tpu") else TpuHost()
    target = resolve_tpu_target(name, tpu, tpu_zone, gcp_project, os.environ, host)
    if target.kind != NO_TPU:
        logging.info("TPU: %s", target.describe())
        name = "tpu"
    elif name == "auto":
        if os.environ.get("TF_CONFIG") and len(
                json.loads(os.environ["TF_CONFIG"]).get("cluster", {}).get("worker", [])) > 1:
            name = "multi_worker"
        elif tf.config.list_physical_devices("GPU"):
            name = "gpu"
        else:
            name = "cpu"
    if name == "tpu":
        strategy = _tpu_strategy(target)
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
    without one; always true outside multi-worker training (on TPU one program drives every
    host)."""
    task_type, task_id = task(strategy)
    return task_type in (None, "chief") or (
        task_type == "worker" and task_id == 0
        and not strategy.cluster_resolver.cluster_spec().as_dict().get("chief"))


def is_cpu_only(strategy: tf.distribute.Strategy) -> bool:
    """Whether every replica of `strategy` runs on a CPU device."""
    try:
        devices = strategy.extended.worker_devices
    except RuntimeError:  # the default strategy: wherever TensorFlow places ops
        return not tf.config.list_logical_devices("GPU") + tf.config.list_logical_devices("TPU")
    return all("CPU" in d.upper() for d in devices)
