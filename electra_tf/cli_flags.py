"""absl flags that both CLIs (run_pretraining.py, run_finetuning.py) define the same way.

No TensorFlow import here: the CLIs define their flags before TensorFlow loads.
"""

from absl import flags

STRATEGIES = ("auto", "tpu", "gpu", "multi_worker", "cpu")  # electra_tf.distribute's


def define_strategy_flags():
    """--strategy, --tpu, --tpu_zone, --gcp_project (electra_tf.distribute.make_strategy)."""
    flags.DEFINE_enum("strategy", "auto", list(STRATEGIES),
                      "tf.distribute strategy. auto: a TPU if this machine is a Cloud TPU VM "
                      "or --tpu/TPU_NAME names one, else multi_worker when TF_CONFIG lists "
                      "several workers, else every visible GPU, else the CPU.")
    flags.DEFINE_string("tpu", None, "Which TPU (README: Cloud TPU quickstart): 'local' for "
                        "the chips of this Cloud TPU VM (what auto-detection picks there); "
                        "the TPU's NAME for a multi-host TPU VM slice (run on its worker 0 "
                        "only, with TPU_LOAD_LIBRARY=0) or a TPU Node; or grpc://HOST:8470. "
                        "Default: $TPU_NAME, else auto-detection.")
    flags.DEFINE_string("tpu_zone", None, "Zone of the TPU named by --tpu=NAME (default: this "
                        "GCE VM's zone, from the metadata server; outside Google Cloud, "
                        "required).")
    flags.DEFINE_string("gcp_project", None, "Project of the TPU named by --tpu=NAME (default: "
                        "this GCE VM's project; outside Google Cloud, required).")
