"""Checks an install: versions, which distribution owns `tensorflow`, libtpu, and a step.

`python -m electra_tf.check_install [--strategy=auto] [--tpu=local|NAME]` prints what is
installed and runs one small matmul under the strategy that pre-training would pick (TPU,
GPUs or CPU), so that a fresh Cloud TPU VM is checked in one command before a long run.
Exit 0 when everything holds, 1 with one line naming what does not (README: Install).
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # noqa: E402

from electra_tf import backend  # noqa: E402

try:  # --backend before Keras loads
    backend.select()
except backend.BackendError as e:
    sys.exit(f"check_install: {e}")

from electra_tf import compat  # noqa: E402  (checks the versions, sets TPU_LOAD_LIBRARY)
from electra_tf.training.options import STRATEGIES  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_enum("strategy", "auto", list(STRATEGIES), "As for run_pretraining.py.")
flags.DEFINE_string("tpu", None, "As for run_pretraining.py: local, a TPU's name or "
                    "grpc://HOST:PORT; default: this machine's chips, if any.")
flags.DEFINE_string("tpu_zone", None, "As for run_pretraining.py.")
flags.DEFINE_string("gcp_project", None, "As for run_pretraining.py.")
flags.DEFINE_enum("backend", None, list(backend.BACKENDS), "As for run_pretraining.py: jax "
                  "lists JAX's devices and runs one compiled train step of a tiny ELECTRA "
                  "on them.")


class InstallProblem(Exception):
    """Something the install lacks; the message is one line."""


def describe_packages() -> list:
    """The lines about installed packages; raises InstallProblem for an unsound install."""
    found = compat.installed_versions()
    (name, version), = found["tensorflow"]  # require_supported_versions made sure of one
    lines = [f"TensorFlow {version} ({name}); tensorflow-text {found['tensorflow_text']}; "
             f"Keras {found['keras']}; supported TensorFlow: "
             f"{', '.join(compat.SUPPORTED_TENSORFLOW)}; JAX (the model's other Keras "
             f"backend): {found['jax'] or 'not installed'}"]
    owners = compat.tensorflow_package_owners()
    if owners != [name]:
        raise InstallProblem(
            f"the `tensorflow` package's files belong to {', '.join(owners) or 'nothing'}, "
            f"expected {name} alone: reinstall (README: Install)")
    stand_in = (f"; `tensorflow {found['stand_in']}` is the stand-in that satisfies "
                "`tensorflow` requirements with it (no files)" if found["stand_in"] else "")
    lines.append(f"`tensorflow` package files: {name} only{stand_in}")
    library = compat.libtpu_path()
    import tensorflow as tf
    wanted = compat.tpu_runtime_functions(os.path.dirname(tf.__file__))
    if library is None:
        lines.append("libtpu: not installed" + (
            " (this TensorFlow build has no TPU runtime; a Cloud TPU VM needs "
            "install/tpu.txt)" if not wanted else ""))
    elif wanted:
        libtpu = found["libtpu"]
        missing = compat.missing_tpu_functions(library, wanted)
        if missing:
            raise InstallProblem(
                f"libtpu {libtpu} lacks {len(missing)} of the {len(wanted)} TPU runtime "
                f"functions TensorFlow {version} loads (e.g. {missing[0]}): it belongs to "
                "another TensorFlow release; pip install -r install/tpu.txt pins the one "
                "that matches")
        lines.append(f"libtpu {libtpu}: exports all {len(wanted)} TPU runtime functions "
                     f"TensorFlow {version} loads")
    chips = compat.tpu_chips()
    unloaded = os.environ.get("TPU_LOAD_LIBRARY") == "0"
    lines.append(f"TPU chips attached to this host: {chips}" + (
        "; TPU_LOAD_LIBRARY=0 (the TPU runtime is not loaded)" if unloaded else ""))
    return lines


def describe_jax_packages() -> list:
    """The lines about installed packages for the JAX runtime, which needs no TensorFlow
    (nor imports it where it is installed)."""
    found = compat.installed_versions()
    if not found.get("jax"):
        raise InstallProblem("JAX is not installed: pip install -e '.[jax]' (or a jax[cuda] / "
                             "jax[tpu] of the machine's accelerator)")
    tensorflow = ", ".join(f"{n} {v}" for n, v in found["tensorflow"]) or (
        "not installed (the TensorFlow runtime, SavedModel export and the TF1 "
        "builder paths need it: pip install -e '.[tensorflow]')")
    lines = [f"JAX {found['jax']} (jaxlib {compat._installed('jaxlib') or 'not installed'}); "
             f"Keras {found['keras']}; TensorFlow: {tensorflow}"]
    lines.append("libtpu: " + (found.get("libtpu") or "not installed") +
                 f"; TPU chips attached to this host: {compat.tpu_chips()}")
    return lines


def run_a_step(strategy_name: str, tpu, tpu_zone, gcp_project) -> list:
    """Builds the strategy pre-training would and runs a 128 x 128 matmul on each replica."""
    import tensorflow as tf
    from electra_tf.training.tf_runtime import distribute
    try:
        strategy = distribute.make_strategy(strategy_name, tpu, tpu_zone, gcp_project)
    except distribute.StrategyError as e:
        raise InstallProblem(str(e)) from None
    devices = strategy.extended.worker_devices
    xla = not distribute.is_cpu_only(strategy) or compat.xla_cpu_available()

    @tf.function(jit_compile=xla)
    def matmul():
        x = tf.ones((128, 128))
        return tf.reduce_sum(tf.matmul(x, x))

    result = strategy.experimental_local_results(strategy.run(matmul))
    values = sorted({float(v) for v in result})
    if values != [128.0 ** 3]:
        raise InstallProblem(f"a 128 x 128 matmul of ones summed to {values}, not "
                             f"{128 ** 3} on {type(strategy).__name__}")
    return [f"{type(strategy).__name__}: {strategy.num_replicas_in_sync} replica(s) on "
            f"{', '.join(devices[:4])}{' ...' if len(devices) > 4 else ''}",
            f"{'XLA-compiled' if xla else 'graph (this build has no XLA:CPU)'} 128 x 128 "
            f"matmul on every replica: {128 ** 3} (correct)"]


def run_a_jax_step(strategy_name: str) -> list:
    """JAX's devices (as --backend=jax would use them) and one compiled pre-training step
    of a 1-layer ELECTRA on a batch split over all of them: finite, and applied."""
    import numpy as np
    from electra_tf.configs import load_config
    from electra_tf.pretraining.trainer import make_pretrainer
    from electra_tf.training import backends, runtime
    try:
        devices = backends.devices(strategy_name)
    except runtime.StrategyError as e:
        raise InstallProblem(str(e)) from None
    n = devices.num_replicas
    cfg = load_config("tiny", {"model.num_hidden_layers": "1", "model.vocab_size": "512",
                               "train.train_batch_size": str(2 * n),
                               "train.max_seq_length": "16", "train.num_train_steps": "10"})
    trainer = make_pretrainer(cfg, devices)
    rows = np.random.default_rng(0).integers(110, 512, (2 * n, 16)).astype(np.int32)
    rows[:, 0], rows[:, -1] = 101, 102
    batch = {"input_ids": rows, "input_mask": np.ones_like(rows),
             "segment_ids": np.zeros_like(rows)}
    sums = trainer.make_train_loop()(iter([batch]), 1)
    loss = float(sums["loss_sum"])
    if not np.isfinite(loss) or trainer.step != 1:
        raise InstallProblem(f"the JAX train step gave loss {loss} at step "
                             f"{trainer.step} on {devices.describe()}")
    return [devices.describe(),
            f"one compiled train step of a 1-layer ELECTRA, batch {2 * n} split over "
            f"{n} device(s): loss {loss:.4f}, applied (global step 1)"]


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    try:
        jax = backend.current() == "jax"
        for line in (describe_jax_packages() if jax else describe_packages()):
            print(line, flush=True)
        if jax:
            lines = run_a_jax_step(FLAGS.strategy)
        else:
            lines = run_a_step(FLAGS.strategy, FLAGS.tpu, FLAGS.tpu_zone, FLAGS.gcp_project)
        for line in lines:
            print(line, flush=True)
    except InstallProblem as e:
        sys.exit(f"check_install: {e}")
    print("OK", flush=True)


if __name__ == "__main__":
    app.run(main)
