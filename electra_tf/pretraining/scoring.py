"""What `python -m electra_tf.pretraining.score` computes: an ELECTRIC run restored from its
model_dir (`load_run`) and texts scored by one forward pass each (`Scorer`)."""

from typing import List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from electra_tf import fileio
from electra_tf.configs import PretrainingConfig
from electra_tf.conversion import source
from electra_tf.model.modeling import ElectraPretrainingModel, tf1_variables
from electra_tf.pretraining.losses import pseudo_log_likelihood
from electra_tf.pretraining.objectives import OBJECTIVES
from electra_tf.training.checkpoints import assign_arrays


class ScoreError(ValueError):
    """A bad --model_dir, vocabulary or input; the message is one line."""


def load_run(model_dir: str, checkpoint: Optional[str] = None,
             objective: Optional[str] = None
             ) -> Tuple[PretrainingConfig, ElectraPretrainingModel, str]:
    """(config, float32 model with its objective's heads, checkpoint path) of a pre-training
    run in `model_dir`: its config.json and its newest complete checkpoint (or `checkpoint`),
    every model weight checked to be there; the run must have used `objective` if given."""
    found = source.find_run_config(model_dir)
    if found is None:
        raise ScoreError(f"--model_dir={model_dir}: no config.json (not a pre-training run "
                         "directory)")
    config_path, cfg = found
    if objective and cfg.objective.objective != objective:
        raise ScoreError(f"{config_path}: objective {cfg.objective.objective}, not "
                         f"{objective}")
    src = source.resolve(checkpoint or model_dir, cfg.model,
                         "--checkpoint" if checkpoint else "--model_dir")
    model = ElectraPretrainingModel(src.config, dtype="float32",
                                    heads=OBJECTIVES[cfg.objective.objective].heads)
    try:
        assign_arrays(model, src.arrays(tf1_variables(model)))
    except ValueError as e:
        raise ScoreError(f"{src.path}: does not hold this run's model "
                         f"({str(e).splitlines()[0]})") from None
    return cfg, model, src.path


class Scorer:
    """Texts -> pseudo-log-likelihoods with a restored ELECTRIC model."""

    def __init__(self, model: ElectraPretrainingModel, text_encoder, max_seq_length: int,
                 batch_size: int = 32):
        self.model, self.text = model, text_encoder
        self.max_seq_length, self.batch_size = int(max_seq_length), int(batch_size)
        special = text_encoder.special_ids
        self._not_scored = tf.constant(sorted({special["[CLS]"], special["[SEP]"],
                                               special["[PAD]"], special["[MASK]"]}))
        self._energies = tf.function(self._energy_fn, reduce_retracing=True)

    def _energy_fn(self, input_ids, input_mask, segment_ids):
        energies = self.model.discriminator(input_ids, input_mask, segment_ids,
                                            training=False)
        special = tf.reduce_any(input_ids[..., None] == self._not_scored, -1)
        weights = tf.cast(input_mask, tf.float32) * tf.cast(~special, tf.float32)
        return pseudo_log_likelihood(energies, weights), tf.reduce_sum(weights, -1)

    def score(self, texts: Sequence[str]) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """-> (scores [N] float, scored pieces [N] int, truncated [N] bool)."""
        scores, counts, truncated = [], [], []
        for start in range(0, len(texts), self.batch_size):
            chunk = tf.constant(list(texts[start:start + self.batch_size]))
            pieces = self.text.tokenize(chunk)
            lengths = pieces.row_lengths().numpy()
            inputs = self.text.pack(pieces, max_seq_length=self.max_seq_length)
            s, n = self._energies(inputs["input_ids"], inputs["input_mask"],
                                  inputs["segment_ids"])
            scores.append(s.numpy())
            counts.append(n.numpy().astype(np.int64))
            truncated.append(lengths > self.max_seq_length - 2)
        if not scores:
            return np.zeros([0]), np.zeros([0], np.int64), np.zeros([0], bool)
        return np.concatenate(scores), np.concatenate(counts), np.concatenate(truncated)


def read_lines(path: str) -> List[Tuple[int, str]]:
    """(line number from 1, text) of every non-blank line of a UTF-8 text file."""
    if not fileio.exists(path):
        raise ScoreError(f"--input={path}: no such file")
    out = []
    try:
        for number, line in enumerate(fileio.open_text_lines(path), 1):
            text = line.rstrip("\r\n")
            if text.strip():
                out.append((number, text))
    except UnicodeDecodeError as e:
        raise ScoreError(f"{path}: line {len(out) + 1} or near it is not UTF-8 ({e.reason})"
                         ) from None
    return out
