"""One chunk of raw text -> packed examples -> serialized tf.train.Example records.

This is the unit of work shared by the local multiprocess build and the Beam pipeline:
its output depends only on the chunk, the tokenizer, the sequence length and the seed.
"""

import dataclasses
from typing import Dict, Iterable, List, Tuple

import numpy as np

from electra_tf import fileio
from electra_tf.wire import frame_record
from tfrecord_builder.corpus import MAX_SKIP_EXAMPLES, Chunk, LineStats, clean_lines
from tfrecord_builder.packing import Packer, PackedExamples

FEATURES = ("input_ids", "input_mask", "segment_ids")


@dataclasses.dataclass
class ChunkStats:
    """What a chunk contributed; summed (`merge`) into the manifest."""
    examples: int = 0
    lines: int = 0
    documents: int = 0
    corpus_tokens: int = 0
    example_tokens: int = 0
    skipped: Dict[str, int] = dataclasses.field(default_factory=dict)
    skip_examples: List[str] = dataclasses.field(default_factory=list)
    # Sparse unigram counts (ids, counts) of the corpus tokens, for unigram generators.
    count_ids: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros([0], np.int64))
    counts: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros([0], np.int64))

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("count_ids")
        d.pop("counts")
        return d

    @classmethod
    def from_json(cls, d: dict, count_ids=None, counts=None) -> "ChunkStats":
        s = cls(**d)
        if count_ids is not None:
            s.count_ids, s.counts = count_ids, counts
        return s


def chunk_rng(seed: int, chunk: Chunk) -> np.random.Generator:
    return np.random.default_rng([seed, chunk.file_index, chunk.index])


def tokenize_chunk(chunk: Chunk, tokenizer):
    """Decodes and tokenizes a chunk in one batch.

    Returns (lines, sentences, line_stats): `lines` are the cleaned lines ('' between
    documents), `sentences` the id arrays of the non-empty ones, in order.
    """
    line_stats = LineStats()
    lines = clean_lines(chunk, line_stats)
    text = [line for line in lines if line]
    flat, splits = tokenizer.tokenize(text)
    sentences = np.split(flat, splits[1:-1]) if text else []
    return lines, sentences, line_stats


def pack_chunk(chunk: Chunk, lines, sentences, special_ids, max_seq_length: int,
               seed: int) -> Tuple[PackedExamples, int]:
    """Packs the chunk's documents; returns (examples, number of documents)."""
    packer = Packer(max_seq_length, special_ids["[CLS]"], special_ids["[SEP]"],
                    chunk_rng(seed, chunk))
    documents, doc, k = 0, [], 0
    for line in lines:
        if line:
            doc.append(sentences[k])
            k += 1
        elif doc:
            packer.add_document(doc)
            documents, doc = documents + 1, []
    if doc:
        packer.add_document(doc)
        documents += 1
    return packer.take_examples(), documents


def encode_chunk(chunk: Chunk, tokenizer, max_seq_length: int,
                 seed: int) -> Tuple[PackedExamples, ChunkStats]:
    """Tokenizes a chunk and packs its documents into examples."""
    lines, sentences, line_stats = tokenize_chunk(chunk, tokenizer)
    packed, documents = pack_chunk(chunk, lines, sentences, tokenizer.special_ids,
                                   max_seq_length, seed)
    flat = np.concatenate(sentences) if sentences else np.zeros([0], np.int32)
    ids, counts = np.unique(flat, return_counts=True)
    stats = ChunkStats(
        examples=len(packed.lengths), lines=line_stats.lines, documents=documents,
        corpus_tokens=int(len(flat)), example_tokens=int(packed.content_tokens),
        skipped=dict(line_stats.skipped), skip_examples=list(line_stats.examples_of_skips),
        count_ids=ids.astype(np.int64), counts=counts.astype(np.int64))
    return packed, stats


def _varint_sizes(x: np.ndarray) -> np.ndarray:
    """Bytes of each (unsigned) value as a protobuf varint."""
    sizes = np.ones(x.shape, np.uint8)
    for k in range(1, (int(x.max(initial=0)).bit_length() + 6) // 7):
        sizes += x >= (1 << 7 * k)
    return sizes


def _varints(x: np.ndarray):
    """Rows of (unsigned) values [n, k] as protobuf varints: their bytes [n, k * w], each
    varint padded to the widest w, and which of those bytes to keep (None: all)."""
    sizes = _varint_sizes(x)
    width = int(sizes.max(initial=1))
    if width == 1:
        return x.astype(np.uint8), None
    digits = np.empty(x.shape + (width,), np.uint8)
    for k in range(width):  # 7 bits a byte, low first; the top bit says another follows
        digits[..., k] = ((x >> 7 * k) & 0x7F) | ((sizes > k + 1).view(np.uint8) << 7)
    keep = np.take(np.arange(width + 1)[:, None] > np.arange(width), sizes, axis=0)
    return digits.reshape(len(x), -1), keep.reshape(len(x), -1)


def serialize_examples(packed: PackedExamples) -> List[bytes]:
    """Examples as serialized tf.train.Example protos with three int64 features: the
    bytes of `SerializeToString(deterministic=True)`, written with numpy. Every byte of
    such a record is part of a varint (tags, key characters and lengths below 128 are
    one-byte varints), so a record is a row of values, each encoded as a varint."""
    n = len(packed.lengths)
    if not n:
        return []
    arrays = [getattr(packed, name) for name in sorted(FEATURES)]  # map entries in key order
    # uint32 where it holds every value; a negative int64 is a 10-byte varint, as in protobuf
    dtype = np.uint32 if all(0 <= a.min() and a.max() < 1 << 32 for a in arrays) else np.uint64
    column = lambda v: np.full([n, 1], v, dtype)
    parts, features = [], 0
    for name, array in zip(sorted(FEATURES), arrays):
        values = array.astype(dtype) if dtype == np.uint32 else array.astype(np.int64).view(dtype)
        payload = _varint_sizes(values).sum(1, keepdims=True, dtype=dtype)  # Int64List.value
        int64_list = 1 + _varint_sizes(payload) + payload               # Feature.int64_list
        feature = 1 + _varint_sizes(int64_list) + int64_list            # the map entry's value
        entry = 3 + len(name) + _varint_sizes(feature) + feature        # the map entry
        features = features + 1 + _varint_sizes(entry) + entry          # Example.features
        parts += [[column(0x0A), entry, column(0x0A), column(len(name))] +
                  [column(c) for c in name.encode()] +
                  [column(0x12), feature, column(0x1A), int64_list, column(0x0A), payload],
                  [values]]
    parts[0] = [column(0x0A), features] + parts[0]
    encoded = [_varints(np.concatenate(part, axis=1)) for part in parts]
    digits = np.concatenate([d for d, _ in encoded], axis=1)
    if all(keep is None for _, keep in encoded):
        data = digits.tobytes()
    else:
        data = digits[np.concatenate([np.ones(d.shape, bool) if keep is None else keep
                                      for d, keep in encoded], axis=1)].tobytes()
    ends = np.cumsum(1 + _varint_sizes(features) + features).tolist()
    return [data[a:b] for a, b in zip([0] + ends[:-1], ends)]


def write_records(path: str, records: Iterable[bytes]):
    """A TFRecord file of `records` (uncompressed), byte for byte tf.io.TFRecordWriter's."""
    with fileio.open_file(path, "wb") as f:
        f.write(b"".join(frame_record(r) for r in records))


def merge_stats(total: ChunkStats, part: ChunkStats, vocab_counts: np.ndarray):
    """Adds `part` into `total` in place; unigram counts go into `vocab_counts`."""
    total.examples += part.examples
    total.lines += part.lines
    total.documents += part.documents
    total.corpus_tokens += part.corpus_tokens
    total.example_tokens += part.example_tokens
    for reason, n in part.skipped.items():
        total.skipped[reason] = total.skipped.get(reason, 0) + n
    room = MAX_SKIP_EXAMPLES - len(total.skip_examples)
    if room > 0:
        total.skip_examples.extend(part.skip_examples[:room])
    np.add.at(vocab_counts, part.count_ids, part.counts)
