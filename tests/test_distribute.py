"""electra_tf/training/tf_runtime/distribute.py: which TPU (if any) a run uses and how TensorFlow reaches it,
decided by the pure `resolve_tpu_target` for every setup without a TPU; the real
`make_strategy` and both CLIs refusing with one line on this CPU machine, without the
network; the chief and its directories."""

import json
import os
import socket
import time
import urllib.request

import pytest
import tensorflow as tf

import forked_cli
from electra_tf.training.jax_runtime.devices import jax_cluster
from electra_tf.training.tf_runtime import distribute
from electra_tf.training.tf_runtime.devices import TfDevices
from electra_tf.training.tf_runtime.distribute import (NO_TPU, TPU_GRPC, TPU_NODE, TPU_POD, TPU_VM,
                                   StrategyError, TpuHost, resolve_tpu_target)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CPU_BOX = TpuHost()                                   # no TPU, not on GCE, no API client
GCE_VM = TpuHost(on_gce=True)                         # a plain GCE VM (a TPU Node's user)
V4_8 = TpuHost(chips=4, accelerator_type="v4-8", worker_id=0, on_gce=True)
V5E_8 = TpuHost(chips=8, accelerator_type="v5litepod-8", worker_id=0, on_gce=True)
UNKNOWN_VM = TpuHost(chips=4, on_gce=True)            # a TPU VM whose metadata did not answer
V4_32_W0 = TpuHost(chips=4, accelerator_type="v4-32", worker_id=0, on_gce=True)
V4_32_W2 = TpuHost(chips=4, accelerator_type="v4-32", worker_id=2, on_gce=True)
V5E_16_W0 = TpuHost(chips=8, accelerator_type="v5litepod-16", worker_id=0, on_gce=True)
POD_ENV = {"TPU_LOAD_LIBRARY": "0"}


def resolve(strategy="auto", tpu=None, zone=None, project=None, env=None, host=CPU_BOX):
    return resolve_tpu_target(strategy, tpu, zone, project, env or {}, host)


def refused(*args, **kw) -> str:
    with pytest.raises(StrategyError) as e:
        resolve(*args, **kw)
    message = str(e.value)
    assert message and "\n" not in message, message
    return message


# ---------------------------------------------------------------- no TPU


@pytest.mark.parametrize("strategy", ["auto", "cpu", "gpu", "multi_worker"])
def test_no_tpu_leaves_the_other_strategies(strategy):
    target = resolve(strategy)
    assert target.kind == NO_TPU and not target.resolver_args


@pytest.mark.parametrize("strategy", ["cpu", "gpu", "multi_worker"])
def test_an_explicit_non_tpu_strategy_ignores_the_environment_and_the_chips(strategy):
    env = {"TPU_NAME": "my-tpu", "TF_CONFIG": "{}"}
    assert resolve(strategy, env=env, host=V4_8).kind == NO_TPU


# ---------------------------------------------------------------- a TPU VM, one host


@pytest.mark.parametrize("strategy", ["auto", "tpu"])
@pytest.mark.parametrize("host", [V4_8, V5E_8, UNKNOWN_VM,
                                  TpuHost(tf_tpu_devices=8)], ids=["v4-8", "v5e-8",
                                                                   "no-metadata", "tf-lists"])
def test_a_tpu_vm_is_detected_without_flags(strategy, host):
    target = resolve(strategy, host=host)
    assert (target.kind, dict(target.resolver_args)) == (TPU_VM, {"tpu": "local"})
    assert "auto-detected" in target.source


@pytest.mark.parametrize("strategy", ["auto", "tpu"])
def test_tpu_local(strategy):
    target = resolve(strategy, "local", host=V4_8)
    assert (target.kind, dict(target.resolver_args)) == (TPU_VM, {"tpu": "local"})
    assert target.source == "--tpu=local"


def test_tpu_name_local_from_the_environment():
    target = resolve(env={"TPU_NAME": "local"}, host=V5E_8)
    assert target.kind == TPU_VM and target.source == "TPU_NAME=local"


def test_tpu_local_without_a_tpu_is_refused():
    assert "--tpu=local: no TPU is attached to this machine" in refused("tpu", "local")
    assert "no TPU is attached" in refused("auto", "local", host=GCE_VM)


def test_tpu_local_refuses_zone_and_project():
    assert "--tpu_zone --gcp_project" in refused("tpu", "local", "us-central2-b", "p",
                                                  host=V4_8)


def test_tpu_local_refuses_tpu_load_library_0():
    assert "TPU_LOAD_LIBRARY=0" in refused("tpu", "local", env=POD_ENV, host=V4_8)


def test_a_tpu_name_on_a_single_host_vm():
    # A name on the command line is a mistake there ...
    assert "use --tpu=local" in refused("tpu", "my-v4-8", host=V4_8)
    # ... while a TPU_NAME left in the environment gives way to the attached chips.
    target = resolve(env={"TPU_NAME": "my-v4-8"}, host=V4_8)
    assert target.kind == TPU_VM and "TPU_NAME ignored" in target.source


# ---------------------------------------------------------------- a multi-host TPU VM slice


@pytest.mark.parametrize("host", [V4_32_W0, V5E_16_W0, UNKNOWN_VM], ids=["v4-32", "v5e-16",
                                                                         "no-metadata"])
def test_a_pod_slice_is_driven_from_worker_0_by_name(host):
    target = resolve("auto", "my-pod", env=POD_ENV, host=host)
    assert target.kind == TPU_POD
    assert dict(target.resolver_args) == {"tpu": "my-pod", "zone": None, "project": None}
    target = resolve("tpu", None, "us-central2-b", "proj",
                     env={"TPU_NAME": "my-pod", **POD_ENV}, host=host)
    assert target.kind == TPU_POD and target.source.startswith("TPU_NAME=my-pod")
    assert dict(target.resolver_args) == {"tpu": "my-pod", "zone": "us-central2-b",
                                          "project": "proj"}


def test_a_pod_slice_needs_tpu_load_library_0():
    message = refused("tpu", "my-pod", host=V4_32_W0)
    assert "TPU_LOAD_LIBRARY=0" in message and "--tpu=my-pod" in message
    assert "TPU_LOAD_LIBRARY=0" in refused("tpu", "my-pod", env={"TPU_LOAD_LIBRARY": "1"},
                                           host=V5E_16_W0)


@pytest.mark.parametrize("tpu", ["my-pod", None, "local"])
def test_a_pod_slice_runs_on_worker_0_only(tpu):
    # The same command on every host (gcloud ... --worker=all) stops on the others.
    message = refused("auto", tpu, env={"TPU_NAME": "my-pod", **POD_ENV} if tpu is None
                      else POD_ENV, host=V4_32_W2)
    assert "worker 2" in message and ("worker 0" in message or "--worker=0" in message)


def test_a_pod_slice_without_a_name_asks_for_it():
    message = refused("auto", env=POD_ENV, host=V4_32_W0)
    assert "worker 0 of a 4-host v4-32 slice" in message and "--tpu=NAME" in message
    assert "TPU_LOAD_LIBRARY=0" in message


def test_tpu_local_on_a_pod_slice_is_refused():
    message = refused("tpu", "local", host=V5E_16_W0)
    assert "2-host v5litepod-16 slice" in message and "--tpu=<the TPU's name>" in message


def test_a_pod_slice_by_name_needs_the_api_client():
    host = TpuHost(chips=4, accelerator_type="v4-32", worker_id=0, on_gce=True,
                   api_client=False)
    assert "pip install cloud-tpu-client" in refused("tpu", "my-pod", env=POD_ENV, host=host)


# ---------------------------------------------------------------- a TPU Node, an address


def test_a_tpu_node_by_name_with_zone_and_project():
    target = resolve("tpu", "my-node", "europe-west4-a", "proj")
    assert target.kind == TPU_NODE
    assert dict(target.resolver_args) == {"tpu": "my-node", "zone": "europe-west4-a",
                                          "project": "proj"}


def test_a_tpu_node_from_a_gce_vm_may_leave_zone_and_project_to_the_metadata_server():
    target = resolve("auto", "my-node", host=GCE_VM)
    assert target.kind == TPU_NODE
    assert dict(target.resolver_args) == {"tpu": "my-node", "zone": None, "project": None}


def test_a_tpu_node_outside_google_cloud_needs_zone_and_project():
    message = refused("tpu", "my-node", "europe-west4-a")
    assert "--tpu_zone and --gcp_project" in message


def test_a_tpu_node_by_name_needs_the_api_client():
    host = TpuHost(on_gce=True, api_client=False)
    assert "pip install cloud-tpu-client" in refused("tpu", "my-node", host=host)


def test_tpu_name_environment_variable():
    target = resolve("auto", env={"TPU_NAME": "my-node"}, host=GCE_VM)
    assert target.kind == TPU_NODE and target.resolver_args["tpu"] == "my-node"
    assert target.source == "TPU_NAME=my-node"
    # the flag wins over the variable
    assert resolve("auto", "other", env={"TPU_NAME": "my-node"},
                   host=GCE_VM).resolver_args["tpu"] == "other"


@pytest.mark.parametrize("strategy", ["auto", "tpu"])
def test_a_grpc_address(strategy):
    target = resolve(strategy, "grpc://10.240.1.2:8470")
    assert (target.kind, dict(target.resolver_args)) == (TPU_GRPC,
                                                         {"tpu": "grpc://10.240.1.2:8470"})
    target = resolve(strategy, env={"KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS": "grpc://10.0.0.3:8470"})
    assert target.kind == TPU_GRPC and target.source.startswith("KUBE_GOOGLE_CLOUD_TPU")


def test_a_grpc_address_refuses_zone_and_project():
    assert "is an address" in refused("tpu", "grpc://10.240.1.2:8470", "us-central1-b")


# ---------------------------------------------------------------- contradictions


@pytest.mark.parametrize("strategy, flags, needle", [
    ("gpu", {"tpu": "x"}, "--strategy=gpu contradicts --tpu=x"),
    ("cpu", {"tpu": "local"}, "--strategy=cpu contradicts --tpu=local"),
    ("multi_worker", {"zone": "us-central2-b"}, "contradicts --tpu_zone=us-central2-b"),
    ("gpu", {"project": "p", "tpu": "n"}, "contradicts --tpu=n --gcp_project=p"),
])
def test_contradictory_flags(strategy, flags, needle):
    assert needle in refused(strategy, **flags)


def test_zone_or_project_without_a_tpu_name():
    assert "give --tpu=NAME" in refused("auto", zone="us-central2-b")
    assert "give --tpu=NAME" in refused("tpu", project="p", host=V4_8)


def test_strategy_tpu_without_any_tpu():
    message = refused("tpu")
    assert message.startswith("--strategy=tpu: no TPU here") and "TPU_NAME" in message


@pytest.mark.parametrize("accelerator_type, hosts", [
    ("v2-8", 1), ("v3-32", 4), ("v4-8", 1), ("v4-16", 2), ("v4-32", 4), ("v5p-8", 1),
    ("v5p-128", 16), ("v5litepod-1", 1), ("v5litepod-4", 1), ("v5litepod-8", 1),
    ("v5litepod-16", 2), ("v5litepod-256", 32), ("v6e-8", 1), ("v6e-64", 8),
    ("", None), (None, None), ("TPU v4", None)])
def test_slice_hosts(accelerator_type, hosts):
    assert distribute.slice_hosts(accelerator_type) == hosts


# ---------------------------------------------------------------- the machine


def test_the_metadata_server_is_asked_on_a_tpu_vm_only(monkeypatch):
    from electra_tf.training import gce
    asked = []
    answers = {"accelerator-type": "v4-32", "agent-worker-number": "3"}
    monkeypatch.setattr(gce, "attribute", lambda name: asked.append(name) or answers[name])
    monkeypatch.setattr(gce, "on_gce", lambda: True)
    monkeypatch.setattr(distribute, "tpu_chips", lambda: 0)
    host = distribute.probe_tpu_host({})
    assert not asked and not host.tpu_vm and host.on_gce
    monkeypatch.setattr(distribute, "tpu_chips", lambda: 4)
    host = distribute.probe_tpu_host({})
    assert (host.accelerator_type, host.worker_id, host.hosts) == ("v4-32", 3, 4)
    asked.clear()  # GKE sets them in the environment
    host = distribute.probe_tpu_host({"TPU_ACCELERATOR_TYPE": "v5litepod-16",
                                      "TPU_WORKER_ID": "1"})
    assert not asked and (host.accelerator_type, host.worker_id) == ("v5litepod-16", 1)
    monkeypatch.setattr(gce, "on_gce", lambda: False)
    host = distribute.probe_tpu_host({})
    assert not asked and host.accelerator_type is None


@pytest.fixture
def no_network(monkeypatch):
    """No TPU named in the environment, and any Python-level connection fails the test."""
    for var in ("TPU_NAME", "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS", "TPU_LOAD_LIBRARY",
                "TPU_ACCELERATOR_TYPE", "TPU_WORKER_ID", "TF_CONFIG"):
        monkeypatch.delenv(var, raising=False)

    def refuse(*args, **kw):
        raise AssertionError(f"network access: {args[:1]}")
    monkeypatch.setattr(urllib.request, "urlopen", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    if distribute.tpu_chips():
        pytest.skip("this machine has TPU chips")


@pytest.mark.parametrize("args, needle", [
    (("tpu", "local"), "--tpu=local: no TPU is attached to this machine"),
    (("tpu",), "--strategy=tpu: no TPU here"),
    (("gpu", "my-tpu"), "--strategy=gpu contradicts --tpu=my-tpu"),
    (("tpu", "local", "us-central2-b"), "only locate a TPU by name"),
    (("auto", None, None, "proj"), "give --tpu=NAME too"),
])
def test_make_strategy_refuses_with_one_line_and_no_network(no_network, args, needle):
    start = time.monotonic()
    with pytest.raises(StrategyError) as e:
        distribute.make_strategy(*args)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert time.monotonic() - start < 10


def test_make_strategy_auto_on_this_machine(no_network):
    strategy = distribute.make_strategy("auto")
    assert not isinstance(strategy, tf.distribute.TPUStrategy)
    assert distribute.is_cpu_only(strategy) or tf.config.list_physical_devices("GPU")


@pytest.mark.parametrize("script, flags, needle", [
    ("run_pretraining.py", ["--strategy=tpu", "--tpu=local"],
     "run_pretraining: error: --tpu=local: no TPU is attached"),
    # As a TPU user types it (under the TPU build in CI's second leg): auto strategy.
    ("run_pretraining.py", ["--tpu=local"],
     "run_pretraining: error: --tpu=local: no TPU is attached"),
    ("run_finetuning.py", ["--strategy=cpu", "--tpu_zone=us-central2-b", "--gcp_project=p",
                           "--init_checkpoint=none", "--config=tiny"],
     "run_finetuning: error: --strategy=cpu contradicts --tpu_zone=us-central2-b "
     "--gcp_project=p"),
])
@pytest.mark.every_leg
@pytest.mark.subprocess
def test_the_clis_pass_the_tpu_flags_on(tmp_path, script, flags, needle):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_", "KUBE_"))}
    done = forked_cli.run([script, f"--model_dir={tmp_path / 'm'}", *flags], env=env)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(needle), done.stderr[-2000:]


# ---------------------------------------------------------------- the chief


class _FakeMultiWorker(tf.distribute.MultiWorkerMirroredStrategy):
    """A multi-worker strategy's identity without its collectives."""

    def __init__(self, cluster, task_type, task_id):  # noqa: no super().__init__
        self._resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(cluster), task_type=task_type, task_id=task_id)

    @property
    def cluster_resolver(self):
        return self._resolver


class _FakeTPU(tf.distribute.TPUStrategy):
    """A TPUStrategy on a 4-host slice, as the one program on worker 0 sees it."""

    def __init__(self):  # noqa: no super().__init__
        self._resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec({"worker": [f"10.0.0.{i}:8470" for i in range(4)]}),
            task_type="worker", task_id=0)

    @property
    def cluster_resolver(self):
        return self._resolver


WORKERS = {"worker": ["localhost:1", "localhost:2"]}


@pytest.mark.parametrize("strategy, chief, directory", [
    (tf.distribute.OneDeviceStrategy("/cpu:0"), True, "gs://b/run"),
    (_FakeTPU(), True, "gs://b/run"),
    (_FakeMultiWorker(WORKERS, "worker", 0), True, "gs://b/run"),
    (_FakeMultiWorker(WORKERS, "worker", 1), False, "gs://b/run/.workers/worker_1"),
    (_FakeMultiWorker({"chief": ["localhost:0"], **WORKERS}, "chief", 0), True, "gs://b/run"),
    (_FakeMultiWorker({"chief": ["localhost:0"], **WORKERS}, "worker", 0), False,
     "gs://b/run/.workers/worker_0"),
], ids=["one-device", "tpu-pod-slice", "worker0", "worker1", "chief", "worker0-with-chief"])
def test_is_chief_and_worker_dir(strategy, chief, directory):
    assert distribute.is_chief(strategy) is chief
    assert TfDevices(strategy).is_chief() is chief
    assert TfDevices(strategy).worker_dir("gs://b/run") == directory


def test_resolve_precision():
    assert TfDevices(tf.distribute.OneDeviceStrategy("/cpu:0")).resolve_precision("auto") \
        == "float32"
    assert TfDevices(_FakeTPU()).resolve_precision("auto") == "bfloat16"
    assert TfDevices(_FakeTPU()).resolve_precision("float16") == "float16"


def test_jax_cluster_from_tf_config_or_jax_variables():
    """--strategy=multi_worker on JAX reads the cluster a TensorFlow run reads (TF_CONFIG:
    the chief, then the workers; the coordinator at the first task's address), or JAX's
    three variables; neither: {} (JAX detects TPU slices, SLURM and the like itself)."""
    cluster = {"chief": ["h0:2222"], "worker": ["h1:2222", "h2:2222"]}
    for (kind, index), process_id in ((("chief", 0), 0), (("worker", 0), 1),
                                      (("worker", 1), 2)):
        env = {"TF_CONFIG": json.dumps({"cluster": cluster,
                                        "task": {"type": kind, "index": index}})}
        assert jax_cluster(env) == dict(
            coordinator_address="h0:2222", num_processes=3, process_id=process_id)
    workers = {"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "b:2"]},
                                        "task": {"type": "worker", "index": 1}})}
    assert jax_cluster(workers) == dict(coordinator_address="a:1",
                                                   num_processes=2, process_id=1)
    assert jax_cluster({"JAX_COORDINATOR_ADDRESS": "c:9", "JAX_NUM_PROCESSES": "4",
                                   "JAX_PROCESS_ID": "3"}) == dict(
        coordinator_address="c:9", num_processes=4, process_id=3)
    assert jax_cluster({}) == {}
    assert jax_cluster({"JAX_COORDINATOR_ADDRESS": "c:9"}) == {}
    with pytest.raises(distribute.StrategyError, match="TF_CONFIG: not a cluster"):
        jax_cluster({"TF_CONFIG": json.dumps(
            {"cluster": {"worker": ["a:1"]}, "task": {"type": "ps", "index": 0}})})
    with pytest.raises(distribute.StrategyError, match="TF_CONFIG: not a cluster"):
        jax_cluster({"TF_CONFIG": "{not json"})
    with pytest.raises(distribute.StrategyError, match="together"):
        jax_cluster({"JAX_NUM_PROCESSES": "2"})
    with pytest.raises(distribute.StrategyError, match="expected integers"):
        jax_cluster({"JAX_COORDINATOR_ADDRESS": "c:9", "JAX_NUM_PROCESSES": "two",
                                "JAX_PROCESS_ID": "0"})


def test_a_worker_waits_for_the_jax_coordinator_then_says_it_is_unreachable():
    """jax.distributed aborts the process with a C++ stack dump when the coordinator cannot
    be reached; a worker checks first: it goes on once process 0 listens, and otherwise
    stops with one line naming the address after the timeout."""
    import socket
    import time
    from electra_tf.training.jax_runtime.devices import wait_for_coordinator
    from electra_tf.training.runtime import StrategyError
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(1)
        port = listening.getsockname()[1]
        wait_for_coordinator(f"127.0.0.1:{port}", timeout=5)  # returns at once
    start = time.monotonic()
    with pytest.raises(StrategyError) as caught:
        wait_for_coordinator(f"127.0.0.1:{port}", timeout=1.5)  # closed now
    assert 1.5 <= time.monotonic() - start < 10
    assert str(caught.value).startswith(
        f"--strategy=multi_worker: the JAX coordinator (process 0) at 127.0.0.1:{port} did "
        "not answer within 1.5 s (")
    assert "\n" not in str(caught.value)
    with pytest.raises(StrategyError, match="expected HOST:PORT"):
        wait_for_coordinator("127.0.0.1", timeout=1)


# What each platform sets for the processes of a job (documented in docs/pretraining.md,
# "Several hosts on JAX"): the same command on every host finds its cluster from it.
SLURM_ENV = {"SLURM_JOB_ID": "4242", "SLURM_STEP_NODELIST": "gpu[017-018]",
             "SLURM_NTASKS": "4", "SLURM_PROCID": "3", "SLURM_LOCALID": "1",
             "SLURM_STEP_NUM_NODES": "2"}
GKE_TPU_ENV = {"TPU_WORKER_HOSTNAMES": "10.8.0.5,10.8.0.6,10.8.0.7,10.8.0.8",
               "TPU_WORKER_ID": "2", "TPU_SKIP_MDS_QUERY": "1", "MEGASCALE_NUM_SLICES": "1",
               "MEGASCALE_SLICE_ID": "0", "MEGASCALE_COORDINATOR_ADDRESS": "10.8.0.5"}
PLATFORM_VARIABLES = ("TF_CONFIG", "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES",
                      "JAX_PROCESS_ID", "JAX_COORDINATOR_PORT", *SLURM_ENV, *GKE_TPU_ENV,
                      "OMPI_MCA_orte_hnp_uri", "PMIX_SERVER_URI2", "KUBERNETES_SERVICE_HOST")


@pytest.mark.jax
def test_the_cluster_each_platform_describes_is_found(monkeypatch):
    """--strategy=multi_worker with neither TF_CONFIG nor JAX_* set: the cluster JAX's own
    detection finds in what SLURM, GKE's TPU node pools and a Cloud TPU VM's metadata
    server (a fake one here) give each process, named in the log line. Nothing found:
    ({}, "")."""
    pytest.importorskip("jax")
    from jax._src.clusters import cloud_tpu_cluster, cluster
    from electra_tf.training.jax_runtime.devices import detected_cluster
    for name in PLATFORM_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert detected_cluster() == ({}, "")

    for name, value in SLURM_ENV.items():
        monkeypatch.setenv(name, value)
    port = 4242 % 2 ** 12 + 65535 - 2 ** 12 + 1  # SLURM's: a port of the job's id
    assert detected_cluster() == (dict(coordinator_address=f"gpu017:{port}", num_processes=4,
                                       process_id=3, local_device_ids=[1]),
                                  "found by JAX: SLURM")
    for name in SLURM_ENV:
        monkeypatch.delenv(name)

    # A TPU VM (JAX checks for the chips' driver at import: said yes to here).
    monkeypatch.setattr(cloud_tpu_cluster, "running_in_cloud_tpu_vm", True)
    monkeypatch.setattr(cluster, "running_in_cloud_tpu_vm", True)
    for name, value in GKE_TPU_ENV.items():
        monkeypatch.setenv(name, value)
    assert detected_cluster() == (dict(coordinator_address="10.8.0.5:8482", num_processes=4,
                                       process_id=2),
                                  "found by JAX: GKE's TPU_WORKER_HOSTNAMES and TPU_WORKER_ID")
    for name in GKE_TPU_ENV:
        monkeypatch.delenv(name)

    # A Cloud TPU VM of a slice (gcloud ... tpu-vm create): its metadata server.
    from test_preemption import FakeMetadata, metadata_server
    with metadata_server(monkeypatch):
        monkeypatch.setenv("GCE_METADATA_IP", os.environ["GCE_METADATA_IP"])
        FakeMetadata.values = {
            "attributes/agent-worker-number": "1",
            "attributes/worker-network-endpoints":
                "unknown:unknown:10.130.0.2,unknown:unknown:10.130.0.3",
            "attributes/tpu-env": "ACCELERATOR_TYPE: 'v5litepod-16'\nMEGASCALE_NUM_SLICES: '1'\n"
                                  "MEGASCALE_SLICE_ID: '0'\n"}
        assert detected_cluster() == (dict(coordinator_address="10.130.0.2:8482",
                                           num_processes=2, process_id=1),
                                      "found by JAX: the Cloud TPU VM's metadata server")
