"""One writer per run directory: the process training into a `--model_dir` holds a lease
file there (`lease.json`), taken before its first write and renewed by a heartbeat thread, so
a second process given the directory stops with one line instead of interleaving checkpoints.

A lease is live while its heartbeat is younger than STALE_SECONDS and, if written on this
host, its process runs; otherwise it is stale and taken over with a warning (or at once by
deleting the file). `tf.io.gfile` has no create-if-absent, so taking a lease is write, wait
SETTLE_SECONDS, read back: of two processes starting together the last writer keeps it. The
holder reads it again at every heartbeat and before every checkpoint. Staleness compares the
holder's clock with the reader's (GCE keeps hosts' clocks synced).
"""

import dataclasses
import json
import os
import socket
import sys
import threading
import time
import uuid
from typing import Optional

from absl import logging

from electra_tf import fileio

LEASE_FILE = "lease.json"
HEARTBEAT_SECONDS = 30.0
STALE_SECONDS = 300.0  # 10 missed beats
# How long a new holder waits before reading its lease back: longer than the gap between
# another process's read (no lease) and its write landing (one upload and a rename).
SETTLE_SECONDS = {"local": 0.2, "remote": 2.0}


class LeaseError(ValueError):
    """Another process holds (or took) the run directory's lease: one line naming it."""


@dataclasses.dataclass(frozen=True)
class Holder:
    token: str
    host: str
    pid: int
    command: str
    started: float  # unix time
    heartbeat: float  # unix time of the last renewal

    def describe(self, now: float) -> str:
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started))
        return (f"pid {self.pid} on host {self.host} ({self.command}), started {started}, "
                f"last heartbeat {max(0, now - self.heartbeat):.0f} s ago")


def _process_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def read_holder(directory: str) -> Optional[Holder]:
    """The lease in `directory`, or None; an unreadable lease file counts as none (it
    cannot be a live holder's: those are written whole, by a rename)."""
    path = fileio.join(directory, LEASE_FILE)
    if not fileio.exists(path):
        return None
    try:
        fields = json.loads(fileio.read_text(path))
        return Holder(**{f.name: fields[f.name] for f in dataclasses.fields(Holder)})
    except (ValueError, KeyError, TypeError) as e:
        logging.warning("%s is unreadable (%s); treating it as no lease", path, e)
        return None


def stale_reason(holder: Holder, now: float, host: str, stale_seconds: float
                 ) -> Optional[str]:
    """Why `holder` no longer holds its lease, or None while it is live."""
    if holder.host == host and not _process_running(holder.pid):
        return f"pid {holder.pid} is no longer running on this host"
    if now - holder.heartbeat > stale_seconds:
        return f"no heartbeat for {now - holder.heartbeat:.0f} s (stale after {stale_seconds:.0f} s)"
    return None


class RunLease:
    """`with RunLease(dir):` takes the lease (or raises LeaseError) and releases it on exit;
    `check()` raises LeaseError if another process has taken it since."""

    def __init__(self, directory: str, heartbeat_seconds: Optional[float] = None,
                 stale_seconds: Optional[float] = None):
        self.directory = directory
        self.path = fileio.join(directory, LEASE_FILE)
        self.heartbeat_seconds = heartbeat_seconds or HEARTBEAT_SECONDS
        self.stale_seconds = stale_seconds or STALE_SECONDS
        self.host = socket.gethostname()
        now = time.time()
        command = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
        self.holder = Holder(token=uuid.uuid4().hex, host=self.host, pid=os.getpid(),
                             command=command, started=now, heartbeat=now)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._lost: Optional[Holder] = None
        self._write_lock = threading.Lock()

    # -------------------------------------------------------------- taking and renewing

    def _write(self):
        with self._write_lock:
            self.holder = dataclasses.replace(self.holder, heartbeat=time.time())
            fileio.write_json_atomic(self.path, dataclasses.asdict(self.holder))

    def _refuse(self, other: Holder, now: float) -> LeaseError:
        wait = max(0.0, self.stale_seconds - (now - other.heartbeat))
        return LeaseError(
            f"{self.directory} is in use by another run: {other.describe(now)}. Give this "
            f"run another --model_dir, or, if that process is gone, delete {self.path} (or "
            f"wait {wait:.0f} s for its lease to go stale) and rerun")

    def acquire(self) -> "RunLease":
        fileio.makedirs(self.directory)
        now = time.time()
        other = read_holder(self.directory)
        if other is not None and other.token != self.holder.token:
            reason = stale_reason(other, now, self.host, self.stale_seconds)
            if reason is None:
                raise self._refuse(other, now)
            logging.warning("Taking over the lease on %s from %s: %s", self.directory,
                            other.describe(now), reason)
        self._write()
        time.sleep(SETTLE_SECONDS["remote" if fileio.is_remote(self.directory) else "local"])
        self.check()
        self._thread = threading.Thread(target=self._heartbeat, daemon=True,
                                        name="run-lease-heartbeat")
        self._thread.start()
        logging.info("Holding the lease on %s (%s)", self.directory,
                     f"pid {self.holder.pid} on host {self.host}")
        return self

    def check(self):
        """Raises LeaseError when the lease file is no longer this process's."""
        if self._lost is None:
            found = read_holder(self.directory)
            if found is None or found.token != self.holder.token:
                self._lost = found or dataclasses.replace(self.holder, token="", pid=-1)
        if self._lost is not None:
            who = (self._lost.describe(time.time()) if self._lost.pid >= 0
                   else "its lease file was deleted")
            raise LeaseError(f"lost the lease on {self.directory} ({who}); stopping without "
                             "writing to it")

    def _heartbeat(self):
        while not self._stop.wait(self.heartbeat_seconds):
            try:
                self.check()
                self._write()
            except LeaseError:
                logging.warning("Another process took the lease on %s; this run stops "
                                "before its next checkpoint", self.directory)
                return
            except Exception as e:  # a transient storage error: the next beat retries
                logging.warning("Could not renew the lease on %s (%s)", self.directory,
                                fileio.error_reason(e))

    def release(self):
        """Stops the heartbeat and deletes the lease file if it is still this process's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        found = read_holder(self.directory)
        if found is not None and found.token == self.holder.token:
            fileio.remove(self.path)

    def __enter__(self) -> "RunLease":
        return self.acquire()

    def __exit__(self, *exc):
        try:
            self.release()
        except Exception as e:  # never hide the error that ended the run
            logging.warning("Could not release the lease on %s (%s)", self.directory,
                            fileio.error_reason(e))


class _NoLease:
    """What a process that does not write the run directory (a non-chief worker) holds."""

    def check(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def hold(directory: str, writer: bool = True):
    """`RunLease(directory)` for the process that writes the run directory; a no-op for
    the others."""
    return RunLease(directory) if writer else _NoLease()
