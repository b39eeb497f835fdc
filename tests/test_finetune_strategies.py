"""Fine-tuning under strategies and precisions, and its preemption: two MirroredStrategy
replicas equal one device, a bfloat16 run, and SIGTERM -> checkpoint -> resume."""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.configs import apply_overrides
from electra_tf.finetune.tasks import get_task
from electra_tf.text import TextEncoder
from electra_tf.finetune.trainer import Finetuner, FinetuneConfig
from electra_tf.training.preemption import PREEMPTED_EXIT_CODE

from conftest import REPO, sigterm_after
from test_finetune_trainer import TINY, VOCAB, synthetic_polarity, write

NO_DROPOUT = dataclasses.replace(TINY, hidden_dropout_prob=0.0,
                                 attention_probs_dropout_prob=0.0)
CFG = apply_overrides(FinetuneConfig(), dict(learning_rate=1e-3, layerwise_lr_decay=0.8,
                                             num_train_epochs=1, train_batch_size=16,
                                             eval_batch_size=16, max_seq_length=16,
                                             warmup_proportion=0.0, steps_per_loop=10))


def toy_batch(directory, n=16, seed=0):
    """A toy polarity task in `directory` and its first `n` training rows as one batch."""
    write(os.path.join(directory, "toy", "train.tsv"),
          synthetic_polarity(np.random.default_rng(seed), n))
    task = get_task("toy", directory, ["sentence"], "label")
    data = task.train_split(directory, TextEncoder(os.path.join(REPO, VOCAB)),
                            CFG.train.max_seq_length)
    assert data.num_examples == n
    return task, {k: v[:n] for k, v in data.arrays.items()}


def run_steps(finetuner, batch, n):
    """n steps of the real host loop on the same global batch -> (mean loss, skipped)."""
    ds = finetuner.strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensors(batch).repeat())
    out = finetuner.make_train_loop()(iter(ds), tf.constant(n))
    return float(out["loss_sum"]) / n, int(round(float(out["skipped"])))


# ----------------------------------------------------------------------------- replicas

REPLICA_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    sys.path.insert(0, {tests!r})
    from electra_tf.training.trainer import default_jit
    from electra_tf.finetune.trainer import Finetuner
    from test_finetune_strategies import CFG, NO_DROPOUT, run_steps, toy_batch
    task, batch = toy_batch({data!r})
    one = Finetuner(task, NO_DROPOUT, CFG, tf.distribute.OneDeviceStrategy("/cpu:0"), 10,
                    None, 1, jit_compile=False)
    weights = one.model.get_weights()
    loss_one, _ = run_steps(one, batch, 1)
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    # jit_compile=None: the Finetuner's default, which is no XLA for Mirrored over CPUs.
    two = Finetuner(task, NO_DROPOUT, CFG, mirrored, 10, None, 2)
    two.model.set_weights(weights)
    loss_two, skipped = run_steps(two, batch, 1)
    diff = max(float(np.max(np.abs(a - b))) for a, b in
               zip(one.model.get_weights(), two.model.get_weights()))
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(weights, one.model.get_weights()))
    print(json.dumps({{"diff": diff, "moved": moved, "loss_one": loss_one,
                      "loss_two": loss_two, "skipped": skipped,
                      "steps": [int(one.global_step.numpy()), int(two.global_step.numpy())],
                      "replicas": mirrored.num_replicas_in_sync,
                      "default_jit": default_jit(mirrored)}}))
""")


@pytest.mark.subprocess
def test_two_replicas_equal_one_device(tmp_path):
    """One fine-tuning step under MirroredStrategy on 2 logical CPUs (8 rows each) == one
    step on one device with the same global batch of 16 and the same weights (dropout off;
    the loss is divided by the global batch, gradients are summed over replicas)."""
    code = REPLICA_SCRIPT.format(tests=os.path.join(REPO, "tests"), data=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["replicas"] == 2
    assert result["default_jit"] is False
    assert result["steps"] == [1, 1] and result["skipped"] == 0
    assert result["loss_one"] == pytest.approx(np.log(2), abs=0.2)
    assert result["loss_two"] == pytest.approx(result["loss_one"], rel=1e-5)
    assert result["moved"] > 1e-4  # the step changed the weights
    assert result["diff"] < 1e-5, result


# ----------------------------------------------------------------------------- bfloat16

@pytest.fixture
def precision():
    """Sets a run precision (the global Keras policy) and restores float32 afterwards."""
    from electra_tf.training import distribute
    yield distribute.set_precision
    distribute.set_precision("float32")


def test_bfloat16_finetuning(tmp_path, precision):
    task, batch = toy_batch(str(tmp_path))
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    reference = Finetuner(task, NO_DROPOUT, CFG, strategy, 10, None, 1)
    weights = reference.model.get_weights()
    want, _ = run_steps(reference, batch, 1)
    precision("bfloat16")
    ft = Finetuner(task, NO_DROPOUT, CFG, strategy, 10, None, 1)
    assert ft.model.electra.blocks[0].query.compute_dtype == "bfloat16"
    assert ft.model.head.classifier.compute_dtype == "bfloat16"
    assert ft.model.head.compute_dtype == "bfloat16"
    assert all(v.dtype == tf.float32 for v in ft.variables)
    assert all(v.dtype == tf.float32 for v in ft.optimizer.variables
               if v.dtype.is_floating)
    ft.model.set_weights(weights)
    logits = ft.model(batch, training=False)["logits"]
    assert logits.dtype == tf.float32 and logits.shape == (16, 2)
    first, skipped_first = run_steps(ft, batch, 1)
    assert first == pytest.approx(want, rel=0.03)
    rest, skipped_rest = run_steps(ft, batch, 5)
    assert skipped_first == skipped_rest == 0
    assert int(ft.global_step.numpy()) == 6
    assert all(v.dtype == tf.float32 for v in ft.variables)
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(weights, ft.model.get_weights()))
    assert moved > 1e-4
    assert rest < first
    # Evaluation after training: the loss on the fixed batch fell below the initial one.
    assert ft.task.loss(ft.model(batch, training=False), batch).numpy().mean() < first


# ----------------------------------------------------------------------------- SIGTERM

@pytest.mark.subprocess
@pytest.mark.e2e
def test_sigterm_saves_a_checkpoint_and_the_rerun_resumes(tmp_path):
    data = str(tmp_path / "data")
    rng = np.random.default_rng(1)
    write(f"{data}/toy/train.tsv", synthetic_polarity(rng, 64))
    write(f"{data}/toy/dev.tsv", synthetic_polarity(rng, 16))
    config = tmp_path / "tiny_model.json"
    # A pre-training config file: its model section is the fine-tuned model's size.
    config.write_text(json.dumps({"model": dataclasses.asdict(TINY),
                                  "train": {"max_seq_length": 16}}))
    model_dir = tmp_path / "model"
    # 64 examples x 12 epochs / batch 8 = 96 steps, a loop (and a checkpoint) every 4.
    args = [sys.executable, "run_finetuning.py", "--task=toy", f"--data_dir={data}",
            "--text_columns=sentence", "--label_column=label", "--init_checkpoint=none",
            f"--config={config}", f"--model_dir={model_dir}", "--max_seq_length=16",
            "--train_batch_size=8", "--eval_batch_size=8", "--num_train_epochs=12",
            "--save_checkpoints_steps=4", "--learning_rate=1e-3", "--strategy=cpu"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.Popen(args, cwd=REPO, stderr=subprocess.PIPE, text=True, env=env)
    seen, rest = sigterm_after(proc, " step 4/96 ")
    assert proc.returncode == PREEMPTED_EXIT_CODE == 75, (seen + rest)[-3000:]
    last = rest.strip().splitlines()[-1]
    assert last.startswith("run_finetuning: SIGTERM at step ") and "rerun" in last, last
    step = int(last.split("SIGTERM at step ")[1].split(" ")[0])
    assert 4 <= step < 96
    trial_dir = str(model_dir / "trial_0")
    saved = tf.train.latest_checkpoint(trial_dir)
    assert saved.endswith(f"ckpt-{step}") and saved in last, (saved, last)
    assert not (model_dir / "results.json").exists()
    assert not (model_dir / "trial_0" / "result.json").exists()

    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"Resumed from {saved} (step {step})" in done.stderr, done.stderr[-3000:]
    steps = [int(x.split(" step ")[1].split("/")[0]) for x in done.stderr.splitlines()
             if " step " in x and "/96 |" in x]
    assert steps and steps[0] > step and steps[-1] == 96, steps
    assert tf.train.latest_checkpoint(trial_dir).endswith("ckpt-96")
    with open(model_dir / "results.json") as f:
        results = json.load(f)
    assert results["num_train_steps"] == 96 and len(results["scores"]) == 1
    assert 0.0 <= results["scores"][0] <= 1.0


def test_float16_finetuning_scales_the_loss(tmp_path, precision):
    """float16 starts at a loss scale of 2^15 and trains; an overflowing step is skipped
    (weights untouched, step not counted) and halves the scale; the scale is checkpointed."""
    task, batch = toy_batch(str(tmp_path))
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    precision("float16")
    ft = Finetuner(task, NO_DROPOUT, CFG, strategy, 10, None, 1)
    assert ft.model.electra.blocks[0].query.compute_dtype == "float16"
    assert float(ft.loss_scale.numpy()) == 2.0 ** 15
    first, skipped = run_steps(ft, batch, 3)
    assert skipped == 0 and int(ft.global_step.numpy()) == 3
    assert np.isfinite(first) and first == pytest.approx(np.log(2), abs=0.2)
    ft.loss_scale.assign(3e38)  # the scaled loss overflows: non-finite gradients
    before = [v.numpy().copy() for v in ft.variables]
    _, skipped = run_steps(ft, batch, 1)
    assert skipped == 1 and int(ft.global_step.numpy()) == 3
    assert float(ft.loss_scale.numpy()) == pytest.approx(1.5e38)
    assert all(np.array_equal(b, v.numpy()) for b, v in zip(before, ft.variables))
    names = dict(tf.train.list_variables(ft.checkpoint().write(str(tmp_path / "ck"))))
    assert any(n.startswith("loss_scale/") for n in names)


def test_resumed_trial_continues_at_its_data_position_after_skipped_steps(
        tmp_path, precision, monkeypatch):
    """float16 steps skipped for overflow consume batches without counting steps; the
    trial's checkpoint records the batches consumed, so a trial stopped at its first
    checkpoint and resumed ends with the weights of one trained straight through."""
    from electra_tf.finetune import trainer
    from electra_tf.training import loop
    data_dir = str(tmp_path / "data")
    write(f"{data_dir}/toy/train.tsv", synthetic_polarity(np.random.default_rng(3), 64))
    task = get_task("toy", data_dir, ["sentence"], "label")
    data = task.train_split(data_dir, TextEncoder(os.path.join(REPO, VOCAB)), 16)
    cfg = apply_overrides(CFG, dict(train_batch_size=8, steps_per_loop=2,
                                    save_checkpoints_steps=4))
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    precision("float16")

    def trial(trial_dir):
        ft = Finetuner(task, NO_DROPOUT, cfg, strategy, 8, None, 1, jit_compile=False)
        ft.loss_scale.assign(2.0 ** 40)  # the first steps overflow (restored on resume)
        trainer.train_trial(ft, data, str(trial_dir), seed=5)
        return ft

    straight = trial(tmp_path / "straight")
    skipped = int(straight.data_batches.numpy()) - 8
    assert int(straight.global_step.numpy()) == 8 and skipped >= 1

    real_save = loop.save_checkpoint

    def save_then_crash(manager, step):
        path = real_save(manager, step)
        raise KeyboardInterrupt(f"simulated crash after {path}")

    monkeypatch.setattr(loop, "save_checkpoint", save_then_crash)
    with pytest.raises(KeyboardInterrupt, match="ckpt-4"):
        trial(tmp_path / "resumed")
    monkeypatch.setattr(loop, "save_checkpoint", real_save)
    first = tf.train.load_checkpoint(str(tmp_path / "resumed"))
    assert first.get_tensor("data_batches/.ATTRIBUTES/VARIABLE_VALUE") == 4 + skipped
    resumed = trial(tmp_path / "resumed")
    assert int(resumed.data_batches.numpy()) == 8 + skipped
    for a, b in zip(straight.model.get_weights(), resumed.model.get_weights()):
        np.testing.assert_array_equal(a, b)
