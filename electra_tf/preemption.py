"""Preemption notices: everything that asks a job to stop now and come back later, behind
one check per host loop (`PreemptionWatch.stop_if_noticed`), used by pre-training and by
fine-tuning trials.

Where each notice comes from:
- **SIGTERM**, in a single-process job (one machine with its GPUs, the TPUStrategy client
  on a Cloud TPU VM, a CPU): what schedulers, `kill` and a GCE preemption (a shutdown)
  send.
- **The GCE metadata server**, in a single-process job on a GCE VM (Cloud TPU VMs are GCE
  VMs): `instance/maintenance-event` turning to TERMINATE_ON_HOST_MAINTENANCE, announced
  ahead of a maintenance that stops the VM, or `instance/preempted` turning TRUE. A
  background thread polls both. TensorFlow's own `PreemptionCheckpointHandler` handles
  TPUs only inside Google and does nothing on a Cloud TPU VM, hence this watcher.
- **TensorFlow's `PreemptionCheckpointHandler`**, in a multi-worker job: a save needs
  every worker, so the handler agrees on a step with the others first; it watches SIGTERM
  itself (and the maintenance events on GCE GPU VMs).

On a notice the job saves a checkpoint at the current step and raises `Preempted`; the
CLIs exit with `PREEMPTED_EXIT_CODE`, and rerunning the same command resumes.
"""

import os
import signal
import threading
import urllib.request
from typing import Callable, List, Optional

import tensorflow as tf
from absl import logging

from electra_tf import distribute

# EX_TEMPFAIL: the job was asked to stop (preemption) and can be resumed by a rerun.
PREEMPTED_EXIT_CODE = 75

# TensorFlow's name for the metadata server's address (tests point it at a fake server).
METADATA_HOST_ENV = "GCE_METADATA_IP"
METADATA_POLL_SECONDS = 5.0


class Preempted(Exception):
    """A preemption notice arrived; the job saved a checkpoint at the current step and
    stopped."""


def on_gce() -> bool:
    """Whether this machine is a GCE VM (Cloud TPU VMs included), from the DMI product
    name, as Google's client libraries check it; no network. The metadata address
    variable forces it on."""
    if os.environ.get(METADATA_HOST_ENV):
        return True
    try:
        with open("/sys/class/dmi/id/product_name") as f:
            return f.read().strip().startswith("Google")
    except OSError:
        return False


def metadata_notice(host: Optional[str] = None, timeout: float = 2.0) -> Optional[str]:
    """The GCE metadata server's stop notice for this VM, or None: a maintenance event
    that terminates the VM, or a preemption. A live migration is not a notice (the VM keeps
    running). Raises OSError when the server cannot be read."""
    host = host or os.environ.get(METADATA_HOST_ENV, "metadata.google.internal")

    def get(path):
        request = urllib.request.Request(f"http://{host}/computeMetadata/v1/instance/{path}",
                                         headers={"Metadata-Flavor": "Google"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.read().decode("utf-8").strip()

    event = get("maintenance-event")
    if event == "TERMINATE_ON_HOST_MAINTENANCE":
        return f"GCE maintenance event ({event})"
    if get("preempted").upper() == "TRUE":
        return "GCE preemption"
    return None


class PreemptionWatch:
    """A context for a training loop: collects preemption notices while it is open.

    `manager` (the loop's CheckpointManager) is only used in a multi-worker job, where
    TensorFlow's handler saves through it (None: no coordinated save there; one handler
    per process, so fine-tuning trials pass None); `what` names the loop in messages."""

    def __init__(self, strategy: tf.distribute.Strategy,
                 manager: Optional[tf.train.CheckpointManager] = None, what: str = ""):
        self.strategy, self.manager, self.what = strategy, manager, what
        self.notices: List[str] = []
        self._handler = None
        self._previous_sigterm = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._metadata_failed = False

    # ------------------------------------------------------------------ sources

    def __enter__(self) -> "PreemptionWatch":
        if distribute.task(self.strategy)[0] is not None:
            if self.manager is not None:
                self._handler = _tf_handler(self.strategy, self.manager)
            else:
                logging.warning("Multi-worker %s: no coordinated preemption checkpoint; a "
                                "preempted worker loses the steps since the last periodic "
                                "checkpoint", self.what or "job")
            return self
        if threading.current_thread() is threading.main_thread():
            # signal handlers can only be set from the main thread
            self._previous_sigterm = signal.signal(
                signal.SIGTERM, lambda signum, frame: self._notice("SIGTERM"))
        if on_gce():
            # The first look is synchronous: a job started during a pending maintenance
            # stops after its first host loop.
            self._look_at_metadata()
            self._thread = threading.Thread(target=self._watch_metadata, daemon=True,
                                            name="gce-maintenance-watch")
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _notice(self, reason: str):
        if not self.notices:
            self.notices.append(reason)

    def _look_at_metadata(self):
        try:
            reason = metadata_notice()
        except OSError as e:
            if not self._metadata_failed:  # once; SIGTERM still works meanwhile
                logging.warning("Cannot read the GCE metadata server (%s); will retry", e)
            self._metadata_failed = True
            return
        if reason:
            logging.warning("Preemption notice: %s; saving after the current host loop",
                            reason)
            self._notice(reason)

    def _watch_metadata(self):
        while not self.notices and not self._stop.wait(METADATA_POLL_SECONDS):
            self._look_at_metadata()

    # ------------------------------------------------------------------ the check

    def stop_if_noticed(self, step: int, save: Callable[[], str]) -> None:
        """Call after each host loop: on a notice, `save()` (returns the checkpoint path)
        and raise Preempted. In a multi-worker job TensorFlow's handler saves at an agreed
        step through the manager instead."""
        if self._handler is not None:
            self._handler.save_checkpoint_if_preempted(checkpoint_number=step)
            return
        if self.notices:
            where = f"step {step}" + (f" of the {self.what}" if self.what else "")
            raise Preempted(f"{self.notices[0]} at {where}: saved {save()}; rerun the same "
                            "command to resume")


def _tf_handler(strategy, manager):
    """TF's PreemptionCheckpointHandler for a multi-worker job: on a preemption notice
    (SIGTERM on any worker) all workers save at the same step, then raise Preempted."""
    def exit_fn():
        raise Preempted(f"preemption notice: saved {manager.latest_checkpoint}; rerun the "
                        "same command to resume")
    try:
        return tf.distribute.experimental.PreemptionCheckpointHandler(
            strategy.cluster_resolver, manager,
            termination_config=tf.distribute.experimental.TerminationConfig(exit_fn=exit_fn))
    except (ValueError, NotImplementedError, tf.errors.OpError) as e:
        logging.warning("No preemption handler (%s): a preempted worker loses the steps "
                        "since the last periodic checkpoint", e)
        return None
