"""Fine-tuning on the JAX runtime: `FinetuningJob` (the model with its pre-trained
encoder, layer-wise rates, the weighted task loss) over `training/jax_trainer.JaxTrainer`
(the compiled step, host loops, checkpoints in the TensorFlow runtime's format), plus the
jitted prediction over a split. Trials, results.json and test predictions are
`finetune/trainer.run`'s, as on TensorFlow; the SavedModel export needs TensorFlow's Keras
and runs in a TensorFlow process (`export_child.py`)."""

from typing import Dict, List, Optional

import jax
import keras
import numpy as np

from electra_tf.configs import FinetuneConfig, ModelConfig
from electra_tf.finetune.base_task import Task, TaskData
from electra_tf.finetune.trainer import FinetuningJob, pad_rows
from electra_tf.training import distribute, jax_step
from electra_tf.training.jax_trainer import JaxDevices, JaxTrainer, host_array


class JaxFinetuner(FinetuningJob, JaxTrainer):
    """`Finetuner`'s JAX twin: the same model, optimizer semantics and loss."""

    def __init__(self, task: Task, model_config: ModelConfig, cfg: FinetuneConfig,
                 devices: JaxDevices, num_train_steps: int, init_checkpoint: Optional[str],
                 seed: int):
        build_model, optimizer = self._setup_job(task, model_config, cfg, num_train_steps,
                                                 init_checkpoint)
        super().__init__(devices, build_model, optimizer, num_train_steps, seed=seed,
                         seed_stream=0xF17E, clip_norm=optimizer.clip_norm,
                         float16=distribute.active_precision() == "float16")
        self.set_lr_multipliers(self.layerwise_multipliers())
        self._predict = None

    def train_dataset(self, data: TaskData, seed: int, skip_batches: int = 0):
        return self.train_batches(data, seed, skip_batches)

    def predict(self, data: TaskData) -> Dict[str, np.ndarray]:
        """Runs the model over a split (no dropout), in padded batches of one shape split
        over the devices, and returns the fetched arrays. With several processes each reads
        the whole split and sends its share of every batch; the outputs come back whole to
        every process."""
        batch = self.cfg.train.eval_batch_size
        batch += -batch % self.strategy.num_replicas_in_sync
        arrays = pad_rows(data.arrays, batch)
        if self._predict is None:
            rep, rows = (jax_step.replicated(self.strategy.mesh),
                         jax_step.batch_sharding(self.strategy.mesh))

            def fetch(params, frozen, batch):
                mapping = list(zip(self.variables, params)) + list(zip(self.frozen, frozen))
                with keras.StatelessScope(state_mapping=mapping):
                    return self.fetches(batch, self.model(batch, training=False))

            self._predict = jax.jit(fetch, in_shardings=(rep, rep, rows), out_shardings=rep)
        share = batch // self.strategy.process_count
        mine = self.strategy.process_index * share
        parts: Dict[str, List[np.ndarray]] = {}
        n = len(arrays["weight"])
        for start in range(0, n, batch):
            chunk = self.steps.place_batch({k: v[start + mine:start + mine + share]
                                            for k, v in arrays.items()})
            out = self._predict(self.state["params"], self.state["frozen"], chunk)
            for k, v in out.items():
                parts.setdefault(k, []).append(host_array(v))
        return {k: np.concatenate(v)[:data.num_examples] for k, v in parts.items()}
