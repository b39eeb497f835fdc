"""The pre-training run: data, strategy, checkpoints, the loop, logging and evaluation.

`run(options)` is everything `run_pretraining.py` does after parsing flags: it resumes
from the newest checkpoint in `model_dir`, trains to `num_train_steps` in host loops of
`steps_per_loop` compiled steps, logs and writes TensorBoard scalars (throughput and MFU
included), profiles the steps asked for, and leaves a discriminator-only checkpoint in the
released TF1 layout for fine-tuning.
"""

import contextlib
import dataclasses
import os
import time
from typing import Dict, Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf
from absl import logging

from electra_tf import distribute, fileio, flops, hardware, input_pipeline
from electra_tf.checkpoints import remove_torn_checkpoints, save_checkpoint
from electra_tf.preemption import PreemptionWatch
from electra_tf.configs import PretrainingConfig
from electra_tf.modeling import discriminator_variables, save_tf1_checkpoint
from electra_tf.objectives import BERT_SPECIAL_IDS
from electra_tf.pretraining import Pretrainer, summarize

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # local: this package
SAMPLE_CACHE = os.path.join("cache", "tfrecords")


class RunError(ValueError):
    """A problem with the run's flags or data, reported as one line."""


# With on_nan=skip, this many non-finite steps in a row stop the run (float16 loss
# scaling needs at most ~25 to come down from 2^15 after an overflow).
MAX_CONSECUTIVE_SKIPS = 100

@dataclasses.dataclass(frozen=True)
class RunOptions:
    model_dir: str
    train_data: Optional[str] = None  # glob(s) or build dir; None = the bundled sample
    eval_data: Optional[str] = None
    do_train: bool = True
    do_eval: bool = False
    strategy: str = "auto"
    tpu: Optional[str] = None
    tpu_zone: Optional[str] = None
    gcp_project: Optional[str] = None
    jit_compile: Optional[bool] = None
    # "START,END" or (START, END): trace global steps START+1..END with the profiler.
    profile_steps: Union[None, str, Tuple[int, int]] = None
    # Peak FLOP/s of one device for MFU (`hardware.peak_flops`); None: table or measured.
    peak_flops: Union[None, str, float] = None


def parse_profile_steps(value) -> Optional[Tuple[int, int]]:
    """--profile_steps "START,END" (or a pair) -> (START, END), 0 <= START < END."""
    if value is None or value == "":
        return None
    parts = value.split(",") if isinstance(value, str) else list(value)
    try:
        start, end = (int(str(p).strip()) for p in parts)
    except ValueError:
        start = end = -1
    if not 0 <= start < end:
        raise RunError(f"--profile_steps={value if isinstance(value, str) else parts}: "
                       "expected START,END global steps with 0 <= START < END, e.g. 100,110")
    return start, end


# ----------------------------------------------------------------------------- data


def bundled_sample(max_seq_length: int, vocab_size: int) -> str:
    """Builds (once) the bundled Wikipedia sample at this length into ./cache."""
    from tfrecord_builder import DEFAULT_CORPUS, DEFAULT_VOCAB, BuildError
    from tfrecord_builder.build import BuildConfig, build
    if vocab_size != 30522:
        raise RunError(f"no --train_data given, and the bundled sample uses the 30522-token "
                       f"BERT vocabulary but model.vocab_size={vocab_size}")
    out = os.path.join(SAMPLE_CACHE, f"enwiki_sample-seq{max_seq_length}")
    logging.info("No --train_data: using the bundled Wikipedia sample, built in %s", out)
    build_cfg = BuildConfig(output_dir=out, inputs=(DEFAULT_CORPUS,), vocab_file=DEFAULT_VOCAB,
                            max_seq_length=max_seq_length, num_shards=16,
                            num_workers=min(2, os.cpu_count() or 1))
    try:
        build(build_cfg)  # a finished identical build is reused as it is
    except BuildError:  # the cache holds another build of ours (older builder): replace it
        build(dataclasses.replace(build_cfg, overwrite=True))
    return out


def resolve_data(options: RunOptions, cfg: PretrainingConfig):
    """-> (train files, eval files, manifest or None). The bundled sample holds out its
    last shard for evaluation."""
    tc = cfg.train
    train_pattern, eval_pattern = options.train_data, options.eval_data
    held_out = None
    if not train_pattern:
        train_pattern = bundled_sample(tc.max_seq_length, cfg.model.vocab_size)
        files = input_pipeline.resolve_files(train_pattern, tc.on_bad_shard)
        files, held_out = files[:-1], files[-1:]
    else:
        files = input_pipeline.resolve_files(train_pattern, tc.on_bad_shard)
    manifest = input_pipeline.check_data(train_pattern, vocab_size=cfg.model.vocab_size,
                                         max_seq_length=tc.max_seq_length,
                                         on_bad_shard=tc.on_bad_shard)
    input_pipeline.check_sequence_length(files[:1], tc.max_seq_length, tc.on_bad_shard)
    if eval_pattern:
        eval_files = input_pipeline.resolve_files(eval_pattern, tc.on_bad_shard)
        input_pipeline.check_data(eval_pattern, vocab_size=cfg.model.vocab_size,
                                  max_seq_length=tc.max_seq_length,
                                  on_bad_shard=tc.on_bad_shard)
    elif held_out:
        eval_files = held_out
    elif options.do_eval:
        raise RunError("--do_eval needs --eval_data (held-out shards)")
    else:
        eval_files = []
    return files, eval_files, manifest


def input_config(files, cfg: PretrainingConfig, batch_size: int, training: bool,
                 skip_batches: int = 0) -> input_pipeline.InputConfig:
    """The input pipeline of a run: deterministic for the seed, so it can be resumed.

    tf.data's shuffles also depend on TensorFlow's global seed, which `Pretrainer` sets
    from the same seed: make the dataset after the trainer, as `run` does."""
    return input_pipeline.InputConfig(
        file_pattern=",".join(files), max_seq_length=cfg.train.max_seq_length,
        batch_size=batch_size, repeat=True, deterministic=True, seed=cfg.train.seed,
        check_data=False, shuffle_buffer=10_000 if training else 1,
        skip_batches=skip_batches, on_bad_shard=cfg.train.on_bad_shard)


def _dataset(strategy, icfg: input_pipeline.InputConfig):
    return strategy.distribute_datasets_from_function(
        lambda ctx: input_pipeline.make_dataset(icfg, ctx))


def _special_ids_and_counts(manifest: Optional[dict], files, cfg: PretrainingConfig):
    special = dict(BERT_SPECIAL_IDS)
    counts = None
    if manifest:
        special.update(manifest["tokenizer"].get("special_token_ids", {}))
        if cfg.objective.generator == "unigram":
            base = os.path.dirname(files[0])
            with fileio.open_file(fileio.join(base, manifest["token_counts_file"])) as f:
                counts = np.loadtxt(f, dtype=np.int64)
    return special, counts


# ----------------------------------------------------------------------------- logging


def _format_time(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def format_log_line(step: int, total: int, out, lr: float, seqs_per_s: float,
                    eta_s: float, flops_per_s: Optional[float] = None,
                    mfu: Optional[float] = None) -> str:
    m = out.metrics
    parts = [f"step {step}/{total}", f"loss {out.loss:.4f}"]
    if "masked_lm_loss" in m:
        parts.append(f"mlm_loss {m['masked_lm_loss']:.4f} mlm_acc {m['masked_lm_accuracy']:.4f}")
    if "main_lm_loss" in m:
        parts.append(f"main_lm_loss {m['main_lm_loss']:.4f} "
                     f"main_lm_acc {m['main_lm_accuracy']:.4f}")
    if "disc_loss" in m:
        parts.append(f"disc_loss {m['disc_loss']:.4f} disc_acc {m['disc_accuracy']:.4f} "
                     f"disc_auc {m['disc_auc']:.4f} replaced {m['replaced_fraction']:.3f}")
    if "hp_loss_corr" in m:
        parts.append(f"hp_corr {m['hp_loss_corr']:.3f}")
    parts.append(f"lr {lr:.3g}")
    parts.append(f"{seqs_per_s:.1f} seq/s")
    if flops_per_s is not None:
        parts.append(hardware.format_flops(flops_per_s) +
                     ("" if mfu is None else f" MFU {100 * mfu:.1f}%"))
    parts.append(f"ETA {_format_time(eta_s)}")
    if out.skipped_steps:
        parts.append(f"skipped {out.skipped_steps} non-finite step(s)")
    return " | ".join(parts)


def _write_scalars(writer, step: int, out, extra: Dict[str, float]):
    with writer.as_default(step=step):
        tf.summary.scalar("loss", out.loss)
        for k, v in out.metrics.items():
            tf.summary.scalar(k, v)
        for k, v in extra.items():
            tf.summary.scalar(k, v)
    writer.flush()


# ----------------------------------------------------------------------------- run


def resolve_precision(cfg: PretrainingConfig, strategy) -> PretrainingConfig:
    """`train.precision=auto` -> bfloat16 on TPU, float32 elsewhere."""
    if cfg.train.precision != "auto":
        return cfg
    precision = distribute.default_precision(strategy)
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, precision=precision))


def run(cfg: PretrainingConfig, options: RunOptions) -> Dict[str, float]:
    """Trains and/or evaluates; returns the last logged (or eval) metrics.

    Every process of a multi-worker job calls this; only the chief writes the run's
    outputs (config, summaries, checkpoints in `model_dir`, the discriminator export).
    """
    profile_steps = parse_profile_steps(options.profile_steps)
    if options.peak_flops is not None:
        try:
            hardware.parse_flops(options.peak_flops)
        except ValueError as e:
            raise RunError(f"--peak_flops={options.peak_flops}: {e}") from None
    strategy = distribute.make_strategy(options.strategy, options.tpu, options.tpu_zone,
                                        options.gcp_project)
    cfg = resolve_precision(cfg, strategy)
    tc = cfg.train
    distribute.set_precision(tc.precision)
    chief = distribute.is_chief(strategy)
    input_pipeline.reset_skipped_shards()
    files, eval_files, manifest = resolve_data(options, cfg)
    special, counts = _special_ids_and_counts(manifest, files, cfg)
    fileio.makedirs(options.model_dir)
    if chief:  # a rename (a whole-object upload on a bucket): never a torn config.json
        fileio.write_json_atomic(fileio.join(options.model_dir, "config.json"), cfg.to_json())

    trainer = Pretrainer(cfg, strategy, special, counts, jit_compile=options.jit_compile)
    ckpt = trainer.checkpoint()
    if chief:
        remove_torn_checkpoints(options.model_dir)
    latest = tf.train.latest_checkpoint(options.model_dir)
    if latest:
        ckpt.restore(latest).assert_existing_objects_matched()
        logging.info("Resumed from %s (step %d)", latest, int(trainer.global_step.numpy()))
    manager = tf.train.CheckpointManager(ckpt, distribute.worker_dir(options.model_dir,
                                                                     strategy),
                                         max_to_keep=tc.keep_checkpoint_max,
                                         step_counter=trainer.global_step)

    result: Dict[str, float] = {}
    if options.do_train:
        # The data order is a function of the seed, so a resumed run continues it exactly
        # by passing over the batches its checkpoint has already consumed.
        train_ds = _dataset(strategy, input_config(
            files, cfg, tc.train_batch_size, True, int(trainer.data_batches.numpy())))
        result = _train(cfg, trainer, iter(train_ds), manager, options.model_dir, chief,
                        Perf.of(cfg, strategy, options.peak_flops), profile_steps, files)
        if chief:
            export_discriminator(trainer.model, options.model_dir)
    if options.do_eval and eval_files:
        result = evaluate(cfg, trainer, strategy, eval_files, options.model_dir, chief)
    if not chief:
        fileio.rmtree(manager.directory)
    return result


def export_discriminator(model, model_dir: str) -> str:
    """Writes MODEL_DIR/discriminator/model.ckpt: the discriminator alone, under the
    released TF1 names (what fine-tuning loads), with a `checkpoint` state file so that
    tf.train.latest_checkpoint finds it. Returns the prefix."""
    directory = fileio.join(model_dir, "discriminator")
    prefix = save_tf1_checkpoint(model, fileio.join(directory, "model.ckpt"),
                                 discriminator_variables(model))
    # The state file, written after the checkpoint it names, marks the export complete.
    fileio.write_atomic(fileio.join(directory, "checkpoint"),
                        'model_checkpoint_path: "model.ckpt"\n'
                        'all_model_checkpoint_paths: "model.ckpt"\n')
    logging.info("Discriminator-only checkpoint (released TF1 layout): %s", prefix)
    return prefix


def _summary_writer(model_dir: str, name: str, chief: bool):
    if not chief:
        return tf.summary.create_noop_writer()
    return tf.summary.create_file_writer(fileio.join(model_dir, name))


class _Progress:
    """Sequences/s since the last log line and an ETA from the rate after the first host
    loop (compilation is paid once and would otherwise inflate the ETA for long)."""

    def __init__(self, step: int, total: int, batch_size: int):
        self.total, self.batch_size = total, batch_size
        self.start = self.last = (step, time.monotonic())
        self.warm = None  # (step, time) after the first host loop

    def loop_done(self, step: int):
        if self.warm is None:
            self.warm = (step, time.monotonic())

    def rates(self, step: int):
        """-> (sequences per second since the last call, ETA in seconds)."""
        now = time.monotonic()
        seqs_per_s = (step - self.last[0]) * self.batch_size / max(now - self.last[1], 1e-9)
        since_step, since = self.warm if self.warm and step > self.warm[0] else self.start
        rate = (step - since_step) / max(now - since, 1e-9)
        self.last = (step, now)
        return seqs_per_s, (self.total - step) / rate if rate > 0 else float("nan")


@dataclasses.dataclass(frozen=True)
class Perf:
    """What a log line's FLOP/s and MFU need: the hardware-convention train FLOPs of one
    step (`flops.HARDWARE`: the matmuls the step executes, backward = 2 x forward) and the
    peak FLOP/s of all devices (None: unknown, FLOP/s without MFU)."""
    flops_per_step: float
    peak: Optional[float]

    @classmethod
    def of(cls, cfg: PretrainingConfig, strategy, peak_override=None) -> "Perf":
        per_step = flops.count_config(cfg, flops.HARDWARE).train_per_step()["total"]
        peak, where = hardware.peak_flops(strategy, cfg.train.precision, peak_override)
        logging.info("Train step: %.4g FLOPs (hardware convention); peak %s (%s)", per_step,
                     "unknown" if peak is None else hardware.format_flops(peak), where)
        return cls(per_step, peak)

    def rates(self, seqs_per_s: float, batch_size: int) -> Dict[str, float]:
        achieved = seqs_per_s / batch_size * self.flops_per_step
        out = {"perf/flops_per_second": achieved}
        if self.peak:
            out["perf/mfu"] = achieved / self.peak
        return out


class _ProfileWindow:
    """Traces global steps START+1..END with the TensorFlow profiler into
    <model_dir>/train/plugins/profile/<run>/ (TensorBoard's Profile tab reads it).

    `n_until_boundary` ends host loops at START and END, so a trace holds exactly those
    steps; every worker of a job ends its loops there (the loops are collective), only
    the chief traces."""

    def __init__(self, steps: Optional[Tuple[int, int]], logdir: str, enabled: bool):
        self.steps, self.logdir, self.enabled = steps, logdir, enabled and steps is not None
        self.active = False

    def n_until_boundary(self, step: int, n: int) -> int:
        for boundary in self.steps or ():
            if boundary > step:
                n = min(n, boundary - step)
        return n

    def before_loop(self, step: int):
        if not self.enabled or self.active or not self.steps[0] <= step < self.steps[1]:
            return
        try:
            tf.profiler.experimental.start(self.logdir)
        except tf.errors.AlreadyExistsError:  # another trace is under way in this process
            logging.warning("--profile_steps: a profiler is already running; no trace")
            self.enabled = False
            return
        self.active = True
        logging.info("Profiling global steps %d..%d", step + 1, self.steps[1])

    def after_loop(self, step: int):
        if self.active and step >= self.steps[1]:
            self.stop()
            logging.info("Profiler trace up to step %d in %s", step,
                         fileio.join(self.logdir, "plugins", "profile"))

    def stop(self):
        if self.active:
            tf.profiler.experimental.stop()
            self.active, self.enabled = False, False

    def __enter__(self):
        return self

    def __exit__(self, *exc):  # training ended before END, or failed: keep what ran
        self.stop()


def _train(cfg, trainer: Pretrainer, iterator, manager, model_dir, chief: bool = True,
           perf: Optional[Perf] = None,
           profile_steps: Optional[Tuple[int, int]] = None,
           files: Sequence[str] = ()) -> Dict[str, float]:
    tc = cfg.train
    total = tc.num_train_steps
    writer = _summary_writer(model_dir, "train", chief)
    loops = {}  # one compiled host loop per phase of the objective
    step = int(trainer.global_step.numpy())
    if step >= total:
        logging.info("Already at step %d of %d: nothing to train", step, total)
        return {}
    progress = _Progress(step, total, tc.train_batch_size)
    last_saved = step  # a loop of only skipped (non-finite) steps does not save again
    out_metrics: Dict[str, float] = {}
    sums = None
    bad_run = 0  # consecutive skipped (non-finite) steps
    reported_shards = 0  # bad shards skipped (on_bad_shard=skip) and logged so far
    # A preemption notice stops the run at the end of the current host loop, after a
    # checkpoint (multi-worker: at a step agreed with the other workers).
    with (PreemptionWatch(trainer.strategy) as preemption,
          _ProfileWindow(profile_steps, fileio.join(model_dir, "train"), chief) as profile):
        while step < total:
            # Stop each host loop at the next log, checkpoint, phase or profile boundary.
            n = profile.n_until_boundary(step, min(
                tc.steps_per_loop, total - step,
                tc.log_every_steps - step % tc.log_every_steps,
                tc.save_checkpoints_steps - step % tc.save_checkpoints_steps,
                trainer.steps_left_in_phase(step) or total))
            phase = trainer.phase_at(step)
            if phase not in loops:
                loops[phase] = trainer.make_train_loop(phase)
            trainer.enter_phase(step)
            profile.before_loop(step)
            with _read_errors(files, manager):
                loop_sums = loops[phase](iterator, tf.constant(n))
            trainer.data_batches.assign_add(n)
            sums = loop_sums if sums is None else {k: sums[k] + loop_sums[k] for k in sums}
            step = int(trainer.global_step.numpy())  # waits for the loop's steps
            profile.after_loop(step)
            skipped_shards = input_pipeline.skipped_shards()
            if len(skipped_shards) > reported_shards:
                reported_shards = len(skipped_shards)
                logging.warning("%d bad shard(s) skipped so far: %s", reported_shards,
                                ", ".join(s.path for s in skipped_shards[:5]))
            skipped = int(round(float(loop_sums["skipped"])))
            bad_run = bad_run + skipped if skipped == n else 0
            if skipped and (tc.on_nan == "stop" or bad_run >= MAX_CONSECUTIVE_SKIPS):
                why = ("on_nan=stop" if tc.on_nan == "stop" else
                       f"{bad_run} steps in a row, the run cannot recover")
                raise RunError(f"non-finite loss or gradients at step {step + 1} ({why}; no "
                               "such step is applied); last good checkpoint: "
                               f"{manager.latest_checkpoint or 'none'}")
            if step % tc.log_every_steps == 0 or step >= total:
                out, sums = summarize(sums), None
                seqs_per_s, eta = progress.rates(step)
                lr = float(trainer.optimizer.learning_rate(step))
                rates = perf.rates(seqs_per_s, tc.train_batch_size) if perf else {}
                logging.info(format_log_line(step, total, out, lr, seqs_per_s, eta,
                                             rates.get("perf/flops_per_second"),
                                             rates.get("perf/mfu")))
                _write_scalars(writer, step, out, {"learning_rate": lr,
                                                   "grad_norm": out.grad_norm,
                                                   "sequences_per_second": seqs_per_s,
                                                   "input/skipped_shards": reported_shards,
                                                   **rates})
                out_metrics = dict(out.metrics, loss=out.loss, **rates)
            saved = step != last_saved and (step % tc.save_checkpoints_steps == 0 or
                                            step >= total)
            if saved:
                last_saved = step
                logging.info("Saved checkpoint %s", save_checkpoint(manager, step))
            preemption.stop_if_noticed(step, lambda: manager.latest_checkpoint if saved
                                       else save_checkpoint(manager, step))
            progress.loop_done(step)
    return out_metrics


@contextlib.contextmanager
def _read_errors(files: Sequence[str], manager):
    """Turns a TFRecord read failure inside a compiled loop into a one-line RunError
    naming the shard (and the last good checkpoint); nothing is saved on that path."""
    try:
        yield
    except tf.errors.OpError as e:
        bad = input_pipeline.explain_read_error(e, files)
        if bad is None:
            raise
        last = manager.latest_checkpoint if manager is not None else None
        raise RunError(f"{bad}" + (f"; last good checkpoint: {last or 'none'}"
                                   if manager is not None else "")) from None


def evaluate(cfg, trainer: Pretrainer, strategy, files, model_dir,
             chief: bool = True) -> Dict[str, float]:
    """The objective's metrics over held-out shards, no dropout, `max_eval_steps` batches."""
    tc = cfg.train
    ds = _dataset(strategy, input_config(files, cfg, tc.eval_batch_size, False))
    loop = trainer.make_eval_loop()
    with _read_errors(files, None):
        out = summarize(loop(iter(ds), tf.constant(tc.max_eval_steps)))
    step = int(trainer.global_step.numpy())
    metrics = dict(out.metrics, loss=out.loss)
    logging.info("eval at step %d over %d batches of %d: %s", step, tc.max_eval_steps,
                 tc.eval_batch_size, " ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    if chief:
        _write_scalars(_summary_writer(model_dir, "eval", chief), step, out, {})
        fileio.write_json_atomic(fileio.join(model_dir, "eval_results.json"),
                                 dict(metrics, step=step))
    return metrics
