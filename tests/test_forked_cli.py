"""tests/forked_cli.py: a command forked from the command server ends as `python <argv>`
in a fresh process does (exit code, stdout, stderr, working directory, environment, argv,
an uncaught exception, a timeout), and a command whose start-up environment differs forks
from a server started with that environment."""

import os
import subprocess
import sys

import pytest

import forked_cli

pytestmark = pytest.mark.subprocess

SCRIPT = """
import os, sys
print("argv", sys.argv[1:], "cwd", os.getcwd(), "var", os.environ.get("FORKED_CLI_VAR"))
print("pid differs", os.getpid() != int(sys.argv[1]), file=sys.stderr)
print("tensorflow", "tensorflow" in sys.modules, file=sys.stderr)
if sys.argv[2] == "raise":
    raise ValueError("boom")
sys.exit(sys.argv[2] if not sys.argv[2].isdigit() else int(sys.argv[2]))
"""


@pytest.mark.parametrize("how", ["0", "3", "a message", "raise"])
def test_a_forked_command_ends_as_the_same_python_command(tmp_path, how):
    env = dict(os.environ, FORKED_CLI_VAR="set")
    argv = ["-c", SCRIPT, str(os.getpid()), how]
    forked = forked_cli.run(argv, cwd=tmp_path, env=env)
    plain = subprocess.run([sys.executable, *argv], capture_output=True, text=True,
                           cwd=tmp_path, env=env)
    assert forked.returncode == plain.returncode == {"0": 0, "3": 3}.get(how, 1)
    assert forked.stdout == plain.stdout == \
        f"argv ['{os.getpid()}', '{how}'] cwd {tmp_path} var set\n"
    # The same stderr, but that the server has TensorFlow imported already.
    assert forked.stderr.splitlines()[0] == plain.stderr.splitlines()[0] == "pid differs True"
    assert forked.stderr.splitlines()[1] == "tensorflow True"
    assert plain.stderr.splitlines()[1] == "tensorflow False"
    # What follows: nothing, the exit message, or the traceback's last line.
    assert forked.stderr.splitlines()[2:][-1:] == plain.stderr.splitlines()[2:][-1:] == {
        "0": [], "3": [], "a message": ["a message"], "raise": ["ValueError: boom"]}[how]


def test_a_script_runs_as_main_from_its_directory(tmp_path):
    script = tmp_path / "tool.py"
    script.write_text("import sys\nprint(__name__, sys.path[0], sys.argv)\n")
    done = forked_cli.run([str(script), "--x=1"], cwd=tmp_path)
    assert done.returncode == 0
    assert done.stdout == f"__main__ {tmp_path} ['{script}', '--x=1']\n"


def test_a_command_past_its_timeout_is_killed():
    with pytest.raises(subprocess.TimeoutExpired):
        forked_cli.run(["-c", "import time; print('started', flush=True); time.sleep(60)"],
                       timeout=2)
    # The server goes on serving.
    assert forked_cli.run(["-c", "print('next')"]).stdout == "next\n"


def test_a_start_up_variable_gets_a_server_started_with_it():
    extra = "/nonexistent-forked-cli-dir"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [
        os.environ.get("PYTHONPATH"), extra])))
    code = ("import os, sys; print('tensorflow' in sys.modules, %r in sys.path, os.getppid())"
            % extra)
    first, second = (forked_cli.run(["-c", code], env=env) for _ in range(2))
    default = forked_cli.run(["-c", code])
    # PYTHONPATH is read when Python starts: the command sees it as `python -c` would,
    # forked (TensorFlow imported) from one server kept for that environment.
    tf_loaded, on_path, parent = first.stdout.split()
    assert first.returncode == 0 and (tf_loaded, on_path) == ("True", "True"), first
    assert second.stdout == first.stdout
    assert default.stdout.split()[:2] == ["True", "False"]
    assert default.stdout.split()[2] != parent
    assert forked_cli.startup_key(env) != forked_cli.startup_key(os.environ)
    # The server's own default for a variable counts as unset.
    assert forked_cli.startup_key(dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")) == \
        forked_cli.startup_key({k: v for k, v in os.environ.items()
                                if k != "TF_CPP_MIN_LOG_LEVEL"})


WAITER = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(75))
print("out", sys.argv[1], flush=True)
print("started", sys.argv[1], file=sys.stderr, flush=True)
time.sleep(60)
"""


def test_started_commands_run_at_once_and_take_signals_as_popen_ones_do(tmp_path):
    """Two commands at once; each one's stderr is read line by line while it runs; SIGTERM
    (handled: exit 75) and SIGKILL (-9) end them with Popen's return codes."""
    log = open(tmp_path / "b.log", "w")
    a = forked_cli.start(["-c", WAITER, "a"], stdout=forked_cli.PIPE, stderr=forked_cli.PIPE)
    b = forked_cli.start(["-c", WAITER, "b"], stdout=forked_cli.DEVNULL, stderr=log)
    log.close()
    plain = subprocess.Popen([sys.executable, "-c", WAITER, "p"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    assert a.stderr.readline() == "started a\n" and plain.stderr.readline() == "started p\n"
    assert a.poll() is None and b.poll() is None and a.pid != b.pid
    with pytest.raises(subprocess.TimeoutExpired):
        a.wait(0.2)
    for proc in (a, plain):
        proc.send_signal(15)
        assert proc.communicate(timeout=60) == ("out %s\n" % proc.args[-1], "")
        assert proc.returncode == 75
    b.kill()
    assert b.wait(60) == -9 and b.poll() == -9
    assert (tmp_path / "b.log").read_text() == "started b\n"


MERGED = """
import os, sys
print("out 1")
print("err 2", file=sys.stderr)
print("out 3")
print("session leader", os.getsid(0) == os.getpid(), "group", os.getpgid(0) == os.getpid())
"""


def test_popen_merges_stderr_into_stdout_in_its_own_session():
    """As `subprocess.Popen([python, ...], stdout=PIPE, stderr=STDOUT, text=True,
    start_new_session=True)` with PYTHONUNBUFFERED=1 (bench/fault_injection.py's commands):
    one stream in the order written, and a process group to signal."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    got = {}
    for name, make in (("forked", forked_cli.popen), ("plain", subprocess.Popen)):
        proc = make([sys.executable, "-c", MERGED], cwd=forked_cli.REPO, env=env,
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                    start_new_session=True)
        got[name] = (proc.stdout.read(), proc.wait(60))
        proc.stdout.close()
    assert got["forked"] == got["plain"] == (
        "out 1\nerr 2\nout 3\nsession leader True group True\n", 0)
