"""The JAX runtime (`--backend=jax`): its compiled step against the TensorFlow runtime's, on
one device and on two, its checkpoints in the TensorFlow runtime's object graph, and whole
runs: resume across runtimes, SIGTERM, exact resume, the exports read by the TensorFlow
side.

The step comparisons run TensorFlow's step here (eagerly, its draws recorded) and the JAX
step in a process with TensorFlow unimportable (`jax_step_parity.py`) from the same weights
(`backend_parity.set_weights`) and the same draws: every updated variable and Adam slot
within 1e-4 of TensorFlow's, relative to the array's largest value (`array_errors.max_error`)."""

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from electra_tf import compat, rng
from runtimes import tf_pretrainer

import backend_parity as cases
from array_errors import errors as _errors
import forked_cli
from conftest import REPO, sigterm_after

HERE = os.path.dirname(os.path.abspath(__file__))
STEP_TOL = 1e-4
jax_installed = pytest.mark.skipif(not compat.module_exists("jax"),
                                   reason="the jax extra is not installed")
JAX_ENV = {"KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}

# name -> (objective case, config overrides, lr multipliers by path)
STEP_CASES = {
    "electra_adamw_layerwise": ("electra", {}, {
        "electra/encoder/layer_0/output/dense/kernel": 0.5,
        "electra/embeddings/word_embeddings": 0.25}),
    "electra_lamb_accumulated": ("electra", {"optimizer.optimizer": "lamb",
                                             "train.grad_accum_steps": 2}, {}),
    "electric": ("electric", {}, {}),
    "hp_loss_focal_clipped": ("hp_loss_focal", {"optimizer.clip_norm": 0.01}, {}),
}


def _overrides(extra):
    return {k: str(v) for k, v in extra.items()}


def _tf_step(name):
    """One TensorFlow-runtime step of a case, eagerly, with its draws recorded."""
    case_name, extra, multipliers = STEP_CASES[name]
    objective, base, _ = cases.OBJECTIVE_CASES[case_name]
    cfg = __import__("electra_tf.configs", fromlist=["load_config"]).load_config(
        "tiny", {**cases.SMALL, "objective.objective": objective, **base, **_overrides(extra)})
    counts = np.arange(cases.V, dtype=np.float64) % 17
    trainer = tf_pretrainer(cfg, tf.distribute.get_strategy(), None, counts, jit_compile=False)
    cases.set_weights(trainer.model)
    by_path = {v.path: v for v in trainer.model.trainable_variables}
    trainer.lr_multipliers = [(by_path[p], m) for p, m in multipliers.items()] or None
    batch = {k: tf.constant(v) for k, v in cases.batch_arrays().items()}
    with rng.recorded_draws() as draws:
        sums = trainer._replica_step_fn(batch)
    slots = trainer.optimizer.slot_variables()
    expected = {
        "params": {v.path: v.numpy() for v in trainer.model.trainable_variables},
        "m": {v.path: slots[f"{v.path}/adam_m"].numpy()
              for v in trainer.model.trainable_variables},
        "v": {v.path: slots[f"{v.path}/adam_v"].numpy()
              for v in trainer.model.trainable_variables},
        "step": int(trainer.global_step.numpy()),
        "sums": {k: np.asarray(v) for k, v in sums.items()}}
    case = {"kind": "step", "name": case_name, "overrides": _overrides(extra),
            "multipliers": multipliers, "batch": cases.batch_arrays(), "draws": draws,
            "base_seed": [1, 2]}
    return case, expected


@pytest.fixture(scope="module")
def jax_steps(tmp_path_factory):
    """TensorFlow's steps here, then one JAX process for them and the device cases."""
    built = {name: _tf_step(name) for name in STEP_CASES}
    device_case = {"kind": "devices", "name": "electra", "overrides": {},
                   "batches": [cases.batch_arrays(seed) for seed in (0, 1)],
                   "base_seed": [3, 0x5EED]}
    nonfinite_case = dict(device_case, kind="nonfinite", batches=device_case["batches"][:1])
    program_case = {"kind": "program", "name": "electra", "overrides": {},
                    "batch": cases.batch_arrays(),
                    "lengths": PROGRAM_LENGTHS, "at": PROGRAM_STEPS}
    tmp = tmp_path_factory.mktemp("jax_steps")
    cases_path, out_path = tmp / "cases.pkl", tmp / "out.pkl"
    with open(cases_path, "wb") as f:
        pickle.dump([case for case, _ in built.values()] +
                    [device_case, nonfinite_case, program_case], f)
    env = {**os.environ, **JAX_ENV,
           "XLA_FLAGS": "--xla_force_host_platform_device_count=2 "
                        "--xla_backend_optimization_level=0"}
    subprocess.run([sys.executable, os.path.join(HERE, "jax_step_parity.py"), str(cases_path),
                    str(out_path)], check=True, timeout=900, env=env, cwd=REPO)
    with open(out_path, "rb") as f:
        results = pickle.load(f)
    return built, dict(zip(built, results)), results[-3], results[-2], results[-1]


# (total steps, warmup steps) of runs whose compiled steps must be one program, and the
# steps at which each run's rate is checked against the schedule's closed form.
PROGRAM_LENGTHS = [(12, 3), (13, 3), (600, 20)]
PROGRAM_STEPS = [0, 1, 2, 5, 11, 12]


@jax_installed
@pytest.mark.subprocess
@pytest.mark.jax
@pytest.mark.parametrize("name", list(STEP_CASES))
def test_one_step_on_jax_equals_one_step_on_tensorflow(jax_steps, name):
    """AdamW with layer-wise multipliers, LAMB over 2 micro-batches, ELECTRIC, a clipped
    focal HP step: the loss and metric sums, every updated variable and both Adam slots."""
    built, results = jax_steps[:2]
    expected, got = built[name][1], results[name]
    assert got["step"] == expected["step"] == 1
    assert set(got["params"]) == set(expected["params"])
    for key in ("params", "m", "v"):
        for path, error in _errors(expected[key], got[key]).items():
            assert error <= STEP_TOL, (name, key, path, error)
    # the update moved every variable (a skipped or zero step would pass the above)
    moved = [p for p, v in expected["params"].items() if np.any(expected["m"][p] != 0)]
    assert len(moved) >= len(expected["params"]) - 1, name
    sums = got["sums"][0]
    for key, value in expected["sums"].items():
        if "hist" in key:
            continue
        assert abs(float(sums[key]) - float(value)) <= STEP_TOL * max(1.0, abs(float(value))), \
            (name, key, float(sums[key]), float(value))


@jax_installed
@pytest.mark.subprocess
@pytest.mark.jax
def test_two_host_devices_give_the_one_device_steps(jax_steps):
    """XLA_FLAGS=--xla_force_host_platform_device_count=2: the batch split over 2 devices
    (the gradient all-reduce inserted by XLA), two steps, against the same on one device
    with the generator's own (row-exact) draws."""
    one, two = jax_steps[2]["one"], jax_steps[2]["all"]
    assert (one["devices"], two["devices"]) == (1, 2)
    assert one["step"] == two["step"] == 2
    for key in ("params", "m", "v"):
        for path, error in _errors(one[key], two[key]).items():
            assert error <= 1e-5, (key, path, error)
    for s1, s2 in zip(one["sums"], two["sums"]):
        assert float(s1["loss_sum"]) == pytest.approx(float(s2["loss_sum"]), rel=1e-5)
        assert float(s1["disc_correct"]) == float(s2["disc_correct"])


@jax_installed
@pytest.mark.subprocess
@pytest.mark.jax
def test_a_non_finite_step_is_skipped_and_counted_on_jax(jax_steps):
    """A NaN weight makes the loss and gradients non-finite: the step is reported skipped,
    the global step stays 0, and no weight or slot moves."""
    got = jax_steps[3]
    assert got["step"] == 0
    assert float(got["sums"][0]["skipped"]) == 1.0
    assert float(got["sums"][0]["grad_norm_sum"]) == 0.0
    for path, before in got["before"].items():
        np.testing.assert_array_equal(got["params"][path], before, err_msg=path)
        assert not np.any(got["m"][path]) and not np.any(got["v"][path]), path


@jax_installed
@pytest.mark.subprocess
@pytest.mark.jax
def test_runs_of_any_length_share_one_compiled_step(jax_steps):
    """The run's total and warmup steps are inputs of the jitted step, not constants: runs
    of 12, 13 and 600 steps lower to the same program (JAX's persistent cache serves all
    three from one compile), and each still follows its own schedule."""
    got = jax_steps[4]
    assert got["same_program"]
    for (total, warmup), rates in zip(PROGRAM_LENGTHS, got["rates"]):
        for step, rate in zip(PROGRAM_STEPS, rates):
            want = got["learning_rate"] * (1 - min(step, total) / total) * min(
                1.0, step / warmup)
            assert rate == pytest.approx(want, rel=1e-6, abs=1e-12), (total, step)


# One step on JAX between two on TensorFlow, through the checkpoint files: restores the
# TensorFlow runtime's checkpoint, takes the step with TensorFlow's recorded draws, saves.
JAX_STEP_BETWEEN = """
import pickle, sys
sys.path.insert(0, "tests")
import tensorflow as tf
from electra_tf import rng
from electra_tf.configs import load_config
from electra_tf.pretraining.trainer import make_pretrainer
from electra_tf.training.jax_runtime.devices import jax_devices
with open(sys.argv[1], "rb") as f:
    case = pickle.load(f)
cfg = load_config("tiny", case["overrides"])
rt = make_pretrainer(cfg, jax_devices("cpu"), None, case["counts"])
rt.restore(tf.train.latest_checkpoint(case["dir"]))
restored = (rt.step, rt.data_position)
with rng.given_draws(case["draws"]):  # traced inside: TensorFlow's draws as constants
    rt.make_train_loop(0)(iter(tf.data.Dataset.from_tensors(case["batch"]).repeat()), 1)
rt.advance_data(1)
rt.checkpoint_manager(case["dir"], 5).save(rt.step)
with open(sys.argv[2], "wb") as f:
    pickle.dump({"restored": restored, "saved": (rt.step, rt.data_position)}, f)
"""


def _tf_runtime(overrides):
    from electra_tf.configs import load_config
    cfg = load_config("tiny", overrides)
    trainer = tf_pretrainer(cfg, tf.distribute.get_strategy(), None, COUNTS, jit_compile=False)
    cases.set_weights(trainer.model)
    return trainer


def _eager_step(trainer, batch, draws=None):
    """One eager step of the TensorFlow runtime: with `draws` given, else recording them."""
    tensors = {k: tf.constant(v) for k, v in batch.items()}
    if draws is None:
        with rng.recorded_draws() as draws:
            trainer._replica_step_fn(tensors)
    else:
        with rng.given_draws(draws):
            trainer._replica_step_fn(tensors)
    trainer.advance_data(1)
    return list(draws)


def _trained_state(trainer):
    """{kind: {variable path: array}} of the weights and both Adam slots."""
    slots = trainer.optimizer.slot_variables()
    paths = [v.path for v in trainer.model.trainable_variables]
    return {"params": {v.path: v.numpy() for v in trainer.model.trainable_variables},
            **{slot: {p: slots[f"{p}/{slot}"].numpy() for p in paths}
               for slot in ("adam_m", "adam_v")}}


COUNTS = np.arange(cases.V, dtype=np.float64) % 17
RESUME_TOL = 1e-5


@jax_installed
@pytest.mark.subprocess
@pytest.mark.jax
def test_tensorflow_then_jax_then_tensorflow_ends_where_tensorflow_alone_does(tmp_path):
    """Three steps on TensorFlow alone, against step 1 on TensorFlow, step 2 on JAX and
    step 3 on TensorFlow again, each resuming the one before from its checkpoint files
    with the same batches and draws: every weight and both Adam slots within 1e-5 of the
    one-runtime run (relative to each array's largest value, `_errors`: JAX's step orders
    its float operations its own way; seen: 1.2e-6), the step and data position carried
    through both hand-overs."""
    overrides = {**cases.SMALL, "objective.objective": "electra"}
    batches = [cases.batch_arrays(seed) for seed in (0, 1, 2)]
    alone = _tf_runtime(overrides)
    draws = [_eager_step(alone, batch) for batch in batches]
    want = _trained_state(alone)
    assert (alone.step, alone.data_position) == (3, 3)

    first = _tf_runtime(overrides)
    _eager_step(first, batches[0], draws[0])
    first.checkpoint_manager(str(tmp_path / "run"), 5).save(first.step)
    case_path, out_path = tmp_path / "case.pkl", tmp_path / "out.pkl"
    with open(case_path, "wb") as f:
        pickle.dump({"overrides": {k: str(v) for k, v in overrides.items()}, "counts": COUNTS,
                     "dir": str(tmp_path / "run"), "batch": batches[1], "draws": draws[1]}, f)
    done = forked_cli.run(["-c", JAX_STEP_BETWEEN, str(case_path), str(out_path)], cwd=REPO,
                          timeout=300, env={**os.environ, **JAX_ENV})
    assert done.returncode == 0, done.stderr[-3000:]
    with open(out_path, "rb") as f:
        on_jax = pickle.load(f)
    assert on_jax == {"restored": (1, 1), "saved": (2, 2)}

    last = _tf_runtime(overrides)
    last.restore(tf.train.latest_checkpoint(str(tmp_path / "run")))
    assert (last.step, last.data_position) == (2, 2)
    _eager_step(last, batches[2], draws[2])
    assert (last.step, last.data_position) == (3, 3)
    got = _trained_state(last)
    assert len(want["params"]) > 20
    for kind in want:
        assert got[kind].keys() == want[kind].keys()
        errors = _errors(want[kind], got[kind])
        worst = max(errors, key=errors.get)
        assert errors[worst] <= RESUME_TOL, (kind, worst, errors[worst])
    # the JAX step moved the weights as TensorFlow's would have, not left them: a run that
    # skipped step 2 ends far from the one-runtime weights
    skipped = _tf_runtime(overrides)
    _eager_step(skipped, batches[0], draws[0])
    _eager_step(skipped, batches[2], draws[2])
    moved = _trained_state(skipped)["params"]
    assert max(_errors(want["params"], moved).values()) > 100 * RESUME_TOL


@pytest.mark.slow
@pytest.mark.jax
def test_checkpoint_paths_of_the_jax_runtime_are_tensorflows(tmp_path):
    """`checkpoints.object_paths` walks a model as TensorFlow's checkpoint does: the same
    key for every variable, for the objectives whose models differ in shape (GDES deltas,
    ELECTRIC's heads, two-tower generators, HP heads, untied embeddings)."""
    pytest.importorskip("jax")
    from electra_tf.training.checkpoints import object_paths
    counts = np.arange(cases.V, dtype=np.float64) % 17
    for name in ("electra_gdes", "electric", "hp_dist", "two_stage_0",
                 "electra_untied_official_masking"):
        trainer = tf_pretrainer(cases.objective_config(name), tf.distribute.get_strategy(),
                             None, counts)
        path = trainer.checkpoint().write(str(tmp_path / name))
        suffix = "/.ATTRIBUTES/VARIABLE_VALUE"
        keys = {n[:-len(suffix)] for n, _ in tf.train.list_variables(path)
                if n.startswith("model/")}
        paths = object_paths(trainer.model, "model")
        assert {paths[id(v)] for v in trainer.model.weights} == keys, name
        assert len(keys) == len(trainer.model.weights)


@pytest.mark.jax
def test_batches_ahead_keep_their_order_and_raise_where_the_source_did():
    """The JAX host loop's input thread: batches come out placed and in order, what the
    source raises comes out at its batch (and again after), the end of a finite source is
    StopIteration, at most `depth` batches wait placed (one more in hand), and `close`
    ends the thread: on return it has stopped and the batches it placed and nobody took
    are freed (a reader the interpreter stops at exit while it holds placed batches
    aborts the process); `close_all` (at exit) closes the readers still open."""
    pytest.importorskip("jax")
    import itertools
    import time
    from electra_tf.training.jax_runtime.step import BatchesAhead

    def source():
        yield from (1, 2, 3)
        raise ValueError("bad shard 4")

    ahead = BatchesAhead(source(), lambda x: x * 10)
    assert [next(ahead) for _ in range(3)] == [10, 20, 30]
    for _ in range(2):
        with pytest.raises(ValueError, match="bad shard 4"):
            next(ahead)
    assert list(BatchesAhead(iter([1, 2]), lambda x: -x)) == [-1, -2]
    read = []
    endless = BatchesAhead((read.append(i) or i for i in itertools.count()), lambda x: x,
                           depth=2)
    time.sleep(0.5)
    assert 2 <= len(read) <= 3 and next(endless) == 0
    for _ in range(100):  # the thread refills the queue
        if endless._queue.qsize() == 2:
            break
        time.sleep(0.05)
    assert endless._queue.qsize() == 2
    endless.close()
    assert not endless._thread.is_alive() and endless._queue.qsize() == 0
    assert endless not in BatchesAhead._open
    left = [BatchesAhead(itertools.count(), lambda x: x) for _ in range(2)]
    assert set(left) <= set(BatchesAhead._open)
    BatchesAhead.close_all()
    assert not any(a._thread.is_alive() for a in left) and not BatchesAhead._open


# ------------------------------------------------------------------------------ whole runs


# Long enough that a second process starts and is refused while the first still trains.
LONG = 40


def _run_args(model_dir, data, steps, *extra):
    return [f"--model_dir={model_dir}", f"--train_data={data}", f"--num_train_steps={steps}",
            "--train_batch_size=8", "--steps_per_loop=1", "--save_checkpoints_steps=10",
            "--params_override=log_every_steps=1,warmup_steps=2", *extra]


def _cli(args, env=None, timeout=300):
    return forked_cli.run(["run_pretraining.py", *args], cwd=REPO, timeout=timeout,
                          env={**os.environ, **(env or {})})


def _weights(model_dir):
    reader = tf.train.load_checkpoint(str(model_dir))
    return {n: reader.get_tensor(n) for n, _ in tf.train.list_variables(str(model_dir))
            if n.startswith(("model/", "optimizer/")) or n.startswith("global_step")}


@pytest.fixture(scope="module")
def jax_run(tmp_path_factory, sample_build):
    """A pre-training run on JAX of LONG steps (checkpoints every 10, the discriminator
    export), steps 3..4 traced by jax.profiler (TensorBoard's Profile tab reads the
    .xplane.pb)."""
    import glob
    run_dir = tmp_path_factory.mktemp("jax_run") / "run"
    done = _cli(_run_args(run_dir, sample_build[0], LONG, "--backend=jax",
                          "--profile_steps=2,4"), JAX_ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    assert glob.glob(str(run_dir / "train" / "plugins" / "profile" / "*" / "*.xplane.pb"))
    return run_dir, done.stderr


@jax_installed
@pytest.mark.subprocess
@pytest.mark.e2e
@pytest.mark.jax
def test_jax_runs_resume_exactly_and_either_runtime_resumes_the_other(tmp_path, sample_build,
                                                                      jax_run):
    """On JAX: LONG steps straight; the same run stopped by SIGTERM (it saves and exits 75;
    meanwhile a second run on its directory is refused by the lease) and rerun ends with
    the straight run's weights and slots bit for bit (data position and draws restored); TensorFlow resumes the JAX run's checkpoint and goes on; JAX
    resumes a TensorFlow run's; the JAX run's discriminator export converts to Hugging
    Face."""
    import shutil
    data = sample_build[0]
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    shutil.copytree(jax_run[0], straight)
    assert "JAX devices: JAX " in jax_run[1] and f" step {LONG}/{LONG} " in jax_run[1]
    assert "Train step: XLA-compiled (one jax.jit program)" in jax_run[1]

    proc = forked_cli.start(["run_pretraining.py",
                             *_run_args(stopped, data, LONG, "--backend=jax")], cwd=REPO,
                            env={**os.environ, **JAX_ENV}, stderr=forked_cli.PIPE)
    second = []

    def second_writer(line):  # while the first trains: the lease refuses a second run
        if f" step 1/{LONG} " in line and not second:
            second.append(_cli(_run_args(stopped, data, LONG, "--backend=jax"), JAX_ENV))
        return bool(second) and " step " in line

    _, rest = sigterm_after(proc, second_writer)
    assert second and second[0].returncode == 1, second
    assert f"{stopped} is in use by another run: pid {proc.pid}" in \
        second[0].stderr.strip().splitlines()[-1]
    from electra_tf.training import preemption
    assert proc.returncode == preemption.PREEMPTED_EXIT_CODE, rest[-3000:]
    last = rest.strip().splitlines()[-1]
    assert last.startswith("run_pretraining: SIGTERM at step ") and "rerun" in last, last
    at = int(last.split("SIGTERM at step ")[1].split(":")[0])
    assert 1 <= at < LONG, last
    again = _cli(_run_args(stopped, data, LONG, "--backend=jax"), JAX_ENV)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"(step {at})" in again.stderr
    a, b = _weights(straight), _weights(stopped)
    assert a.keys() == b.keys() and len(a) > 100
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)

    # TensorFlow resumes the JAX run (its object graph, counters and slots) and goes on.
    tf_on = _cli(_run_args(straight, data, LONG + 2, "--nojit_compile"))
    assert tf_on.returncode == 0, tf_on.stderr[-3000:]
    assert f"(step {LONG})" in tf_on.stderr and f" step {LONG + 2}/{LONG + 2} " in tf_on.stderr
    # JAX resumes the checkpoint TensorFlow wrote.
    jax_on = _cli(_run_args(straight, data, LONG + 3, "--backend=jax"), JAX_ENV)
    assert jax_on.returncode == 0, jax_on.stderr[-3000:]
    assert f"(step {LONG + 2})" in jax_on.stderr and f" step {LONG + 3}/{LONG + 3} " in \
        jax_on.stderr
    assert tf.train.latest_checkpoint(str(straight)).endswith(f"ckpt-{LONG + 3}")

    # The JAX run's discriminator, as every TensorFlow-side reader takes it.
    hf = forked_cli.run(["-m", "electra_tf.conversion.convert", "export-hf",
                         str(stopped), str(tmp_path / "hf")], cwd=REPO, timeout=300)
    assert hf.returncode == 0, hf.stderr[-3000:]
    for part in ("discriminator", "generator"):
        assert os.path.exists(tmp_path / "hf" / part / "model.safetensors"), part


# ------------------------------------------------------------------------------ the switch


def test_backend_flag_is_read_before_keras_loads(monkeypatch):
    """--backend=X or --backend X sets KERAS_BACKEND; the flag wins over the variable; an
    unknown name, or a flag asking for another backend than the one Keras loaded with, is a
    one-line error."""
    from electra_tf import backend
    assert backend.from_argv(["run.py", "--backend=jax", "--x=1"]) == "jax"
    assert backend.from_argv(["run.py", "--backend", "tensorflow"]) == "tensorflow"
    assert backend.from_argv(["run.py", "--model_dir=d"]) is None
    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    assert backend.select(["run.py"]) == "tensorflow"
    assert backend.select(["run.py", "--backend=tensorflow"]) == "tensorflow"
    with pytest.raises(backend.BackendError, match=r"^--backend=torch: expected one of "
                                                   r"tensorflow, jax$"):
        backend.select(["run.py", "--backend=torch"])
    monkeypatch.setenv("KERAS_BACKEND", "numpy")
    with pytest.raises(backend.BackendError, match="^KERAS_BACKEND=numpy: expected one of"):
        backend.select(["run.py"])
    # this process loaded Keras on TensorFlow
    with pytest.raises(backend.BackendError, match="already loaded with the tensorflow"):
        backend.select(["run.py", "--backend=jax"])


@pytest.mark.subprocess
@pytest.mark.every_leg
def test_an_unknown_backend_is_a_one_line_error(tmp_path):
    for script in ("run_pretraining.py", "run_finetuning.py"):
        done = forked_cli.run([script, "--backend=torch", f"--model_dir={tmp_path}"],
                              cwd=REPO, timeout=120)
        assert done.returncode == 1, done.stderr[-2000:]
        assert done.stderr.strip().splitlines()[-1] == (
            f"{script}: error: --backend=torch: expected one of tensorflow, jax")
        assert "Traceback" not in done.stderr


def _finetune_args(data, init, model_dir, *extra):
    return ["--task=mine", f"--data_dir={data}", "--text_columns=sentence",
            "--label_column=label", f"--init_checkpoint={init}", f"--model_dir={model_dir}",
            "--max_seq_length=16", "--train_batch_size=8", "--eval_batch_size=8",
            "--num_train_epochs=2", *extra]


@jax_installed
@pytest.mark.subprocess
@pytest.mark.e2e
@pytest.mark.jax
def test_finetuning_on_jax_and_from_a_jax_run_on_tensorflow(tmp_path, jax_run):
    """A JAX pre-training run fine-tunes on TensorFlow; on JAX, two trials on one compiled
    step write the same results.json, and the median trial's SavedModel (exported by a
    TensorFlow process) scores the dev rows as the JAX run reported."""
    data = tmp_path / "data"
    (data / "mine").mkdir(parents=True)
    dev = [(f"a bad film {i}" if i % 2 == 0 else f"a good film {i}", "neg" if i % 2 == 0
            else "pos") for i in range(8)]
    for split, rows in (("train", [(f"a good film {i}" if i % 2 else f"a bad film {i}",
                                    "pos" if i % 2 else "neg") for i in range(24)]),
                        ("dev", dev)):
        (data / "mine" / f"{split}.tsv").write_text(
            "sentence\tlabel\n" + "".join(f"{t}\t{l}\n" for t, l in rows))
    on_tf = forked_cli.run(["run_finetuning.py", *_finetune_args(
        data, jax_run[0], tmp_path / "ft_tf", "--num_trials=1")], cwd=REPO, timeout=300)
    assert on_tf.returncode == 0, on_tf.stderr[-3000:]
    assert (tmp_path / "ft_tf" / "results.json").exists()

    on_jax = forked_cli.run(["run_finetuning.py", *_finetune_args(
        data, jax_run[0], tmp_path / "ft_jax", "--num_trials=2", "--backend=jax",
        f"--export_dir={tmp_path / 'export'}")], cwd=REPO, timeout=300,
        env={**os.environ, **JAX_ENV})
    assert on_jax.returncode == 0, on_jax.stderr[-3000:]
    assert "exporting" in on_jax.stderr and "in a TensorFlow process" in on_jax.stderr
    import json
    results = json.loads((tmp_path / "ft_jax" / "results.json").read_text())
    assert len(results["trials"]) == 2 and results["labels"] == ["neg", "pos"]
    assert [t["seed"] for t in results["trials"]] == [1, 2]
    best = results["trials"][results["median_trial"]]
    served = tf.saved_model.load(results["export"]["task"]).signatures["serving_default"]
    labels = served(sentence=tf.constant([t for t, _ in dev]))["label"].numpy()
    accuracy = np.mean([p.decode() == l for p, (_, l) in zip(labels, dev)])
    assert accuracy == pytest.approx(best["accuracy"]), (accuracy, best)


# check_install --backend=jax: tests/test_jax_only.py.


# Several processes (jax.distributed): tests/test_jax_multiprocess.py.
