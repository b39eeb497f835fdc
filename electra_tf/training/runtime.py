"""The runtime contract: what the host loop (`loop.py`), the jobs (`pretraining/`,
`finetune/`) and the CLIs need of a runtime, written once. A runtime is two objects:

- `Devices`, chosen once per process from `--backend` (`backends.setup`): where the run
  executes (replicas, processes, the chief, the accelerator), how its input is spread over
  them, its profiler, and the factory of its trainers (`Devices.runtime`).
- `Runtime`, one per job (`Devices.runtime(job)`): the model, the compiled train and eval
  loops, the global step and data position, the learning rate, checkpoint save and restore,
  phases and the start of a new trial.

A job (`Job`: pre-training, fine-tuning) says what to train; it is the same object on every
runtime. The runtimes: `tf_runtime/` (TensorFlow: `tf.function` steps under
`tf.distribute`) and `jax_runtime/` (JAX: one `jax.jit` step over a device mesh). Both
compute the update with `update.py` and write the same checkpoints (`checkpoints.py`), so
either resumes the other's run. Neither imports the other; only `backends.py` knows both."""

import abc
import os
import dataclasses
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import keras
import numpy as np

from electra_tf.training.schedule import Phases


class StrategyError(ValueError):
    """The devices or cluster a run asked for cannot be used, as one line."""


# --------------------------------------------------------------------------- precision


def set_precision(precision: str):
    """Sets the Keras dtype policy: variables stay float32, compute in the given type."""
    policy = {"float32": "float32", "bfloat16": "mixed_bfloat16",
              "float16": "mixed_float16"}[precision]
    keras.mixed_precision.set_dtype_policy(policy)


def active_precision() -> str:
    """The compute precision models are built with now (`set_precision`'s)."""
    return {"float16": "float16", "bfloat16": "bfloat16"}.get(
        keras.mixed_precision.global_policy().compute_dtype, "float32")


# --------------------------------------------------------------------------- the job


@dataclasses.dataclass(frozen=True)
class Settings:
    """How a job trains, on any runtime: the optimizer section (`OptimizerConfig`), the
    schedule's length, the run's seed and the stream that tells this job's draws from
    another's, clipping and micro-batches."""
    optimizer: object
    total_steps: int
    seed: int
    seed_stream: int
    clip_norm: float
    grad_accum_steps: int = 1


class Job(abc.ABC):
    """What a runtime needs of a job; the same object on every runtime. Everything here is
    `keras.ops` (the model and losses) or host Python: a job never sees a backend."""

    settings: Settings
    # A CPU-only TensorFlow run without --jit_compile XLA-compiles its step when this is
    # true (each job's measured choice: docs/benchmarks.md).
    xla_on_cpu: bool = True

    @abc.abstractmethod
    def build_model(self) -> keras.Model:
        """A new model (the runtime sets the global seed first, so every rerun and worker
        starts from the same weights)."""

    @abc.abstractmethod
    def loss(self, model, batch, seed, context, training: bool, phase: int = 0, step=None):
        """-> (float32 loss, additive float32 metric sums) of a (micro-)batch, over global
        denominators: replicas and micro-batches add up to the global batch's. `step`: the
        global step as the compiled step sees it (a schedule may read it)."""

    def denominators(self, batch) -> Dict:
        """Additive counts over `batch` that the loss divides by; the runtime sums them over
        the whole global batch (every replica's rows) before the micro-batches. Default: none."""
        return {}

    def phases(self) -> List[int]:
        return [0]

    def on_phase_start(self, model, phase: int):
        """Eager code on the model before phase `phase` > 0's first step."""

    def log_fields(self, metrics: Dict[str, float]) -> List[str]:
        """The job's groups of the log line, between the loss and the learning rate."""
        return []

    def lr_multipliers(self, model) -> Optional[Dict[str, float]]:
        """{variable path: learning-rate multiplier} (layer-wise rates), or None."""
        return None

    def fetches(self, batch, outputs) -> Dict:
        """What `Runtime.predict` brings back of a batch from the model's outputs."""
        raise NotImplementedError(f"{type(self).__name__} predicts nothing")


# --------------------------------------------------------------------------- devices


class Devices(abc.ABC):
    """Where a run executes, chosen once per process (`backends.setup`)."""

    backend: str  # "tensorflow" or "jax": the name in logs and results
    num_replicas: int  # devices the global batch is split over
    # Whether this process can export a SavedModel itself (TensorFlow's Keras); else a
    # TensorFlow process does it from the checkpoint (`finetune/export_child.py`).
    saved_model_in_process: bool = False
    # Whether the runtime takes its input as NumPy batches made on the host, without
    # TensorFlow (JAX), rather than tf.data pipelines it distributes (TensorFlow): the jobs
    # choose their pipelines by it (`dataset.make_input`, `finetune.trainer`).
    host_input: bool = False
    process_index: int = 0
    process_count: int = 1
    # Whether the chief alone logs a multi-worker run's steps (JAX: one line per step for
    # the job); else every worker logs its own (TensorFlow's workers, as they always have).
    chief_logs_steps: bool = False

    @property
    @abc.abstractmethod
    def platform(self) -> str:
        """'CPU', 'GPU' or 'TPU'."""

    @property
    def hosts(self) -> int:
        """Processes: what a CPU peak is multiplied by (a host's CPU devices share its cores)."""
        return self.process_count

    @abc.abstractmethod
    def accelerator_name(self) -> Optional[str]:
        """The accelerator's name as the peak table knows it (a GPU's device name, a TPU's
        accelerator type); None on CPU or when it cannot be found."""

    @abc.abstractmethod
    def tf32_enabled(self) -> bool:
        """Whether float32 matmuls may run in TensorFloat-32 (one bfloat16 pass on TPU)."""

    @abc.abstractmethod
    def task(self) -> Tuple[Optional[str], Optional[int]]:
        """(task type, id) of this process in a cluster of several, else (None, None)."""

    @abc.abstractmethod
    def is_chief(self) -> bool:
        """Whether this process writes the run's outputs."""

    def worker_dir(self, model_dir: str) -> str:
        """Where this process saves checkpoints: `model_dir` for the chief; for the other
        workers (a save is a collective) a scratch directory nobody reads."""
        if self.is_chief():
            return model_dir
        task_type, task_id = self.task()
        return os.path.join(model_dir, ".workers", f"{task_type}_{task_id}")

    @abc.abstractmethod
    def sum_over_workers(self, value: int) -> int:
        """`value` summed over every worker of a cluster (a collective: all must call it);
        `value` itself on one."""

    @abc.abstractmethod
    def describe(self) -> str:
        """One line for the log."""

    def resolve_precision(self, precision: str) -> str:
        """precision=auto -> bfloat16 on TPU, float32 elsewhere; others as they are."""
        if precision != "auto":
            return precision
        return "bfloat16" if self.platform == "TPU" else "float32"

    def compile_mark(self):
        """A mark of this process's compiles so far, for `compiles_since` (None: the
        runtime counts none)."""
        return None

    def compiles_since(self, mark) -> Optional[str]:
        """What compiling cost since `mark`, for the log (None: not counted)."""
        return None

    @abc.abstractmethod
    def dataset(self, make: Callable):
        """The run's input over its replicas: `make(context)` -> this input pipeline's
        batches of its share of each global batch. The context says which pipeline:
        `tf.distribute.InputContext` (TensorFlow: `make` gives a tf.data.Dataset) or
        `data.dataset.InputContext` (JAX: an iterator of NumPy batches, no TensorFlow)."""

    @abc.abstractmethod
    def distribute(self, dataset):
        """An in-memory split's tf.data.Dataset of global batches, spread over the replicas."""

    @abc.abstractmethod
    def profiler_start(self, logdir: str):
        """The runtime's profiler into <logdir>/plugins/profile; RuntimeError when a trace
        is under way in this process already."""

    @abc.abstractmethod
    def profiler_stop(self):
        """Ends `profiler_start`'s trace."""

    @abc.abstractmethod
    def runtime(self, job: Job, jit_compile: Optional[bool] = None) -> "Runtime":
        """This runtime's trainer of `job`. `jit_compile`: XLA or not where the runtime has
        a choice (None: its default)."""


# --------------------------------------------------------------------------- the runtime


class Runtime(Phases, abc.ABC):
    """A job's state and compiled functions on one runtime: what `loop.train`, the jobs'
    runs and the tests use. Host numbers in, host numbers out."""

    job: Job
    devices: Devices
    model: keras.Model
    variables: List  # the trained Keras variables, in the update's order
    jit_compile: bool

    # ------------------------------------------------------------------ counters

    @property
    @abc.abstractmethod
    def step(self) -> int:
        """The global step: updates applied so far (waits for the dispatched steps)."""

    @property
    @abc.abstractmethod
    def data_position(self) -> int:
        """Global batches read: where the input resumes (ahead of the step by the skipped
        non-finite steps)."""

    @abc.abstractmethod
    def advance_data(self, batches: int):
        """Counts `batches` more global batches as read (after a host loop took them)."""

    @abc.abstractmethod
    def learning_rate(self, step: int) -> float:
        """The schedule's rate at `step` (before layer-wise multipliers)."""

    # ------------------------------------------------------------------ compiled loops

    @abc.abstractmethod
    def make_train_loop(self, phase: int = 0) -> Callable:
        """`loop(iterator, num_steps)` -> the steps' metric sums (host numbers), over the
        global batch and the steps; made (and compiled) once per phase. A loop never
        crosses a phase start (`steps_left_in_phase`)."""

    @abc.abstractmethod
    def make_eval_loop(self, phase: Optional[int] = None) -> Callable:
        """As `make_train_loop`, without dropout or updates, with evaluation's draws;
        `phase` None: the current step's."""

    @abc.abstractmethod
    def predict(self, arrays: Dict[str, np.ndarray], batch_size: int) -> Dict[str, np.ndarray]:
        """`job.fetches` of the model (no dropout) over every row of `arrays` (a split in
        memory with a `weight` column), in batches of `batch_size` padded as the runtime
        needs; -> the fetched arrays, one row per input row."""

    @abc.abstractmethod
    def describe_step(self) -> str:
        """How the step executes, for the log."""

    def end_input(self):
        """Stops reading ahead of the steps (a runtime that does) and frees what was read
        and not taken; the loops' iterators are done with. Called when a run's or an
        evaluation's loops end, however they end."""

    # ------------------------------------------------------------------ checkpoints

    @abc.abstractmethod
    def checkpoint_manager(self, directory: str, max_to_keep: int):
        """-> a manager (`save(checkpoint_number)`, `latest_checkpoint`, `directory`) that
        writes this runtime's state as a training checkpoint (the one object graph both
        runtimes read: `checkpoints.py`)."""

    @abc.abstractmethod
    def restore(self, path: str):
        """Restores a training checkpoint of either runtime (one without a data position
        resumes the input at the step)."""

    # ------------------------------------------------------------------ the model

    @abc.abstractmethod
    def sync_model(self):
        """The Keras variables take the trained values (for exports and eager code)."""

    @abc.abstractmethod
    def model_changed(self):
        """The trained state takes the Keras variables' values (after eager code assigned
        them: a fixed generator loaded, a phase's weight copy)."""

    @abc.abstractmethod
    def reinitialize(self, seed: int):
        """Puts the runtime where a new one built with `seed` would start (weights, zero
        slots and counters, loss scale, draws), keeping its compiled functions: several
        trials (fine-tuning seeds) compile once."""

    # ------------------------------------------------------------------ phases and the job

    def phases(self) -> List[int]:
        return self.job.phases()

    def enter_phase(self, step: int):
        """Runs the job's phase-start code when `step` is the first of a phase > 0
        (idempotent: its effect does not depend on when it ran before)."""
        starts = self.phases()
        if step in starts[1:]:
            self.sync_model()
            self.job.on_phase_start(self.model, starts.index(step))
            self.model_changed()

    def log_fields(self, metrics: Dict[str, float]) -> List[str]:
        return self.job.log_fields(metrics)


def check_same_model(fresh: keras.Model, model: keras.Model):
    """`reinitialize`'s check: the job's `build_model` made the same variables again."""
    if [w.path for w in fresh.weights] != [w.path for w in model.weights]:
        raise ValueError("build_model made a different model on reinitialize")


def pad_rows(arrays: Dict[str, np.ndarray], multiple: int) -> Dict[str, np.ndarray]:
    """Pads every array to a multiple of `multiple` rows (copies of row 0, weight 0): one
    batch shape, one XLA compilation."""
    n = len(arrays["weight"])
    extra = -n % multiple
    if not extra:
        return arrays
    out = {k: np.concatenate([v, np.repeat(v[:1], extra, axis=0)]) for k, v in arrays.items()}
    out["weight"][n:] = 0.0
    return out


def add_sums(total: Optional[Dict], more: Dict) -> Dict:
    """Metric sums of more steps added to `total` (None: none yet)."""
    return dict(more) if total is None else {k: total[k] + more[k] for k in total}


def concat_rows(parts: Iterable[Dict[str, np.ndarray]], rows: int) -> Dict[str, np.ndarray]:
    """Batches of fetched arrays -> one array per key, the first `rows` rows."""
    out: Dict[str, List[np.ndarray]] = {}
    for part in parts:
        for k, v in part.items():
            out.setdefault(k, []).append(np.asarray(v))
    return {k: np.concatenate(v)[:rows] for k, v in out.items()}
