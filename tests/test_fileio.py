"""Tests of electra_tf.fileio, and a scan of the library for file access that bypasses
TensorFlow's filesystem layer (a user path there would not work on gs://)."""

import ast
import gzip
import bz2
import os
import uuid

import pytest
import tensorflow as tf

from electra_tf import fileio

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The code that runs on user paths: the library, the builder, the CLIs and experiments.
SCANNED = ["electra_tf", "tfrecord_builder", "experiments", "run_pretraining.py",
           "run_finetuning.py"]

# Calls that only work on a local disk (or mangle a URL: abspath("gs://b") is
# "/cwd/gs:/b"). Pure string functions (os.path.join, basename, dirname) are fine.
LOCAL_ONLY = {
    "open", "io.open", "os.open", "os.makedirs", "os.mkdir", "os.replace", "os.rename",
    "os.remove", "os.unlink", "os.listdir", "os.scandir", "os.walk", "os.stat", "os.rmdir",
    "os.chmod", "os.path.exists", "os.path.lexists", "os.path.isdir", "os.path.isfile",
    "os.path.islink", "os.path.getsize", "os.path.getmtime", "os.path.abspath",
    "os.path.realpath", "os.path.normpath", "os.path.expanduser", "os.path.samefile",
    "glob.glob", "glob.iglob", "gzip.open", "bz2.open", "lzma.open", "pathlib.Path",
    "Path", "tempfile.mkdtemp", "tempfile.mkstemp", "tempfile.NamedTemporaryFile",
    "tempfile.TemporaryDirectory",
} | {"shutil." + name for name in dir(__import__("shutil")) if not name.startswith("_")}

# The allowed uses, each with why: (file, enclosing function, call) -> reason. A call on
# `__file__` (this checkout: bundled data, presets) is allowed anywhere.
ALLOWED = {
    # The one place that makes local temporary directories (for SentencePiece's trainer,
    # builder worker processes and SavedModel staging, whose output is copied with gfile).
    # Local paths only, after a "://" check: abspath keeps the build fingerprint and the
    # logged vocab path of a local file what they were.
    ("tfrecord_builder/corpus.py", "expand_inputs", "os.path.abspath"): "local only, after ://",
    ("tfrecord_builder/vocab_learning.py", "_parent", "os.path.abspath"): "local only",
    ("tfrecord_builder/corpus.py", "_stat_input", "os.stat"): "local only: ns mtimes",
    ("electra_tf/text.py", "_read", "os.path.abspath"): "local only",
    # The TPU probe reads this machine's device files (/dev/accel*, /dev/vfio) and the
    # installed TensorFlow and libtpu (site-packages).
    ("electra_tf/compat.py", "tpu_chips", "glob.glob"): "/dev",
    ("electra_tf/compat.py", "tpu_chips", "os.listdir"): "/dev",
    ("electra_tf/compat.py", "_libtpu_installed", "os.path.exists"): "site-packages",
    ("electra_tf/compat.py", "tpu_runtime_functions", "glob.glob"): "site-packages",
    ("electra_tf/compat.py", "tpu_runtime_functions", "open"): "site-packages",
    ("electra_tf/compat.py", "libtpu_path", "os.path.exists"): "site-packages",
    # The bundled presets in configs/ beside the package.
    ("electra_tf/configs/loader.py", "preset_names", "os.listdir"): "configs/ of this checkout",
    ("electra_tf/configs/loader.py", "_read_preset_without_tensorflow", "open"):
        "a preset of this checkout, where TensorFlow is not installed (JAX only)",
    # Quieting TensorFlow's C++ start-up lines: /dev/null onto stderr.
    ("electra_tf/quiet.py", "quiet_native_stderr", "os.open"): "/dev/null",
    ("experiments/compute_matched.py", "machine", "open"): "/proc/cpuinfo",
    # JAX's persistent compilation cache reads local files: its directory is refused when
    # remote ("://"), and ~ expanded.
    ("electra_tf/training/jax_runtime/compile_cache.py", "cache_dir", "os.path.expanduser"):
        "local only, after ://",
    ("electra_tf/training/jax_runtime/compile_cache.py", "configure", "os.makedirs"):
        "local only (cache_dir)",
}
# Files whose every use is local by nature: the kernel's /proc and /sys.
ALLOWED_FILES = {
    # The file layer itself: its own layer's local branch (after a "://" check), the local
    # staging directories, fsync of a local file.
    "electra_tf/fileio.py": "the file layer",
    "electra_tf/training/hardware.py": "/proc/cpuinfo, /sys/devices (CPU and accelerator facts)",
    "electra_tf/training/gce.py": "/sys/class/dmi (is this a GCE VM?)",
}


def _on_file_dunder(call: ast.Call) -> bool:
    return any(isinstance(n, ast.Name) and n.id == "__file__"
               for arg in call.args for n in ast.walk(arg))


def _dotted(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return base and f"{base}.{node.attr}"
    return None


def _python_files():
    for entry in SCANNED:
        path = os.path.join(REPO, entry)
        if entry.endswith(".py"):
            yield entry
            continue
        for root, _, names in os.walk(path):
            for name in sorted(names):
                if name.endswith(".py"):
                    yield os.path.relpath(os.path.join(root, name), REPO)


def local_file_calls():
    """[(file, line, function, call)] of LOCAL_ONLY calls not allowed above."""
    found = []
    for rel in _python_files():
        rel = rel.replace(os.sep, "/")
        if rel in ALLOWED_FILES:
            continue
        with open(os.path.join(REPO, rel), encoding="utf-8") as f:
            tree = ast.parse(f.read(), rel)

        def visit(node, function):
            for child in ast.iter_child_nodes(node):
                name = function
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    name = child.name
                if isinstance(child, ast.Call):
                    call = _dotted(child.func)
                    if (call in LOCAL_ONLY and (rel, function, call) not in ALLOWED
                            and not _on_file_dunder(child)):
                        found.append((rel, child.lineno, function, call))
                visit(child, name)
        visit(tree, "<module>")
    return found


def test_no_local_only_file_access_on_user_paths():
    found = local_file_calls()
    assert not found, "file access that bypasses tf.io.gfile (gs:// would fail):\n" + "\n".join(
        f"  {f}:{line} in {fn}(): {call}(...)" for f, line, fn, call in found)


def test_the_scan_finds_what_it_looks_for(tmp_path, monkeypatch):
    """The scanner itself: a planted call is found, an allowed one is not."""
    package = tmp_path / "electra_tf"
    package.mkdir()
    (package / "bad.py").write_text(
        "import os, shutil\n"
        "def save(path):\n"
        "    os.makedirs(os.path.dirname(path))\n"
        "    with open(path, 'w') as f:\n"
        "        f.write(os.path.join('a', 'b'))\n"
        "    shutil.copy(path, path + '.bak')\n")
    monkeypatch.setattr(__import__(__name__), "REPO", str(tmp_path))
    monkeypatch.setattr(__import__(__name__), "SCANNED", ["electra_tf"])
    assert local_file_calls() == [("electra_tf/bad.py", 3, "save", "os.makedirs"),
                                  ("electra_tf/bad.py", 4, "save", "open"),
                                  ("electra_tf/bad.py", 6, "save", "shutil.copy")]


# ----------------------------------------------------------------------------- fileio


# Both filesystem layers (fileio's docstring): TensorFlow's, with its in-memory ram://
# filesystem, and our own, with fsspec's memory:// (a remote path to it, as gs:// is).
LAYERS = {"tensorflow": "ram", "native": "memory"}


@pytest.fixture(params=sorted(LAYERS))
def layer(request, monkeypatch):
    monkeypatch.setenv(fileio.ENV_LAYER, request.param)
    return request.param


@pytest.fixture
def root(layer):
    return f"{LAYERS[layer]}://fileio_{uuid.uuid4().hex}"


def test_write_atomic_and_read_back(root):
    path = fileio.join(root, "sub", "x.json")
    fileio.makedirs(fileio.join(root, "sub"))
    fileio.write_json_atomic(path, {"a": 1})
    assert fileio.read_json(path) == {"a": 1}
    fileio.write_atomic(path, "replaced")
    assert fileio.read_text(path) == "replaced"
    assert fileio.listdir(fileio.join(root, "sub")) == ["x.json"]  # no temp file left


@pytest.mark.parametrize("where", ["local", "remote"])
def test_atomic_output_renames_or_removes(root, tmp_path, where, monkeypatch):
    directory = str(tmp_path) if where == "local" else root
    fileio.makedirs(directory)
    path = fileio.join(directory, "shard")
    fileio.write_atomic(path, b"old")
    with fileio.atomic_output(path) as tmp:
        assert tmp.startswith(path + ".") and tmp.endswith(fileio.TMP_SUFFIX)
        assert len(tmp) == len(path) + 1 + 12 + len(fileio.TMP_SUFFIX)
        with fileio.open_file(tmp, "wb") as f:
            f.write(b"record")
        assert fileio.read_bytes(path) == b"old"  # nothing visible before the block ends
    assert fileio.read_bytes(path) == b"record"
    with pytest.raises(KeyboardInterrupt):
        with fileio.atomic_output(path) as tmp:
            with fileio.open_file(tmp, "wb") as f:
                f.write(b"torn")
            raise KeyboardInterrupt
    assert fileio.listdir(directory) == ["shard"]  # the temp file went, the old file stayed
    assert fileio.read_bytes(path) == b"record"
    # sync: the temp file is flushed (fsync'ed when local) before the rename.
    synced = []
    monkeypatch.setattr(fileio, "fsync", synced.append)
    fileio.write_json_atomic(path, {"b": [1, 2], "a": None}, indent=None, sort_keys=True,
                             sync=True)
    assert fileio.read_bytes(path) == b'{"a": null, "b": [1, 2]}\n'
    assert len(synced) == 1 and synced[0].startswith(path + ".")
    fileio.write_json_atomic(path, {"b": 1, "a": 2})
    assert fileio.read_text(path) == '{\n  "b": 1,\n  "a": 2\n}\n' and len(synced) == 1


def test_compressed_reads(root):
    fileio.makedirs(root)
    for name, data in [("a.txt", b"one\ntwo\n"), ("a.txt.gz", gzip.compress(b"one\ntwo\n")),
                       ("a.txt.bz2", bz2.compress(b"one\ntwo\n"))]:
        with fileio.open_file(fileio.join(root, name), "wb") as f:
            f.write(data)
        assert list(fileio.open_text_lines(fileio.join(root, name))) == ["one\n", "two\n"]


def test_copy_tree_puts_the_marker_last(root, monkeypatch):
    src, dst = fileio.join(root, "src"), fileio.join(root, "dst")
    for rel in ["b/shard-1", "a/shard-0", "DONE", "z"]:
        fileio.makedirs(os.path.dirname(fileio.join(src, rel)))
        fileio.write_atomic(fileio.join(src, rel), rel)
    copied = []
    real_copy = fileio.copy
    monkeypatch.setattr(fileio, "copy", lambda a, b, overwrite=True: (
        copied.append(b[len(dst) + 1:]), real_copy(a, b, overwrite))[-1])
    fileio.copy_tree(src, dst, last=["DONE"])
    assert copied == ["a/shard-0", "b/shard-1", "z", "DONE"]
    assert fileio.walk_files(dst) == sorted(fileio.join(dst, r) for r in copied)
    assert fileio.read_text(fileio.join(dst, "b", "shard-1")) == "b/shard-1"


def test_join_keeps_urls():
    assert fileio.join("gs://bucket/run", "ckpt", "x") == "gs://bucket/run/ckpt/x"
    assert fileio.join("ram://r", "a") == "ram://r/a"
    assert fileio.is_remote("gs://b") and not fileio.is_remote("/tmp/x")


def test_errors_are_oserrors_on_both_layers(root, tmp_path, layer):
    """A missing path is a FileNotFoundError with the one-line reason on either layer (and
    under TensorFlow's, still TensorFlow's class for the code that catches that)."""
    for missing in (fileio.join(root, "none", "x"), str(tmp_path / "none")):
        with pytest.raises(FileNotFoundError) as caught:
            fileio.read_bytes(missing)
        assert fileio.error_reason(caught.value) == "No such file or directory"
        assert caught.value.filename == missing
        if layer == "tensorflow":
            assert isinstance(caught.value, tf.errors.NotFoundError)
            assert caught.value.message == "No such file or directory"
        with pytest.raises(FileNotFoundError):
            fileio.remove(missing, missing_ok=False)
        fileio.remove(missing)  # missing_ok
        with pytest.raises(FileNotFoundError):
            fileio.listdir(missing)
    fileio.makedirs(root)
    path = fileio.join(root, "a")
    fileio.write_atomic(path, b"1")
    with pytest.raises(FileExistsError):
        fileio.rename(path, path, overwrite=False)
    assert fileio.writable_dir_problem(path) == "it is a file, not a directory"


def test_the_layers_list_glob_walk_and_copy_alike(root, tmp_path):
    """The same tree gives the same answers on a remote filesystem and a local disk, on
    either layer: names that start with '.' included in glob (as TensorFlow's glob)."""
    answers = []
    for base in (root, str(tmp_path / "t")):
        for rel in ["d/one.txt", "d/.hidden", "d/sub/two.txt", "three.bin"]:
            fileio.makedirs(os.path.dirname(fileio.join(base, rel)))
            fileio.write_atomic(fileio.join(base, rel), rel)
        fileio.copy(fileio.join(base, "three.bin"), fileio.join(base, "four.bin"))
        fileio.rename(fileio.join(base, "four.bin"), fileio.join(base, "five.bin"))
        rel = lambda paths: [p[len(base) + 1:] for p in paths]  # noqa: E731
        answers.append((
            fileio.listdir(base), fileio.listdir(fileio.join(base, "d")),
            rel(fileio.glob(fileio.join(base, "d", "*"))), rel(fileio.walk_files(base)),
            fileio.size(fileio.join(base, "d", "sub", "two.txt")),
            fileio.isdir(fileio.join(base, "d")), fileio.isfile(fileio.join(base, "d")),
            fileio.read_text(fileio.join(base, "five.bin")),
            fileio.exists(fileio.join(base, "four.bin"))))
        fileio.rmtree(fileio.join(base, "d"))
        assert not fileio.exists(fileio.join(base, "d"))
    assert answers[0] == answers[1]
    assert answers[0] == (["d", "five.bin", "three.bin"], [".hidden", "one.txt", "sub"],
                          ["d/.hidden", "d/one.txt", "d/sub"],
                          ["d/one.txt", "d/sub/two.txt", "five.bin", "three.bin"],
                          len("d/sub/two.txt"), True, False, "three.bin", False)


def test_the_native_layer_needs_no_tensorflow(tmp_path):
    """With TensorFlow unimportable the layer is our own, local and remote (memory://)."""
    import subprocess
    import sys
    code = ("import sys; sys.modules['tensorflow'] = None\n"
            "from electra_tf import fileio\n"
            "assert not fileio.uses_tensorflow()\n"
            "for root in (sys.argv[1], 'memory://notf'):\n"
            "    fileio.makedirs(fileio.join(root, 'a'))\n"
            "    fileio.write_json_atomic(fileio.join(root, 'a', 'x.json'), [1, 2])\n"
            "    print(fileio.read_json(fileio.join(root, 'a', 'x.json')),\n"
            "          fileio.listdir(fileio.join(root, 'a')))\n"
            "try:\n"
            "    fileio.exists('nosuchscheme://b/x')\n"
            "except OSError as e:\n"
            "    print(type(e).__name__, fileio.error_reason(e)[:41])\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [
        "[1, 2] ['x.json']", "[1, 2] ['x.json']",
        "OSError no filesystem for nosuchscheme:// without"]
