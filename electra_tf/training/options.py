"""How and where a run executes (not its hyper-parameters): one options type per job, the
fields both share (and their flags) declared once. No TensorFlow import: the CLIs define
their flags before TensorFlow loads."""

import dataclasses
from typing import Optional, Tuple, Union

from electra_tf.configs.schema import knob, one_of

STRATEGIES = ("auto", "tpu", "gpu", "multi_worker", "cpu")  # tf_runtime.distribute's, jax_runtime.devices'


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """What both jobs' runs share, with the flags both CLIs define (`schema.define_flags`)."""
    model_dir: str
    backend: Optional[str] = knob(None, one_of("tensorflow", "jax"), flag=(
        "Runtime: tensorflow (tf.distribute; the default) or jax (one jax.jit step over "
        "every device JAX sees: Cloud TPU VMs of every generation, GPUs). Sets KERAS_BACKEND "
        "(which alone works too); jax needs no TensorFlow installed, and checkpoints are the "
        "same format: either resumes the other."))
    strategy: str = knob("auto", one_of(*STRATEGIES), flag=(
        "tf.distribute strategy (under --backend=jax: which of JAX's devices; multi_worker "
        "calls jax.distributed.initialize()). auto: a TPU if this machine is a Cloud TPU VM or "
        "--tpu/TPU_NAME names one, else multi_worker when TF_CONFIG lists several workers, "
        "else every visible GPU, else the CPU."))
    tpu: Optional[str] = knob(None, flag=(
        "Which TPU (README: Cloud TPU quickstart): 'local' for the chips of this Cloud TPU "
        "VM (what auto-detection picks there); the TPU's NAME for a multi-host TPU VM slice "
        "(run on its worker 0 only, with TPU_LOAD_LIBRARY=0) or a TPU Node; or "
        "grpc://HOST:8470. Default: $TPU_NAME, else auto-detection."))
    tpu_zone: Optional[str] = knob(None, flag=(
        "Zone of the TPU named by --tpu=NAME (default: this GCE VM's zone, from the metadata "
        "server; outside Google Cloud, required)."))
    gcp_project: Optional[str] = knob(None, flag=(
        "Project of the TPU named by --tpu=NAME (default: this GCE VM's project; outside "
        "Google Cloud, required)."))
    jit_compile: Optional[bool] = knob(None, flag="Force XLA on/off (default: on where "
                                                  "supported).")
    profile_steps: Union[None, str, Tuple[int, int]] = knob(None, flag=(
        "START,END: trace global steps START+1..END with the TensorFlow profiler (0 <= START "
        "< END; host loops end at both) into the run's train/ log directory, TensorBoard's "
        "Profile tab. Traces this process's host and devices (CPU, GPU, a TPU VM's TPUs); "
        "for a remote Cloud TPU node use tf.profiler.experimental.client.trace, or "
        "TensorBoard's Capture Profile, against the TPU's address instead."))
    peak_flops: Union[None, str, float] = knob(None, flag=(
        "Peak FLOP/s of ONE device, for the MFU in the logs (e.g. 312e12 or 312T): one GPU, "
        "one TPU device as TensorFlow lists them (a TensorCore on v2/v3, a chip from v4 on) "
        "or one CPU host; it is multiplied by the number of devices. Default: the published "
        "dense peak of a known GPU/TPU for the run's precision "
        "(electra_tf/training/hardware.py), or on CPU a timed matmul."))


@dataclasses.dataclass(frozen=True)
class PretrainingOptions(RunOptions):
    train_data: Optional[str] = None  # glob(s) or build dir; None = the bundled sample
    eval_data: Optional[str] = None
    do_train: bool = True
    do_eval: bool = False


@dataclasses.dataclass(frozen=True)
class FinetuneOptions(RunOptions):
    data_dir: Optional[str] = None
    init_checkpoint: Optional[str] = None
    export_dir: Optional[str] = None
    vocab_file: Optional[str] = None
    spm_model: Optional[str] = None
    do_lower_case: bool = True
    do_predict: bool = False  # test-set predictions of the median trial


def options_from_flags(flag_values, cls, **computed):
    """Options `cls` (PretrainingOptions, FinetuneOptions): each field from the flag of its
    name, but those the CLI `computed` (defaults that depend on other flags)."""
    return cls(**{f.name: computed[f.name] if f.name in computed else
                  getattr(flag_values, f.name) for f in dataclasses.fields(cls)})
