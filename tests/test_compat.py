"""electra_tf/compat.py: the supported versions, the TPU build's runtime, the install check."""

import importlib.metadata
import os
import subprocess
import sys

import pytest

from electra_tf import compat

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _found(tensorflow=(("tensorflow", "2.21.0"),), text="2.21.1", keras="3.15.1",
           stand_in=None, libtpu=None, jax=None):
    return {"tensorflow": list(tensorflow), "stand_in": stand_in, "tensorflow_text": text,
            "keras": keras, "libtpu": libtpu, "jax": jax}


def test_supported_installs_pass():
    assert compat.check_versions(_found()) is None
    assert compat.check_versions(_found(jax="0.10.2")) is None  # the jax extra beside TF
    # A machine with JAX and no TensorFlow (a GPU box, a JAX TPU VM): the model's backend.
    assert compat.check_versions(_found((), None, jax="0.11.2")) is None
    assert compat.check_versions(_found((("tensorflow-tpu", "2.20.0"),), "2.20.1",
                                        stand_in="2.20.0+tpu.stand.in")) is None
    assert compat.check_versions(_found((("tensorflow-cpu", "2.20.0"),), "2.20.1")) is None


@pytest.mark.parametrize("found, needles", [
    (_found((("tensorflow", "2.19.1"),), "2.19.0"),
     ["TensorFlow 2.19.1 (tensorflow) is installed", "supports TensorFlow 2.20 and 2.21"]),
    (_found((("tensorflow", "2.22.0"),), "2.22.0"),
     ["TensorFlow 2.22.0 (tensorflow) is installed", "2.20 and 2.21"]),
    (_found((("tensorflow-tpu", "2.18.0"),), "2.18.1"),
     ["TensorFlow 2.18.0 (tensorflow-tpu)", "install/tpu.txt"]),
    (_found(()), ["TensorFlow is not installed", "2.20 and 2.21"]),
    (_found((("tensorflow-tpu", "2.20.0"), ("tensorflow", "2.21.0"))),
     ["tensorflow-tpu 2.20.0, tensorflow 2.21.0 are installed", "one `tensorflow` package"]),
    (_found((("tensorflow", "2.21.0"),), "2.20.1"),
     ["tensorflow-text 2.20.1 does not match TensorFlow 2.21.0", "tensorflow-text==2.21.*"]),
    (_found(text=None), ["tensorflow-text is not installed", "tensorflow-text==2.21.*"]),
    (_found(keras="2.15.0"), ["Keras 2.15.0 is installed", "needs Keras 3"]),
    (_found(keras=None), ["Keras is not installed", "needs Keras 3"]),
    (_found((), None, jax="0.11.2", keras=None), ["Keras is not installed", "needs Keras 3"]),
    (_found((), None, jax="0.4.30"), ["JAX 0.4.30 is installed", "JAX >= 0.6", ".[jax]"]),
    (_found(jax="0.5.3"), ["JAX 0.5.3 is installed", "JAX >= 0.6"]),
])
def test_unsupported_installs_get_one_line(found, needles):
    message = compat.check_versions(found)
    assert message.startswith("electra-tf: ") and "\n" not in message
    for needle in needles:
        assert needle in message


def test_this_environment_is_read_from_metadata():
    import tensorflow as tf
    found = compat.installed_versions()
    (name, version), = found["tensorflow"]
    assert version == tf.__version__
    assert compat.check_versions(found) is None
    # The distribution named is the one whose files are the importable package; a stand-in
    # (install/tensorflow-tpu-stand-in) owns none.
    assert compat.tensorflow_package_owners() == [name]
    if found["stand_in"]:
        assert name == "tensorflow-tpu" and found["stand_in"] == "2.20.0+tpu.stand.in"
        stand_in = importlib.metadata.distribution("tensorflow")
        assert not [f for f in stand_in.files if not str(f).startswith("tensorflow-")]


def test_tpu_chips_from_dev(monkeypatch):
    monkeypatch.setattr(compat.glob, "glob",
                        lambda p: ["/dev/accel0", "/dev/accel1", "/dev/accel"])  # dir: DRM
    assert compat.tpu_chips() == 2
    monkeypatch.setattr(compat.glob, "glob", lambda p: [])
    monkeypatch.setattr(compat.os, "listdir", lambda p: ["0", "1", "vfio"])
    monkeypatch.setattr(compat, "_libtpu_installed", lambda: False)
    assert compat.tpu_chips() == 0  # VFIO alone: GPU passthrough as well
    monkeypatch.setattr(compat, "_libtpu_installed", lambda: True)
    assert compat.tpu_chips() == 2


@pytest.mark.parametrize("libtpu, chips, environ, set_it", [
    (True, 0, {}, True),                            # TPU build on a CPU machine
    (True, 0, {"TPU_LOAD_LIBRARY": "1"}, False),     # the user's choice is kept
    (True, 4, {}, False),                           # a TPU VM loads its runtime
    (False, 0, {}, False),                          # the stock wheel has none to load
])
def test_configure_tpu_library(monkeypatch, libtpu, chips, environ, set_it):
    monkeypatch.setattr(compat, "_libtpu_installed", lambda: libtpu)
    monkeypatch.setattr(compat, "tpu_chips", lambda: chips)
    before = dict(environ)
    assert compat.configure_tpu_library(environ) is set_it
    assert environ == ({**before, "TPU_LOAD_LIBRARY": "0"} if set_it else before)


def test_tpu_runtime_functions_are_read_from_the_headers(tmp_path):
    tpu = tmp_path / "include" / "xla" / "stream_executor" / "tpu"
    tpu.mkdir(parents=True)
    (tpu / "tpu_library_init_fns.inc").write_text(
        "  TFTPU_SET_FN(ops_api_fn, ConfigureDistributedTpuOp_DoWork);\n"
        "  TFTPU_SET_FN(ops_api_fn,\n               TpuConfigurationApi_TpusPerHost);\n")
    (tpu / "tpu_executor_init_fns.inc").write_text("TFTPU_SET_FN(executor_fn, TpuPlatform_New);")
    assert compat.tpu_runtime_functions(str(tmp_path)) == [
        "ConfigureDistributedTpuOp_DoWork", "TpuConfigurationApi_TpusPerHost", "TpuPlatform_New"]
    assert compat.tpu_runtime_functions(str(tmp_path / "none")) == []


def test_missing_tpu_functions_reads_a_real_library():
    import ctypes.util
    libc = ctypes.util.find_library("c")
    assert compat.missing_tpu_functions(libc, ["malloc", "free", "TpuPlatform_New"]) == [
        "TpuPlatform_New"]


def test_xla_cpu_matches_the_build():
    # The stock wheel compiles for the CPU; the TPU build has no XLA:CPU backend.
    found = compat.installed_versions()
    assert compat.xla_cpu_available() is (found["tensorflow"][0][0] != "tensorflow-tpu")


# ------------------------------------------------------------------ every CLI, one line

CLIS = [
    ["run_pretraining.py"],
    ["run_finetuning.py"],
    ["-m", "tfrecord_builder"],
    ["-m", "electra_tf.conversion.convert", "inspect", "x"],
    ["-m", "electra_tf.conversion.saved_model_cli", "run", "--dir", "x"],
    ["-m", "electra_tf.pretraining.score", "--model_dir=x", "--input=x"],
    ["-m", "electra_tf.check_install"],
    ["bench/bench_train_step.py"],
    ["experiments/compute_matched.py"],
]


@pytest.fixture(scope="module")
def fake_old_tensorflow(tmp_path_factory):
    """A directory that, first on PYTHONPATH, makes the installed TensorFlow distribution
    read as 2.19.0 in package metadata (what `pip install tensorflow==2.19.0` leaves)."""
    (name, _), = compat.installed_versions()["tensorflow"]
    root = tmp_path_factory.mktemp("old_tf")
    info = root / f"{name.replace('-', '_')}-2.19.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 2.19.0\n")
    return str(root), name


@pytest.mark.every_leg
@pytest.mark.parametrize("cli", CLIS, ids=lambda c: c[-1] if c[0] != "-m" else c[1])
@pytest.mark.subprocess
def test_every_cli_stops_with_one_line_on_unsupported_tensorflow(cli, fake_old_tensorflow):
    root, name = fake_old_tensorflow
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, REPO]))
    proc = subprocess.run([sys.executable, *cli], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == [f"electra-tf: TensorFlow 2.19.0 ({name}) is installed; electra-tf "
                     f"supports TensorFlow 2.20 and 2.21: {compat.INSTALL_HINT}"], proc.stderr
    assert proc.stdout == ""


@pytest.mark.every_leg
@pytest.mark.subprocess
def test_check_install_reports_this_install():
    """`python -m electra_tf.check_install`, the README's install check, on this machine:
    the versions read from metadata, the owner of `tensorflow/`, libtpu where the TPU build
    is installed (CI's second leg: all its TPU functions present), and a correct matmul."""
    import tensorflow as tf
    env = {k: v for k, v in os.environ.items() if k != "TPU_LOAD_LIBRARY"}
    proc = subprocess.run([sys.executable, "-m", "electra_tf.check_install"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    (name, version), = compat.installed_versions()["tensorflow"]
    assert lines[0].startswith(f"TensorFlow {tf.__version__} ({name}); tensorflow-text "
                               f"{importlib.metadata.version('tensorflow-text')}")
    jax = compat.installed_versions()["jax"]
    assert lines[0].endswith(f"JAX (the model's other Keras backend): {jax or 'not installed'}")
    assert lines[1].startswith(f"`tensorflow` package files: {name} only")
    if name == "tensorflow-tpu":
        libtpu = importlib.metadata.version("libtpu")
        assert lines[2].startswith(f"libtpu {libtpu}: exports all ")
        wanted = compat.tpu_runtime_functions(os.path.dirname(tf.__file__))
        assert len(wanted) > 200 and f"all {len(wanted)} TPU runtime functions" in lines[2]
    else:
        assert lines[2].startswith("libtpu: not installed")
    chips = compat.tpu_chips()
    assert lines[3].startswith(f"TPU chips attached to this host: {chips}")
    assert lines[-2].endswith(f"matmul on every replica: {128 ** 3} (correct)")
    assert lines[-1] == "OK"


def test_check_install_refuses_a_mismatched_libtpu(monkeypatch, capsys):
    """A libtpu of another release (TensorFlow 2.20 with libtpu 0.0.52 lacks 142 of the 212
    functions) is one line naming the pin that matches."""
    from electra_tf import check_install
    monkeypatch.setattr(compat, "installed_versions", lambda: _found(
        (("tensorflow-tpu", "2.20.0"),), "2.20.1", stand_in="2.20.0+tpu.stand.in",
        libtpu="0.0.52"))
    monkeypatch.setattr(compat, "tensorflow_package_owners", lambda: ["tensorflow-tpu"])
    monkeypatch.setattr(compat, "libtpu_path", lambda: "/fake/libtpu.so")
    monkeypatch.setattr(compat, "tpu_runtime_functions", lambda d: ["TpuPlatform_New", "A", "B"])
    monkeypatch.setattr(compat, "missing_tpu_functions", lambda lib, names: names[1:])
    with pytest.raises(check_install.InstallProblem, match=r"^libtpu 0\.0\.52 lacks 2 of the 3 "
                                                           r"TPU runtime functions .*install/tpu"):
        check_install.describe_packages()
