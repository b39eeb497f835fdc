"""electra_tf.training.lease: one writer per run directory (holder, refusal, stale leases,
takeover, a lost lease, release), local and on a remote filesystem."""

import json
import os
import subprocess
import sys
import time
import uuid

import pytest

from electra_tf import fileio
from electra_tf.training import lease


@pytest.fixture(autouse=True)
def quick(monkeypatch):
    monkeypatch.setattr(lease, "SETTLE_SECONDS", {"local": 0.0, "remote": 0.0})


def _write_holder(directory, **fields):
    holder = dict(token=uuid.uuid4().hex, host="other-host", pid=4242, command="x.py",
                  started=time.time() - 100, heartbeat=time.time() - 5)
    holder.update(fields)
    fileio.makedirs(directory)
    fileio.write_json_atomic(fileio.join(directory, lease.LEASE_FILE), holder)
    return holder


def _dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("where", ["local", "remote"])
def test_holding_and_releasing(tmp_path, where):
    # Remote: TensorFlow's in-memory filesystem where its layer serves, else fsspec's.
    scheme = "ram" if fileio.uses_tensorflow() else "memory"
    root = (str(tmp_path / "run") if where == "local" else
            f"{scheme}://lease_{uuid.uuid4().hex}/run")
    fileio.makedirs(root)
    with lease.RunLease(root) as held:
        found = json.loads(fileio.read_text(fileio.join(root, lease.LEASE_FILE)))
        assert found["pid"] == os.getpid() and found["token"] == held.holder.token
        assert found["heartbeat"] >= found["started"]
        held.check()  # still ours
        # A second holder in the same directory is refused, naming the first.
        with pytest.raises(lease.LeaseError) as e:
            lease.RunLease(root).acquire()
        message = str(e.value)
        assert message.startswith(f"{root} is in use by another run: pid {os.getpid()} on "
                                  "host ")
        assert "last heartbeat 0 s ago" in message and "another --model_dir" in message
        assert f"delete {root}/{lease.LEASE_FILE}" in message
    assert not fileio.exists(fileio.join(root, lease.LEASE_FILE))  # released


def test_a_live_holder_on_another_host_is_refused_until_stale(tmp_path):
    root = str(tmp_path)
    other = _write_holder(root, heartbeat=time.time() - 60)
    with pytest.raises(lease.LeaseError, match=r"pid 4242 on host other-host \(x.py\), "
                       r"started .* UTC, last heartbeat 60 s ago. .*wait 240 s"):
        lease.RunLease(root, stale_seconds=300).acquire()
    assert json.loads((tmp_path / lease.LEASE_FILE).read_text())["token"] == other["token"]
    # No heartbeat for longer than the stale time: taken over.
    _write_holder(root, heartbeat=time.time() - 301)
    held = lease.RunLease(root, stale_seconds=300).acquire()
    try:
        assert json.loads((tmp_path / lease.LEASE_FILE).read_text())["pid"] == os.getpid()
    finally:
        held.release()


@pytest.mark.subprocess
def test_a_dead_process_on_this_host_is_taken_over_at_once(tmp_path, caplog):
    import socket
    root = str(tmp_path)
    pid = _dead_pid()
    _write_holder(root, host=socket.gethostname(), pid=pid, heartbeat=time.time())
    with lease.RunLease(root):
        pass
    assert f"pid {pid} is no longer running on this host" in caplog.text
    # A live one on this host (this very process, under another token) is refused.
    _write_holder(root, host=socket.gethostname(), pid=os.getpid(), heartbeat=time.time())
    with pytest.raises(lease.LeaseError):
        lease.RunLease(root).acquire()


def test_an_unreadable_lease_file_is_no_lease(tmp_path):
    (tmp_path / lease.LEASE_FILE).write_text("{torn")
    with lease.RunLease(str(tmp_path)):
        pass


def test_a_lost_lease_is_noticed_by_check_and_by_the_heartbeat(tmp_path):
    root = str(tmp_path)
    held = lease.RunLease(root, heartbeat_seconds=0.05).acquire()
    try:
        first = json.loads((tmp_path / lease.LEASE_FILE).read_text())["heartbeat"]
        time.sleep(0.3)
        assert json.loads((tmp_path / lease.LEASE_FILE).read_text())["heartbeat"] > first
        thief = _write_holder(root, heartbeat=time.time())
        time.sleep(0.3)  # the heartbeat sees it and stops renewing: it never writes over it
        assert json.loads((tmp_path / lease.LEASE_FILE).read_text())["token"] == \
            thief["token"]
        with pytest.raises(lease.LeaseError, match=f"^lost the lease on {root} \\(pid 4242 "
                           "on host other-host .*\\); stopping without writing to it$"):
            held.check()
    finally:
        held.release()
    # Releasing leaves the other holder's lease alone.
    assert json.loads((tmp_path / lease.LEASE_FILE).read_text())["token"] == thief["token"]


def test_a_deleted_lease_file_is_a_lost_lease(tmp_path):
    held = lease.RunLease(str(tmp_path)).acquire()
    os.remove(tmp_path / lease.LEASE_FILE)
    with pytest.raises(lease.LeaseError, match="its lease file was deleted"):
        held.check()
    held.release()


def test_of_two_writers_racing_only_the_last_keeps_the_lease(tmp_path, monkeypatch):
    """Two processes that both found no lease: the one whose write landed first reads
    the other's back after the settle time and stops."""
    root = str(tmp_path)
    first, second = lease.RunLease(root), lease.RunLease(root)
    monkeypatch.setattr(lease, "read_holder", lambda d: None)  # both see no lease
    first._write()
    second._write()
    monkeypatch.undo()
    with pytest.raises(lease.LeaseError, match="^lost the lease"):
        first.check()
    second.check()


def test_no_lease_for_a_process_that_does_not_write(tmp_path):
    with lease.hold(str(tmp_path), writer=False) as held:
        held.check()
    assert not (tmp_path / lease.LEASE_FILE).exists()
