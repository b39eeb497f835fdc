"""A multi-process JAX job's guard against a lost process.

When one process of a `jax.distributed` job dies (SIGKILL, OOM, a host gone), JAX's
coordination service notices it (process 0's death at once, another's after
`heartbeat_timeout_seconds` without a heartbeat) and terminates every other process from a
C++ thread: a fatal log line, a C++ stack trace and Python's fatal-error dump, exit code
134. Nothing in the dying process can print something clearer first, so the guard is a
second process: `start` forks before `jax.distributed.initialize`; the child runs the job
with its stderr through a pipe, and the parent relays every line of it, waits, and exits
with the child's code. When the child ends on JAX's verdict, the parent drops the crash
dump and prints one line naming the lost process instead, and exits LOST_PROCESS_EXIT_CODE.

The parent forwards SIGTERM, SIGINT and SIGHUP to the child (which runs in its own process
group, so a terminal's Ctrl-C reaches it once, through the parent), and the child dies with
the parent (Linux: PR_SET_PDEATHSIG), so SIGKILL to the process a scheduler started stops
the job's process as it would an unguarded one. ELECTRA_TF_PROCESS_GUARD=0 runs without the
guard (one process, JAX's own messages)."""

import contextlib
import os
import re
import signal
import sys
import time
from typing import List, Optional

# EX_UNAVAILABLE: another process of the job was lost; rerun every process to resume
# from the last checkpoint.
LOST_PROCESS_EXIT_CODE = 69

# JAX's verdict, in the fatal log line it prints before terminating the process.
FATAL = b"Terminating process because the JAX distributed service detected fatal errors"
# Lines of the coordination service that come just before the verdict: held back, and
# printed unless the verdict follows.
COORDINATION = re.compile(rb"^[EWF]\d{4} .*(coordination_service|preemption_sync_manager|"
                          rb"client\.h:|distributed_runtime)")
LOG_LINE = re.compile(rb"^[IWEF]\d{4} |^[A-Za-z_]+: ")  # an absl line or a CLI's own line
HOLD_SECONDS = 2.0


def enabled() -> bool:
    return os.environ.get("ELECTRA_TF_PROCESS_GUARD", "1") != "0" and hasattr(os, "fork")


def start(process_id: Optional[int], num_processes: Optional[int]) -> None:
    """Forks: returns in the child (which goes on to join the cluster); the parent relays
    the child's stderr and exits with its code, never returning."""
    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        os.dup2(write_end, 2)
        os.close(write_end)
        # Its own process group, where the system allows it; else it stays in the parent's,
        # and a terminal's Ctrl-C reaches it twice (directly and forwarded): the same stop.
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)
        _die_with(parent)
        return
    os.close(write_end)
    prog = os.path.splitext(os.path.basename(sys.argv[0] or "electra_tf"))[0]
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda s, frame: _send(pid, s))
    relay = Relay(process_id, num_processes, prog)
    code = relay.run(read_end, pid)
    os._exit(code)


def _send(pid: int, signum: int):
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _die_with(parent: int):
    """The child gets SIGKILL when the parent dies (Linux), and stops now if it already
    has."""
    if sys.platform.startswith("linux"):
        import ctypes
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:
        os._exit(1)


class Relay:
    """The parent's side: the child's stderr line by line to ours, JAX's crash dump held
    back, and the exit code."""

    def __init__(self, process_id: Optional[int], num_processes: Optional[int], prog: str,
                 out=None):
        self.process_id, self.num_processes, self.prog = process_id, num_processes, prog
        self.out = out or sys.stderr.buffer
        self.held: List[bytes] = []
        self.held_since = 0.0
        self.verdict: Optional[List[bytes]] = None  # the fatal line and what followed it
        self.ending = False  # a traceback came: everything after it is held to the end

    def feed(self, line: bytes):
        if self.verdict is not None:
            self.verdict.append(line)
            return
        if FATAL in line:
            self.verdict = [line]
            return
        if line.startswith(b"Traceback (most recent call last):"):
            # The process is ending: a collective that failed with the lost process
            # raises here before JAX's verdict comes. Held until the child has exited.
            self.ending = True
        if not (self.ending or self.held or COORDINATION.search(line)):
            self._write([line])
            return
        if (not self.ending and LOG_LINE.search(line) and not COORDINATION.search(line)
                and time.monotonic() - self.held_since > HOLD_SECONDS):
            # No verdict came after the service's lines: they were no crash.
            self._write(self.held + [line])
            self.held = []
            return
        if not self.held:
            self.held_since = time.monotonic()
        self.held.append(line)  # in order, behind the lines held before it

    def _write(self, lines):
        self.out.write(b"".join(lines))
        self.out.flush()

    def finish(self, status: int) -> int:
        """-> the exit code for the child's wait status."""
        if self.verdict is not None:
            self._write([(self.lost_line() + "\n").encode()])
            return LOST_PROCESS_EXIT_CODE
        self._write(self.held)
        self.held = []
        if os.WIFSIGNALED(status):
            return 128 + os.WTERMSIG(status)
        return os.WEXITSTATUS(status)

    def lost_line(self) -> str:
        text = b"".join(self.held + (self.verdict or [])).decode("utf-8", "replace")
        # The cluster as given (TF_CONFIG, JAX_*); None where JAX found it itself.
        n = f" of {self.num_processes}" if self.num_processes else ""
        me = "this process" if self.process_id is None else f"process {self.process_id}"
        found = re.search(r"stopped sending heartbeats\):\s*\n((?:\s*\d+[,\s]*\n)+)", text)
        if found:
            lost = sorted({int(i) for i in re.findall(r"\d+", found.group(1))})
            who = ", ".join(str(i) for i in lost)
            return (f"{self.prog}: error: lost process {who}{n}: it stopped sending "
                    f"heartbeats to the JAX coordination service (killed, out of memory or "
                    f"its host gone); {me} stopped. Rerun every process to resume "
                    "from the last checkpoint")
        if "leader task" in text or "coordination service" in text and "RPC" in text:
            return (f"{self.prog}: error: lost process 0{n} (the coordinator): the JAX "
                    f"coordination service stopped answering (killed, out of memory or its "
                    f"host gone); {me} stopped. Rerun every process to resume from "
                    "the last checkpoint")
        status = re.search(r"absl::Status: ([^\n]*)", text)
        return (f"{self.prog}: error: the JAX distributed service stopped {me}{n}: "
                f"{status.group(1) if status else 'another process failed'}. Rerun every "
                "process to resume from the last checkpoint")

    def run(self, fd: int, pid: int) -> int:
        with os.fdopen(fd, "rb") as pipe:
            while True:
                try:
                    line = pipe.readline()
                except InterruptedError:
                    continue
                if not line:
                    break
                self.feed(line)
        while True:
            try:
                _, status = os.waitpid(pid, 0)
                break
            except InterruptedError:
                continue
        return self.finish(status)
