"""Preemption notices: SIGTERM and the GCE metadata server (a fake one on localhost),
from the watch itself to a pre-training run that stops, saves and resumes."""

import contextlib
import http.server
import os
import signal
import threading

import pytest
import tensorflow as tf

from electra_tf.training.options import PretrainingOptions
from electra_tf.pretraining import pretrain
from electra_tf.training.tf_runtime.devices import TfDevices
from electra_tf.training import gce, preemption
from electra_tf.configs import load_config


class FakeMetadata(http.server.BaseHTTPRequestHandler):
    """GCE's metadata server for `instance/<key>`: answers only with the
    Metadata-Flavor header, as the real one."""
    values = {}
    requests = []

    def do_GET(self):
        key = self.path.split("/computeMetadata/v1/instance/")[-1]
        self.requests.append(key)
        if self.headers.get("Metadata-Flavor") != "Google":
            self.send_response(403)
            self.end_headers()
            return
        body = self.values.get(key, "").encode()
        self.send_response(200 if key in self.values else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def metadata_server(monkeypatch, **values):
    FakeMetadata.values = {k.replace("_", "-"): v for k, v in values.items()}
    FakeMetadata.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeMetadata)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv(gce.METADATA_HOST_ENV, f"127.0.0.1:{server.server_port}")
    monkeypatch.setattr(preemption, "METADATA_POLL_SECONDS", 0.02)
    try:
        yield FakeMetadata
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("event, preempted, expected", [
    ("NONE", "FALSE", None),
    ("MIGRATE_ON_HOST_MAINTENANCE", "FALSE", None),  # live migration: the VM keeps running
    ("TERMINATE_ON_HOST_MAINTENANCE", "FALSE",
     "GCE maintenance event (TERMINATE_ON_HOST_MAINTENANCE)"),
    ("NONE", "TRUE", "GCE preemption"),
])
def test_metadata_notice(monkeypatch, event, preempted, expected):
    with metadata_server(monkeypatch, maintenance_event=event, preempted=preempted) as fake:
        assert gce.on_gce()
        assert preemption.metadata_notice() == expected
        assert fake.requests[0] == "maintenance-event"


def test_metadata_notice_sends_the_flavor_header(monkeypatch):
    with metadata_server(monkeypatch, maintenance_event="NONE", preempted="FALSE"):
        host = os.environ[gce.METADATA_HOST_ENV]
        with pytest.raises(OSError, match="403"):
            import urllib.request
            urllib.request.urlopen(f"http://{host}/computeMetadata/v1/instance/preempted")
        assert preemption.metadata_notice() is None


def _saver(paths):
    def save():
        paths.append(f"ckpt-{len(paths) + 1}")
        return paths[-1]
    return save


@pytest.fixture
def off_gce(monkeypatch):
    """A one-device strategy on a host that is not a GCE VM (signals are the only source)."""
    monkeypatch.delenv(gce.METADATA_HOST_ENV, raising=False)
    monkeypatch.setattr(gce, "on_gce", lambda: False)
    return TfDevices(tf.distribute.OneDeviceStrategy("/cpu:0"))


def test_sigterm_is_a_notice_and_the_handler_is_restored(off_gce):
    strategy = off_gce
    previous = signal.getsignal(signal.SIGTERM)
    saved = []
    with preemption.PreemptionWatch(strategy, what="trial") as watch:
        watch.stop_if_noticed(3, _saver(saved))  # nothing yet: no save
        assert saved == []
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # a second notice changes nothing
        with pytest.raises(preemption.Preempted) as e:
            watch.stop_if_noticed(7, _saver(saved))
    assert saved == ["ckpt-1"]
    assert str(e.value) == ("SIGTERM at step 7 of the trial: saved ckpt-1; rerun the same "
                            "command to resume")
    assert signal.getsignal(signal.SIGTERM) == previous
    assert e.value.exit_code == preemption.PREEMPTED_EXIT_CODE == 75


def test_ctrl_c_saves_and_exits_130_and_a_second_one_interrupts(off_gce):
    strategy = off_gce
    previous = signal.getsignal(signal.SIGINT)
    saved = []
    with preemption.PreemptionWatch(strategy) as watch:
        os.kill(os.getpid(), signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):  # the second: Python's own, at once
            os.kill(os.getpid(), signal.SIGINT)
        with pytest.raises(preemption.Preempted) as e:
            watch.stop_if_noticed(5, _saver(saved))
    assert saved == ["ckpt-1"]
    assert str(e.value) == "SIGINT at step 5: saved ckpt-1; rerun the same command to resume"
    assert e.value.exit_code == preemption.INTERRUPTED_EXIT_CODE == 130
    assert signal.getsignal(signal.SIGINT) == previous


def test_maintenance_event_while_the_loop_runs(monkeypatch):
    strategy = TfDevices(tf.distribute.OneDeviceStrategy("/cpu:0"))
    with metadata_server(monkeypatch, maintenance_event="NONE", preempted="FALSE") as fake:
        with preemption.PreemptionWatch(strategy) as watch:
            saved = []
            watch.stop_if_noticed(1, _saver(saved))
            fake.values["maintenance-event"] = "TERMINATE_ON_HOST_MAINTENANCE"
            for _ in range(500):  # the watcher polls every 20 ms
                if watch.notices:
                    break
                threading.Event().wait(0.01)
            with pytest.raises(preemption.Preempted, match=r"^GCE maintenance event "
                               r"\(TERMINATE_ON_HOST_MAINTENANCE\) at step 2: saved ckpt-1;"):
                watch.stop_if_noticed(2, _saver(saved))
        polled = len(fake.requests)
        threading.Event().wait(0.1)
        assert len(fake.requests) == polled  # the watcher stopped with the notice


def test_unreachable_metadata_server_is_no_notice(monkeypatch):
    import socket
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv(gce.METADATA_HOST_ENV, f"127.0.0.1:{port}")
    monkeypatch.setattr(preemption, "METADATA_POLL_SECONDS", 0.02)
    strategy = TfDevices(tf.distribute.OneDeviceStrategy("/cpu:0"))
    with preemption.PreemptionWatch(strategy) as watch:
        threading.Event().wait(0.2)
        watch.stop_if_noticed(5, _saver([]))
        assert watch.notices == [] and watch._metadata_failed


@pytest.mark.e2e
def test_pretraining_stops_on_a_maintenance_event(tmp_path, sample_build, monkeypatch):
    """A run started during a pending TERMINATE maintenance saves after its first host
    loop and raises Preempted (the rerun resumes from that checkpoint as after SIGTERM:
    test_pretrain)."""
    cfg = load_config("tiny", {"train_batch_size": "8", "num_train_steps": "6",
                               "save_checkpoints_steps": "100", "steps_per_loop": "2",
                               "log_every_steps": "2", "warmup_steps": "2"})
    options = PretrainingOptions(model_dir=str(tmp_path / "run"), train_data=sample_build[0],
                               strategy="cpu", jit_compile=False)
    with metadata_server(monkeypatch, maintenance_event="TERMINATE_ON_HOST_MAINTENANCE",
                         preempted="FALSE") as fake:
        with pytest.raises(preemption.Preempted, match=r"^GCE maintenance event .* at step 2: "
                           r"saved .*ckpt-2; rerun"):
            pretrain.run(cfg, options)
        assert fake.requests[0] == "maintenance-event"  # looked up before the first loop
    assert tf.train.latest_checkpoint(options.model_dir).endswith("ckpt-2")
    step = tf.train.load_checkpoint(options.model_dir).get_tensor("global_step/.ATTRIBUTES/"
                                                                 "VARIABLE_VALUE")
    assert int(step) == 2
