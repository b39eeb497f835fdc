"""The pre-training run: data, strategy, checkpoints, the loop, logging and evaluation. `run` is
everything `run_pretraining.py` does after parsing flags: it resumes from the newest checkpoint
in `model_dir`, trains to `num_train_steps` in host loops of `steps_per_loop` compiled steps,
logs and writes TensorBoard scalars (throughput and MFU included), profiles the steps asked for,
and leaves a discriminator-only checkpoint in the released TF1 layout for fine-tuning."""

import contextlib
import os
from typing import Dict, Optional, Sequence

import numpy as np
from absl import logging

from electra_tf import REPO_DATA, fileio, text
from electra_tf.data import dataset, files as data_files, shards
from electra_tf.pretraining import flops
from electra_tf.training import backends, hardware
from electra_tf.pretraining import losses as obj
from electra_tf.configs import PretrainingConfig
from electra_tf.conversion.source import resolve
from electra_tf.training.checkpoints import save_tf1_checkpoint
from electra_tf.model.modeling import discriminator_variables, tf1_variables
from electra_tf.pretraining.objectives import BERT_SPECIAL_IDS
from electra_tf.pretraining.trainer import make_pretrainer
from electra_tf.training import lease, loop
from electra_tf.training.loop import RunError, summarize
from electra_tf.training.options import PretrainingOptions
from electra_tf.training.runtime import Devices, Runtime


def resolve_data(options: PretrainingOptions, cfg: PretrainingConfig):
    """-> (train files, eval files, manifest or None)."""
    tc = cfg.train
    train_pattern, eval_pattern = options.train_data, options.eval_data
    if not train_pattern:
        if options.do_train or not eval_pattern:
            raise RunError("no training data: give --train_data (TFRecord globs or a "
                           "tfrecord_builder output directory)")
        train_pattern = eval_pattern  # evaluation only: its data gives the manifest

    def checked(pattern):  # -> (files, manifest or None)
        return (data_files.resolve_files(pattern, tc.on_bad_shard), data_files.check_data(
            pattern, vocab_size=cfg.model.vocab_size, max_seq_length=tc.max_seq_length,
            on_bad_shard=tc.on_bad_shard))

    files, manifest = checked(train_pattern)
    data_files.check_sequence_length(files[:1], tc.max_seq_length, tc.on_bad_shard)
    if options.do_eval and not eval_pattern:
        raise RunError("--do_eval needs --eval_data (held-out shards)")
    eval_files = checked(eval_pattern)[0] if eval_pattern else []
    return files, eval_files, manifest


def input_config(files, cfg: PretrainingConfig, batch_size: int, training: bool,
                 skip_batches: int = 0) -> dataset.InputConfig:
    """The input pipeline of a run, deterministic for the seed so it can be resumed: tf.data's
    shuffles also depend on TensorFlow's global seed, which the runtime sets from the same
    seed, so make the dataset after the trainer, as `run` does."""
    return dataset.InputConfig(
        file_pattern=",".join(files), max_seq_length=cfg.train.max_seq_length,
        batch_size=batch_size, repeat=True, deterministic=True, seed=cfg.train.seed,
        check_data=False, shuffle_buffer=10_000 if training else 1,
        skip_batches=skip_batches, on_bad_shard=cfg.train.on_bad_shard)


def _dataset(devices: Devices, icfg: dataset.InputConfig, log: shards.ShardLog):
    """The run's input over its replicas (`Devices.dataset`: this process's pipeline of its
    share of each global batch). (Releasing a strategy's iterator waited 18-37 s after the
    last step of some runs for tf.data's autotuning thread, which `dataset.make_dataset`
    now turns off.)"""
    return devices.dataset(lambda ctx: dataset.make_input(icfg, ctx, log))


def special_ids_and_counts(manifest: Optional[dict], files, cfg: PretrainingConfig):
    special = dict(BERT_SPECIAL_IDS)
    counts = None
    if manifest:
        special.update(manifest["tokenizer"].get("special_token_ids", {}))
        if cfg.objective.generator == "unigram":
            base = os.path.dirname(files[0])
            with fileio.open_file(fileio.join(base, manifest["token_counts_file"])) as f:
                counts = np.loadtxt(f, dtype=np.int64)
    return special, counts


def run(cfg: PretrainingConfig, options: PretrainingOptions) -> Dict[str, float]:
    """Trains and/or evaluates; returns the last logged (or eval) metrics. Every process of
    a multi-worker job calls this; only the chief writes the run's outputs (config,
    summaries, checkpoints in `model_dir`, the discriminator export)."""
    profile_steps = loop.parse_profile_steps(options.profile_steps)
    if options.peak_flops is not None:
        try:
            hardware.parse_flops(options.peak_flops)
        except ValueError as e:
            raise RunError(f"--peak_flops={options.peak_flops}: {e}") from None
    devices, cfg, chief = backends.setup(options, cfg)
    files, eval_files, manifest = resolve_data(options, cfg)
    special, counts = special_ids_and_counts(manifest, files, cfg)
    loop.check_writable(options.model_dir, "--model_dir")
    # One writer per run directory, from before its first write (lease.py).
    with lease.hold(options.model_dir, writer=chief) as run_lease:
        tc = cfg.train
        trainer = make_pretrainer(cfg, devices, special, counts, options.jit_compile)
        manager = loop.open_checkpoints(trainer, options.model_dir,
                                        devices.worker_dir(options.model_dir),
                                        max_to_keep=tc.keep_checkpoint_max, clean=chief)
        # After the checkpoints are resolved (a directory none of whose checkpoints is
        # complete stops the run unchanged); a rename, so never a torn config.json.
        if chief:
            fileio.write_json_atomic(fileio.join(options.model_dir, "config.json"), cfg.to_json())
            record_vocab(options.model_dir, manifest, files)
        if cfg.objective.generator == "fixed" and trainer.step == 0:
            source = load_fixed_generator(trainer.model, cfg.objective.generator_checkpoint)
            trainer.model_changed()
            logging.info("Fixed generator (forward only) from %s", source)

        result: Dict[str, float] = {}
        if options.do_train:
            # The data order is a function of the seed, so a resumed run continues it exactly
            # by passing over the batches its checkpoint has already consumed.
            inputs = ShardInputs(files)
            train_ds = _dataset(devices, input_config(
                files, cfg, tc.train_batch_size, True, trainer.data_position), inputs.log)
            per_step = flops.count_config(cfg, flops.HARDWARE).train_per_step()["total"]
            logdir = fileio.join(options.model_dir, "train")
            with loop.summary_writer(logdir, chief) as writer:
                result = loop.train(
                    trainer, iter(train_ds), manager, loop.Schedule.of(tc), what="",
                    writer=writer, chief=chief,
                    perf=loop.Perf.of(per_step, devices, tc.precision, options.peak_flops),
                    profile_steps=profile_steps, profile_dir=logdir, inputs=inputs,
                    metrics_from_sums=obj.metrics_from_sums, lease=run_lease)
            if chief:
                run_lease.check()
                trainer.sync_model()
                export_discriminator(trainer.model, options.model_dir)
        if options.do_eval and eval_files:
            result = evaluate(cfg, trainer, eval_files, options.model_dir, chief, run_lease)
        if not chief and manager.directory != options.model_dir:  # a scratch copy
            fileio.rmtree(manager.directory)
        return result


def record_vocab(model_dir: str, manifest: Optional[dict], files: Sequence[str]):
    """The data's vocabulary and casing into the run directory (`text.record_run_vocab`:
    what fine-tuning, `convert` and the exports read by default), from the build directory
    or, for builds made before builds carried it, the bundled vocabularies."""
    why = text.record_run_vocab(model_dir, manifest, os.path.dirname(files[0]),
                                search=[os.path.join(REPO_DATA, "vocab")])
    if why:
        logging.warning("The run directory records no vocabulary (%s): give --vocab_file "
                        "(and --do_lower_case) to fine-tuning and conversion", why)


def load_fixed_generator(model, path: str) -> str:
    """--generator=fixed: assigns the generator's weights (encoder, embeddings, MLM head) of
    the configured sizes from any `conversion.source` and returns its path; a source whose
    generator shared the discriminator's embeddings gives `electra/embeddings/...`."""
    weights = list(model.generator.weights) + [
        w for w in model.generator_predictions.weights
        if all(w is not g for g in model.generator.weights)]
    src = resolve(path, model.config, "--generator_checkpoint")
    sources, missing = {}, []
    for name, variable in tf1_variables(model, weights).items():
        source = name
        if source not in src.shapes and source.startswith("generator/embeddings/"):
            source = "electra/" + source[len("generator/"):]  # shared in the source
        if source not in src.shapes:
            missing.append(name)
            continue
        if src.shapes[source] != tuple(variable.shape):  # sizes first: the likelier slip
            raise RunError(f"--generator_checkpoint={src.path}: {source} has shape "
                           f"{list(src.shapes[source])}, the configured generator's is "
                           f"{list(variable.shape)} (set model.generator_hidden_size / "
                           "generator_layers to its sizes)")
        sources[source] = variable
    if missing:
        raise RunError(f"--generator_checkpoint={src.path}: no {missing[0]} ({len(missing)} "
                       "generator weights missing; a generator checkpoint has generator/ and "
                       "generator_predictions/ weights of the configured sizes)")
    for source, variable in sources.items():  # all checked: nothing half-assigned
        variable.assign(src.read(source))
    return src.path


def export_discriminator(model, model_dir: str) -> str:
    """Writes MODEL_DIR/discriminator/model.ckpt: the discriminator alone, under the
    released TF1 names (what fine-tuning loads), with a `checkpoint` state file so that
    tf.train.latest_checkpoint finds it. Returns the prefix."""
    directory = fileio.join(model_dir, "discriminator")
    prefix = save_tf1_checkpoint(model, fileio.join(directory, "model.ckpt"),
                                 discriminator_variables(model))
    logging.info("Discriminator-only checkpoint (released TF1 layout): %s", prefix)
    return prefix


class ShardInputs(loop.InputWatch):
    """The TFRecord input of a run: read failures become one-line errors naming the
    shard, and shards skipped as bad (on_bad_shard=skip) are logged and counted. It owns
    the run's ShardLog: give `.log` to the datasets it watches (in this process)."""

    def __init__(self, files: Sequence[str]):
        self.files = files
        self.log = shards.ShardLog()
        self.reported = 0  # bad shards skipped and logged so far

    @contextlib.contextmanager
    def guard(self, manager):
        """Turns a TFRecord read failure inside a compiled loop into a one-line RunError
        naming the shard (and the last good checkpoint); nothing is saved on that path."""
        try:
            yield
        except Exception as e:  # noqa: BLE001 (what is not a read error is raised as it is)
            bad = shards.explain_read_error(e, self.files, self.log)
            if bad is None:
                raise
            last = manager.latest_checkpoint if manager is not None else None
            raise RunError(f"{bad}" + (f"; last good checkpoint: {last or 'none'}"
                                       if manager is not None else "")) from None

    def after_loop(self) -> Dict[str, float]:
        skipped = self.log.skipped()
        if len(skipped) > self.reported:
            self.reported = len(skipped)
            logging.warning("%d bad shard(s) skipped so far: %s", self.reported,
                            ", ".join(s.path for s in skipped[:5]))
        return {"input/skipped_shards": self.reported}


def evaluate(cfg, trainer: Runtime, files, model_dir, chief: bool = True,
             run_lease=None) -> Dict[str, float]:
    """The objective's metrics over held-out shards, no dropout, `max_eval_steps` batches."""
    tc = cfg.train
    inputs = ShardInputs(files)
    ds = _dataset(trainer.devices, input_config(files, cfg, tc.eval_batch_size, False),
                  inputs.log)
    eval_loop = trainer.make_eval_loop()
    with inputs.guard(None), loop.input_ended(trainer):
        out = summarize(eval_loop(iter(ds), tc.max_eval_steps), obj.metrics_from_sums)
    step = trainer.step
    metrics = dict(out.metrics, loss=out.loss)
    logging.info("eval at step %d over %d batches of %d: %s", step, tc.max_eval_steps,
                 tc.eval_batch_size, " ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    if chief:
        with loop.summary_writer(fileio.join(model_dir, "eval"), chief) as writer:
            loop.write_scalars(writer, step, out, {})
        loop.write_results(fileio.join(model_dir, "eval_results.json"),
                           dict(metrics, step=step), run_lease)
    return metrics
