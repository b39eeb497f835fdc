"""The repository's command lines as processes forked from one that has imported
TensorFlow already, so that a test that runs `python run_pretraining.py ...` does not pay
TensorFlow's import (6 s on an idle core, 12-15 s while the suite runs) for each
command.

`run(argv, cwd=..., timeout=...)` behaves as `subprocess.run([sys.executable, *argv],
capture_output=True, text=True, ...)`: argv is a script path, `-m module` or `-c code`
and its arguments; the command runs as `__main__` in a child process of a per-test-process
server (this file run as a script) that imported PRELOAD and nothing else of the command.
The child has its own pid, working directory, environment, argv, stdin (/dev/null),
stdout and stderr files and signal dispositions, and exits through the interpreter's own
shutdown (atexit handlers included), so its exit code, its output and what it leaves on
disk are those of `python <argv>`. What differs is only what happens at import: TensorFlow's
start-up messages are not printed again, and a command that must start without TensorFlow
(the import checks) is run with `subprocess` instead. A command whose environment differs
from the test process's in a variable read at start-up (PYTHONPATH, Cloud Storage settings,
...) is forked from a server started with that environment (one per such environment, kept
for the test process's life: MAX_SERVERS in all, then `subprocess`).
"""

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What the server imports before it forks: the framework and the modules every command
# line imports (its flags and its own module stay for the child).
PRELOAD = ("tensorflow", "keras", "tensorflow_text", "numpy", "electra_tf",
           "electra_tf.pretraining.pretrain", "electra_tf.finetune.cli",
           "electra_tf.conversion.convert", "tfrecord_builder.build")
# Variables read when Python or TensorFlow start: a command given other values of these
# runs as a plain subprocess.
STARTUP_VARIABLES = ("PYTHONPATH", "PYTHONHOME", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE",
                     "TF_CPP_MIN_LOG_LEVEL", "TF_CPP_MAX_VLOG_LEVEL", "TPU_LOAD_LIBRARY",
                     "TF_ENABLE_ONEDNN_OPTS", "CUDA_VISIBLE_DEVICES", "KERAS_BACKEND",
                     "TF_XLA_FLAGS", "XLA_FLAGS", "OMP_NUM_THREADS")
# ... and by TensorFlow's Cloud Storage filesystem, which is set up when TensorFlow loads.
STARTUP_PREFIXES = ("GCS_", "GOOGLE_", "CURL_", "https_proxy", "HTTPS_PROXY", "http_proxy",
                    "HTTP_PROXY", "NO_GCE_CHECK", "STORAGE_EMULATOR")

# The server's own default for a variable it reads at start-up (see _serve).
SERVER_DEFAULTS = {"TF_CPP_MIN_LOG_LEVEL": "2"}
MAX_SERVERS = 4

_servers = {}  # start-up key -> _Server
_lock = threading.Lock()


class _Server:
    def __init__(self, env):
        env = dict(env)
        self.log = tempfile.TemporaryFile(mode="w+")  # the server's own stderr
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, cwd=REPO, env=env, text=True,
                                     bufsize=1)
        ready = self.proc.stdout.readline()
        if ready.strip() != "ready":
            self.log.seek(0)
            raise RuntimeError(f"the command server did not start: {ready!r}\n"
                               f"{self.log.read()[-3000:]}")

    def request(self, req, timeout):
        """The command's exit code, or None once it ran past `timeout` (then killed)."""
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        pid = json.loads(self.proc.stdout.readline())["pid"]
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            os.kill(pid, signal.SIGKILL)
            self.proc.stdout.readline()
            return None
        return json.loads(self.proc.stdout.readline())["rc"]


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


def run(argv, cwd=REPO, timeout=300, env=None):
    """`subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=cwd,
    timeout=timeout, env=env)`, forked from the command server of env's start-up key."""
    argv = [str(a) for a in argv]
    env = dict(os.environ if env is None else env)
    key = startup_key(env)
    with _lock:
        server = _servers.get(key)
        if server is not None and server.proc.poll() is not None:  # it died: a new one
            del _servers[key]
            server = None
        if server is None and not _on_a_gpu_machine() and len(_servers) < MAX_SERVERS:
            server = _servers[key] = _Server(env)
        if server is None:
            return subprocess.run([sys.executable, *argv], capture_output=True, text=True,
                                  cwd=cwd, timeout=timeout, env=env)
        with tempfile.TemporaryDirectory() as d:
            out, err = os.path.join(d, "stdout"), os.path.join(d, "stderr")
            req = {"argv": argv, "cwd": str(cwd), "env": env, "stdout": out, "stderr": err}
            rc = server.request(req, timeout)
            with open(out, encoding="utf-8", errors="replace") as f:
                stdout = f.read()
            with open(err, encoding="utf-8", errors="replace") as f:
                stderr = f.read()
    if rc is None:
        raise subprocess.TimeoutExpired([sys.executable, *argv], timeout, stdout, stderr)
    return subprocess.CompletedProcess([sys.executable, *argv], rc, stdout, stderr)


# ------------------------------------------------------------------------------ the server


def _child(req):
    """In the forked child: become `python <argv>`. Returns if the command ends without
    exiting; its SystemExit or exception propagates to the interpreter's own exit."""
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY),
                            (1, req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                            (2, req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        opened = os.open(path, flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", closefd=False)  # line-buffered only on a terminal, as python
    sys.stderr = open(2, "w", closefd=False, errors="backslashreplace", buffering=1)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
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


def _serve():
    for name, value in SERVER_DEFAULTS.items():
        os.environ.setdefault(name, value)
    import importlib
    for name in PRELOAD:
        importlib.import_module(name)
    # The platforms' start-up lines (no CUDA driver, ...) here, not in each command's
    # stderr; this starts no thread.
    sys.modules["tensorflow"].config.list_physical_devices()
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    requests = sys.stdin
    replies.write("ready\n")
    for line in requests:
        req = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            replies.close()
            requests.close()
            _child(req)
            return  # the interpreter's normal exit, with the command's exit code
        replies.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"rc": os.waitstatus_to_exitcode(status)}) + "\n")


if __name__ == "__main__":
    sys.path[0] = REPO
    _serve()
