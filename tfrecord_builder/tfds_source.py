"""Reading a text dataset that tensorflow-datasets has already prepared locally
(`--tfds_name` under `--tfds_data_dir`); nothing is ever downloaded or prepared here.

Each record is one document; its text (the `--tfds_text_key` feature: a string, or a list
of strings taken as its lines) becomes the corpus layout: stripped non-empty lines, one
blank line between documents, in chunks cut as `corpus.iter_file_chunks` cuts files. A
TFDS chunk's `file_index` is 0 (a single input), its `path` the label "tfds:NAME/SPLIT",
its `first_line` the 0-based number of its first record (--tfds_split "SPLIT[n:]" finds
it again), its `raw_pos` the records consumed (progress against num_examples).
"""

import itertools
import os
from typing import Iterator, List, Optional

from tfrecord_builder import BuildError
from tfrecord_builder import corpus

# Records pulled from tf.data per step: amortises the Python-side iteration cost while
# keeping what is held in memory small (one batch plus the chunk being filled).
READ_BATCH = 256
# Bump when the record -> lines conversion changes: it is part of the build fingerprint.
LAYOUT_VERSION = 1


def source_label(cfg) -> str:
    return f"tfds:{cfg.tfds_name}/{cfg.tfds_split}"


def _where(cfg, data_dir: Optional[str] = None) -> str:
    """'NAME' plus the data dir, for error messages."""
    data_dir = data_dir or cfg.tfds_data_dir or _default_data_dir()
    return f"--tfds_name {cfg.tfds_name} (data dir {data_dir})"


def _default_data_dir() -> str:
    try:
        from tensorflow_datasets.core import constants
        return str(constants.DATA_DIR)
    except Exception:  # pragma: no cover - only used in messages
        return os.environ.get("TFDS_DATA_DIR", "~/tensorflow_datasets")


def _first_line(e, limit: int = 300) -> str:
    """An exception's message on one line (a first line ending in ':' keeps what follows)."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    if not lines:
        return type(e).__name__
    text = lines[0] if not lines[0].endswith(":") else " ".join(lines)
    return text if len(text) <= limit else text[:limit - 3].rstrip() + "..."


def _import_tfds():
    try:
        import tensorflow_datasets as tfds
    except ImportError as e:
        top = (e.name or "").split(".")[0]
        if isinstance(e, ModuleNotFoundError) and top == "tensorflow_datasets":
            raise BuildError("--tfds_name needs tensorflow-datasets: "
                             "pip install -e .[tfds]") from None
        raise BuildError(f"--tfds_name: cannot import tensorflow-datasets: "
                         f"{_first_line(e)}") from None
    try:
        tfds.disable_progress_bar()
    except Exception:  # pragma: no cover
        pass
    return tfds


def _has_namespace(name: str) -> bool:
    """'ns:dataset/...' (community / Hugging Face datasets, which reach the network)."""
    head = name.split("/", 1)[0]
    return ":" in head and not head.split(":", 1)[1][:1].isdigit()


def _open_builder(cfg):
    """The prepared builder of cfg.tfds_name, or a one-line BuildError."""
    tfds = _import_tfds()
    name = cfg.tfds_name
    if _has_namespace(name):
        raise BuildError(f"{_where(cfg)}: namespaced (community / Hugging Face) datasets are "
                         "not supported: their builders reach the network")
    kwargs = {}
    if cfg.tfds_data_dir:
        kwargs["data_dir"] = os.fspath(cfg.tfds_data_dir)
    try:
        builder = tfds.builder(name, try_gcs=False, **kwargs)
    except tfds.core.registered.DatasetNotFoundError:
        raise BuildError(f"{_where(cfg)}: no such dataset: no TFDS builder has that name and "
                         "it is not prepared in the data dir") from None
    except Exception as e:  # bad config or version, unreadable dataset_info.json, ...
        raise BuildError(f"{_where(cfg)}: {_first_line(e)}") from None
    try:
        prepared = bool(builder.is_prepared())
    except Exception:  # pylint: disable=broad-except
        prepared = False
    if not prepared:
        root = getattr(builder, "data_dir_root", None) or cfg.tfds_data_dir or _default_data_dir()
        raise BuildError(
            f"{_where(cfg, root)}: the dataset is not prepared there (no "
            f"{builder.data_dir}); prepare it first, e.g. `tfds build {name} --data_dir "
            f"{root}` (this builder never downloads)")
    return tfds, builder


def _split_info(cfg, builder):
    """SplitInfo of cfg.tfds_split (slices like 'train[:10%]' and 'a+b' allowed)."""
    split = cfg.tfds_split
    available = sorted(builder.info.splits.keys())
    try:
        return builder.info.splits[split]
    except (KeyError, ValueError, AssertionError, TypeError) as e:
        bases = [part.split("[", 1)[0].strip() for part in split.split("+")]
        if any(base not in available for base in bases):
            raise BuildError(f"--tfds_split {split}: {_where(cfg)} has no such split "
                             f"(available: {', '.join(available) or 'none'})") from None
        raise BuildError(f"--tfds_split {split} of {_where(cfg)}: {_first_line(e)}") from None


def _feature_paths(features, prefix: str = "") -> List[str]:
    out = []
    for key in features.keys():
        sub = features[key]
        path = f"{prefix}{key}"
        if hasattr(sub, "keys") and callable(sub.keys):
            out.extend(_feature_paths(sub, path + "/"))
        else:
            out.append(path)
    return out


def _text_feature(cfg, builder):
    """Checks cfg.tfds_text_key ('a' or nested 'a/b'); returns its rank (0 or 1)."""
    import tensorflow as tf  # tensorflow-datasets has imported it
    features = builder.info.features
    feature = features
    for part in cfg.tfds_text_key.split("/"):
        if not (hasattr(feature, "keys") and callable(feature.keys)) or part not in feature.keys():
            raise BuildError(f"--tfds_text_key {cfg.tfds_text_key}: {_where(cfg)} has no such "
                             f"feature (features: {', '.join(_feature_paths(features))})")
        feature = feature[part]
    dtype = getattr(feature, "tf_dtype", None)
    if dtype is None:
        dtype = getattr(feature, "dtype", None)
    try:
        shape = tuple(getattr(feature, "shape", ()) or ())
        is_text = not isinstance(dtype, dict) and tf.as_dtype(dtype) == tf.string
    except (TypeError, ValueError):
        shape, is_text = (), False
    if not is_text or len(shape) > 1:
        raise BuildError(f"--tfds_text_key {cfg.tfds_text_key}: feature of {_where(cfg)} "
                         f"is not text ({type(feature).__name__}, {dtype}, shape {shape})")
    return len(shape)


def open_tfds_source(cfg):
    """Checks the dataset, split and text feature; returns the build's `corpus.Source`."""
    _, builder = _open_builder(cfg)
    split_info = _split_info(cfg, builder)
    _text_feature(cfg, builder)
    info = builder.info
    num_examples = int(split_info.num_examples)
    try:
        num_bytes = int(split_info.num_bytes)
    except Exception:
        num_bytes = 0
    fingerprint = {"tfds": {
        "name": cfg.tfds_name, "full_name": str(info.full_name), "version": str(info.version),
        "split": cfg.tfds_split, "text_key": cfg.tfds_text_key, "num_examples": num_examples,
        "num_bytes": num_bytes, "layout": LAYOUT_VERSION}}
    return corpus.Source((source_label(cfg),), (num_examples,), fingerprint)


# ----------------------------------------------------------------------------- records


def document_bytes(text) -> bytes:
    """One record's text -> its lines in the corpus layout, each ending in '\\n'.

    `text` is bytes/str, or a sequence of them (taken as consecutive lines). Lines are
    stripped and empty ones dropped; b'' when nothing is left. Bytes that are not UTF-8
    are kept, line by line, for the worker to count and drop (`corpus.clean_lines`).
    """
    if isinstance(text, (list, tuple)) or (hasattr(text, "ndim") and text.ndim == 1):
        return b"".join(document_bytes(part) for part in text)
    if isinstance(text, str):
        lines = [line.strip() for line in text.splitlines()]
        return "".join(line + "\n" for line in lines if line).encode("utf-8")
    text = bytes(text)
    try:
        return document_bytes(text.decode("utf-8"))
    except UnicodeDecodeError:
        out = []
        for raw in text.split(b"\n"):
            try:
                out.append(document_bytes(raw.decode("utf-8")))
            except UnicodeDecodeError:
                raw = raw.strip()
                if raw:
                    out.append(raw + b"\n")
        return b"".join(out)


def _iter_texts(cfg, tfds, builder, rank: int) -> Iterator[bytes]:
    """The text of each record of the split, in the dataset's stored order."""
    import tensorflow as tf  # tensorflow-datasets has imported it
    read_config = tfds.ReadConfig(
        interleave_cycle_length=1,  # one file after the other: the canonical order
        try_autocache=False,  # never cache a whole split in memory
        add_tfds_id=False)
    try:
        ds = builder.as_dataset(split=cfg.tfds_split, shuffle_files=False,
                                read_config=read_config)
    except Exception as e:  # files vanished or unreadable since open_tfds_source
        raise BuildError(f"{_where(cfg)}: cannot read split {cfg.tfds_split}: "
                         f"{_first_line(e)}") from None
    parts = cfg.tfds_text_key.split("/")

    def pick(example):
        for part in parts:
            example = example[part]
        if rank == 1:  # a list of strings: its items are lines
            example = tf.strings.reduce_join(example, separator="\n")
        return example

    ds = ds.map(pick, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.batch(READ_BATCH).prefetch(2)
    count = 0
    try:
        for batch in ds.as_numpy_iterator():
            for text in batch:
                yield text
                count += 1
    except tf.errors.OpError as e:
        raise BuildError(f"{_where(cfg)}: cannot read split {cfg.tfds_split} near record "
                         f"{count}: {_first_line(e.message)}") from None


def chunk_documents(texts, label: str, chunk_bytes: int) -> Iterator[corpus.Chunk]:
    """Batches record texts into document-aligned chunks (see the module docstring).

    A chunk closes at the first document boundary at or past `chunk_bytes`; a chunk never
    grows past MAX_CHUNK_FACTOR * chunk_bytes: a longer document is cut at line breaks
    (at a space within a giant line, flagged `split_line`), as for files.
    """
    hard_limit = chunk_bytes * corpus.MAX_CHUNK_FACTOR
    chunk_index = itertools.count()
    parts: List[bytes] = []  # documents of the chunk being filled, blank lines included
    size = 0
    first = 0  # record number of the chunk's first record
    records = 0  # records consumed

    def emit(data: bytes, split: bool = False):
        return corpus.Chunk(0, next(chunk_index), label, first, data, split, records)

    for text in texts:
        doc = document_bytes(text)
        if doc and size and size + 1 + len(doc) > hard_limit:
            yield emit(b"".join(parts))
            parts, size, first = [], 0, records
        if not size:
            first = records
        while len(doc) > hard_limit:
            end, split = corpus.hard_cut(doc, hard_limit)
            yield emit(doc[:end], split)
            doc = doc[end:]
            first = records
        records += 1
        if doc:
            if size:
                parts.append(b"\n")
                size += 1
            parts.append(doc)
            size += len(doc)
        if size >= chunk_bytes:
            yield emit(b"".join(parts))
            parts, size, first = [], 0, records
    if size:
        yield emit(b"".join(parts))


def iter_tfds_chunks(cfg) -> Iterator[corpus.Chunk]:
    """Yields the split of cfg.tfds_name as chunks, deterministically, memory bounded."""
    tfds, builder = _open_builder(cfg)
    _split_info(cfg, builder)
    rank = _text_feature(cfg, builder)
    yield from chunk_documents(_iter_texts(cfg, tfds, builder, rank), source_label(cfg),
                               cfg.chunk_bytes)
