"""Shared paths and one session-wide build of the bundled Wikipedia sample."""

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# One XLA compile per distinct program per test run: TensorFlow's persistent compilation
# cache (TF_XLA_FLAGS --tf_xla_persistent_cache_directory) in one directory for the whole
# run, made by the first pytest process and inherited by its xdist workers and every
# process a test starts. A program compiled once (the tiny step of the command-line tests,
# the learning runs, the jobs several tests start) is loaded from it after that, the same
# executable: a run's numbers are the same either way (docs/testing.md: One XLA compile
# per program per test run).
XLA_CACHE_VARIABLE = "ELECTRA_TF_TEST_XLA_CACHE"
if XLA_CACHE_VARIABLE not in os.environ:
    import atexit
    import shutil
    import tempfile
    os.environ[XLA_CACHE_VARIABLE] = tempfile.mkdtemp(prefix="electra_tf_xla_cache_")
    # Removed when this process ends (not a forked child that runs exit handlers).
    atexit.register(lambda pid=os.getpid(), path=os.environ[XLA_CACHE_VARIABLE]:
                    os.getpid() == pid and shutil.rmtree(path, ignore_errors=True))
if "--tf_xla_persistent_cache_directory" not in os.environ.get("TF_XLA_FLAGS", ""):
    os.environ["TF_XLA_FLAGS"] = " ".join(filter(None, (
        os.environ.get("TF_XLA_FLAGS"),
        "--tf_xla_persistent_cache_directory=" + os.environ[XLA_CACHE_VARIABLE])))

# The same for JAX's processes (KERAS_BACKEND=jax): its persistent compilation cache in a
# directory of the run, every program cached (JAX skips those that compile in under a
# second by default). The tiny step of the JAX command-line tests: 19 s to the first step
# without it, 4 s from the cache.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(os.environ[XLA_CACHE_VARIABLE],
                                                           "jax")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

# Before any test imports TensorFlow: the version check, and under the TPU build on a host
# without TPU chips TPU_LOAD_LIBRARY=0, which every subprocess a test starts inherits.
import electra_tf  # noqa: E402,F401


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "xla_cpu: checks XLA-compiled code on the CPU; skipped under a TensorFlow "
        "build without XLA:CPU (the TPU build, CI's second leg), which runs the step as a graph")
    # The tiers (docs/testing.md): `-m UNIT_TIER` is the fast unit tier.
    config.addinivalue_line(
        "markers", "subprocess: starts Python processes or the command lines")
    config.addinivalue_line(
        "markers", "e2e: runs a whole pre-training or fine-tuning job (train, save, resume)")
    config.addinivalue_line(
        "markers", "slow: an in-process test that compiles or trains for ~10 s or more "
        "(outside the fast unit tier)")
    # The legs (docs/testing.md): CI's first leg runs every test; the other builds' legs
    # run OTHER_LEGS: the in-process tiers, and the processes and whole jobs marked
    # every_leg.
    config.addinivalue_line(
        "markers", "jax: runs the model or the runtime on JAX (its own processes, "
        "KERAS_BACKEND=jax): leg 1 runs them all; CI's JAX leg, in the README's JAX "
        "install, those also marked every_leg")
    config.addinivalue_line(
        "markers", "every_leg: a subprocess or e2e test that CI's other legs (the TPU build, "
        "the JAX backend) run too: an import or version check, a command line or a whole "
        "job whose outcome the build can change")


# The -m expression of the fast unit tier (docs/testing.md: at most 5 minutes on two cores).
UNIT_TIER = "not (subprocess or e2e or slow)"
# The -m expression of CI's TPU-build leg (.ci/run): the JAX tests are the JAX leg's.
OTHER_LEGS = "(every_leg or not (subprocess or e2e)) and not jax"
# The -m expression of CI's JAX leg (.ci/run): what its install can change. Leg 1 runs every
# jax test with the same JAX and TensorFlow versions; leg 3's install differs only in what
# it lacks (the test extra), so it runs the JAX paths that import and run what a user of the
# README's JAX line runs: the imports without TensorFlow, check_install, both command lines.
JAX_LEG = "jax and every_leg"


# A unit-tier test (no subprocess, e2e or slow marker) that takes longer than this is named
# at the end of the run, so that it can be marked `slow` and the fast tier stay fast.
SLOW_UNIT_SECONDS = 10.0
_unmarked_slow = []


def pytest_runtest_logreport(report):
    _note_missing_skip(report)
    if report.when == "call" and report.duration > SLOW_UNIT_SECONDS and not (
            {"subprocess", "e2e", "slow"} & set(report.keywords)):
        _unmarked_slow.append((report.duration, report.nodeid))


def pytest_terminal_summary(terminalreporter):
    if _missing_skips:
        terminalreporter.section("skipped for a missing package (ELECTRA_TF_NO_MISSING_SKIPS=1:"
                                 " this fails the run)")
        for line in _missing_skips:
            terminalreporter.write_line(line)
    if _unmarked_slow:
        terminalreporter.section("unit-tier tests over %d s (mark them slow)"
                                 % SLOW_UNIT_SECONDS)
        for duration, nodeid in sorted(_unmarked_slow, reverse=True):
            terminalreporter.write_line(f"{duration:6.1f} s  {nodeid}")


# --- a leg without TensorFlow (CI's JAX leg: the README's `.[jax]` install) -------------
# There only the test files that hold JAX-leg tests (marked jax and every_leg) are
# collected: the others import TensorFlow, and that leg runs none of their tests. A file
# of JAX-leg tests must import without TensorFlow (tests/test_jax_only.py): one that does
# not is a collection error, which fails the leg, never a silent skip.
import ast  # noqa: E402
import importlib.util  # noqa: E402

TENSORFLOW_INSTALLED = importlib.util.find_spec("tensorflow") is not None

# The start of a `python -c` program that makes TensorFlow and the packages built on it
# unimportable, in it and in the processes it forks: what a machine with JAX alone runs.
NO_TENSORFLOW = """import sys
for _name in ("tensorflow", "tensorflow_text", "tf_keras", "tensorflow_datasets"):
    sys.modules[_name] = None
"""


def without_tensorflow(argv) -> list:
    """`python ARGV` (a script and its arguments, or `-c code ...`) as the arguments of a
    Python whose TensorFlow is unimportable (NO_TENSORFLOW); the script runs as __main__
    with its own name in sys.argv[0]."""
    argv = [str(a) for a in argv]
    if argv[0] == "-c":
        return ["-c", NO_TENSORFLOW + argv[1], *argv[2:]]
    return ["-c", NO_TENSORFLOW + f"import runpy\nsys.argv = [{argv[0]!r}, *sys.argv[1:]]\n"
            f"runpy.run_path({argv[0]!r}, run_name='__main__')\n", *argv[1:]]


def jax_leg_tests(tree) -> list:
    """Names of the test functions of a module's AST marked both jax and every_leg."""
    def marks(fn):
        return {d.attr for d in fn.decorator_list if isinstance(d, ast.Attribute)} | {
            d.func.attr for d in fn.decorator_list
            if isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute)}
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef)
            and n.name.startswith("test_") and {"jax", "every_leg"} <= marks(n)]


def pytest_ignore_collect(collection_path, config):
    if TENSORFLOW_INSTALLED or collection_path.suffix != ".py" or \
            not collection_path.name.startswith("test_"):
        return None
    tree = ast.parse(collection_path.read_text(encoding="utf-8"))
    return None if jax_leg_tests(tree) else True


# --- skips for a missing package fail a CI leg -----------------------------------------
# ELECTRA_TF_NO_MISSING_SKIPS=1 (.ci/run sets it for every leg): a test skipped because a
# package is not installed fails the run, as every leg installs what its tests need.
_MISSING = ("not installed", "No module named", "could not import", "needs torch",
            "is not installed", "not importable")
_missing_skips = []


def _note_missing_skip(report):
    if report.skipped and os.environ.get("ELECTRA_TF_NO_MISSING_SKIPS") == "1":
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else \
            str(report.longrepr)
        if any(words in reason for words in _MISSING):
            _missing_skips.append(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session, exitstatus):
    if _missing_skips:
        session.exitstatus = 1


def pytest_runtest_setup(item):
    if item.get_closest_marker("xla_cpu"):
        from electra_tf.compat import xla_cpu_available
        if not xla_cpu_available():
            pytest.skip("this TensorFlow build has no XLA:CPU backend (the TPU build)")


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = os.path.join(REPO, "data", "vocab", "bert_uncased_vocab.txt")
WIKI = os.path.join(REPO, "data", "corpus", "enwiki_sample.txt")
NEWS = os.path.join(REPO, "data", "corpus", "lee_news_sample.txt")


def write(path, text):
    """A small test input file (local), its directories made."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def finetune_tiny_model():
    """The one-layer, 32-wide model of the fine-tuning tests (BERT's vocabulary)."""
    from electra_tf.configs import ModelConfig
    return ModelConfig(vocab_size=30522, embedding_size=16, hidden_size=32,
                       num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                       max_position_embeddings=32)


@pytest.fixture(scope="session")
def sample_build(tmp_path_factory):
    """The bundled Wikipedia sample built with the defaults (length 128, 16 shards)."""
    from tfrecord_builder.build import BuildConfig, build
    out = str(tmp_path_factory.mktemp("sample_build"))
    manifest = build(BuildConfig(output_dir=out, inputs=(WIKI,), vocab_file=VOCAB,
                                 num_workers=1))
    return out, manifest


# A small build of the pipeline tests (test_files.py, test_dataset.py).
SMALL_SEQ = 128
SMALL_SHARDS = 4


def _records_of(path):
    """(input_ids, input_mask, segment_ids) of every record of `path`, in file order."""
    import numpy as np
    import tensorflow as tf
    from electra_tf.data.files import FEATURE_NAMES
    rows = []
    for raw in tf.data.TFRecordDataset(path).as_numpy_iterator():
        f = tf.train.Example.FromString(raw).features.feature
        rows.append(tuple(np.array(f[n].int64_list.value, np.int64) for n in FEATURE_NAMES))
    return rows


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """A manifest build of ~250 KB of the Wikipedia sample (data/files, dataset tests)."""
    from tfrecord_builder.build import BuildConfig, build
    root = tmp_path_factory.mktemp("input_pipeline")
    # ~250 KB of whole lines: about 450 examples, enough for several batches per shard.
    lines, size = [], 0
    with open(WIKI, encoding="utf-8") as f:
        for line in f:
            lines.append(line)
            size += len(line)
            if size > 250_000:
                break
    corpus = root / "corpus.txt"
    corpus.write_text("".join(lines), encoding="utf-8")
    out = root / "build"
    build(BuildConfig(output_dir=str(out), inputs=(str(corpus),), vocab_file=VOCAB,
                      max_seq_length=SMALL_SEQ, num_shards=SMALL_SHARDS, num_workers=1))
    return str(out)


@pytest.fixture(scope="session")
def manifest(data_dir):
    import json
    with open(os.path.join(data_dir, "manifest.json")) as f:
        return json.load(f)


@pytest.fixture(scope="session")
def records(data_dir, manifest):
    """{shard path: [row tuples in file order]}."""
    return {os.path.join(data_dir, s["name"]): _records_of(os.path.join(data_dir, s["name"]))
            for s in manifest["shards"]}


@pytest.fixture(scope="session")
def official_dir(data_dir, tmp_path_factory):
    import shutil
    """The same shards without manifest.json, like the official builder's output."""
    d = tmp_path_factory.mktemp("official")
    for name in os.listdir(data_dir):
        if name.startswith("pretrain_data.tfrecord"):
            shutil.copy(os.path.join(data_dir, name), d / name)
    (d / "vocab.txt").write_text("[PAD]\n")  # must not be taken for a shard
    return str(d)


def read_examples(directory, manifest):
    """All examples of a build in build order (shard s, record k -> k * S + s)."""
    import numpy as np
    import tensorflow as tf
    n_shards = len(manifest["shards"])
    rows = {}
    for s, shard in enumerate(manifest["shards"]):
        path = os.path.join(directory, shard["name"])
        for k, raw in enumerate(tf.data.TFRecordDataset(path).as_numpy_iterator()):
            ex = tf.train.Example.FromString(raw).features.feature
            rows[k * n_shards + s] = tuple(
                np.array(ex[name].int64_list.value, np.int64)
                for name in ("input_ids", "input_mask", "segment_ids"))
    assert sorted(rows) == list(range(len(rows)))
    return [rows[i] for i in range(len(rows))]


def free_ports(n):
    """`n` ports on 127.0.0.1 free a moment ago (a cluster's addresses for local workers)."""
    import socket
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def sigterm_after(proc, needle, timeout: float = 120):
    """Reads `proc`'s stderr until a line containing `needle` (training under way; or a
    line for which `needle(line)` is true), sends SIGTERM and waits; returns (the lines
    read before, the rest of stderr). Kills the process if it outlives `timeout`."""
    import signal
    found = needle if callable(needle) else (lambda line: needle in line)
    seen = []
    try:
        for line in proc.stderr:
            seen.append(line)
            if found(line):
                break
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=timeout)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    return "".join(seen), rest


class EagerEncoder:
    """A Python `tokenize(list of str) -> id lists` (a hand-made test tokenizer) behind the
    TextEncoder methods the in-graph preprocessors call; eager execution only."""

    def __init__(self, tokenize, special_ids):
        from electra_tf.text import TextEncoder
        self.tokenize_lists, self.special_ids = tokenize, special_ids
        self._pack = TextEncoder.pack

    def tokenize(self, strings):
        import tensorflow as tf
        rows = self.tokenize_lists([s.decode("utf-8") for s in
                                    tf.convert_to_tensor(strings).numpy().tolist()])
        return tf.RaggedTensor.from_row_lengths(
            tf.constant([i for r in rows for i in r], tf.int32, shape=[sum(map(len, rows))]),
            tf.constant([len(r) for r in rows], tf.int64, shape=[len(rows)]))

    def pack(self, first, second=None, max_seq_length=128):
        return self._pack(self, first, second, max_seq_length)
