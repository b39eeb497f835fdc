"""Pre-training objectives: what a train step minimises.

An objective turns (model, batch, seed) into a scalar loss and additive metric sums out
of the pure loss functions in `objective.py`; the train step (`pretraining.py`) adds the
gradients, all-reduce, clipping and the update. New objectives subclass `Objective` and
register in `OBJECTIVES`.
"""

import abc
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from electra_tf.pretraining import losses as obj
from electra_tf import rng
from electra_tf.configs import PretrainingConfig
from electra_tf.model.modeling import gather_positions

BERT_SPECIAL_IDS = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}
_EPS = 1e-5


class Objective(abc.ABC):
    """Base class: what a pre-training objective must provide.

    `denominators(batch)` returns the loss denominators that depend on the batch alone
    (no randomness), so they can be summed over replicas and micro-batches before the
    forward pass; `loss_terms(...)` divides its local sums by those global values, which
    makes N replicas (or k micro-batches) give exactly the update of one device on the
    whole global batch.

    An objective may run in phases (`phases`: the first step of each); the trainer
    compiles one step function per phase, calls `on_phase_start` when a phase begins, and
    passes the phase to `loss_terms`. `heads` are the optional model heads it needs
    (`modeling.HEADS`).
    """
    heads: Tuple[str, ...] = ()

    def __init__(self, cfg: PretrainingConfig, special_ids: Dict[str, int],
                 unigram_counts: Optional[np.ndarray] = None):
        self.cfg = cfg
        self.oc = cfg.objective
        self.special = dict(special_ids)
        self.max_predictions = self.oc.predictions_per_seq(cfg.train.max_seq_length)
        self.unigram_counts = unigram_counts
        self.focal_gamma = self.oc.focal_gamma()

    def phases(self) -> List[int]:
        """The first global step of each phase (one phase by default)."""
        return [0]

    def on_phase_start(self, model, phase: int):
        """Called (eagerly, before its first step) when phase `phase` > 0 begins."""

    def denominators(self, batch) -> Dict[str, tf.Tensor]:
        """mlm: real prediction slots; disc: real tokens (global sums are taken by the
        trainer)."""
        _, count = obj.num_to_mask(batch["input_ids"], batch["input_mask"], **self._mask_args())
        return {"mlm": tf.cast(tf.reduce_sum(count), tf.float32),
                "disc": tf.reduce_sum(tf.cast(batch["input_mask"], tf.float32))}

    @abc.abstractmethod
    def loss_terms(self, model, batch, seed, denominators, training: bool, phase: int = 0
                   ) -> Tuple[Dict[str, tf.Tensor], Dict[str, tf.Tensor]]:
        """-> ({term name: weighted scalar float32 loss}, dict of additive metric sums).

        Terms: "generator", "baseline", "sampling", "discriminator", "mlm" as present;
        the loss is their sum.
        """

    def loss(self, model, batch, seed, denominators, training: bool, phase: int = 0):
        """-> (scalar float32 loss, dict of additive float32 metric sums)."""
        terms, sums = self.loss_terms(model, batch, seed, denominators, training, phase)
        return tf.add_n(list(terms.values())), sums

    # --- shared pieces ---------------------------------------------------------------
    def _mask_args(self):
        s = self.special
        return dict(mask_prob=self.oc.mask_prob, max_predictions=self.max_predictions,
                    mask_id=s["[MASK]"], cls_id=s["[CLS]"], sep_id=s["[SEP]"])

    def mask(self, batch, seed):
        return obj.mask_tokens(
            batch["input_ids"], batch["input_mask"], seed,
            vocab_size=self.cfg.model.vocab_size, mask_token_prob=self.oc.mask_token_prob,
            random_token_prob=self.oc.random_token_prob, **self._mask_args())

    @property
    def has_generator(self) -> bool:
        return self.oc.generator == "masked_lm"

    def generator(self, model, masked, batch, seed, training):
        """(logits [B,P,V] of the proposal distribution at the slots, the generator's
        hidden states there [B,P,h] or None for uniform / unigram proposals)."""
        if self.oc.generator == "uniform":
            return obj.uniform_logits(masked["masked_ids"], self.cfg.model.vocab_size), None
        if self.oc.generator == "unigram":
            return obj.unigram_logits(masked["masked_ids"], self.unigram_counts), None
        hidden = model.generator_hidden(masked["masked_input_ids"], batch["input_mask"],
                                        batch["segment_ids"], training=training, seed=seed)
        slots = gather_positions(hidden, masked["masked_positions"])
        return model.generator_predictions(slots), slots

    def sample(self, logits, masked, seed):
        return obj.categorical_sample(
            logits, seed, self.oc.temperature,
            disallow_ids=masked["masked_ids"] if self.oc.disallow_correct else None)

    def generator_mlm_term(self, gen_logits, masked, denominators):
        loss_sum, _, _ = obj.mlm_loss_sums(gen_logits, masked["masked_ids"],
                                           masked["masked_weights"], self.focal_gamma)
        return self.oc.gen_weight * loss_sum / tf.maximum(denominators["mlm"], _EPS)


class ElectraObjective(Objective):
    """Replaced-token detection: generator + disc_weight x discriminator BCE.

    Variants by `objective.objective`:
    * electra: the generator's MLM (focal with `gen_focal_gamma`) + BCE over real tokens;
    * electra_15: the BCE only over the prediction slots (ELECTRA paper 3.5);
    * hp_loss / hp_dist: replacements drawn from a sampling head (HP paper 4.1.2), whose
      loss (weight `sampling_weight()`) is the term "sampling";
    * adversarial: no MLE; the generator maximises the discriminator's loss at the slots by
      REINFORCE with a learned baseline (ELECTRA paper, Appendix F);
    * two_stage: phase 0 trains the generator alone (MLM); phase 1 copies it into the
      discriminator (equal sizes, untied) and trains the discriminator with the generator
      frozen (ELECTRA paper 3.2). The learning-rate schedule is the run's, not restarted.
    No discriminator gradient reaches a generator-only weight: samples are discrete and
    every generator-side use of the discriminator's output is a constant.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        name = self.oc.objective
        self.heads = {"hp_loss": ("sampling",), "hp_dist": ("sampling",),
                      "adversarial": ("baseline",)}.get(name, ())

    def phases(self):
        if self.oc.objective == "two_stage":
            return [0, self.oc.switch_step(self.cfg.train.num_train_steps)]
        return [0]

    def on_phase_start(self, model, phase):
        if self.oc.objective == "two_stage" and phase == 1:
            copy_encoder_weights(model.generator, model.electra)

    def loss_terms(self, model, batch, seed, denominators, training, phase=0):
        name, oc = self.oc.objective, self.oc
        seeds = rng.split(seed, 4)  # masking, sampling, generator and disc dropout
        masked = self.mask(batch, seeds[0])
        ids, w = masked["masked_ids"], masked["masked_weights"]
        den_mlm = tf.maximum(denominators["mlm"], _EPS)
        gen_logits, gen_slots = self.generator(model, masked, batch, seeds[2], training)
        terms = {}
        if name == "two_stage":
            if phase == 0:  # the generator alone
                terms["generator"] = self.generator_mlm_term(gen_logits, masked, denominators)
                return terms, obj.metric_sums(input_mask=batch["input_mask"], masked_ids=ids,
                                              masked_weights=w, mlm_logits=gen_logits)
            gen_logits = tf.stop_gradient(gen_logits)  # frozen
        elif self.has_generator and name != "adversarial":
            terms["generator"] = self.generator_mlm_term(gen_logits, masked, denominators)

        sampling_logits = gen_logits
        if name in ("hp_loss", "hp_dist"):
            hp_logits = model.sampling_predictions(gen_slots)
            sampling_logits = (obj.hp_loss_sampling_logits(gen_logits, hp_logits, ids)
                               if name == "hp_loss" else hp_logits)
        sampled = self.sample(sampling_logits, masked, seeds[1])
        fake_ids, labels = obj.corrupt(batch["input_ids"], masked["masked_positions"],
                                       sampled, w)
        disc_logits = model.discriminator(fake_ids, batch["input_mask"], batch["segment_ids"],
                                          training=training, seed=seeds[3])
        slot_loss = obj.slot_disc_loss(disc_logits, labels, masked["masked_positions"], w)

        hp_estimate = None
        if name == "hp_loss":
            hp_at_sample = obj.pick(hp_logits, sampled)
            head_sum, _ = obj.hp_loss_head_sums(
                hp_at_sample, obj.gather_slots(disc_logits, masked["masked_positions"]), w)
            hp_estimate = obj.hp_loss_estimate(hp_at_sample, tf.equal(sampled, ids))
        elif name == "hp_dist":
            head_sum, _ = obj.hp_dist_head_sums(hp_logits, gen_logits, sampled, slot_loss, w)
            # The head's loss estimate up to the slot's normaliser: p_S / p_G.
            hp_estimate = tf.exp(obj.pick(tf.nn.log_softmax(hp_logits), sampled) -
                                 obj.pick(tf.nn.log_softmax(gen_logits), sampled))
        if hp_estimate is not None:
            terms["sampling"] = oc.sampling_weight() * head_sum / den_mlm
        if name == "adversarial":
            policy, baseline = obj.reinforce_sums(gen_logits, sampled, slot_loss,
                                                  model.baseline_logits(gen_slots), w)
            terms["generator"] = oc.gen_weight * policy / den_mlm
            terms["baseline"] = baseline / den_mlm

        if name == "electra_15":
            disc_term = tf.reduce_sum(slot_loss) / den_mlm
        else:
            disc_sum, _, _ = obj.disc_loss_sums(disc_logits, labels, batch["input_mask"])
            disc_term = disc_sum / tf.maximum(denominators["disc"], _EPS)
        terms["discriminator"] = oc.disc_weight * disc_term
        sums = obj.metric_sums(
            input_mask=batch["input_mask"], masked_ids=ids, masked_weights=w,
            sampled_ids=sampled, mlm_logits=gen_logits if self.has_generator else None,
            disc_logits=disc_logits, disc_labels=labels,
            masked_positions=masked["masked_positions"],
            sampling_logits=None if training else sampling_logits,
            hp_estimate=hp_estimate, hp_actual=slot_loss if hp_estimate is not None else None)
        return terms, sums


class MaskedLMObjective(Objective):
    """Objectives whose main model is a masked LM (ELECTRA paper 3.5), with an MLM head
    (`mlm_predictions`) on the discriminator-sized encoder, weight 1, term "mlm":

    * mlm: BERT; the encoder sees `mask_tokens`' corruption (official 85% [MASK] / 15%
      kept, or BERT's 80/10/10 with mask_token_prob=0.8, random_token_prob=0.1) and
      predicts the originals at the slots. No generator.
    * replace_mlm: the slots hold generator samples instead of [MASK]; MLM loss there.
    * all_tokens_mlm: as replace_mlm, predicting every real token through the copy
      mechanism (copy probability from `discriminator_predictions`).
    The generator (replace_mlm, all_tokens_mlm) trains with its MLM loss as in ELECTRA.
    """
    heads = ("mlm",)

    def loss_terms(self, model, batch, seed, denominators, training, phase=0):
        name = self.oc.objective
        seeds = rng.split(seed, 4)
        masked = self.mask(batch, seeds[0])
        ids, w, positions = masked["masked_ids"], masked["masked_weights"], \
            masked["masked_positions"]
        terms, sampled, gen_logits = {}, None, None
        if name == "mlm":
            inputs = masked["masked_input_ids"]
        else:
            gen_logits, _ = self.generator(model, masked, batch, seeds[2], training)
            if self.has_generator:
                terms["generator"] = self.generator_mlm_term(gen_logits, masked, denominators)
            sampled = self.sample(gen_logits, masked, seeds[1])
            inputs, _ = obj.corrupt(batch["input_ids"], positions, sampled, w)
        hidden = model.discriminator_hidden(inputs, batch["input_mask"], batch["segment_ids"],
                                            training=training, seed=seeds[3])
        if name == "all_tokens_mlm":
            logits = model.mlm_predictions(hidden)                       # [B,L,V]
            copy_logits = model.discriminator_predictions(hidden)        # [B,L]
            loss_sum, _, per_item = obj.copy_mlm_loss_sums(
                logits, copy_logits, inputs, batch["input_ids"], batch["input_mask"])
            item_weights = tf.cast(tf.cast(batch["input_mask"], tf.int32) > 0, tf.float32)
            correct = tf.equal(copy_prediction(logits, copy_logits, inputs),
                               tf.cast(batch["input_ids"], tf.int32))
            den = denominators["disc"]
        else:
            logits = model.mlm_predictions(gather_positions(hidden, positions))  # [B,P,V]
            loss_sum, _, per_item = obj.mlm_loss_sums(logits, ids, w)
            item_weights = w
            correct = tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), ids)
            den = denominators["mlm"]
        terms["mlm"] = loss_sum / tf.maximum(den, _EPS)
        sums = obj.metric_sums(
            input_mask=batch["input_mask"], masked_ids=ids, masked_weights=w,
            sampled_ids=sampled,
            mlm_logits=gen_logits if (sampled is not None and self.has_generator) else None,
            sampling_logits=None if training else gen_logits, main_loss=per_item,
            main_correct=item_weights * tf.cast(correct, tf.float32),
            main_weights=item_weights)
        return terms, sums


def copy_prediction(mlm_logits, copy_logits, input_ids):
    """The copy-mechanism model's most likely token [B,L]: the input token when its
    mixture probability D + (1 - D) p(input) beats (1 - D) max p, else the argmax."""
    probs = tf.nn.softmax(tf.cast(mlm_logits, tf.float32))
    d = tf.sigmoid(tf.cast(copy_logits, tf.float32))
    input_ids = tf.cast(input_ids, tf.int32)
    copy_p = d + (1.0 - d) * obj.pick(probs, input_ids)
    best = tf.argmax(probs, axis=-1, output_type=tf.int32)
    return tf.where(copy_p >= (1.0 - d) * tf.reduce_max(probs, axis=-1), input_ids, best)


def copy_encoder_weights(source, target):
    """Assigns every weight of encoder `source` to the same-named weight of `target`
    (paths compared below their first component, e.g. generator/... -> electra/...)."""
    rel = lambda v: v.path.split("/", 1)[1]
    by_path = {rel(v): v for v in source.weights}
    missing = [v.path for v in target.weights if rel(v) not in by_path]
    if missing or len(by_path) != len(target.weights):
        raise ValueError(f"encoders differ: {missing[:3]} not in {source.name}")
    for v in target.weights:
        src = by_path[rel(v)]
        if tuple(src.shape) != tuple(v.shape):
            raise ValueError(f"{src.path} {tuple(src.shape)} != {v.path} {tuple(v.shape)}")
        v.assign(src.value)


OBJECTIVES: Dict[str, Callable[..., Objective]] = {
    "electra": ElectraObjective, "electra_15": ElectraObjective, "hp_loss": ElectraObjective,
    "hp_dist": ElectraObjective, "adversarial": ElectraObjective,
    "two_stage": ElectraObjective, "mlm": MaskedLMObjective,
    "replace_mlm": MaskedLMObjective, "all_tokens_mlm": MaskedLMObjective}


def build_objective(cfg: PretrainingConfig, special_ids=None, unigram_counts=None) -> Objective:
    name = cfg.objective.objective
    if name not in OBJECTIVES:
        raise ValueError(f"objective.objective={name!r}: expected one of {', '.join(OBJECTIVES)}")
    if cfg.objective.generator == "unigram" and unigram_counts is None:
        raise ValueError("objective.generator=unigram needs token counts (the builder's "
                         "token_counts.txt beside the training data)")
    return OBJECTIVES[name](cfg, special_ids or BERT_SPECIAL_IDS, unigram_counts)
