"""Peak FLOP/s: the accelerator table, device counts, overrides and the CPU measurement."""

import inspect
import types

import pytest
import tensorflow as tf

from electra_tf.training import gce, hardware
from electra_tf.training.tf_runtime.devices import TfDevices

T = 1e12


@pytest.mark.parametrize("name, chip, bf16, tf32, fp32", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.4 * T, 494.7 * T, 66.9 * T),
    ("NVIDIA H100 PCIe", "H100 PCIe", 756.5 * T, 378 * T, 51.2 * T),
    ("NVIDIA H100 NVL", "H100 NVL", 835.5 * T, 417.5 * T, 60 * T),
    ("NVIDIA H200", "H200 SXM", 989.4 * T, 494.7 * T, 66.9 * T),
    ("NVIDIA A100-SXM4-40GB", "A100", 312 * T, 156 * T, 19.5 * T),
    ("NVIDIA A100 80GB PCIe", "A100", 312 * T, 156 * T, 19.5 * T),
    # No TF32 on V100: float32 is the plain FP32 peak even with TF32 execution enabled;
    # its "bf16" column is the fp16 tensor-core peak.
    ("Tesla V100-SXM2-16GB", "V100 SXM2", 125 * T, 15.7 * T, 15.7 * T),
    ("Tesla V100-PCIE-32GB", "V100 PCIe", 112 * T, 14 * T, 14 * T),
    # TPUs: float32 is one bf16 pass with TF32 execution on, six with it off.
    ("v2-8", "TPU v2", 45 * T, 45 * T, 7.5 * T),
    ("v3-32", "TPU v3", 123 * T, 123 * T, 20.5 * T),
    ("TPU v4", "TPU v4", 275 * T, 275 * T, 275 * T / 6),
    ("v5litepod-16", "TPU v5e", 197 * T, 197 * T, 197 * T / 6),
    ("TPU v5 lite", "TPU v5e", 197 * T, 197 * T, 197 * T / 6),
    ("v5p-128", "TPU v5p", 459 * T, 459 * T, 459 * T / 6),
])
def test_table(name, chip, bf16, tf32, fp32):
    found = hardware.lookup(name)
    assert found is not None and found.name == chip
    assert found.peak("bfloat16")[0] == pytest.approx(bf16)
    assert found.peak("float16")[0] == pytest.approx(bf16)
    assert found.peak("float32", tf32_enabled=True)[0] == pytest.approx(tf32)
    assert found.peak("float32", tf32_enabled=False)[0] == pytest.approx(fp32)


@pytest.mark.parametrize("name", ["NVIDIA GeForce RTX 4090", "Tesla T4", "NVIDIA L4",
                                  "NVIDIA GH100", "", "cpu"])
def test_unknown_devices(name):
    assert hardware.lookup(name) is None


@pytest.mark.parametrize("text, value", [
    ("312e12", 312e12), ("312T", 312e12), ("312 TFLOP/s", 312e12), ("1.5P", 1.5e15),
    ("989.4tflops", 989.4e12), ("2.2e11", 2.2e11), (7e10, 7e10), ("45G", 45e9)])
def test_parse_flops(text, value):
    assert hardware.parse_flops(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["-5", "0", "abc", "312X", "1e400", "", "1.2.3T"])
def test_parse_flops_rejects(text):
    with pytest.raises(ValueError, match="^expected a positive number of FLOP/s"):
        hardware.parse_flops(text)


def _strategy(devices, replicas=None):
    """A stand-in strategy: its devices and replicas."""
    return types.SimpleNamespace(extended=types.SimpleNamespace(worker_devices=tuple(devices)),
                                 num_replicas_in_sync=replicas or len(devices))


def _devices(kind, n):
    return [f"/job:worker/replica:0/task:0/device:{kind}:{i}" for i in range(n)]


def _on(kind, n, replicas=None, name=None):
    """The TensorFlow runtime's devices over a stand-in strategy, with the accelerator
    `name` (what the devices would report) given."""
    devices = TfDevices(_strategy(_devices(kind, n), replicas))
    devices.accelerator_name = lambda: name
    return devices


def test_peaks_of_devices():
    gpus = _on("GPU", 8, name="NVIDIA H100 80GB HBM3")
    v3, v4 = _on("TPU", 8, name="v3-8"), _on("TPU", 4, name="v4-8")
    t4 = _on("GPU", 2, name="Tesla T4")
    peak, where = hardware.peak_flops(gpus, "bfloat16")
    assert peak == pytest.approx(8 * 989.4 * T) and "H100 SXM bf16" in where
    # TF32 is TensorFlow's default for float32 matmuls.
    assert tf.config.experimental.tensor_float_32_execution_enabled()
    assert hardware.peak_flops(gpus, "float32")[0] == pytest.approx(8 * 494.7 * T)
    # v3-8: 8 TensorFlow devices are 4 chips; v4-8: 4 devices, 4 chips.
    peak, where = hardware.peak_flops(v3, "bfloat16")
    assert peak == pytest.approx(4 * 123 * T) and "x 4 chip(s)" in where
    assert hardware.peak_flops(v4, "bfloat16")[0] == pytest.approx(4 * 275 * T)
    # Unknown accelerator: no peak (no MFU) unless given; the override is per device.
    peak, where = hardware.peak_flops(t4, "float16")
    assert peak is None and "Tesla T4" in where and "--peak_flops" in where
    peak, where = hardware.peak_flops(t4, "float16", override="65T")
    assert peak == 2 * 65 * T and where == "--peak_flops 65 TFLOP/s x 2 GPU devices"


def test_cpu_device_counts():
    # Logical CPU devices of one host share its cores: one host's peak.
    assert hardware.num_devices(_on("CPU", 2)) == (1, "CPU host")
    # Two workers with one CPU device each: each worker lists its own devices.
    assert hardware.num_devices(_on("CPU", 1, replicas=2)) == (2, "CPU hosts")
    peak, where = hardware.peak_flops(_on("CPU", 1, replicas=2), "float32", override=1e11)
    assert peak == 2e11 and where == "--peak_flops 100 GFLOP/s x 2 CPU hosts"


def _clock(monkeypatch, *durations):
    """hardware's timer, reading `durations` (one per timed run) and nothing more."""
    ticks = iter([t for i, d in enumerate(durations) for t in (10.0 * i, 10.0 * i + d)])
    monkeypatch.setattr(hardware, "time", types.SimpleNamespace(
        perf_counter=lambda: next(ticks)))


def test_cpu_peak_is_measured_once(monkeypatch):
    monkeypatch.setattr(hardware, "_MEASURED", {})
    strategy = TfDevices(tf.distribute.OneDeviceStrategy("/cpu:0"))
    assert strategy.platform == "CPU" and strategy.accelerator_name() is None
    assert inspect.signature(hardware.peak_flops).parameters[
        "cpu_matmul_size"].default == hardware.RUN_MATMUL_SIZE
    # Three timed runs after the untimed warm-up: the best, 0.25 s, gives 2 * 64^3 / 0.25.
    _clock(monkeypatch, 0.5, 0.25, 0.4)
    peak, where = hardware.peak_flops(strategy, "float32", cpu_matmul_size=64)
    assert peak == 2 * 64 ** 3 / 0.25 == 2_097_152
    assert where == "measured: 64^2 float32 matmul 2.1 MFLOP/s x 1 CPU host"
    # The clock is used up: a second measurement would raise StopIteration.
    assert hardware.peak_flops(strategy, "float32", cpu_matmul_size=64) == (peak, where)
    assert hardware.measure_matmul_flops(64, "float32") == peak
    # Another size is another measurement.
    _clock(monkeypatch, 1.0, 2.0, 4.0)
    assert hardware.measure_matmul_flops(32, "float32") == 2 * 32 ** 3 / 1.0


def test_tpu_name_from_the_metadata_server(monkeypatch):
    """Without the TPU VM's environment (and no Cloud TPU API) the accelerator type comes
    from the metadata server's instance attribute; an unreachable server gives None."""
    for var in ("TPU_ACCELERATOR_TYPE", "ACCELERATOR_TYPE"):
        monkeypatch.delenv(var, raising=False)
    strategy = TfDevices(_strategy(_devices("TPU", 8)))
    monkeypatch.setattr(gce, "attribute", {"accelerator-type": "v4-8"}.get)
    assert strategy.accelerator_name() == "v4-8"
    monkeypatch.undo()
    monkeypatch.setenv(gce.METADATA_HOST_ENV, "127.0.0.1:1")  # nothing listens there
    assert gce.attribute("accelerator-type") is None


def test_tpu_name_from_the_tpu_vm_environment(monkeypatch):
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-8")
    strategy = TfDevices(_strategy(_devices("TPU", 8)))
    assert strategy.accelerator_name() == "v5litepod-8"
    assert hardware.peak_flops(strategy, "bfloat16")[0] == pytest.approx(8 * 197 * T)
