"""The repository's command lines as processes forked from one that has imported
TensorFlow already, so that a test that runs `python run_pretraining.py ...` does not pay
TensorFlow's import (6 s on an idle core, 12-15 s while the suite runs) for each
command.

`run(argv, cwd=..., timeout=...)` behaves as `subprocess.run([sys.executable, *argv],
capture_output=True, text=True, ...)` and `start(argv, ...)` as `subprocess.Popen(...)`
(pid, poll, wait, communicate, send_signal, kill, stdout/stderr pipes or files): argv is a
script path, `-m module` or `-c code` and its arguments; the command runs as `__main__` in
a child process of a per-test-process server (this file run as a script) that imported
PRELOAD and nothing else of the command. Several commands may run at once (the workers of
one job, two runs on one directory). The child has its own pid, working directory,
environment, argv, stdin (/dev/null), stdout and stderr and signal dispositions, and exits
through the interpreter's own shutdown (atexit handlers included), so its exit code, its
output and what it leaves on disk are those of `python <argv>`. What differs is only what
happens at import: TensorFlow's start-up messages are not printed again, and a command
that must start without TensorFlow (the import checks) is run with `subprocess` instead. A
command whose environment differs from the test process's in a variable read at start-up
(PYTHONPATH, Cloud Storage settings, ...) is forked from a server started with that
environment (one per such environment, kept for the test process's life: MAX_SERVERS in
all, then `subprocess`).

The server and the test process talk over a Unix socket pair: a request carries the
command and the file descriptors of its stdout and stderr (pipes or files the test process
opened), the server answers with the child's pid and, when it has reaped it, its exit code.
"""

import io
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What the server imports before it forks: the framework and the modules every command
# line imports (its flags and its own module stay for the child). electra_tf first, as
# every command line does: it sets up the TPU build's runtime before TensorFlow loads
# (compat.configure_tpu_library; imported first, the TPU build on a host without TPU
# chips waits for one).
PRELOAD = ("electra_tf", "tensorflow", "keras", "tensorflow_text", "numpy",
           "electra_tf.pretraining.pretrain", "electra_tf.finetune.cli",
           "electra_tf.conversion.convert", "tfrecord_builder.build")
# Variables read when Python or TensorFlow start: a command given other values of these
# forks from a server started with them.
STARTUP_VARIABLES = ("PYTHONPATH", "PYTHONHOME", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE",
                     "TF_CPP_MIN_LOG_LEVEL", "TF_CPP_MAX_VLOG_LEVEL", "TPU_LOAD_LIBRARY",
                     "TF_ENABLE_ONEDNN_OPTS", "CUDA_VISIBLE_DEVICES", "KERAS_BACKEND",
                     "TF_XLA_FLAGS", "XLA_FLAGS", "OMP_NUM_THREADS")
# ... and by TensorFlow's Cloud Storage filesystem, which is set up when TensorFlow loads.
STARTUP_PREFIXES = ("GCS_", "JAX_", "GOOGLE_", "CURL_", "https_proxy", "HTTPS_PROXY", "http_proxy",
                    "HTTP_PROXY", "NO_GCE_CHECK", "STORAGE_EMULATOR")
# The server's own default for a variable it reads at start-up (see _serve).
SERVER_DEFAULTS = {"TF_CPP_MIN_LOG_LEVEL": "2"}
MAX_SERVERS = 4
START_TIMEOUT = 300  # seconds for a server's imports
_MESSAGE = 1 << 20  # the largest request or reply (a command and its environment)

PIPE, DEVNULL, STDOUT = subprocess.PIPE, subprocess.DEVNULL, subprocess.STDOUT

_servers = {}  # start-up key -> _Server
_lock = threading.Lock()


class _Server:
    """One server process and a thread that reads its replies."""

    def __init__(self, env):
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.log = tempfile.TemporaryFile(mode="w+")  # the server's own stderr
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), str(theirs.fileno())],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.log, cwd=REPO,
            env=dict(env), pass_fds=[theirs.fileno()])
        theirs.close()
        self.sock = mine
        self.send_lock = threading.Lock()
        self.changed = threading.Condition()
        self.pids, self.exits = {}, {}  # request id -> pid; pid -> exit code
        self.next_id = 0
        self.dead = False  # the server ended
        self.sock.settimeout(START_TIMEOUT)
        try:
            ready = self._receive()
        except socket.timeout:
            self.proc.kill()
            ready = "no reply within %d s" % START_TIMEOUT
        if ready != {"ready": True}:
            self.log.seek(0)
            raise RuntimeError(f"the command server did not start ({ready}):\n"
                               f"{self.log.read()[-3000:]}")
        self.sock.settimeout(None)
        threading.Thread(target=self._read_replies, daemon=True).start()

    def _receive(self):
        data = self.sock.recv(_MESSAGE)
        return json.loads(data) if data else None

    def _read_replies(self):
        while True:
            try:
                reply = self._receive()
            except OSError:
                reply = None
            with self.changed:
                if reply is None:  # the server ended: its children's codes are lost
                    self.dead = True
                elif "exit" in reply:
                    self.exits[reply["exit"]] = reply["rc"]
                else:
                    self.pids[reply["id"]] = reply["pid"]
                self.changed.notify_all()
            if reply is None:
                return

    def spawn(self, argv, cwd, env, fds, nice, new_session=False):
        """Starts the command with stdout, stderr on `fds`; returns its pid."""
        with self.send_lock:
            self.next_id += 1
            ident = self.next_id
            req = json.dumps({"id": ident, "argv": argv, "cwd": str(cwd), "env": env,
                              "nice": nice, "new_session": new_session})
            socket.send_fds(self.sock, [req.encode()], fds)
        with self.changed:
            self.changed.wait_for(lambda: ident in self.pids or self.dead)
            if self.dead:
                raise RuntimeError("the command server ended")
            return self.pids.pop(ident)

    def wait(self, pid, timeout):
        """The exit code of `pid`, or None if it still runs after `timeout` seconds."""
        with self.changed:
            self.changed.wait_for(lambda: pid in self.exits or self.dead, timeout)
            if pid in self.exits:
                return self.exits[pid]
            if self.dead:
                raise RuntimeError("the command server ended before its command")
            return None


class Process:
    """What `subprocess.Popen` gives for a command forked from a server."""

    def __init__(self, server, argv, cwd, env, stdout, stderr, nice=0, new_session=False):
        self.args = [sys.executable, *argv]
        self.returncode = None
        self._server = server
        self.stdout = self.stderr = None
        fds, close = [], []
        for name, how in (("stdout", stdout), ("stderr", stderr)):
            if how == PIPE:
                read, write = os.pipe()
                setattr(self, name, io.open(read, "r", encoding="utf-8", errors="replace"))
                fds.append(write)
                close.append(write)
            elif how == DEVNULL:
                fd = os.open(os.devnull, os.O_WRONLY)
                fds.append(fd)
                close.append(fd)
            elif how is None:  # this process's own (as a plain child inherits them)
                fds.append(1 if name == "stdout" else 2)
            elif how == STDOUT:  # stderr into stdout's file
                assert name == "stderr"
                fds.append(fds[0])
            else:
                fds.append(how if isinstance(how, int) else how.fileno())
        try:
            self.pid = server.spawn(argv, cwd, env, fds, nice, new_session)
        finally:
            for fd in close:
                os.close(fd)

    def poll(self):
        if self.returncode is None:
            self.returncode = self._server.wait(self.pid, 0)
        return self.returncode

    def wait(self, timeout=None):
        if self.returncode is None:
            self.returncode = self._server.wait(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, timeout=None):
        """(stdout, stderr) read to their ends (None where not a pipe), then the exit."""
        deadline = None if timeout is None else time.monotonic() + timeout
        out = {}
        readers = [threading.Thread(target=lambda n=n, f=f: out.__setitem__(n, f.read()),
                                    daemon=True)
                   for n, f in (("stdout", self.stdout), ("stderr", self.stderr)) if f]
        for r in readers:
            r.start()
        for r in readers:
            r.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if r.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        for f in (self.stdout, self.stderr):
            if f:
                f.close()
        return out.get("stdout"), out.get("stderr")

    def send_signal(self, sig):
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for f in (self.stdout, self.stderr):
            if f:
                f.close()
        self.wait()


def _on_a_gpu_machine():
    # The server initialises the framework's devices before it forks (so that their
    # start-up lines are printed once, by the server): never where a GPU is, whose driver
    # does not survive a fork.
    return os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl")


def startup_key(env):
    """What of `env` a process reads when Python or TensorFlow start: commands with equal
    keys can fork from one server."""
    names = set(STARTUP_VARIABLES) | {k for k in env if k.startswith(STARTUP_PREFIXES)}
    return tuple(sorted((k, env.get(k, SERVER_DEFAULTS.get(k))) for k in names))


def _server_for(env):
    """The server for env's start-up key (started if need be), or None: run a subprocess."""
    key = startup_key(env)
    with _lock:
        server = _servers.get(key)
        if server is not None and (server.dead or server.proc.poll() is not None):
            del _servers[key]  # it died: a new one
            server = None
        if server is None and not _on_a_gpu_machine() and len(_servers) < MAX_SERVERS:
            server = _servers[key] = _Server(env)
        return server


def start(argv, cwd=REPO, env=None, stdout=None, stderr=None, nice=0,
          start_new_session=False):
    """`subprocess.Popen([sys.executable, *argv], cwd=cwd, env=env, stdout=stdout,
    stderr=stderr, text=True, start_new_session=start_new_session)` (stdout: PIPE,
    DEVNULL, None or an open file; stderr: the same or STDOUT), forked from the command
    server of env's start-up key; `nice` as os.nice in the child."""
    argv = [str(a) for a in argv]
    env = dict(os.environ if env is None else env)
    server = _server_for(env)
    if server is None:
        return subprocess.Popen([sys.executable, *argv], cwd=cwd, env=env, stdout=stdout,
                                stderr=stderr, text=True, start_new_session=start_new_session,
                                preexec_fn=(lambda: os.nice(nice)) if nice else None)
    return Process(server, argv, cwd, env, stdout, stderr, nice, start_new_session)


def popen(cmd, cwd=REPO, env=None, stdout=None, stderr=None, text=True, bufsize=-1,
          start_new_session=False):
    """`subprocess.Popen(cmd, ...)` for a `cmd` of this interpreter (`[sys.executable,
    *argv]`, text mode), forked as `start` does: for code that takes a Popen to call
    (bench/fault_injection.py's POPEN)."""
    assert cmd[0] == sys.executable and text, cmd
    return start(cmd[1:], cwd=cwd, env=env, stdout=stdout, stderr=stderr,
                 start_new_session=start_new_session)


def run(argv, cwd=REPO, timeout=300, env=None):
    """`subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=cwd,
    timeout=timeout, env=env)`, forked from the command server of env's start-up key."""
    argv = [str(a) for a in argv]
    env = dict(os.environ if env is None else env)
    server = _server_for(env)
    if server is None:
        return subprocess.run([sys.executable, *argv], capture_output=True, text=True,
                              cwd=cwd, timeout=timeout, env=env)
    # Files, not pipes: nothing to drain while waiting.
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = Process(server, argv, cwd, env, out, err)
        try:
            proc.wait(timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            timed_out = True
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if timed_out:
        raise subprocess.TimeoutExpired([sys.executable, *argv], timeout, stdout, stderr)
    return subprocess.CompletedProcess([sys.executable, *argv], proc.returncode, stdout, stderr)


# ------------------------------------------------------------------------------ the server


def _child(req, fds):
    """In the forked child: become `python <argv>`. Returns if the command ends without
    exiting; its SystemExit or exception propagates to the interpreter's own exit."""
    if req.get("new_session"):
        os.setsid()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    for target, fd in zip((1, 2), fds):  # fds: received, so never 0-2 (open in the server)
        os.dup2(fd, target)
    for fd in fds:
        os.close(fd)
    sys.stdin = open(0, closefd=False)
    # Line-buffered only on a terminal, as python, or where PYTHONUNBUFFERED asks (each
    # line written as it ends, as `python -u` writes it).
    sys.stdout = open(1, "w", closefd=False,
                      buffering=1 if req["env"].get("PYTHONUNBUFFERED") else -1)
    sys.stderr = open(2, "w", closefd=False, errors="backslashreplace", buffering=1)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
                signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    if req["nice"]:
        os.nice(req["nice"])
    argv = req["argv"]
    import runpy
    if argv[0] == "-m":
        sys.argv = [argv[1]] + argv[2:]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[0] == "-c":
        sys.argv = ["-c"] + argv[2:]
        sys.path[0] = ""
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
    else:
        script = os.path.abspath(argv[0])
        sys.argv = argv
        sys.path[0] = os.path.dirname(script)
        runpy.run_path(script, run_name="__main__")


def _serve(sock):
    for name, value in SERVER_DEFAULTS.items():
        os.environ.setdefault(name, value)
    import importlib
    for name in PRELOAD:
        importlib.import_module(name)
    # The platforms' start-up lines (no CUDA driver, ...) here, not in each command's
    # stderr; this starts no thread.
    sys.modules["tensorflow"].config.list_physical_devices()
    sock.send(json.dumps({"ready": True}).encode())
    children = set()
    while True:
        # Reap every child that ended (a 50 ms poll: no signal handler to race with fork).
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                sock.send(json.dumps({"exit": pid,
                                      "rc": os.waitstatus_to_exitcode(status)}).encode())
        ready, _, _ = select.select([sock], [], [], 0.05)
        if not ready:
            continue
        data, fds, _, _ = socket.recv_fds(sock, _MESSAGE, 2)
        if not data:  # the test process ended
            return
        req = json.loads(data)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            sock.close()
            _child(req, fds)
            return  # the interpreter's normal exit, with the command's exit code
        for fd in fds:
            os.close(fd)
        children.add(pid)
        sock.send(json.dumps({"id": req["id"], "pid": pid}).encode())


if __name__ == "__main__":
    sys.path[0] = REPO
    _serve(socket.socket(fileno=int(sys.argv[1])))
