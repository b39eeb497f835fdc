"""bench/official_finetune.py's pure parts: the official fine-tuning hyper-parameters of our
config, the checkpoint files it copies, the launcher it writes. No official code here."""

import importlib.util
import os

import numpy as np
import pytest

from conftest import REPO
from electra_tf import configs
from electra_tf.training.checkpoints import write_tf1

_spec = importlib.util.spec_from_file_location(
    "official_finetune", os.path.join(REPO, "bench", "official_finetune.py"))
of = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(of)


def test_tiny_translates_to_these_official_finetuning_hparams():
    model = configs.load_config("tiny").to_json()["model"]
    assert of.finetune_hparams(model, init_checkpoint="/m/model.ckpt", max_seq_length=64,
                               epochs=10, learning_rate=3e-4, layerwise_lr_decay=0.8,
                               batch_size=32) == {
        "model_size": "small", "task_names": ["sst"],
        "model_hparam_overrides": {
            "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
            "intermediate_size": 512, "hidden_dropout_prob": 0.1,
            "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 128,
            "type_vocab_size": 2, "initializer_range": 0.02},
        "embedding_size": 64, "vocab_size": 30522, "learning_rate": 3e-4,
        "layerwise_lr_decay": 0.8, "num_train_epochs": 10.0, "max_seq_length": 64,
        "train_batch_size": 32, "eval_batch_size": 32, "num_trials": 1,
        "keep_all_models": False, "init_checkpoint": "/m/model.ckpt",
        "use_tfrecords_if_existing": False}


def test_checkpoint_files_of_a_prefix_and_of_a_directory(tmp_path):
    write_tf1({"electra/x": np.zeros(2, np.float32)}, str(tmp_path / "run" / "model.ckpt-7"))
    expected = sorted(str(tmp_path / "run" / f) for f in
                      ("model.ckpt-7.index", "model.ckpt-7.data-00000-of-00001"))
    assert sorted(of.checkpoint_files(str(tmp_path / "run" / "model.ckpt-7"))) == expected
    assert sorted(of.checkpoint_files(str(tmp_path / "run"))) == expected
    with pytest.raises(SystemExit, match="neither a checkpoint prefix nor a directory"):
        of.checkpoint_files(str(tmp_path / "nothing"))


@pytest.mark.e2e
def test_the_launcher_runs_the_official_finetuning_script():
    source = of.launcher_source()
    assert 'script = os.path.join(official_dir, "run_finetuning.py")' in source
    assert "run_pretraining.py\")" not in source
    compile(source, "launcher", "exec")
