"""The SavedModel export of a fine-tuning run made on JAX: SavedModels are TensorFlow
graphs of a TensorFlow-backend Keras model, which a JAX process cannot build, so the median
trial's checkpoint (the TensorFlow runtime's format, whichever runtime wrote it) is
exported by a TensorFlow process: `python -m electra_tf.finetune.export_child JOB.pkl`,
started by `export_in_tensorflow`."""

import os
import pickle
import subprocess
import sys
from typing import Dict


class ExportError(RuntimeError):
    """The TensorFlow export process failed (its last line)."""


def export_in_tensorflow(task, model_config, checkpoint: str, encoder_args: Dict,
                         max_seq_length: int, export_dir: str) -> Dict[str, str]:
    """Exports `checkpoint`'s model as `export.export` does, in a TensorFlow process;
    -> the paths it wrote."""
    from electra_tf import fileio
    with fileio.local_staging_dir("electra_tf_export_") as tmp:
        job, out = os.path.join(tmp, "job.pkl"), os.path.join(tmp, "out.pkl")
        fileio.write_atomic(job, pickle.dumps(dict(
            task=task, model_config=model_config, checkpoint=checkpoint,
            encoder_args=encoder_args, max_seq_length=max_seq_length, export_dir=export_dir,
            out=out)))
        env = {**os.environ, "KERAS_BACKEND": "tensorflow"}
        done = subprocess.run([sys.executable, "-m", "electra_tf.finetune.export_child", job],
                              env=env, capture_output=True, text=True)
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines() or ["(no output)"]
            raise ExportError(f"the SavedModel export (a TensorFlow process) failed: "
                              f"{lines[-1]}")
        with fileio.open_file(out, "rb") as f:
            return pickle.load(f)


def _main(job_path: str):
    import tensorflow as tf
    from electra_tf import fileio
    with fileio.open_file(job_path, "rb") as f:
        job = pickle.load(f)
    from electra_tf.finetune import export
    from electra_tf.finetune.model import FinetuningModel, make_head
    from electra_tf.text import TextEncoder
    task, config = job["task"], job["model_config"]
    model = FinetuningModel(config, make_head(task.kind, config, task.num_outputs(),
                                              **task.head_options()))
    tf.train.Checkpoint(model=model).read(job["checkpoint"]).expect_partial() \
        .assert_existing_objects_matched()
    encoder = TextEncoder(**job["encoder_args"])
    paths = export.export(task, model, encoder, job["max_seq_length"], job["export_dir"])
    fileio.write_atomic(job["out"], pickle.dumps(paths))


if __name__ == "__main__":
    _main(sys.argv[1])
