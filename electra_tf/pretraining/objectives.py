"""Pre-training objectives: (model, batch, seed) -> a scalar loss and additive metric sums,
from the pure functions in `losses.py`. One class per variant under `@register`: the
ELECTRA family overrides `ReplacedTokenDetection`'s hooks, the masked-LM family
`MaskedLM`'s. The rest of an objective (heads, requirements, FLOPs, log line) is its spec,
`objective_specs.SPECS[name]` (docs/objectives.md)."""

import abc
from typing import Dict, List, Optional, Tuple, Type

import numpy as np
from keras import ops

from electra_tf import kernels as K
from electra_tf.pretraining import losses as obj
from electra_tf import rng
from electra_tf.configs import PretrainingConfig
from electra_tf.objective_specs import SPECS

BERT_SPECIAL_IDS = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}
_EPS = 1e-5


# objective name -> its class (filled by @register)
OBJECTIVES: Dict[str, Type["Objective"]] = {}


def register(name: str):
    """Class decorator: `--objective=name` builds this class, with its spec's heads."""
    def add(cls):
        if name in OBJECTIVES:
            raise ValueError(f"objective {name!r} registered twice")
        if name not in SPECS:
            raise ValueError(f"objective {name!r} has no spec in objective_specs.SPECS")
        cls.name, cls.heads = name, SPECS[name].heads
        OBJECTIVES[name] = cls
        return cls
    return add


class Objective(abc.ABC):
    """Base class. `denominators(batch)` depend on the batch alone: the trainer sums them
    over replicas and micro-batches, the loss divides its local sums by them (losses.py).
    The trainer compiles one step per phase (`phases`); `heads` come from the spec."""
    heads: Tuple[str, ...] = ()

    def __init__(self, cfg: PretrainingConfig, special_ids: Dict[str, int],
                 unigram_counts: Optional[np.ndarray] = None):
        self.cfg = cfg
        self.oc = cfg.objective
        self.special = dict(special_ids)
        self.max_predictions = self.oc.predictions_per_seq(cfg.train.max_seq_length)
        self.unigram_counts = unigram_counts
        self.focal_gamma = self.oc.focal_gamma()
        # The run's step counter (the trainer sets it) for a temperature schedule.
        self.global_step = None  # a scalar variable

    def phases(self) -> List[int]:
        """The first global step of each phase (one phase by default)."""
        return [0]

    def on_phase_start(self, model, phase: int):
        """Called (eagerly, before its first step) when phase `phase` > 0 begins."""

    def denominators(self, batch) -> Dict:
        """mlm: real prediction slots; disc: real tokens."""
        _, count = obj.num_to_mask(batch["input_ids"], batch["input_mask"], **self._mask_args())
        return {"mlm": ops.cast(ops.sum(count), "float32"),
                "disc": ops.sum(ops.cast(batch["input_mask"], "float32"))}

    def loss_terms(self, model, batch, seed, denominators, training: bool, phase: int = 0
                   ) -> Tuple[Dict, Dict]:
        """-> ({"generator", "baseline", "sampling", "discriminator" or "mlm": weighted
        scalar loss}, additive metric sums)."""
        seeds = rng.split(seed, 4)  # masking, sampling, generator and disc dropout
        den = {k: ops.maximum(v, _EPS) for k, v in denominators.items()}
        return self.terms(model, batch, self.mask(batch, seeds[0]), seeds, den, training, phase)

    @abc.abstractmethod
    def terms(self, model, batch, masked, seeds, den, training, phase):
        """`loss_terms` of the masking `masked`, with the denominators `den` kept >= _EPS."""

    def loss(self, model, batch, seed, denominators, training: bool, phase: int = 0):
        """-> (scalar float32 loss, dict of additive float32 metric sums)."""
        terms, sums = self.loss_terms(model, batch, seed, denominators, training, phase)
        return K.add_n(list(terms.values())), sums

    # --- shared pieces ---------------------------------------------------------------
    def _mask_args(self):
        s = self.special
        return dict(mask_prob=self.oc.mask_prob, max_predictions=self.max_predictions,
                    mask_id=s["[MASK]"], cls_id=s["[CLS]"], sep_id=s["[SEP]"])

    def mask(self, batch, seed):
        return obj.mask_tokens(
            batch["input_ids"], batch["input_mask"], seed,
            vocab_size=self.cfg.model.vocab_size, mask_token_prob=self.oc.mask_token_prob,
            random_token_prob=self.oc.random_token_prob,
            with_replacement=self.oc.mask_with_replacement, **self._mask_args())

    @property
    def has_generator(self) -> bool:
        """A generator network runs (trained, or fixed)."""
        return self.oc.generator in ("masked_lm", "fixed")

    @property
    def trains_generator(self) -> bool:
        return self.oc.generator == "masked_lm"

    def generator(self, model, masked, batch, seed, training):
        """(proposal logits [B,P,V] at the slots, the generator's hidden states there or
        None). A fixed generator runs forward only: no dropout, no gradient."""
        if self.oc.generator == "uniform":
            return obj.uniform_logits(masked["masked_ids"], self.cfg.model.vocab_size), None
        if self.oc.generator == "unigram":
            return obj.unigram_logits(masked["masked_ids"], self.unigram_counts), None
        fixed = self.oc.generator == "fixed"
        hidden = model.generator_hidden(masked["masked_input_ids"], batch["input_mask"],
                                        batch["segment_ids"], training=training and not fixed,
                                        seed=seed)
        slots = obj.gather_slots(hidden, masked["masked_positions"])
        logits = model.generator_predictions(slots)
        if fixed:
            return ops.stop_gradient(logits), ops.stop_gradient(slots)
        return logits, slots

    def temperature(self):
        """objective.temperature, or the schedule's value at `global_step` (0 if unset)."""
        shape, start, end = self.oc.schedule()
        if shape == "constant":
            return self.oc.temperature
        step = 0 if self.global_step is None else self.global_step
        return obj.scheduled_temperature(step, self.cfg.train.num_train_steps, shape, start,
                                         end)

    def sample(self, logits, masked, seed):
        return obj.categorical_sample(
            logits, seed, self.temperature(),
            disallow_ids=masked["masked_ids"] if self.oc.disallow_correct else None)

    def generator_mlm_term(self, gen_logits, masked, den):
        loss_sum, _, _ = obj.mlm_loss_sums(gen_logits, masked["masked_ids"],
                                           masked["masked_weights"], self.focal_gamma)
        return self.oc.gen_weight * loss_sum / den["mlm"]


class ReplacedTokenDetection(Objective):
    """ELECTRA's replaced-token detection: the generator's MLM (focal with `gen_focal_gamma`) +
    disc_weight x the discriminator's BCE over real tokens. A step masks, proposes
    (`sampling_logits`), samples, corrupts and discriminates; variants override the hooks.
    Samples are discrete, so no discriminator gradient reaches the generator."""
    trains_generator_by_mle = True  # the generator's MLM term

    def sampling_logits(self, model, gen_logits, gen_slots, ids):
        """-> (the logits replacements are drawn from, the sampling head's logits or None)."""
        return gen_logits, None

    def sampling_head_terms(self, terms, hp_logits, gen_logits, sampled, ids, disc_logits,
                            slot_loss, positions, w, den_mlm):
        """Adds the sampling head's term; -> its loss estimate at the samples or None."""
        return None

    def generator_policy_terms(self, terms, model, gen_logits, gen_slots, sampled, slot_loss,
                               w, den_mlm):
        """Adds terms that train the generator from the discriminator's loss (none)."""

    def discriminator_term(self, disc_logits, labels, slot_loss, batch, den):
        disc_sum, _, _ = obj.disc_loss_sums(disc_logits, labels, batch["input_mask"])
        return disc_sum / den["disc"]

    def terms(self, model, batch, masked, seeds, den, training, phase):
        gen_logits, gen_slots = self.generator(model, masked, batch, seeds[2], training)
        return self.detection_terms(model, batch, masked, gen_logits, gen_slots, seeds, den,
                                    training)

    def detection_terms(self, model, batch, masked, gen_logits, gen_slots, seeds, den,
                        training):
        ids, w = masked["masked_ids"], masked["masked_weights"]
        positions = masked["masked_positions"]
        den_mlm, terms = den["mlm"], {}
        if self.trains_generator and self.trains_generator_by_mle:
            terms["generator"] = self.generator_mlm_term(gen_logits, masked, den)
        sampling_logits, hp_logits = self.sampling_logits(model, gen_logits, gen_slots, ids)
        sampled = self.sample(sampling_logits, masked, seeds[1])
        fake_ids, labels = obj.corrupt(batch["input_ids"], positions, sampled, w)
        disc_logits = model.discriminator(fake_ids, batch["input_mask"], batch["segment_ids"],
                                          training=training, seed=seeds[3])
        slot_loss = obj.slot_disc_loss(disc_logits, labels, positions, w)
        hp_estimate = self.sampling_head_terms(terms, hp_logits, gen_logits, sampled, ids,
                                               disc_logits, slot_loss, positions, w, den_mlm)
        self.generator_policy_terms(terms, model, gen_logits, gen_slots, sampled, slot_loss,
                                    w, den_mlm)
        terms["discriminator"] = self.oc.disc_weight * self.discriminator_term(
            disc_logits, labels, slot_loss, batch, den)
        sums = obj.metric_sums(
            input_mask=batch["input_mask"], masked_ids=ids, masked_weights=w,
            sampled_ids=sampled, mlm_logits=gen_logits if self.has_generator else None,
            disc_logits=disc_logits, disc_labels=labels, masked_positions=positions,
            sampling_logits=None if training else sampling_logits,
            hp_estimate=hp_estimate, hp_actual=slot_loss if hp_estimate is not None else None)
        return terms, sums


@register("electra")
class Electra(ReplacedTokenDetection):
    __doc__ = ReplacedTokenDetection.__doc__


@register("electra_15")
class Electra15(ReplacedTokenDetection):
    """ELECTRA 15% (ELECTRA paper 3.5): the discriminator's BCE only over the prediction slots."""

    def discriminator_term(self, disc_logits, labels, slot_loss, batch, den):
        return ops.sum(slot_loss) / den["mlm"]


@register("hp_loss")
class HpLoss(ReplacedTokenDetection):
    """Replacements from a sampling head predicting the discriminator's loss (HP paper 4.1.2)."""

    def sampling_logits(self, model, gen_logits, gen_slots, ids):
        hp_logits = model.sampling_predictions(gen_slots)
        return obj.hp_loss_sampling_logits(gen_logits, hp_logits, ids), hp_logits

    def sampling_head_terms(self, terms, hp_logits, gen_logits, sampled, ids, disc_logits,
                            slot_loss, positions, w, den_mlm):
        hp_at_sample = obj.pick(hp_logits, sampled)
        head_sum, _ = obj.hp_loss_head_sums(
            hp_at_sample, obj.gather_slots(disc_logits, positions), w)
        terms["sampling"] = self.oc.sampling_weight() * head_sum / den_mlm
        return obj.hp_loss_estimate(hp_at_sample, ops.equal(sampled, ids))


@register("hp_dist")
class HpDist(ReplacedTokenDetection):
    """Replacements from a head trained towards p_G x the discriminator's loss (HP paper 4.1.2)."""

    def sampling_logits(self, model, gen_logits, gen_slots, ids):
        hp_logits = model.sampling_predictions(gen_slots)
        return hp_logits, hp_logits

    def sampling_head_terms(self, terms, hp_logits, gen_logits, sampled, ids, disc_logits,
                            slot_loss, positions, w, den_mlm):
        head_sum, _ = obj.hp_dist_head_sums(hp_logits, gen_logits, sampled, slot_loss, w)
        terms["sampling"] = self.oc.sampling_weight() * head_sum / den_mlm
        # The head's loss estimate up to the slot's normaliser: p_S / p_G.
        return ops.exp(obj.pick(ops.log_softmax(hp_logits), sampled) -
                      obj.pick(ops.log_softmax(gen_logits), sampled))


@register("adversarial")
class Adversarial(ReplacedTokenDetection):
    """Adversarial ELECTRA (ELECTRA paper, Appendix F): the generator maximises the
    discriminator's loss by REINFORCE with a learned baseline, no MLE."""
    trains_generator_by_mle = False

    def generator_policy_terms(self, terms, model, gen_logits, gen_slots, sampled, slot_loss,
                               w, den_mlm):
        policy, baseline = obj.reinforce_sums(gen_logits, sampled, slot_loss,
                                              model.baseline_logits(gen_slots), w)
        terms["generator"] = self.oc.gen_weight * policy / den_mlm
        terms["baseline"] = baseline / den_mlm


@register("two_stage")
class TwoStage(ReplacedTokenDetection):
    """Two-stage training (ELECTRA paper 3.2): phase 0 trains the generator alone; phase 1
    copies it into the discriminator and trains that with the generator frozen (the
    learning-rate schedule is not restarted)."""
    trains_generator_by_mle = False  # phase 1: frozen

    def phases(self):
        return [0, self.oc.switch_step(self.cfg.train.num_train_steps)]

    def on_phase_start(self, model, phase):
        if phase == 1:
            copy_encoder_weights(model.generator, model.electra)

    def terms(self, model, batch, masked, seeds, den, training, phase):
        gen_logits, gen_slots = self.generator(model, masked, batch, seeds[2], training)
        if phase == 0:  # the generator alone
            terms = {"generator": self.generator_mlm_term(gen_logits, masked, den)}
            return terms, obj.metric_sums(
                input_mask=batch["input_mask"], masked_ids=masked["masked_ids"],
                masked_weights=masked["masked_weights"], mlm_logits=gen_logits)
        return self.detection_terms(model, batch, masked, ops.stop_gradient(gen_logits),
                                    gen_slots, seeds, den, training)


@register("electric")
class Electric(Objective):
    """ELECTRIC (Clark et al. 2020): the discriminator's energy E per token, trained by
    noise-contrastive estimation (`losses.electric_logits`) against a two-tower cloze
    generator q of the unmasked input, whose loss is -log q at every maskable position.
    Metrics: mlm_* are q's at the slots, disc_* the noise logits'."""

    def denominators(self, batch):
        """+ cloze: the maskable positions."""
        out = super().denominators(batch)
        candidates, _ = obj.num_to_mask(batch["input_ids"], batch["input_mask"],
                                        **self._mask_args())
        out["cloze"] = ops.sum(ops.cast(candidates, "float32"))
        return out

    def terms(self, model, batch, masked, seeds, den, training, phase):
        ids, w = masked["masked_ids"], masked["masked_weights"]
        positions = masked["masked_positions"]
        input_ids = batch["input_ids"]
        hidden = model.generator_hidden(input_ids, batch["input_mask"], batch["segment_ids"],
                                        training=training, seed=seeds[2])
        cloze_logits = model.generator_predictions(hidden)  # [B, L, V] float32
        candidates, _ = obj.num_to_mask(input_ids, batch["input_mask"], **self._mask_args())
        cloze_sum, _, _ = obj.mlm_loss_sums(cloze_logits, input_ids, candidates,
                                            self.focal_gamma)
        terms = {"generator": self.oc.gen_weight * cloze_sum / den["cloze"]}
        slot_logits = obj.gather_slots(cloze_logits, positions)
        sampled = self.sample(slot_logits, masked, seeds[1])
        fake_ids, labels = obj.corrupt(input_ids, positions, sampled, w, label_all_slots=True)
        energies = model.discriminator(fake_ids, batch["input_mask"], batch["segment_ids"],
                                       training=training, seed=seeds[3])
        log_q = obj.pick(ops.log_softmax(cloze_logits), fake_ids)
        disc_logits = obj.electric_logits(energies, log_q, self.oc.mask_prob)
        disc_sum, _, _ = obj.disc_loss_sums(disc_logits, labels, batch["input_mask"])
        terms["discriminator"] = self.oc.disc_weight * disc_sum / den["disc"]
        sums = obj.metric_sums(
            input_mask=batch["input_mask"], masked_ids=ids, masked_weights=w,
            sampled_ids=sampled, mlm_logits=slot_logits, disc_logits=disc_logits,
            disc_labels=labels, masked_positions=positions,
            sampling_logits=None if training else slot_logits)
        return terms, sums


class MaskedLM(Objective):
    """Objectives whose main model is a masked LM (ELECTRA paper 3.5): an MLM head on the
    discriminator-sized encoder, term "mlm"; variants override `encoder_inputs` and `main_loss`."""

    def encoder_inputs(self, model, batch, masked, seeds, den, training, terms):
        """-> (the ids the encoder reads: samples at the slots, the samples, their logits)."""
        gen_logits, _ = self.generator(model, masked, batch, seeds[2], training)
        if self.trains_generator:
            terms["generator"] = self.generator_mlm_term(gen_logits, masked, den)
        sampled = self.sample(gen_logits, masked, seeds[1])
        inputs, _ = obj.corrupt(batch["input_ids"], masked["masked_positions"], sampled,
                                masked["masked_weights"])
        return inputs, sampled, gen_logits

    def main_loss(self, model, hidden, inputs, batch, masked, den):
        """-> (loss sum, per-item losses, item weights, per-item correct, denominator) of
        the originals at the slots."""
        ids, w = masked["masked_ids"], masked["masked_weights"]
        logits = model.mlm_predictions(obj.gather_slots(hidden, masked["masked_positions"]))
        loss_sum, _, per_item = obj.mlm_loss_sums(logits, ids, w)
        correct = ops.equal(K.argmax(logits), ids)
        return loss_sum, per_item, w, correct, den["mlm"]

    def terms(self, model, batch, masked, seeds, den, training, phase):
        terms = {}
        inputs, sampled, gen_logits = self.encoder_inputs(model, batch, masked, seeds, den,
                                                          training, terms)
        hidden = model.discriminator_hidden(inputs, batch["input_mask"], batch["segment_ids"],
                                            training=training, seed=seeds[3])
        loss_sum, per_item, item_weights, correct, main_den = self.main_loss(
            model, hidden, inputs, batch, masked, den)
        terms["mlm"] = loss_sum / main_den
        sums = obj.metric_sums(
            input_mask=batch["input_mask"], masked_ids=masked["masked_ids"],
            masked_weights=masked["masked_weights"], sampled_ids=sampled,
            mlm_logits=gen_logits if (sampled is not None and self.has_generator) else None,
            sampling_logits=None if training else gen_logits, main_loss=per_item,
            main_correct=item_weights * ops.cast(correct, "float32"),
            main_weights=item_weights)
        return terms, sums


@register("mlm")
class Mlm(MaskedLM):
    """BERT: no generator; the encoder reads `mask_tokens`' corruption (85/0/15 officially,
    BERT's 80/10/10 with mask_token_prob=0.8, random_token_prob=0.1)."""

    def encoder_inputs(self, model, batch, masked, seeds, den, training, terms):
        return masked["masked_input_ids"], None, None


@register("replace_mlm")
class ReplaceMlm(MaskedLM):
    """Replace MLM: the slots hold generator samples instead of [MASK]; MLM loss there."""


@register("all_tokens_mlm")
class AllTokensMlm(MaskedLM):
    """All-tokens MLM: replace_mlm predicting every real token with the copy mechanism."""

    def main_loss(self, model, hidden, inputs, batch, masked, den):
        logits = model.mlm_predictions(hidden)                       # [B,L,V]
        copy_logits = model.discriminator_predictions(hidden)        # [B,L]
        loss_sum, _, per_item = obj.copy_mlm_loss_sums(
            logits, copy_logits, inputs, batch["input_ids"], batch["input_mask"])
        item_weights = ops.cast(ops.cast(batch["input_mask"], "int32") > 0, "float32")
        correct = ops.equal(copy_prediction(logits, copy_logits, inputs),
                           ops.cast(batch["input_ids"], "int32"))
        return loss_sum, per_item, item_weights, correct, den["disc"]


def copy_prediction(mlm_logits, copy_logits, input_ids):
    """The copy-mechanism model's most likely token [B,L]: the input token when its
    mixture probability D + (1 - D) p(input) beats (1 - D) max p, else the argmax."""
    probs = ops.softmax(ops.cast(mlm_logits, "float32"))
    d = ops.sigmoid(ops.cast(copy_logits, "float32"))
    input_ids = ops.cast(input_ids, "int32")
    copy_p = d + (1.0 - d) * obj.pick(probs, input_ids)
    best = K.argmax(probs)
    return ops.where(copy_p >= (1.0 - d) * ops.max(probs, axis=-1), input_ids, best)


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


def build_objective(cfg: PretrainingConfig, special_ids=None, unigram_counts=None) -> Objective:
    name = cfg.objective.objective
    if name not in OBJECTIVES:
        raise ValueError(f"objective.objective={name!r}: expected one of {', '.join(OBJECTIVES)}")
    if cfg.objective.generator == "unigram" and unigram_counts is None:
        raise ValueError("objective.generator=unigram needs token counts (the builder's "
                         "token_counts.txt beside the training data)")
    return OBJECTIVES[name](cfg, special_ids or BERT_SPECIAL_IDS, unigram_counts)
