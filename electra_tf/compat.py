"""The TensorFlow versions electra-tf runs on (2.20, the newest TPU build, and 2.21, each
with the tensorflow-text of its minor version and Keras 3), and JAX where it is installed
(the model's other Keras backend; on a machine with JAX and no TensorFlow, JAX and Keras
alone are checked), read from package metadata before any framework is imported:
`import electra_tf` stops with one line otherwise. Where the TensorFlow builds differ (the
TPU build's runtime), the difference lives here.
"""

import functools
import glob
import importlib.metadata
import importlib.util
import os
import re
from typing import Dict, List, MutableMapping, Optional, Tuple

SUPPORTED_TENSORFLOW = ("2.20", "2.21")

# Distributions that write the importable `tensorflow` package on Linux, the stock wheel
# last: on a Cloud TPU VM its entry is install/tensorflow-tpu-stand-in (no files, local
# version label below). (tensorflow-intel / tensorflow-cpu-aws, which the stock wheel
# depends on elsewhere, would read as a second copy.)
TENSORFLOW_DISTRIBUTIONS = ("tensorflow-tpu", "tensorflow-cpu", "tf-nightly",
                            "tf-nightly-cpu", "tf-nightly-tpu", "tensorflow")
STAND_IN_LABEL = "tpu.stand.in"

INSTALL_HINT = ("install with `pip install -e \".[tensorflow]\"` (CPU, or `.[gpu]` for GPUs), "
                "`pip install -e \".[jax]\"` for the JAX runtime alone or, on a Cloud TPU "
                "VM, `pip install -r install/tpu.txt` (README: Install)")


class UnsupportedEnvironment(SystemExit):
    """An installed TensorFlow, tensorflow-text or Keras outside the supported range (a
    SystemExit: a CLI stops with this one line and no traceback)."""


def normalise_name(name: str) -> str:
    """A distribution name as pip compares them (PEP 503): tensorflow_tpu -> tensorflow-tpu."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _minor(version: str) -> str:
    match = re.match(r"(\d+)\.(\d+)", version)
    return f"{match.group(1)}.{match.group(2)}" if match else version


def _installed(name: str) -> Optional[str]:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_versions() -> Dict[str, object]:
    """What is installed, from package metadata: {'tensorflow': [(distribution, version),
    ...] (stand-ins left out), and the versions (or None) of the others}."""
    tensorflow: List[Tuple[str, str]] = []
    stand_in = None
    for name in TENSORFLOW_DISTRIBUTIONS:
        version = _installed(name)
        if version is None:
            continue
        if version.endswith("+" + STAND_IN_LABEL):
            stand_in = version
        else:
            tensorflow.append((name, version))
    return {"tensorflow": tensorflow, "stand_in": stand_in,
            "tensorflow_text": _installed("tensorflow-text"), "keras": _installed("keras"),
            "libtpu": _installed("libtpu"), "jax": _installed("jax")}


SUPPORTED_JAX = "0.6"  # the oldest JAX release the model's JAX backend is tested above


def _keras_problem(found) -> Optional[str]:
    keras = found["keras"]
    if keras is None or int(_minor(keras).split(".")[0]) < 3:
        what = f"Keras {keras} is installed" if keras else "Keras is not installed"
        return f"electra-tf: {what}; electra-tf needs Keras 3 (pip install 'keras>=3.10')"
    return None


def _jax_problem(found) -> Optional[str]:
    jax = found.get("jax")
    if jax and tuple(int(p) for p in _minor(jax).split(".")) < tuple(
            int(p) for p in SUPPORTED_JAX.split(".")):
        return (f"electra-tf: JAX {jax} is installed; the JAX backend needs JAX >= "
                f"{SUPPORTED_JAX} (pip install -e '.[jax]')")
    return None


def check_versions(found: Dict[str, object]) -> Optional[str]:
    """The one-line problem with `found` (as `installed_versions` returns it), or None."""
    supported = " and ".join(SUPPORTED_TENSORFLOW)
    tensorflow = found["tensorflow"]
    if not tensorflow and found.get("jax"):
        # A JAX-only machine (a GPU box, a JAX TPU VM): the model, heads and objectives run
        # under KERAS_BACKEND=jax; the parts that need TensorFlow say so where they import it.
        return _jax_problem(found) or _keras_problem(found)
    if not tensorflow:
        return (f"electra-tf: TensorFlow is not installed; electra-tf supports TensorFlow "
                f"{supported}: {INSTALL_HINT}")
    if len(tensorflow) > 1:
        listed = ", ".join(f"{name} {version}" for name, version in tensorflow)
        return (f"electra-tf: {listed} are installed and all write the one `tensorflow` "
                f"package; keep one (pip uninstall the others, then reinstall the one you "
                f"keep): {INSTALL_HINT}")
    name, version = tensorflow[0]
    if _minor(version) not in SUPPORTED_TENSORFLOW:
        return (f"electra-tf: TensorFlow {version} ({name}) is installed; electra-tf supports "
                f"TensorFlow {supported}: {INSTALL_HINT}")
    text = found["tensorflow_text"]
    if text is None:
        return (f"electra-tf: tensorflow-text is not installed; it must match TensorFlow "
                f"{version}: pip install 'tensorflow-text=={_minor(version)}.*'")
    if _minor(text) != _minor(version):
        return (f"electra-tf: tensorflow-text {text} does not match TensorFlow {version} "
                f"({name}); install the same minor version: "
                f"pip install 'tensorflow-text=={_minor(version)}.*'")
    return _keras_problem(found) or _jax_problem(found)


@functools.lru_cache(maxsize=None)  # once it passed
def require_supported_versions() -> None:
    """Stops the process with one line unless the installed versions are supported."""
    problem = check_versions(installed_versions())
    if problem:
        raise UnsupportedEnvironment(problem)


# ---------------------------------------------------------------- the TPU build's runtime


def module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _libtpu_installed() -> bool:
    return (any(os.path.exists(p) for p in ("/lib/libtpu.so", "/usr/lib/libtpu.so"))
            or any("libtpu" in os.environ.get(var, "")
                   for var in ("TPU_LIBRARY_PATH", "TF_PLUGGABLE_DEVICE_LIBRARY_PATH"))
            or module_exists("libtpu"))


def tpu_chips() -> int:
    """TPU chips attached to this host, from /dev and without the network: /dev/accelN
    (v2-v4, v5p) or, where libtpu is installed, the numbered /dev/vfio groups (v5e, v6e;
    VFIO alone also serves GPU passthrough, hence the libtpu condition)."""
    accel = [p for p in glob.glob("/dev/accel*") if re.fullmatch(r"/dev/accel\d+", p)]
    if accel:
        return len(accel)
    try:
        groups = [e for e in os.listdir("/dev/vfio") if e.isdigit()]
    except OSError:
        return 0
    return len(groups) if groups and _libtpu_installed() else 0


def configure_tpu_library(environ: Optional[MutableMapping[str, str]] = None) -> bool:
    """Sets TPU_LOAD_LIBRARY=0 (before TensorFlow is imported) where its TPU build would
    load the TPU runtime on a host with no chips; -> whether it did. There tensorflow-tpu
    2.20's import asks the GCE metadata server, 30 tries a variable (CI: over 10 minutes, 4 s
    unloaded); unloaded, it still reaches a TPU Node. A value the user set is kept."""
    environ = os.environ if environ is None else environ
    if "TPU_LOAD_LIBRARY" in environ or not _libtpu_installed() or tpu_chips():
        return False
    environ["TPU_LOAD_LIBRARY"] = "0"
    return True


def tensorflow_package_owners() -> List[str]:
    """The installed distributions whose files include the importable `tensorflow` package
    (`tensorflow/__init__.py`): one on a sound install; the TPU stand-in owns no files."""
    owners = []
    for dist in importlib.metadata.distributions():
        files = dist.files or ()
        if any(str(f).replace("\\", "/") == "tensorflow/__init__.py" for f in files):
            owners.append(normalise_name(dist.metadata["Name"]))
    return sorted(set(owners))


_SET_FN = re.compile(r"TFTPU_SET_FN\(\s*\w+\s*,\s*(\w+)\s*\)")


def tpu_runtime_functions(tensorflow_dir: str) -> List[str]:
    """The TPU runtime's C functions that this TensorFlow build looks up by name when it
    loads libtpu (its `xla/stream_executor/tpu/*_init_fns.inc` headers list them); [] for a
    build without them (the stock wheel)."""
    names = set()
    pattern = os.path.join(tensorflow_dir, "include", "xla", "stream_executor", "tpu",
                           "*_init_fns.inc")
    for path in glob.glob(pattern):
        with open(path, encoding="utf-8") as f:
            names.update(_SET_FN.findall(f.read()))
    return sorted(names)


def libtpu_path() -> Optional[str]:
    """The libtpu.so of the installed `libtpu` package, or None."""
    spec = importlib.util.find_spec("libtpu") if module_exists("libtpu") else None
    if spec is None or not spec.origin:
        return None
    path = os.path.join(os.path.dirname(spec.origin), "libtpu.so")
    return path if os.path.exists(path) else None


def missing_tpu_functions(library: str, names: List[str]) -> List[str]:
    """Those of `names` that the shared library `library` does not export (a libtpu of
    another TensorFlow release: TensorFlow then fails to start the TPU, on a TPU VM only)."""
    import ctypes
    lib = ctypes.CDLL(library, mode=os.RTLD_LAZY)
    return [name for name in names if not hasattr(lib, name)]


@functools.lru_cache(maxsize=None)
def xla_cpu_available() -> bool:
    """Whether this TensorFlow build can XLA-compile for the CPU (the TPU build cannot:
    'could not find registered transfer manager for platform Host'); probed once."""
    import tensorflow as tf
    try:
        with tf.init_scope(), tf.device("/CPU:0"):  # eager, even when asked from a trace
            value = tf.function(lambda a: tf.matmul(a, a), jit_compile=True)(tf.ones((2, 2)))
            return float(tf.reduce_sum(value)) == 8.0
    except (tf.errors.NotFoundError, tf.errors.UnimplementedError,
            tf.errors.InvalidArgumentError, tf.errors.InternalError):
        return False


def in_xla_trace() -> bool:
    """Whether the graph being traced now is compiled by XLA (jit_compile, TPU)."""
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util  # no public API
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def xla_kernels_apply() -> bool:
    """Whether code traced now runs elementwise chains as XLA kernels (one pass over memory,
    not one per op): in a graph outside XLA, on a build that can XLA-compile. XLA fuses
    a * b + c into an FMA, so results may differ from the ops' in the last bit."""
    import tensorflow as tf
    return not tf.executing_eagerly() and not in_xla_trace() and xla_cpu_available()
