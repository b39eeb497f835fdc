"""Reading the raw corpus: input expansion, decompression, and document-aligned chunks.

The main process only finds chunk boundaries in raw bytes; decoding and line checks run
in the workers (`clean_lines`), so the reader stays cheap and memory stays bounded.

Every input goes through `electra_tf.fileio`, so files, directories and globs may be local
or on any filesystem its layer knows (gs://...).
"""

import concurrent.futures
import dataclasses
import errno
import glob
import os
import sys
from typing import Iterator, List, Sequence, Tuple

from electra_tf import fileio
from tfrecord_builder import BuildError

# A chunk closes at the first document boundary after this many bytes ...
DEFAULT_CHUNK_BYTES = 1 << 18
# ... or, inside a very long document or line, at a line/word boundary past this many.
MAX_CHUNK_FACTOR = 4
READ_BLOCK = 1 << 16
# Skipped lines quoted in the manifest (`skipped_line_examples`), the first ones in order.
MAX_SKIP_EXAMPLES = 20


@dataclasses.dataclass(frozen=True)
class Chunk:
    """A run of whole lines from one input; (file_index, index) fixes its RNG stream
    and its place in the output, independently of how many workers run."""
    file_index: int
    index: int  # position of the chunk within its input
    path: str
    first_line: int  # 1-based line number of the chunk's first line in `path`
    #                  (for a tensorflow-datasets source: 0-based number of its first record)
    data: bytes
    split_line: bool  # the chunk ends inside a line that was too long to keep whole
    raw_pos: int = 0  # bytes of the (possibly compressed) input consumed so far


@dataclasses.dataclass(frozen=True)
class Source:
    """The corpus as an ordered list of inputs (files, or one tensorflow-datasets split),
    with their sizes (progress) and what identifies them (the build fingerprint)."""
    names: Tuple[str, ...]
    sizes: Tuple[int, ...]
    fingerprint: dict


def open_files(patterns: Sequence[str]) -> Source:
    """The files `patterns` name (`expand_inputs`), each stamped with its size and
    modification time."""
    files = expand_inputs(patterns)
    # Remote metadata is one request per file: ask for many at once.
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        found = list(pool.map(_stat_input, files))
    sizes = [size for size, _ in found]
    stamps = [[path, size, mtime] for path, (size, mtime) in zip(files, found)]
    return Source(tuple(files), tuple(sizes), {"files": stamps})


def _stat_input(path: str) -> Tuple[int, int]:
    """(size, modification time in ns) of an input, for the build's fingerprint."""
    if "://" not in path:
        # Local: os.stat keeps the nanoseconds that gfile's stat rounds to whole seconds,
        # so a local build's fingerprint stays what it was.
        if not os.access(path, os.R_OK):  # local path only (URLs above)
            raise BuildError(f"cannot read {path}: permission denied")
        try:
            st = os.stat(path)  # local path only (URLs above)
        except OSError as e:
            raise BuildError(f"cannot read {path}: {fileio.error_reason(e)}") from None
        return st.st_size, st.st_mtime_ns
    if fileio.uses_tensorflow():
        tf = sys.modules["tensorflow"]
        try:
            st = tf.io.gfile.stat(path)
        except tf.errors.OpError as e:
            raise BuildError(f"cannot read {path}: {fileio.error_reason(e)}") from None
        return st.length, st.mtime_nsec
    try:  # fileio offers no modification time: the size alone stamps a remote input
        return fileio.size(path), 0
    except OSError as e:
        raise BuildError(f"cannot read {path}: {fileio.error_reason(e)}") from None


def expand_inputs(patterns: Sequence[str]) -> List[str]:
    """Files, directories (recursively) and glob patterns -> sorted unique file list.

    As the shell's glob does: wildcards skip names that start with '.', and `**` spans any
    number of directories. Local paths are made absolute; URLs (gs://...) stay as given.
    """
    files = []
    for pattern in patterns:
        pattern = pattern.strip()
        if not pattern:
            continue
        try:
            if fileio.isdir(pattern):
                found = fileio.walk_files(pattern)
            elif glob.has_magic(pattern):
                found = [p for p in _glob(pattern) if not fileio.isdir(p)]
            elif fileio.exists(pattern):
                found = [pattern]
            else:
                raise BuildError(f"--input: no such file or directory: {pattern}")
        except OSError as e:  # no filesystem for the scheme, no access, ...
            raise BuildError(f"--input: cannot list {pattern}: "
                             f"{fileio.error_reason(e)}") from None
        if not found:
            raise BuildError(f"--input: {pattern} matches no files")
        files.extend(found)
    if not files:
        raise BuildError("--input: no input files given")
    return sorted(set(f if "://" in f else os.path.abspath(f) for f in files))


def _glob(pattern: str) -> List[str]:
    """What Python's recursive glob finds, on any filesystem (files and directories)."""
    parts = pattern.split("/")
    if "**" not in parts:
        found = []
        for path in fileio.glob(pattern):
            got = path.split("/")
            # A wildcard matches no hidden name, unless the pattern part starts with '.'.
            if len(got) == len(parts) and any(glob.has_magic(p) and g.startswith(".") and
                                              not p.startswith(".") for g, p in zip(got, parts)):
                continue
            found.append(path)
        return found
    i = parts.index("**")
    head, rest = "/".join(parts[:i]), "/".join(parts[i + 1:])
    if head and glob.has_magic(head):
        bases = [p for p in _glob(head) if fileio.isdir(p)]
    else:
        bases = [head] if fileio.isdir(head or ".") else []
    found = []
    for base in bases:
        root = base or "."
        below = [root] + _directories_below(root)
        for d in below:
            if rest:
                found.extend(_glob(fileio.join(d, rest)))
            elif d != root:
                found.append(d)
        if not rest:  # "dir/**": also every (non-hidden) file below
            found.extend(p for p in fileio.walk_files(root)
                         if not any(part.startswith(".") for part in
                                    p[len(root):].split("/")))
    if not head:  # "**/x" names paths relative to the working directory
        found = [p[2:] if p.startswith("./") else p for p in found]
    return sorted(set(found))


def _directories_below(root: str) -> List[str]:
    """Every directory under `root`, hidden ones (and what is in them) skipped."""
    if fileio.uses_tensorflow():
        tf = sys.modules["tensorflow"]
        found = []
        try:
            for top, dirs, _ in tf.io.gfile.walk(root):
                dirs[:] = [d for d in dirs if not d.rstrip("/").startswith(".")]
                found.extend(fileio.join(top, d.rstrip("/")) for d in dirs)
        except tf.errors.OpError as e:
            raise OSError(errno.EIO, fileio.error_reason(e), root) from None
        return found
    found, todo = [], [root]
    while todo:
        top = todo.pop(0)
        for name in fileio.listdir(top):
            path = fileio.join(top, name)
            if not name.startswith(".") and fileio.isdir(path):
                found.append(path)
                todo.append(path)
    return found


def _doc_boundary(buf: bytes, start: int) -> int:
    """End offset of the first blank line at or after `start`, or -1."""
    ends = [i + len(sep) for sep in (b"\n\n", b"\n\r\n")
            for i in (buf.find(sep, start),) if i >= 0]
    return min(ends) if ends else -1


def hard_cut(buf: bytes, limit: int) -> Tuple[int, bool]:
    """Cut inside an over-long document: last line break, else last space, else a
    UTF-8 character boundary. Returns (end, whether a line was split)."""
    i = buf.rfind(b"\n", 0, limit)
    if i > 0:
        return i + 1, False
    i = buf.rfind(b" ", 0, limit)
    if i > 0:
        return i + 1, True
    i = limit
    while i > 0 and (buf[i] & 0xC0) == 0x80:  # never split a UTF-8 sequence
        i -= 1
    return max(i, 1), True


def iter_file_chunks(path: str, file_index: int, chunk_bytes: int) -> Iterator[Chunk]:
    """Yields `path` as chunks of whole documents of about `chunk_bytes` bytes.

    A document longer than MAX_CHUNK_FACTOR * chunk_bytes is cut at a line break (or,
    for a giant line, at a space), so memory stays bounded whatever the input.
    """
    hard_limit = chunk_bytes * MAX_CHUNK_FACTOR
    index, line_no, buf, eof, raw_pos = 0, 1, b"", False, 0
    try:
        with fileio.open_compressed(path) as f:  # opened, and failing, on the first read
            raw = getattr(f, "fileobj", None) or getattr(f, "_fp", None)
            while True:
                while not eof and len(buf) <= hard_limit:
                    if len(buf) >= chunk_bytes and _doc_boundary(buf, chunk_bytes - 1) >= 0:
                        break
                    block = f.read(READ_BLOCK)
                    raw_pos = _raw_tell(f, raw)
                    if block:
                        buf += block
                    else:
                        eof = True
                if not buf:
                    return
                end = _doc_boundary(buf, chunk_bytes - 1) if len(buf) >= chunk_bytes else -1
                split = False
                if end < 0 or end > hard_limit:
                    if eof and len(buf) <= hard_limit:
                        end = len(buf)
                    else:
                        end, split = hard_cut(buf, min(len(buf) - 1, hard_limit))
                data, buf = buf[:end], buf[end:]
                yield Chunk(file_index, index, path, line_no, data, split, raw_pos)
                line_no += data.count(b"\n")
                index += 1
    except (OSError, EOFError, ValueError) as e:  # truncated .gz/.bz2, I/O errors
        raise BuildError(f"cannot read {path} (near line {line_no}): {e}") from None


def _raw_tell(f, raw) -> int:
    try:
        return (raw or f).tell()
    except (OSError, ValueError, AttributeError):
        return 0


@dataclasses.dataclass
class LineStats:
    """Per-chunk line accounting, summed into the manifest."""
    lines: int = 0
    skipped: dict = dataclasses.field(default_factory=dict)
    examples_of_skips: list = dataclasses.field(default_factory=list)

    def skip(self, reason: str, where: str):
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        if len(self.examples_of_skips) < MAX_SKIP_EXAMPLES:
            self.examples_of_skips.append(f"{where}: {reason}")


def clean_lines(chunk: Chunk, stats: LineStats) -> List[str]:
    """Decodes a chunk into stripped lines ('' marks a document boundary).

    Lines with invalid UTF-8 or NUL bytes are dropped and counted, never passed on.
    """
    data = chunk.data
    try:
        if b"\x00" in data:
            raise UnicodeError
        text_lines = data.decode("utf-8").split("\n")
        checked = False
    except UnicodeError:
        text_lines = data.split(b"\n")
        checked = True
    if text_lines and text_lines[-1] in ("", b""):
        text_lines.pop()  # the chunk ends with a newline
    out = []
    for offset, line in enumerate(text_lines):
        if checked:
            where = f"{chunk.path}:{chunk.first_line + offset}"
            if b"\x00" in line:
                stats.skip("nul_bytes", where)
                continue
            try:
                line = line.decode("utf-8")
            except UnicodeDecodeError:
                stats.skip("invalid_utf8", where)
                continue
        out.append(line.strip())
    stats.lines += len(text_lines)
    if chunk.split_line:
        stats.skip("long_line_split", f"{chunk.path}:{chunk.first_line + len(text_lines) - 1}")
    return out
