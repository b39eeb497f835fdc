"""File access for every user-given path (local, gs://, ram:// in the tests, any scheme
`tf.io.gfile` knows), through TensorFlow's filesystem layer; the only local-only files are
`local_staging_dir`'s. Outputs are written to a sibling temp file renamed over the target
(`atomic_output`), so a reader never sees a torn file; a bucket has no atomic multi-file
commit, so an output of several files writes the file that marks completion (manifest, DONE
marker, checkpoint state) last, after everything it vouches for.
"""

import bz2
import contextlib
import gzip
import io
import json
import os
import posixpath
import shutil
import tempfile
import uuid
from typing import Iterator, List, Optional, Union

import tensorflow as tf

# Suffix of the temp files write_atomic leaves behind if it is killed mid-write; readers
# of a directory skip names that end with it.
TMP_SUFFIX = ".tmp"


def is_remote(path: str) -> bool:
    """Whether `path` names a non-local filesystem (gs://, ram://, s3://, ...)."""
    return "://" in path and not path.startswith("file://")


def join(path: str, *parts: str) -> str:
    """os.path.join for any filesystem (a URL's `//` is kept)."""
    return posixpath.join(path, *parts) if is_remote(path) else os.path.join(path, *parts)


def exists(path: str) -> bool:
    return tf.io.gfile.exists(path)


def isdir(path: str) -> bool:
    return tf.io.gfile.isdir(path)


def makedirs(path: str):
    """Creates `path` and its parents (nothing when it exists)."""
    if path:
        tf.io.gfile.makedirs(path)


def listdir(path: str) -> List[str]:
    """Names in `path` (without a trailing '/' for subdirectories)."""
    return sorted(name.rstrip("/") for name in tf.io.gfile.listdir(path))


def glob(pattern: str) -> List[str]:
    return sorted(tf.io.gfile.glob(pattern))


def walk_files(directory: str) -> List[str]:
    """Every file under `directory`, recursively, but for names that start with '.'."""
    return sorted(join(root, name) for root, _, names in tf.io.gfile.walk(directory)
                  for name in names if not name.startswith("."))


def size(path: str) -> int:
    return tf.io.gfile.stat(path).length


def remove(path: str, missing_ok: bool = True):
    try:
        tf.io.gfile.remove(path)
    except tf.errors.NotFoundError:
        if not missing_ok:
            raise


def rmtree(path: str):
    """Removes a directory tree; nothing when it is not there."""
    if tf.io.gfile.exists(path):
        tf.io.gfile.rmtree(path)


def rename(src: str, dst: str, overwrite: bool = True):
    tf.io.gfile.rename(src, dst, overwrite=overwrite)


def copy(src: str, dst: str, overwrite: bool = True):
    if overwrite and dst.startswith("ram://") and tf.io.gfile.exists(dst):
        tf.io.gfile.remove(dst)  # ram:// appends to an existing file instead of replacing it
    tf.io.gfile.copy(src, dst, overwrite=overwrite)


def open_file(path: str, mode: str = "r"):
    """A file object for `path` (any filesystem); modes as for `tf.io.gfile.GFile`."""
    return tf.io.gfile.GFile(path, mode)


def read_bytes(path: str) -> bytes:
    with tf.io.gfile.GFile(path, "rb") as f:
        return f.read()


def read_text(path: str) -> str:
    return read_bytes(path).decode("utf-8")


def read_json(path: str):
    return json.loads(read_text(path))


def open_compressed(path: str):
    """`path` opened for binary reading, decompressing `.gz` / `.bz2` by its extension."""
    raw = tf.io.gfile.GFile(path, "rb")
    if path.endswith(".gz"):
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if path.endswith(".bz2"):
        return bz2.BZ2File(raw, "rb")
    return raw


def open_text_lines(path: str, encoding: str = "utf-8") -> Iterator[str]:
    """The lines of a (possibly compressed) text file, newlines kept."""
    with open_compressed(path) as f:
        if isinstance(f, tf.io.gfile.GFile):  # no readable(): TextIOWrapper cannot wrap it
            for line in f:
                yield line.decode(encoding)
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
        tf.io.gfile.rename(tmp, path, overwrite=True)
    except BaseException:
        remove(tmp)
        raise


def write_atomic(path: str, data: Union[str, bytes], sync: bool = False):
    """Writes `data` to `path` through `atomic_output`. `sync`: flush it to disk before
    the rename (`fsync`), for a file that vouches for others written before it."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    with atomic_output(path) as tmp:
        with tf.io.gfile.GFile(tmp, "wb") as f:
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
    files = [paths.relpath(join(root, n), src) for root, _, names in tf.io.gfile.walk(src)
             for n in names]
    ordered = sorted(f for f in files if f not in last) + [f for f in last if f in files]
    for rel in ordered:
        target = join(dst, *rel.split(os.sep))
        makedirs(posixpath.dirname(target) if is_remote(target) else os.path.dirname(target))
        copy(join(src, rel), target)


def isfile(path: str) -> bool:
    """An existing path that is not a directory (any filesystem)."""
    return tf.io.gfile.exists(path) and not tf.io.gfile.isdir(path)


def error_reason(e: BaseException) -> str:
    """The one-line reason of a file error, without the path: an OSError's strerror, a
    TensorFlow error's text after `path; ` (or a default where it is empty), else the
    message's first line."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    message = (getattr(e, "message", None) or str(e) or "").strip()
    first = message.splitlines()[0] if message else ""
    if isinstance(e, tf.errors.OpError) and "; " in first:
        message = first.split("; ", 1)[1]
    if not message:
        defaults = {tf.errors.NotFoundError: "No such file or directory",
                    tf.errors.PermissionDeniedError: "Permission denied"}
        return next((v for k, v in defaults.items() if isinstance(e, k)), type(e).__name__)
    return message.splitlines()[0]


def fsync(path: str):
    """Flushes a written local file to disk (TensorFlow's writers do not), before a file
    that vouches for it is written; remote objects are durable once uploaded."""
    if is_remote(path):
        return
    local = path[len("file://"):] if path.startswith("file://") else path
    fd = os.open(local, os.O_RDONLY)  # local file only (remote paths returned above)
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
        with tf.io.gfile.GFile(probe, "wb") as f:
            f.write(b"")
        remove(probe)
    except (tf.errors.OpError, OSError) as e:
        return error_reason(e)
    return None
