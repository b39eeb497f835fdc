"""bench/cpu_step_profile.py's reading of XLA:CPU profiles and HLO dumps: a small jitted
program (a matrix product and a reduction) run under the profiler with XLA's thunk
events, its dump parsed; every profiled operation is an instruction of the dump, the
product and the reduction are found as such, and the
per-call times add up to no more than the calls took."""

import importlib.util
import os
import subprocess
import sys

import pytest

from electra_tf import compat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # local: the repo
_spec = importlib.util.spec_from_file_location(
    "cpu_step_profile", os.path.join(ROOT, "bench", "cpu_step_profile.py"))
prof = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(prof)

PROGRAM = """
import sys, time, jax, jax.numpy as jnp
f = jax.jit(lambda x, y: (x @ y, jnp.tanh(x).sum(axis=0)))
x = jnp.ones((192, 256)); y = jnp.ones((256, 320))
jax.block_until_ready(f(x, y))
jax.profiler.start_trace(sys.argv[1])
t0 = time.perf_counter()
for _ in range(3):
    jax.block_until_ready(f(x, y))
print("WALL_MS", (time.perf_counter() - t0) * 1e3 / 3)
jax.profiler.stop_trace()
"""


def test_kinds_of_instructions():
    assert prof.kind_of("dot.12", "dot") == "matmul"
    assert prof.kind_of("ynn_fusion.3", "fusion") == "matmul"
    assert prof.kind_of("add_select_fusion.9", "fusion") == "elementwise fusion"
    assert prof.kind_of("copy.193", "copy") == "copy / transpose"
    assert prof.kind_of("reduce-window.1", "reduce-window") == "reduce / softmax"
    assert prof.kind_of("rng-bit-generator.2", "rng-bit-generator") == "random bits"
    assert prof.kind_of("custom", "custom-call") == "other"
    # A library fusion by the op it came from.
    assert prof.kind_of("ynn_fusion.11", "fusion reduce_sum") == "reduce / softmax"
    assert prof.kind_of("ynn_fusion.174", "fusion dot_general") == "matmul"
    assert prof.kind_of("MatMul.326", "dot MatMul") == "matmul"


@pytest.mark.skipif(not compat.module_exists("jax"), reason="needs jax")
@pytest.mark.subprocess
@pytest.mark.jax
def test_a_jitted_programs_profile_is_read_against_its_dump(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu", ELECTRA_TF_COMPILATION_CACHE="off",
               XLA_FLAGS=f"{prof.TRACE_FLAG} --xla_dump_to={tmp_path / 'hlo'} "
                         "--xla_dump_hlo_as_text")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(tmp_path / "profile")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    wall_ms = float(done.stdout.split("WALL_MS")[1])
    names, counts = prof.hlo_instructions(str(tmp_path / "hlo"))
    times = prof.thunk_times(str(tmp_path / "profile"), steps=3)
    assert times and set(times) <= set(names), (sorted(times), sorted(names)[:20])
    kinds = {prof.kind_of(op, names[op]) for op in times}
    assert "matmul" in kinds and "reduce / softmax" in kinds, {op: names[op] for op in times}
    assert 0 < sum(times.values()) <= wall_ms
    assert counts["parameter"] >= 2 and sum(counts.values()) >= 5
    assert any(n.startswith("dot ") or "dot_general" in n for n in names.values())
