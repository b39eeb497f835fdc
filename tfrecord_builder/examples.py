"""One chunk of raw text -> packed examples -> serialized tf.train.Example records.

This is the unit of work shared by the local multiprocess build and the Beam pipeline:
its output depends only on the chunk, the tokenizer, the sequence length and the seed.
"""

import dataclasses
from typing import Dict, List, Tuple

import numpy as np

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


def serialize_examples(packed: PackedExamples) -> List[bytes]:
    """Examples as serialized tf.train.Example protos with three int64 features."""
    from tensorflow.core.example import example_pb2, feature_pb2
    Feature, Int64List = feature_pb2.Feature, feature_pb2.Int64List
    out = []
    for row in zip(packed.input_ids.tolist(), packed.input_mask.tolist(),
                   packed.segment_ids.tolist()):
        example = example_pb2.Example(features=feature_pb2.Features(feature={
            name: Feature(int64_list=Int64List(value=values))
            for name, values in zip(FEATURES, row)}))
        out.append(example.SerializeToString(deterministic=True))
    return out


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
