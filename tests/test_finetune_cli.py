"""run_finetuning.py's bad flags, each one line (`cli.USER_ERRORS`) before any training
step, and the label set in its log and results.json; `cli.main` in-process."""

import json
import logging
import os
import re
import types

import pytest
import tensorflow as tf

from electra_tf.configs import ConfigError
from electra_tf.finetune import cli
from electra_tf.conversion.formats import ConvertError
from electra_tf.finetune.model import InitError
from electra_tf.training.loop import RunError

from conftest import REPO, finetune_tiny_model, write

TINY = finetune_tiny_model()


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A TINY pre-training run's outputs: config.json, an object-based ckpt-1 and the
    TF1-named discriminator/model.ckpt."""
    from electra_tf.conversion import formats
    from electra_tf.model.modeling import ElectraPretrainingModel, discriminator_variables
    from electra_tf.training.checkpoints import save_tf1_checkpoint
    d = tmp_path_factory.mktemp("pre")
    tf.keras.utils.set_random_seed(5)
    model = ElectraPretrainingModel(TINY)
    write(str(d / "config.json"), json.dumps(formats.pretraining_config(TINY).to_json()))
    obj = tf.train.Checkpoint(model=model).write(str(d / "ckpt-1"))
    tf1 = save_tf1_checkpoint(model, str(d / "discriminator" / "model.ckpt"),
                              discriminator_variables(model))
    return str(d), obj, tf1


@pytest.fixture
def data(tmp_path):
    """A user TSV task `mine`: 24 training rows, 8 dev rows."""
    for split, n in (("train", 24), ("dev", 8)):
        write(str(tmp_path / "data" / "mine" / f"{split}.tsv"), "sentence\tlabel\n" + "".join(
            f"a good film {i}\tpos\n" if i % 2 else f"a bad film {i}\tneg\n" for i in range(n)))
    return str(tmp_path / "data")


def flags(**kw):
    """What run_finetuning.py hands cli.main: its flags at their defaults, with `kw`."""
    values = dict(task="polarity", data_dir=None, data_source="auto", tfds_data_dir=None,
                  do_predict=False, init_checkpoint=None, config=None, model_dir=None,
                  export_dir=None, finetune_config=None, params_override="",
                  num_trials=None, learning_rate=None, layerwise_lr_decay=None,
                  official_lr_bug=None, num_train_epochs=None, train_batch_size=None,
                  eval_batch_size=None, max_seq_length=None, warmup_proportion=None,
                  seed=None, save_checkpoints_steps=None, text_columns=[],
                  label_column=None, labels=None, metric="accuracy", vocab_file=None,
                  spm_model=None, do_lower_case=True, strategy="cpu", tpu=None,
                  tpu_zone=None, gcp_project=None, precision=None, jit_compile=None,
                  on_nan=None, profile_steps=None, peak_flops=None,
                  untrained_baseline=None, backend=None)
    assert not set(kw) - set(values), set(kw) - set(values)
    values.update(kw)
    return types.SimpleNamespace(**values)


def mine(data, init, model_dir, **kw):
    """The flags of a tiny run of `mine`: 3 steps of 8, max_seq_length 16."""
    return flags(task="mine", data_dir=data, text_columns=["sentence"], label_column="label",
                 init_checkpoint=init, model_dir=model_dir, max_seq_length=16,
                 train_batch_size=8, eval_batch_size=8, num_train_epochs=1, **kw)


def refused(args, error=None):
    """cli.main's error for `args`: one of USER_ERRORS, in one line."""
    with pytest.raises(cli.USER_ERRORS) as e:
        cli.main(args, REPO)
    if error is not None:
        assert isinstance(e.value, error), type(e.value)
    message = str(e.value)
    assert "\n" not in message, message
    return message


def untrained(model_dir):
    """Nothing was trained into `model_dir`: no trial directory, no checkpoint."""
    return not os.path.exists(os.path.join(model_dir, "trial_0")) and \
        tf.train.latest_checkpoint(os.path.join(model_dir, "trial_0")) is None


@pytest.mark.e2e
def test_results_json_and_the_log_hold_the_label_set(pretrained, data, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="absl")
    model_dir = str(tmp_path / "model")
    results = cli.main(mine(data, pretrained[0], model_dir), REPO)
    train = os.path.join(data, "mine", "train.tsv")
    with open(os.path.join(model_dir, "results.json")) as f:
        saved = json.load(f)
    assert saved["labels"] == results["labels"] == ["neg", "pos"]
    assert saved["labels_from"] == train
    assert saved["num_train_steps"] == 3
    lines = [r.getMessage() for r in caplog.records if "labels (" in r.getMessage()]
    assert lines == [f"Task mine: 2 labels (read from {train}): neg, pos"]
    # Given with --labels: the same classes, logged as given.
    caplog.clear()
    again = cli.main(mine(data, pretrained[0], str(tmp_path / "given"), labels=["neg", "pos"]),
                     REPO)
    assert again["labels"] == ["neg", "pos"] and again["labels_from"] is None
    assert [r.getMessage() for r in caplog.records if "labels (" in r.getMessage()] == \
        ["Task mine: 2 labels (given): neg, pos"]


@pytest.mark.e2e
def test_the_untrained_baseline_is_the_same_recipe_from_random_initialisation(
        pretrained, data, tmp_path, capsys):
    model_dir = str(tmp_path / "model")
    results = cli.main(mine(data, pretrained[0], model_dir, untrained_baseline=True), REPO)
    with open(os.path.join(model_dir, "untrained", "results.json")) as f:
        saved = json.load(f)
    assert saved["init_checkpoint"] is None and saved["num_train_steps"] == 3
    assert results["untrained"] == {"median": saved["median"], "scores": saved["scores"]}
    # The same numbers as a run of its own with --init_checkpoint=none and the run's config.
    alone = cli.main(mine(data, "none", str(tmp_path / "alone"),
                          config=os.path.join(pretrained[0], "config.json")), REPO)
    assert alone["scores"] == saved["scores"]
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == (
        f"mine dev accuracy: median {results['median']:.4f} over 1 trial(s) "
        f"({results['scores'][0]:.4f}); untrained (random initialisation, same recipe): "
        f"median {saved['median']:.4f} ({saved['scores'][0]:.4f}); "
        f"results in {model_dir}/results.json and {model_dir}/untrained/results.json")
    assert "untrained" not in alone
    message = refused(mine(data, "none", str(tmp_path / "both"), untrained_baseline=True,
                           config=os.path.join(pretrained[0], "config.json")), ConfigError)
    assert message == ("--untrained_baseline compares a checkpoint with random "
                       "initialisation: it contradicts --init_checkpoint=none")


def test_an_unwritable_export_dir_is_refused_before_any_training_step(pretrained, data,
                                                                      tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("not a directory")  # chmod would not stop root: a file as parent
    model_dir = str(tmp_path / "model")
    message = refused(mine(data, pretrained[0], model_dir,
                           export_dir=str(afile / "export")), RunError)
    assert message.startswith(f"--export_dir={afile}/export: cannot write there: "), message
    assert "not a directory" in message, message
    assert untrained(model_dir)
    # The probe file is removed again.
    assert os.listdir(model_dir) == []


def test_an_unwritable_model_dir_is_refused(pretrained, data, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    message = refused(mine(data, pretrained[0], str(afile / "model")), RunError)
    assert message.startswith(f"--model_dir={afile}/model: cannot write there: "), message
    assert "not a directory" in message, message
    assert refused(mine(data, pretrained[0], str(afile)), RunError) == \
        f"--model_dir={afile}: cannot write there: it is a file, not a directory"


def test_max_seq_length_above_the_position_embeddings(pretrained, data, tmp_path):
    args = mine(data, pretrained[0], str(tmp_path / "model"))
    args.max_seq_length = 64
    assert refused(args, ConfigError) == (
        "--max_seq_length=64 exceeds the model's max_position_embeddings=32 (the longest "
        "input it has position embeddings for)")
    assert untrained(str(tmp_path / "model"))


@pytest.mark.parametrize("which", ["run_dir", "object", "tf1"])
def test_a_config_of_another_size_than_the_checkpoint(pretrained, data, tmp_path, which,
                                                      caplog):
    """--config=tiny (E=64, H=128) with a TINY (E=16, H=32) checkpoint: one line naming the
    first variable whose shapes differ, and what to do with --config; the failed restore
    does not log its unrestored values (they would follow the CLI's error line)."""
    run_dir, obj, tf1 = pretrained
    init = {"run_dir": run_dir, "object": obj, "tf1": tf1}[which]
    model_dir = str(tmp_path / "model")
    message = refused(mine(data, init, model_dir, config="tiny"), InitError)
    match = re.fullmatch(
        rf"--init_checkpoint {re.escape(init)} does not fit the model config: "
        r"(electra/\S+) is (\[[\d, ]+\]) in the checkpoint but (\[[\d, ]+\]) in the model "
        r"\(hidden_size=128, embedding_size=64, num_hidden_layers=2\); --config=tiny is not "
        r"the size the checkpoint was pre-trained with: drop --config \(the run's "
        r"config.json beside the checkpoint gives the size\) or give the config it was "
        r"trained with", message)
    assert match, message
    assert match.group(2) != match.group(3)
    assert not [r for r in caplog.records if "could not be found" in r.getMessage()]
    if which == "tf1":
        assert match.groups() == ("electra/embeddings/word_embeddings", "[30522, 16]",
                                  "[30522, 64]")
    assert untrained(model_dir)


def test_a_nonexistent_init_checkpoint_says_so(data, tmp_path):
    for config in (None, "tiny"):
        message = refused(flags(task="mine", data_dir=data, text_columns=["sentence"],
                                label_column="label", init_checkpoint="/nonexistent/path",
                                config=config, model_dir=str(tmp_path / "m")), ConvertError)
        assert message == ("--init_checkpoint=/nonexistent/path does not exist (neither a "
                           "directory nor a checkpoint prefix with /nonexistent/path.index)")
    assert not os.path.exists(tmp_path / "m")
