"""Where the runtime is chosen, once per process: `--backend` (read before Keras loads,
`electra_tf/backend.py`) names it, and `devices` makes its `runtime.Devices` from
`--strategy` and the TPU flags; everything after asks that object (no other module tests
which runtime it is on). The only module that knows both runtimes."""

import dataclasses

from electra_tf.backend import current as backend
from electra_tf.training import runtime
from electra_tf.training.options import STRATEGIES


def devices(strategy: str = "auto", tpu=None, tpu_zone=None, gcp_project=None
            ) -> runtime.Devices:
    """The devices of the runtime Keras was loaded for: TensorFlow's strategy (`auto`: TPU,
    several workers, GPUs or the CPU) or the devices JAX sees."""
    if strategy not in STRATEGIES:
        raise runtime.StrategyError(f"--strategy={strategy}: expected one of "
                                    f"{', '.join(STRATEGIES)}")
    if backend() == "jax":
        from electra_tf.training.jax_runtime.devices import jax_devices
        return jax_devices(strategy)
    from electra_tf.training.tf_runtime.devices import TfDevices
    from electra_tf.training.tf_runtime.distribute import make_strategy
    return TfDevices(make_strategy(strategy, tpu, tpu_zone, gcp_project))


def setup(options, cfg):
    """-> (the devices `options` name, `cfg` with its precision resolved for them and set as
    the Keras dtype policy, whether this process is the chief: it writes the outputs)."""
    found = devices(options.strategy, options.tpu, options.tpu_zone, options.gcp_project)
    precision = found.resolve_precision(cfg.train.precision)
    runtime.set_precision(precision)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, precision=precision))
    return found, cfg, found.is_chief()
