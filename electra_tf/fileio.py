"""File access for every user-given path (local, gs://, any scheme of the filesystem layer
in use); the only local-only files are `local_staging_dir`'s. Outputs are written to a
sibling temp file renamed over the target (`atomic_output`), so a reader never sees a torn
file; a bucket has no atomic multi-file commit, so an output of several files writes the
file that marks completion (manifest, DONE marker, checkpoint state) last, after everything
it vouches for.

Two filesystem layers serve these functions, chosen per call:
- TensorFlow's (`tf.io.gfile`: local, gs://, ram:// in the tests) once TensorFlow is loaded
  in the process (the TensorFlow runtime, the builder's TensorFlow path), as before;
- else our own: local paths through `os`, remote ones (gs://, memory:// in the tests, any
  fsspec protocol) through fsspec (gs:// needs gcsfs, part of the `jax` extra). This is the
  JAX runtime's layer, on a machine with or without TensorFlow.
`ELECTRA_TF_FILES=native` (or `tensorflow`) forces one. Either way every error is an
OSError (FileNotFoundError for a missing path, PermissionError, ...) whose `strerror` is the
one-line reason; under TensorFlow's layer it is also the TensorFlow error class raised, for
the TensorFlow-only code that catches those.
"""

import bz2
import contextlib
import errno
import functools
import glob as glob_lib
import gzip
import io
import json
import os
import posixpath
import shutil
import sys
import tempfile
import uuid
from typing import Iterator, List, Optional, Union

# Suffix of the temp files write_atomic leaves behind if it is killed mid-write; readers
# of a directory skip names that end with it.
TMP_SUFFIX = ".tmp"

ENV_LAYER = "ELECTRA_TF_FILES"


def is_remote(path: str) -> bool:
    """Whether `path` names a non-local filesystem (gs://, ram://, s3://, ...)."""
    return "://" in path and not path.startswith("file://")


def join(path: str, *parts: str) -> str:
    """os.path.join for any filesystem (a URL's `//` is kept)."""
    return posixpath.join(path, *parts) if is_remote(path) else os.path.join(path, *parts)


def _local(path: str) -> str:
    return path[len("file://"):] if path.startswith("file://") else path


def uses_tensorflow() -> bool:
    """Whether calls now go through TensorFlow's filesystem layer."""
    layer = os.environ.get(ENV_LAYER, "")
    if layer == "native":
        return False
    if layer == "tensorflow":
        return True
    tf = sys.modules.get("tensorflow")
    return tf is not None and hasattr(tf, "io")


# --- errors: OSError on both layers ------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _dual(os_class, tf_class):
    """An exception class that is both `os_class` and TensorFlow's `tf_class`."""
    return type(tf_class.__name__, (os_class, tf_class), {"__module__": __name__})


def _os_error(e: BaseException, path: str) -> OSError:
    """TensorFlow's error `e` about `path` as an OSError (and still a `type(e)`)."""
    import tensorflow as tf
    codes = {tf.errors.NotFoundError: (FileNotFoundError, errno.ENOENT,
                                       "No such file or directory"),
             tf.errors.PermissionDeniedError: (PermissionError, errno.EACCES,
                                               "Permission denied"),
             tf.errors.AlreadyExistsError: (FileExistsError, errno.EEXIST, "File exists")}
    os_class, code, default = next(
        (v for k, v in codes.items() if isinstance(e, k)), (OSError, errno.EIO, ""))
    first = (getattr(e, "message", "") or str(e) or "").strip().splitlines()
    reason = first[0] if first else ""
    if "; " in reason:
        reason = reason.split("; ", 1)[1]
    out = _dual(os_class, type(e))(code, reason or default or type(e).__name__, path)
    # What TensorFlow's error class reads (`message`, `op`, `error_code`, ...).
    out._message, out._op, out._node_def = out.strerror, None, None
    out._error_code, out._experimental_payloads = e.error_code, {}
    return out


def _gfile_call(fn, path: str, *args, **kwargs):
    import tensorflow as tf
    try:
        return fn(*args, **kwargs)
    except tf.errors.OpError as e:
        raise _os_error(e, path) from None


class _GFile(io.RawIOBase):
    """A `tf.io.gfile.GFile` whose errors are OSErrors (`_os_error`)."""

    def __init__(self, path: str, mode: str):
        import tensorflow as tf
        self._path, self._mode = path, mode
        self._f = _gfile_call(tf.io.gfile.GFile, path, path, mode)

    def _call(self, name, *args):
        return _gfile_call(getattr(self._f, name), self._path, *args)

    def read(self, n=-1):
        return self._call("read", n)

    def readline(self, limit=-1):
        return self._call("readline")

    def write(self, data):
        return self._call("write", data)

    def seek(self, offset, whence=0):
        return self._call("seek", offset, whence)

    def tell(self):
        return self._call("tell")

    def flush(self):
        return self._call("flush")

    def size(self):
        return self._call("size")

    def readable(self):
        return "r" in self._mode

    def writable(self):
        return any(c in self._mode for c in "wa")

    def seekable(self):
        return "r" in self._mode

    def __iter__(self):
        while True:
            line = self.readline()
            if not line:
                return
            yield line

    def __next__(self):
        line = self.readline()
        if not line:
            raise StopIteration
        return line

    def close(self):
        if not self.closed:
            try:
                self._call("close")
            finally:
                super().close()


# --- the native layer's remote filesystems -----------------------------------------------

def _fs(path: str):
    """(fsspec filesystem, its path) for a remote `path`."""
    protocol = path.split("://", 1)[0]
    try:
        import fsspec
    except ImportError:
        raise OSError(errno.EPROTONOSUPPORT, f"{protocol}:// paths need fsspec without "
                      "TensorFlow: pip install fsspec", path) from None
    try:
        return fsspec.filesystem(protocol), path
    except (ImportError, ValueError) as e:
        hint = " (pip install gcsfs)" if protocol in ("gs", "gcs") else ""
        raise OSError(errno.EPROTONOSUPPORT, f"no filesystem for {protocol}:// without "
                      f"TensorFlow: {str(e).splitlines()[0]}{hint}", path) from None


def _remote_call(path: str, name: str, *args, **kwargs):
    fs, p = _fs(path)
    try:
        return getattr(fs, name)(p, *args, **kwargs)
    except FileNotFoundError as e:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", path) from e
    except OSError:
        raise
    except Exception as e:  # a client library's own error classes
        raise OSError(errno.EIO, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                      path) from e


def _with_scheme(path: str, found: str) -> str:
    """fsspec returns remote names without their scheme; put `path`'s back."""
    scheme = path.split("://", 1)[0] + "://"
    return found if "://" in found else scheme + found.lstrip("/")


# --- the functions ------------------------------------------------------------------------

def _ask(path: str, question: str, local) -> bool:
    """A yes/no question about `path` ('exists', 'isdir') on the layer in use; `local` is
    its `os.path` function."""
    if uses_tensorflow():
        import tensorflow as tf
        return _gfile_call(getattr(tf.io.gfile, question), path, path)
    if is_remote(path):
        return bool(_remote_call(path, question))
    return local(_local(path))


def exists(path: str) -> bool:
    return _ask(path, "exists", os.path.exists)


def isdir(path: str) -> bool:
    return _ask(path, "isdir", os.path.isdir)


def isfile(path: str) -> bool:
    """An existing path that is not a directory (any filesystem)."""
    return exists(path) and not isdir(path)


def makedirs(path: str):
    """Creates `path` and its parents (nothing when it exists)."""
    if not path:
        return
    if uses_tensorflow():
        import tensorflow as tf
        _gfile_call(tf.io.gfile.makedirs, path, path)
    elif is_remote(path):
        _remote_call(path, "makedirs", exist_ok=True)
    else:
        os.makedirs(_local(path), exist_ok=True)


def listdir(path: str) -> List[str]:
    """Names in `path` (without a trailing '/' for subdirectories)."""
    if uses_tensorflow():
        import tensorflow as tf
        names = _gfile_call(tf.io.gfile.listdir, path, path)
    elif is_remote(path):
        if not isdir(path):
            raise FileNotFoundError(errno.ENOENT, "No such directory", path)
        names = [posixpath.basename(p.rstrip("/"))
                 for p in _remote_call(path, "ls", detail=False)]
    else:
        names = os.listdir(_local(path))
    return sorted(name.rstrip("/") for name in names)


def glob(pattern: str) -> List[str]:
    if uses_tensorflow():
        import tensorflow as tf
        return sorted(_gfile_call(tf.io.gfile.glob, pattern, pattern))
    if is_remote(pattern):
        return sorted(_with_scheme(pattern, p) for p in _remote_call(pattern, "glob"))
    local = _local(pattern)
    # TensorFlow's glob matches names that start with '.' as any other
    found = (glob_lib.glob(local, include_hidden=True) if sys.version_info >= (3, 11)
             else glob_lib.glob(local))
    prefix = "file://" if pattern.startswith("file://") else ""
    return sorted(prefix + p for p in found)


def _walk(directory: str):
    """(root, dirs, files) for every directory under `directory`, as os.walk."""
    if uses_tensorflow():
        import tensorflow as tf
        yield from _gfile_call(lambda: list(tf.io.gfile.walk(directory)), directory)
    elif is_remote(directory):
        if not isdir(directory):
            return
        for root, dirs, names in _remote_call(directory, "walk"):
            yield _with_scheme(directory, root), dirs, names
    else:
        local = _local(directory)
        prefix = directory[:len(directory) - len(local)]
        for root, dirs, names in os.walk(local):
            yield prefix + root, dirs, names


def walk_files(directory: str) -> List[str]:
    """Every file under `directory`, recursively, but for names that start with '.'."""
    return sorted(join(root, name) for root, _, names in _walk(directory)
                  for name in names if not name.startswith("."))


def size(path: str) -> int:
    if uses_tensorflow():
        import tensorflow as tf
        return _gfile_call(tf.io.gfile.stat, path, path).length
    if is_remote(path):
        return int(_remote_call(path, "size"))
    return os.stat(_local(path)).st_size


def remove(path: str, missing_ok: bool = True):
    try:
        if uses_tensorflow():
            import tensorflow as tf
            _gfile_call(tf.io.gfile.remove, path, path)
        elif is_remote(path):
            if not _remote_call(path, "exists"):
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
            _remote_call(path, "rm_file")
        else:
            os.remove(_local(path))
    except FileNotFoundError:
        if not missing_ok:
            raise


def rmtree(path: str):
    """Removes a directory tree; nothing when it is not there."""
    if not exists(path):
        return
    if uses_tensorflow():
        import tensorflow as tf
        _gfile_call(tf.io.gfile.rmtree, path, path)
    elif is_remote(path):
        _remote_call(path, "rm", recursive=True)
    else:
        shutil.rmtree(_local(path))


def rename(src: str, dst: str, overwrite: bool = True):
    if uses_tensorflow():
        import tensorflow as tf
        _gfile_call(tf.io.gfile.rename, src, src, dst, overwrite=overwrite)
        return
    if not overwrite and exists(dst):
        raise FileExistsError(errno.EEXIST, "File exists", dst)
    if is_remote(src) or is_remote(dst):
        if not exists(src):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", src)
        if is_remote(src) and is_remote(dst) and src.split("://")[0] == dst.split("://")[0]:
            _remote_call(src, "mv", dst)
        else:
            copy(src, dst)
            remove(src)
    else:
        os.replace(_local(src), _local(dst))


def copy(src: str, dst: str, overwrite: bool = True):
    if uses_tensorflow():
        import tensorflow as tf
        if overwrite and dst.startswith("ram://") and tf.io.gfile.exists(dst):
            tf.io.gfile.remove(dst)  # ram:// appends to an existing file instead of replacing it
        _gfile_call(tf.io.gfile.copy, src, src, dst, overwrite=overwrite)
        return
    if not overwrite and exists(dst):
        raise FileExistsError(errno.EEXIST, "File exists", dst)
    if not (is_remote(src) or is_remote(dst)):
        shutil.copyfile(_local(src), _local(dst))
        return
    with open_file(src, "rb") as f_in, open_file(dst, "wb") as f_out:
        shutil.copyfileobj(f_in, f_out, 1 << 22)


def open_file(path: str, mode: str = "r"):
    """A file object for `path` (any filesystem); modes as for `tf.io.gfile.GFile` ('r',
    'rb', 'w', 'wb', 'a', 'ab'): text modes are UTF-8 and leave newlines as they are."""
    if uses_tensorflow():
        return _GFile(path, mode)
    binary = mode if "b" in mode else mode + "b"
    if is_remote(path):
        fs, p = _fs(path)
        try:
            raw = fs.open(p, binary)
        except FileNotFoundError:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path) from None
        if "b" in mode:
            return raw
        return io.TextIOWrapper(raw, encoding="utf-8", newline="")
    if "b" in mode:
        return open(_local(path), mode)  # noqa: SIM115 (the file layer's own open)
    return open(_local(path), mode, encoding="utf-8", newline="")


def read_bytes(path: str) -> bytes:
    with open_file(path, "rb") as f:
        return f.read()


def read_text(path: str) -> str:
    return read_bytes(path).decode("utf-8")


def read_json(path: str):
    return json.loads(read_text(path))


def open_compressed(path: str):
    """`path` opened for binary reading, decompressing `.gz` / `.bz2` by its extension."""
    raw = open_file(path, "rb")
    if path.endswith(".gz"):
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if path.endswith(".bz2"):
        return bz2.BZ2File(raw, "rb")
    return raw


def open_text_lines(path: str, encoding: str = "utf-8") -> Iterator[str]:
    """The lines of a (possibly compressed) text file, newlines kept."""
    with open_compressed(path) as f:
        if isinstance(f, _GFile):  # lines as TensorFlow's reader splits them
            for line in f:
                yield line.decode(encoding) if isinstance(line, bytes) else line
        else:
            yield from io.TextIOWrapper(f, encoding=encoding, newline="")


@contextlib.contextmanager
def atomic_output(path: str) -> Iterator[str]:
    """A temp path to write `path`'s content to (any writer; close it inside the block),
    renamed over `path` when the block ends, removed if it raises. Its name is unique (ram://
    appends to a file it reopens) and ends with TMP_SUFFIX: a kill leaves it, not a torn
    `path`."""
    tmp = f"{path}.{uuid.uuid4().hex[:12]}{TMP_SUFFIX}"
    try:
        yield tmp
        rename(tmp, path, overwrite=True)
    except BaseException:
        remove(tmp)
        raise


def write_atomic(path: str, data: Union[str, bytes], sync: bool = False):
    """Writes `data` to `path` through `atomic_output`. `sync`: flush it to disk before
    the rename (`fsync`), for a file that vouches for others written before it."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    with atomic_output(path) as tmp:
        with open_file(tmp, "wb") as f:
            f.write(data)
        if sync:
            fsync(tmp)


def write_json_atomic(path: str, obj, indent: Optional[int] = 2, sort_keys: bool = False,
                      sync: bool = False):
    """`obj` as JSON plus a newline, through `write_atomic`."""
    write_atomic(path, json.dumps(obj, indent=indent, sort_keys=sort_keys) + "\n", sync=sync)


@contextlib.contextmanager
def local_staging_dir(prefix: str = "electra-tf-") -> Iterator[str]:
    """A local temporary directory, removed on exit, for libraries that only write local
    files (SentencePiece's trainer, builder workers); `copy_tree` / `copy` copy it out."""
    directory = tempfile.mkdtemp(prefix=prefix)  # local staging, not a user path
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)  # local staging, not a user path


def copy_tree(src: str, dst: str, last: Optional[List[str]] = None):
    """Copies the files under `src` to `dst` (either may be on any filesystem); the names
    in `last` (relative paths) are copied after all others, so that a marker of
    completion lands last on a filesystem without atomic directory renames."""
    last = list(last or [])
    paths = posixpath if is_remote(src) else os.path
    files = [paths.relpath(join(root, n), src) for root, _, names in _walk(src) for n in names]
    ordered = sorted(f for f in files if f not in last) + [f for f in last if f in files]
    for rel in ordered:
        target = join(dst, *rel.split(os.sep))
        makedirs(posixpath.dirname(target) if is_remote(target) else os.path.dirname(target))
        copy(join(src, rel), target)


def error_reason(e: BaseException) -> str:
    """The one-line reason of a file error, without the path: an OSError's strerror, a
    TensorFlow error's text after `path; ` (or a default where it is empty), else the
    message's first line."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    message = (getattr(e, "message", None) or str(e) or "").strip()
    first = message.splitlines()[0] if message else ""
    tf = sys.modules.get("tensorflow")
    if tf is not None and hasattr(tf, "errors") and isinstance(e, tf.errors.OpError):
        if "; " in first:
            message = first.split("; ", 1)[1]
        if not message:
            defaults = {tf.errors.NotFoundError: "No such file or directory",
                        tf.errors.PermissionDeniedError: "Permission denied"}
            return next((v for k, v in defaults.items() if isinstance(e, k)),
                        type(e).__name__)
    if not message:
        return type(e).__name__
    return message.splitlines()[0]


def fsync(path: str):
    """Flushes a written local file to disk (TensorFlow's writers do not), before a file
    that vouches for it is written; remote objects are durable once uploaded."""
    if is_remote(path):
        return
    fd = os.open(_local(path), os.O_RDONLY)  # local file only (remote paths returned above)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def writable_dir_problem(path: str) -> Optional[str]:
    """None when `path` is (or could be made) a directory this process can write to, else
    why not; creates it and writes and removes a probe file there."""
    if isfile(path):
        return "it is a file, not a directory"
    try:
        makedirs(path)
        probe = join(path, f".write-probe-{uuid.uuid4().hex[:12]}{TMP_SUFFIX}")
        with open_file(probe, "wb") as f:
            f.write(b"")
        remove(probe)
    except OSError as e:
        return error_reason(e)
    return None
