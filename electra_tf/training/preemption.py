"""Preemption notices, behind one check per host loop (`PreemptionWatch.stop_if_noticed`):
SIGTERM (schedulers, `kill`, a GCE preemption); SIGINT (Ctrl-C: the same save and stop, exit
code 130; a second Ctrl-C stops at once); on a GCE VM, the metadata server's maintenance
event or preemption, polled by a thread (TensorFlow's `PreemptionCheckpointHandler` does
nothing on a Cloud TPU VM). The workers sum their notices in one collective, so all save at
the same step and raise `Preempted`; rerunning the same command resumes.
"""

import signal
import threading
from typing import Callable, List, Optional

from absl import logging

from electra_tf.training import gce

# EX_TEMPFAIL: the job was asked to stop (preemption) and can be resumed by a rerun.
PREEMPTED_EXIT_CODE = 75
INTERRUPTED_EXIT_CODE = 128 + signal.SIGINT  # what a shell reports for a Ctrl-C

METADATA_POLL_SECONDS = 5.0


class Preempted(Exception):
    """A preemption notice (or Ctrl-C) arrived and the job saved a checkpoint;
    `exit_code`: what the CLI exits with."""

    def __init__(self, message: str, exit_code: int = PREEMPTED_EXIT_CODE):
        super().__init__(message)
        self.exit_code = exit_code


def metadata_notice(host: Optional[str] = None, timeout: float = 2.0) -> Optional[str]:
    """The GCE metadata server's stop notice for this VM (a terminating maintenance event or
    a preemption; not a live migration), or None. OSError when it cannot be read."""
    get = lambda path: gce.metadata(f"instance/{path}", host, timeout)  # noqa: E731

    event = get("maintenance-event")
    if event == "TERMINATE_ON_HOST_MAINTENANCE":
        return f"GCE maintenance event ({event})"
    if get("preempted").upper() == "TRUE":
        return "GCE preemption"
    return None


class PreemptionWatch:
    """A context for a training loop: collects preemption notices while it is open;
    `what` names the loop in messages."""

    def __init__(self, devices, what: str = ""):
        self.what = what
        self.notices: List[str] = []
        # Multi-worker: the number of workers with a notice, summed over the cluster
        # (`runtime.Devices.sum_over_workers`, a collective).
        self._count_workers = (devices.sum_over_workers if devices.task()[0] is not None
                               else None)
        self._previous_handlers = {}  # signal -> the handler to put back on exit
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._metadata_failed = False

    # ------------------------------------------------------------------ sources

    def __enter__(self) -> "PreemptionWatch":
        if threading.current_thread() is threading.main_thread():
            # signal handlers can only be set from the main thread
            self._previous_handlers = {
                signal.SIGTERM: signal.signal(signal.SIGTERM,
                                              lambda signum, frame: self._notice("SIGTERM")),
                signal.SIGINT: signal.signal(signal.SIGINT, self._on_sigint)}
        if gce.on_gce():
            # The first look is synchronous: a job started during a pending maintenance
            # stops after its first host loop.
            self._look_at_metadata()
            self._thread = threading.Thread(target=self._watch_metadata, daemon=True,
                                            name="gce-maintenance-watch")
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        for signum, handler in self._previous_handlers.items():
            if handler is not None:
                signal.signal(signum, handler)
        self._previous_handlers = {}
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _notice(self, reason: str):
        if not self.notices:
            self.notices.append(reason)

    def _on_sigint(self, signum, frame):
        # A second Ctrl-C is Python's usual KeyboardInterrupt: stop now, without saving.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        logging.warning("Ctrl-C: saving a checkpoint after the current host loop, then "
                        "stopping (Ctrl-C again to stop at once, without saving)")
        self._notice("SIGINT")

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
        """Call after each host loop (every worker alike): on a notice to any worker,
        `save()` (-> the checkpoint path) and raise Preempted."""
        reason = self.notices[0] if self.notices else None
        if self._count_workers is not None:  # a collective: every worker gets here
            noticed = self._count_workers(int(reason is not None))
            if noticed and reason is None:
                reason = "a preemption notice to another worker"
        if reason:
            where = f"step {step}" + (f" of the {self.what}" if self.what else "")
            code = INTERRUPTED_EXIT_CODE if reason == "SIGINT" else PREEMPTED_EXIT_CODE
            raise Preempted(f"{reason} at {where}: saved {save()}; rerun the same command "
                            "to resume", code)
