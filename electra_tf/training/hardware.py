"""Peak FLOP/s of the devices a run trains on (what MFU divides by): a table of
accelerators' published dense peaks (NVIDIA's sheets quote "with sparsity": the table holds
half), the devices' accelerator (`runtime.Devices`), and a timed matmul where no table
applies (CPU).
float32 matmuls run in TensorFloat-32 by default: the TF32 column on A100/H100/H200, one
bf16 MXU pass on TPU (XLA's DEFAULT precision); with TF32 off, plain FP32 (TPU: HIGHEST).
TensorFlow (or, without it, JAX) is imported only by the CPU's timed matmul: the table
needs none.
"""

import dataclasses
import re
import sys
import time
from typing import Callable, Dict, Optional, Tuple, Union



T = 1e12


@dataclasses.dataclass(frozen=True)
class Chip:
    """Published dense peak FLOP/s of one chip."""
    name: str
    pattern: str  # regex searched in the normalised device name (`normalise`)
    bf16: float  # 16-bit tensor-core / MXU peak (V100: fp16)
    fp32: float  # full-precision float32 (TPU: six bf16 passes)
    tf32: Optional[float]  # TensorFloat-32 (TPU: one bf16 pass); None: no such mode
    source: str
    devices_per_chip: int = 1  # TensorFlow devices per chip

    def peak(self, precision: str, tf32_enabled: bool = True) -> Tuple[float, str]:
        """(peak FLOP/s of one chip, the column used) for a run's compute precision."""
        if precision in ("bfloat16", "float16"):
            return self.bf16, "fp16 tensor" if self.name.startswith("V100") else "bf16"
        if precision != "float32":
            raise ValueError(f"precision {precision!r}: expected float32, bfloat16 or float16")
        if tf32_enabled and self.tf32 is not None:
            return self.tf32, "fp32 as 1 bf16 pass" if self.name.startswith("TPU") else "tf32"
        return self.fp32, "fp32 as 6 bf16 passes" if self.name.startswith("TPU") else "fp32"


def _tpu(name, pattern, bf16, url, devices_per_chip=1):
    return Chip(name, pattern, bf16, bf16 / 6, bf16, f"Cloud TPU docs, {url}",
                devices_per_chip)


_NV = "NVIDIA data sheet"
# Most specific patterns first: the first match wins.
CHIPS = (
    _tpu("TPU v2", r"^(tpu )?v2\b", 45 * T, "cloud.google.com/tpu/docs/v2", 2),
    _tpu("TPU v3", r"^(tpu )?v3\b", 123 * T, "cloud.google.com/tpu/docs/v3", 2),
    _tpu("TPU v4", r"^(tpu )?v4\b", 275 * T, "cloud.google.com/tpu/docs/v4"),
    _tpu("TPU v5e", r"^(tpu )?v5 ?(e|lite|litepod)\b", 197 * T,
         "cloud.google.com/tpu/docs/v5e"),
    _tpu("TPU v5p", r"^(tpu )?v5 ?p?\b", 459 * T, "cloud.google.com/tpu/docs/v5p"),
    _tpu("TPU v6e", r"^(tpu )?v6 ?(e|lite)\b", 918 * T, "cloud.google.com/tpu/docs/v6e"),
    Chip("V100S PCIe", r"\bv100s\b", 130 * T, 16.4 * T, None, f"{_NV} (V100S)"),
    Chip("V100 PCIe", r"\bv100\b.*\bpcie\b", 112 * T, 14 * T, None, f"{_NV} (V100)"),
    Chip("V100 SXM2", r"\bv100\b", 125 * T, 15.7 * T, None, f"{_NV} (V100)"),
    Chip("A100", r"\ba100\b", 312 * T, 19.5 * T, 156 * T, f"{_NV} (A100, SXM and PCIe)"),
    Chip("H100 PCIe", r"\bh100\b.*\bpcie\b", 756.5 * T, 51.2 * T, 378 * T,
         "NVIDIA H100 whitepaper (H100 PCIe)"),
    Chip("H100 NVL", r"\bh100\b.*\bnvl\b", 835.5 * T, 60 * T, 417.5 * T, f"{_NV} (H100 NVL)"),
    Chip("H100 SXM", r"\bh100\b", 989.4 * T, 66.9 * T, 494.7 * T,
         "NVIDIA H100 whitepaper (H100 SXM5)"),
    Chip("H200 NVL", r"\bh200\b.*\bnvl\b", 835.5 * T, 60 * T, 417.5 * T, f"{_NV} (H200 NVL)"),
    Chip("H200 SXM", r"\bh200\b", 989.4 * T, 66.9 * T, 494.7 * T,
         f"{_NV} (H200 SXM: the H100 SXM's compute)"),
)


def normalise(device_name: str) -> str:
    """'NVIDIA A100-SXM4-40GB' -> 'nvidia a100 sxm4 40gb'; 'v5litepod-16' -> 'v5litepod 16'."""
    return " ".join(re.sub(r"[-_/,]", " ", device_name.lower()).split())


def lookup(device_name: str) -> Optional[Chip]:
    """The table's chip for a device name (a GPU's CUDA name, or a TPU's kind or
    accelerator type: 'TPU v4', 'v3-8', 'v5litepod-16'), or None."""
    name = normalise(device_name)
    return next((c for c in CHIPS if re.search(c.pattern, name)), None)


# ----------------------------------------------------------------------------- devices


def num_devices(devices) -> Tuple[int, str]:
    """(devices a peak is multiplied by, their name): replicas on accelerators, hosts on
    CPU (a host's CPU devices share its cores). `devices`: a `runtime.Devices`."""
    kind, n = devices.platform, devices.num_replicas
    if kind == "CPU":
        n = devices.hosts
        return n, "CPU host" + ("s" if n > 1 else "")
    return n, f"{kind} device" + ("s" if n > 1 else "")


# ----------------------------------------------------------------------------- CPU


_MEASURED: Dict[Tuple[int, str, str], float] = {}

# The default of the run's measurement: on the 2-core AMD EPYC (AVX-512) this was
# written on, 2048^2 float32 reached 211-217 GFLOP/s and 4096^2 219-221 (1-4% more) in
# 0.4 s instead of 2.5 s; bfloat16 408-412 against 402-407.
RUN_MATMUL_SIZE = 2048


def _tensorflow_matmul(size: int, dtype: str, device: str) -> Callable[[], None]:
    """A size^3 `tf.linalg.matmul` on `device`, run by each call. TensorFlow's kernel
    (oneDNN), not XLA's: no faster in float32 and far slower in bfloat16."""
    import tensorflow as tf
    with tf.device(device):
        a = tf.cast(tf.random.stateless_normal([size, size], [1, 2]), dtype)
        b = tf.cast(tf.random.stateless_normal([size, size], [3, 4]), dtype)
        # One element back to the host: forces the matmul, transfers nothing.
        f = tf.function(lambda x, y: tf.linalg.matmul(x, y)[0, 0], jit_compile=False)

    def run():
        with tf.device(device):
            f(a, b).numpy()
    return run


def _jax_matmul(size: int, dtype: str) -> Callable[[], None]:
    """A size^3 matmul compiled by XLA on JAX's first CPU device (where TensorFlow is not
    installed), run by each call; the whole product is kept so none of it is left out."""
    import jax
    import jax.numpy as jnp
    cpu = jax.devices("cpu")[0]
    a, b = (jax.device_put(jax.random.normal(jax.random.key(seed), (size, size)).astype(
        dtype), cpu) for seed in (1, 2))
    f = jax.jit(jnp.matmul)
    return lambda: f(a, b).block_until_ready()


def measure_matmul_flops(size: int = 4096, dtype: str = "float32", repeats: int = 3,
                         device: str = "/cpu:0") -> float:
    """FLOP/s of a size^3 matmul on the CPU: the best of `repeats` runs after a warm-up,
    cached per process; TensorFlow's kernel on `device` where TensorFlow is loaded (its
    runtime), else XLA's through JAX (the JAX runtime, which imports no TensorFlow), else
    TensorFlow's. Whatever else loads the host lowers the figure."""
    key = (size, dtype, device)
    if key not in _MEASURED:
        run = None
        if sys.modules.get("tensorflow") is None:  # a JAX process: no TensorFlow import
            try:
                run = _jax_matmul(size, dtype)
            except ImportError:
                pass
        if run is None:
            run = _tensorflow_matmul(size, dtype, device)
        run()
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - start)
        _MEASURED[key] = 2.0 * size ** 3 / best
    return _MEASURED[key]


# ----------------------------------------------------------------------------- peak


_SUFFIXES = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15, "e": 1e18}


def parse_flops(value: Union[str, float]) -> float:
    """'312e12', '312T', '312 TFLOP/s', '1.2P' or a number -> FLOP/s (> 0); ValueError
    (the message says what is expected, not the value) otherwise."""
    number = float("nan")
    if isinstance(value, (int, float)):
        number = float(value)
    else:
        match = re.fullmatch(r"\s*([-+]?[0-9.]+(?:e[-+]?\d+)?)\s*([kmgtpe]?)\s*(flop/?s)?\s*",
                             value.lower())
        if match:
            try:
                number = float(match.group(1)) * _SUFFIXES[match.group(2)]
            except ValueError:  # '1.2.3'
                pass
    if not 0 < number < float("inf"):
        raise ValueError("expected a positive number of FLOP/s, optionally with a "
                         "k/M/G/T/P/E prefix (312e12, 312T)")
    return number


def format_flops(x: float) -> str:
    """3.12e14 -> '312 TFLOP/s'."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if x >= scale:
            return f"{x / scale:.3g} {prefix}FLOP/s"
    return f"{x:.3g} FLOP/s"


def peak_flops(devices, precision: str, override: Union[None, str, float] = None,
               cpu_matmul_size: int = RUN_MATMUL_SIZE) -> Tuple[Optional[float], str]:
    """(peak FLOP/s of all the devices (`runtime.Devices`), where it comes from): `override` (one
    device's) times the devices, else the table's entry, or on CPU a timed matmul in the
    compute dtype; an accelerator the table does not know gives None (no MFU)."""
    count, unit = num_devices(devices)
    if override is not None:
        per_device = parse_flops(override)
        return per_device * count, (f"--peak_flops {format_flops(per_device)} x {count} "
                                    f"{unit}")
    kind = devices.platform
    if kind == "CPU":
        per_host = measure_matmul_flops(cpu_matmul_size, precision)  # the compute dtype
        return per_host * count, (f"measured: {cpu_matmul_size}^2 {precision} matmul "
                                  f"{format_flops(per_host)} x {count} {unit}")
    name = devices.accelerator_name()
    chip = lookup(name) if name else None
    if chip is None:
        return None, (f"unknown {kind} {name or '(no device name)'}: pass --peak_flops "
                      "for MFU")
    per_chip, column = chip.peak(precision, devices.tf32_enabled())
    per_device = per_chip / chip.devices_per_chip
    return per_device * count, (f"{name}: {chip.name} {column} {format_flops(per_chip)}/chip "
                                f"({chip.source}) x {count / chip.devices_per_chip:g} chip(s)")
