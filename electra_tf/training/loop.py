"""The training loop both jobs share (`train`: host loops of compiled steps) and its one
policy for logging (throughput, ETA, MFU), TensorBoard, non-finite steps, preemption, the
profiler window and checkpoints (`open_checkpoints` resumes a trainer)."""

import contextlib
import dataclasses
import time
from typing import Callable, Dict, Optional, Sequence, Tuple

from absl import logging

from electra_tf import configs, events, fileio
from electra_tf.backend import BackendError
from electra_tf.data import files, manifest
from electra_tf.text import VocabError
from electra_tf.training import hardware
from electra_tf.training.checkpoints import (CheckpointError, newest_complete,
                                             remove_torn_checkpoints, save_checkpoint)
from electra_tf.training.lease import LeaseError
from electra_tf.training.preemption import PreemptionWatch
from electra_tf.training.runtime import Devices, Runtime, StrategyError


class RunError(ValueError):
    """A problem with a run's flags, data or numbers, reported as one line."""


# What a CLI reports as one line (exit code 1) rather than a traceback; a job adds its own.
USER_ERRORS = (configs.ConfigError, RunError, files.InputDataError, VocabError,
               manifest.ManifestError, StrategyError, CheckpointError, LeaseError,
               BackendError)


# With on_nan=skip, this many non-finite steps in a row stop the run (float16 loss
# scaling needs at most ~25 to come down from 2^15 after an overflow).
MAX_CONSECUTIVE_SKIPS = 100


@dataclasses.dataclass(frozen=True)
class Schedule:
    """When the loop logs, saves and stops (`batch_size`: the global batch). on_nan: a
    non-finite step is never applied; "skip" goes on (up to MAX_CONSECUTIVE_SKIPS in a
    row), "stop" stops naming the last good checkpoint."""
    num_train_steps: int
    batch_size: int
    steps_per_loop: int
    log_every_steps: int
    save_checkpoints_steps: int
    on_nan: str = "skip"
    log_each_loop: bool = False  # also log at the end of every host loop

    @classmethod
    def of(cls, train, num_train_steps: Optional[int] = None,
           log_each_loop: bool = False) -> "Schedule":
        """A job's schedule from its `TrainConfig` (`num_train_steps`: when the job computes
        it)."""
        return cls(num_train_steps or train.num_train_steps, train.train_batch_size,
                   train.steps_per_loop,
                   train.steps_per_loop if log_each_loop else train.log_every_steps,
                   train.save_checkpoints_steps, train.on_nan, log_each_loop)


def check_writable(path: str, flag: str):
    """Fails at the start of a run, not after training, if `path` cannot be written."""
    problem = fileio.writable_dir_problem(path)
    if problem:
        raise RunError(f"{flag}={path}: cannot write there: {problem}")


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


# ----------------------------------------------------------------------------- logging


@dataclasses.dataclass
class LoopOutput:
    """What one or more host loops report (Python numbers)."""
    loss: float
    metrics: Dict[str, float]
    grad_norm: float
    skipped_steps: int


def summarize(sums: Dict, metrics_from_sums: Callable = lambda sums: sums) -> LoopOutput:
    """Metric sums of one or more steps (`update.step_sums`' keys and the job's) -> the
    reported numbers (`metrics_from_sums` turns the job's own sums into its metrics)."""
    sums = dict(sums)
    steps = max(float(sums.pop("steps")), 1.0)
    loss = float(sums.pop("loss_sum")) / steps
    skipped = int(round(float(sums.pop("skipped", 0.0))))
    norm = float(sums.pop("grad_norm_sum", 0.0)) / max(steps - skipped, 1.0)
    metrics = {k: float(v) for k, v in metrics_from_sums(sums).items()}
    return LoopOutput(loss, metrics, norm, skipped)


def format_time(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def format_log_line(step: int, total: int, out, lr: float, seqs_per_s: float,
                    eta_s: float, flops_per_s: Optional[float] = None,
                    mfu: Optional[float] = None, fields: Sequence[str] = ()) -> str:
    """One log line: step and loss, the job's `fields` (`Trainer.log_fields`), then the
    learning rate, throughput, FLOP/s and MFU, ETA and skipped steps."""
    parts = [f"step {step}/{total}", f"loss {out.loss:.4f}", *fields, f"lr {lr:.3g}",
             f"{seqs_per_s:.1f} seq/s"]
    if flops_per_s is not None:
        parts.append(hardware.format_flops(flops_per_s) +
                     ("" if mfu is None else f" MFU {100 * mfu:.1f}%"))
    parts.append(f"ETA {format_time(eta_s)}")
    if out.skipped_steps:
        parts.append(f"skipped {out.skipped_steps} non-finite step(s)")
    return " | ".join(parts)


def write_scalars(writer, step: int, out, extra: Dict[str, float]):
    """The loss, the metrics and `extra` at `step` (a `summary_writer`), flushed."""
    for k, v in {"loss": out.loss, **out.metrics, **extra}.items():
        writer.scalar(k, v, step)
    writer.flush()


def write_results(path: str, results: Dict, lease=None):
    """A run's results as JSON with sorted keys, never torn, if `lease` (lease.RunLease)
    is still this process's."""
    if lease is not None:
        lease.check()
    fileio.write_json_atomic(path, results, sort_keys=True)


def summary_writer(logdir: str, chief: bool):
    """TensorBoard events under `logdir` (any filesystem; `events.py`: the files
    tf.summary writes, on either runtime); a no-op on other workers."""
    return events.writer(logdir if chief else None)


class Progress:
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
    """A step's train FLOPs (`flops.HARDWARE`: the matmuls it executes, backward = 2 x
    forward) and the peak FLOP/s of all devices (None: unknown, no MFU)."""
    flops_per_step: float
    peak: Optional[float]

    @classmethod
    def of(cls, flops_per_step: float, devices: Devices, precision: str,
           peak_override=None) -> "Perf":
        peak, where = hardware.peak_flops(devices, precision, peak_override)
        logging.info("Train step: %.4g FLOPs (hardware convention); peak %s (%s)",
                     flops_per_step, "unknown" if peak is None else hardware.format_flops(peak),
                     where)
        return cls(flops_per_step, peak)

    def rates(self, seqs_per_s: float, batch_size: int) -> Dict[str, float]:
        achieved = seqs_per_s / batch_size * self.flops_per_step
        out = {"perf/flops_per_second": achieved}
        if self.peak:
            out["perf/mfu"] = achieved / self.peak
        return out


class ProfileWindow:
    """Traces global steps START+1..END into <logdir>/plugins/profile/ (TensorBoard's
    Profile tab). Every worker ends its host loops at START and END (`n_until_boundary`:
    the loops are collective); only the chief traces."""

    def __init__(self, steps: Optional[Tuple[int, int]], logdir: str, enabled: bool,
                 devices: Optional[Devices] = None):
        self.steps, self.logdir, self.enabled = steps, logdir, enabled and steps is not None
        self.devices = devices
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
            self.devices.profiler_start(self.logdir)
        except RuntimeError:  # a trace is under way here
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
            self.devices.profiler_stop()
            self.active, self.enabled = False, False

    def __enter__(self):
        return self

    def __exit__(self, *exc):  # training ended before END, or failed: keep what ran
        self.stop()


class InputWatch:
    """`guard(manager)` wraps each host loop (a read failure -> a one-line error);
    `after_loop()` -> input scalars for TensorBoard. In-memory input needs neither."""

    def guard(self, manager):
        return contextlib.nullcontext()

    def after_loop(self) -> Dict[str, float]:
        return {}


# ----------------------------------------------------------------------------- the loop


def logs_steps(devices: Devices) -> bool:
    """Whether this process logs the step lines: every process, except where the runtime
    has the chief alone log them (`Devices.chief_logs_steps`: one line per step for the
    job; the metrics are the global batch's, the same in every process)."""
    task_type, task_id = devices.task()
    if devices.chief_logs_steps and task_type is not None and not devices.is_chief():
        logging.info("%s %d: the chief logs the steps and checkpoints of the run; this "
                     "process logs its own events only", task_type.capitalize(), task_id)
        return False
    return True


def open_checkpoints(trainer: Runtime, directory: str, save_dir: Optional[str] = None,
                     max_to_keep: int = 1, clean: bool = True):
    """Resumes `trainer` from the newest complete checkpoint in `directory`; -> the manager
    saving to `save_dir` (default `directory`; a non-chief worker's scratch copy).
    `clean` (the directory's owner): delete what a killed write left and set newer damaged
    checkpoints aside (`newest_complete`); checkpoint files none of which is complete stop
    the run (CheckpointError), never a start over from step 0."""
    if clean:
        remove_torn_checkpoints(directory)
    latest = newest_complete(directory, set_aside=clean)
    if latest:
        trainer.restore(latest)
        logging.info("Resumed from %s (step %d)", latest, trainer.step)
    return trainer.checkpoint_manager(save_dir or directory, max_to_keep)


@contextlib.contextmanager
def input_ended(trainer: Runtime):
    """The runtime's reading ahead stopped when the block ends, however it ends."""
    try:
        yield
    finally:
        trainer.end_input()


def train(trainer: Runtime, iterator, manager,
          schedule: Schedule, *, writer, perf: Optional[Perf] = None,
          profile_steps: Optional[Tuple[int, int]] = None, profile_dir: str = "",
          chief: bool = True, inputs: Optional[InputWatch] = None,
          metrics_from_sums: Callable = lambda sums: sums, what: str = "", lease=None
          ) -> Dict[str, float]:
    """Trains from the global step to `schedule.num_train_steps`; -> the last logged
    metrics. A preemption notice saves and raises `preemption.Preempted` after the current
    host loop (at a step all workers agree on). `lease` (lease.RunLease) is checked before
    every save."""
    s = schedule
    total = s.num_train_steps
    inputs = inputs or InputWatch()
    step = trainer.step
    if step >= total:
        logging.info("Already at step %d of %d: nothing to train", step, total)
        return {}
    logging.info("Train step: %s", trainer.describe_step())
    log_steps = logs_steps(trainer.devices)
    progress = Progress(step, total, s.batch_size)
    last_saved = step  # a loop of only skipped (non-finite) steps does not save again
    out_metrics: Dict[str, float] = {}
    sums = None
    bad_run = 0  # consecutive skipped (non-finite) steps

    def save(at: int) -> str:
        if lease is not None:
            lease.check()
        return save_checkpoint(manager, at)
    with (PreemptionWatch(trainer.devices, what=what) as preemption,
          ProfileWindow(profile_steps, profile_dir, chief, trainer.devices) as profile,
          input_ended(trainer)):
        while step < total:
            # Stop each host loop at the next log, checkpoint, phase or profile boundary.
            n = profile.n_until_boundary(step, min(
                s.steps_per_loop, total - step,
                s.log_every_steps - step % s.log_every_steps,
                s.save_checkpoints_steps - step % s.save_checkpoints_steps,
                trainer.steps_left_in_phase(step) or total))
            host_loop = trainer.make_train_loop(trainer.phase_at(step))  # made once a phase
            trainer.enter_phase(step)
            profile.before_loop(step)
            first = progress.warm is None
            if first:
                started, mark = time.monotonic(), trainer.devices.compile_mark()
            with inputs.guard(manager):
                loop_sums = host_loop(iterator, n)
            trainer.advance_data(n)
            sums = loop_sums if sums is None else {k: sums[k] + loop_sums[k] for k in sums}
            step = trainer.step  # waits for the loop's steps
            if first and log_steps:  # the time to the first steps, and what compiling took
                compiled = trainer.devices.compiles_since(mark)
                logging.info("First host loop (%d step%s): %.1f s%s", n, "s" * (n != 1),
                             time.monotonic() - started,
                             f" ({compiled})" if compiled else ", compiling included")
            profile.after_loop(step)
            input_scalars = inputs.after_loop()
            skipped = int(round(float(loop_sums["skipped"])))
            bad_run = bad_run + skipped if skipped == n else 0
            if skipped and (s.on_nan == "stop" or bad_run >= MAX_CONSECUTIVE_SKIPS):
                why = ("on_nan=stop" if s.on_nan == "stop" else
                       f"{bad_run} steps in a row, the run cannot recover")
                raise RunError(f"non-finite loss or gradients at step {step + 1} ({why}; no "
                               "such step is applied); last good checkpoint: "
                               f"{manager.latest_checkpoint or 'none'}")
            if step % s.log_every_steps == 0 or step >= total or s.log_each_loop:
                out, sums = summarize(sums, metrics_from_sums), None
                seqs_per_s, eta = progress.rates(step)
                lr = trainer.learning_rate(step)
                rates = perf.rates(seqs_per_s, s.batch_size) if perf else {}
                if log_steps:
                    logging.info(format_log_line(step, total, out, lr, seqs_per_s, eta,
                                                 rates.get("perf/flops_per_second"),
                                                 rates.get("perf/mfu"),
                                                 trainer.log_fields(out.metrics)))
                write_scalars(writer, step, out, {"learning_rate": lr,
                                                  "grad_norm": out.grad_norm,
                                                  "sequences_per_second": seqs_per_s,
                                                  **input_scalars, **rates})
                out_metrics = dict(out.metrics, loss=out.loss, **rates)
            saved = step != last_saved and (step % s.save_checkpoints_steps == 0 or
                                            step >= total)
            if saved:
                last_saved = step
                path = save(step)
                if log_steps:
                    logging.info("Saved checkpoint %s", path)
            preemption.stop_if_noticed(step, lambda: manager.latest_checkpoint if saved
                                       else save(step))
            progress.loop_done(step)
    return out_metrics
