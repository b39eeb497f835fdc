"""The objective wired to the model, the compiled train step, and replica consistency."""

import json
import math
import os
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.data.dataset import InputConfig, make_dataset
from electra_tf.configs import load_config
from electra_tf.pretraining.losses import metrics_from_sums
from runtimes import tf_pretrainer
from electra_tf.training.loop import summarize

from conftest import REPO
import forked_cli


def _batch(directory, batch_size=16, seed=3):
    cfg = InputConfig(file_pattern=directory, batch_size=batch_size, deterministic=True,
                      seed=seed)
    return next(iter(make_dataset(cfg)))


def _trainer(overrides="", strategy=None, jit_compile=None):
    cfg = load_config("tiny", "train_batch_size=16,num_train_steps=200,warmup_steps=10" +
                      ("," + overrides if overrides else ""))
    return tf_pretrainer(cfg, strategy or tf.distribute.OneDeviceStrategy("/cpu:0"),
                      jit_compile=jit_compile)


def _run_steps(trainer, batch, n):
    """n train steps on the same batch through the compiled loop."""
    ds = trainer.strategy.distribute_datasets_from_function(
        lambda ctx: tf.data.Dataset.from_tensors(batch).repeat())
    return summarize(trainer.make_train_loop()(iter(ds), tf.constant(n)), metrics_from_sums)


def test_losses_at_initialisation(sample_build):
    trainer = _trainer()
    batch = _batch(sample_build[0], 32)
    dens = trainer.job.objective.denominators(batch)
    loss, sums = trainer.job.objective.loss(trainer.model, batch, tf.constant([1, 2, 0]), dens,
                                        False)
    m = {k: float(v) for k, v in metrics_from_sums(sums).items()}
    assert abs(m["masked_lm_loss"] - math.log(30522)) < 0.5
    assert abs(m["disc_loss"] - math.log(2)) < 0.2
    # ~85% of the 15% masked positions are replaced by a near-uniform generator.
    assert 0.10 < m["replaced_fraction"] < 0.16
    assert float(loss) == pytest.approx(m["masked_lm_loss"] + 50 * m["disc_loss"], rel=1e-4)
    # Official masking count: round(real tokens x 0.15), capped at 19, summed.
    real = tf.reduce_sum(batch["input_mask"], axis=1).numpy()
    expected = np.maximum(1, np.minimum(19, np.round(real * 0.15))).sum()
    assert float(dens["mlm"]) == expected


@pytest.mark.slow
@pytest.mark.xla_cpu
def test_step_is_one_xla_program_traced_once(sample_build):
    trainer = _trainer()
    assert trainer.jit_compile
    batch = _batch(sample_build[0])
    first = _run_steps(trainer, batch, 3)
    second = _run_steps(trainer, batch, 4)
    assert int(trainer.global_step.numpy()) == 7
    assert trainer.trace_count == 1  # many steps, one trace
    # The whole step (masking .. optimizer update) lowers to one HLO module: no op falls
    # back to the host, no Python callback.
    hlo = trainer.replica_step().experimental_get_compiler_ir(batch)(stage="hlo")
    assert "ENTRY" in hlo and "custom-call" not in hlo.lower().replace("__cpu", "")
    graph = trainer.replica_step().get_concrete_function(batch).graph
    host_ops = {"PyFunc", "EagerPyFunc", "PyFuncStateless", "Print", "PrintV2"}
    assert not [op.type for op in graph.get_operations() if op.type in host_ops]
    assert second.loss < first.loss  # same batch, 7 updates: the loss falls


@pytest.mark.slow
def test_weights_change_and_float64_free(sample_build):
    trainer = _trainer(jit_compile=False)  # the same graph as XLA's input
    before = [v.numpy().copy() for v in trainer.variables]
    _run_steps(trainer, _batch(sample_build[0]), 2)
    changed = [not np.array_equal(b, v.numpy()) for b, v in zip(before, trainer.variables)]
    assert all(changed), [v.path for v, c in zip(trainer.variables, changed) if not c]
    graph = trainer.replica_step().get_concrete_function(_batch(sample_build[0])).graph
    assert not [op.name for op in graph.get_operations()
                if any(t.dtype == tf.float64 for t in op.outputs)]


@pytest.mark.slow
def test_gradient_accumulation_equals_one_big_batch(sample_build):
    batch = _batch(sample_build[0], 16)
    # Masking, sampling and dropout draws follow the rows (electra_tf.rng), not the blocks.
    one = _trainer("", jit_compile=False)
    four = _trainer("grad_accum_steps=4", jit_compile=False)
    four.model.set_weights(one.model.get_weights())
    a, b = _run_steps(one, batch, 1), _run_steps(four, batch, 1)
    assert a.loss == pytest.approx(b.loss, rel=1e-5)
    for x, y in zip(one.variables, four.variables):
        np.testing.assert_allclose(x.numpy(), y.numpy(), atol=2e-6)


REPLICA_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    sys.path.insert(0, {tests!r})
    from test_pretraining_trainer import _batch, _trainer, _run_steps
    batch = _batch({data!r}, 16)
    one = _trainer("warmup_steps=0")
    weights = one.model.get_weights()
    out_one = _run_steps(one, batch, 1)
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    two = _trainer("warmup_steps=0", strategy=mirrored)
    two.model.set_weights(weights)
    # Replica r gets rows [8r, 8r + 8) of the same global batch.
    values = mirrored.experimental_distribute_values_from_function(
        lambda ctx: {{k: v[8 * ctx.replica_id_in_sync_group: 8 * ctx.replica_id_in_sync_group + 8]
                     for k, v in batch.items()}})
    sums = two._reduce(mirrored.run(two.replica_step(), args=(values,)))
    from test_pretraining_trainer import metrics_from_sums, summarize
    out_two = summarize(sums, metrics_from_sums)
    diff = max(float(np.max(np.abs(a - b))) for a, b in
               zip(one.model.get_weights(), two.model.get_weights()))
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(weights, one.model.get_weights()))
    print(json.dumps({{"diff": diff, "moved": moved, "loss_one": out_one.loss,
                      "loss_two": out_two.loss, "replicas": mirrored.num_replicas_in_sync}}))
""")


@pytest.mark.subprocess
def test_two_replicas_equal_one_device(sample_build):
    """One step under MirroredStrategy on 2 logical CPUs == one step on one device with
    the same global batch: losses are divided by global denominators, and masking,
    sampling and dropout draws follow the rows, not the replicas (dropout on)."""
    code = REPLICA_SCRIPT.format(tests=os.path.join(REPO, "tests"), data=sample_build[0])
    done = forked_cli.run(["-c", code], cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["replicas"] == 2
    assert result["moved"] > 1e-4  # the step did change the weights
    assert result["diff"] < 1e-5
    assert result["loss_two"] == pytest.approx(result["loss_one"], rel=1e-5)


@pytest.fixture
def precision():
    """Sets a run precision (the global Keras policy) and restores float32 afterwards."""
    from electra_tf.training import runtime
    yield runtime.set_precision
    runtime.set_precision("float32")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_mixed_precision_step(sample_build, precision, name):
    """The compiled step under a mixed policy: float32 variables, a loss within a few
    percent of the float32 one at the same weights, and training that moves the weights.
    float16 starts at a loss scale of 2^15 and halves it on each overflowing (skipped) step."""
    batch = _batch(sample_build[0])
    plain = "hidden_dropout_prob=0,attention_probs_dropout_prob=0,warmup_steps=0"
    # XLA:CPU emulates float16 and bfloat16 arithmetic (compiling and running this test
    # took ~100 s), so on CPU the step runs as a graph here; XLA is tested above, and
    # bfloat16 under XLA in fine-tuning.
    jit = False
    reference = _trainer(plain, jit_compile=jit)
    weights = reference.model.get_weights()
    want = _run_steps(reference, batch, 1).loss
    precision(name)
    trainer = _trainer(f"precision={name}," + plain, jit_compile=jit)
    assert trainer.model.electra.blocks[0].query.compute_dtype == name
    assert all(v.dtype == tf.float32 for v in trainer.variables)
    trainer.model.set_weights(weights)
    first = _run_steps(trainer, batch, 1)
    assert first.loss == pytest.approx(want, rel=0.03)
    rest = _run_steps(trainer, batch, 5)
    skipped = first.skipped_steps + rest.skipped_steps
    assert int(trainer.global_step.numpy()) == 6 - skipped
    if name == "float16":
        assert skipped < 6
        assert float(trainer.loss_scale.numpy()) == 2.0 ** (15 - skipped)
    else:
        assert skipped == 0
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(weights, trainer.model.get_weights()))
    assert moved > 1e-4
    assert rest.loss < first.loss
