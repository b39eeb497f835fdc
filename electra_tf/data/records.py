"""TFRecord files and the pre-training Example schema without TensorFlow.

The framing of a TFRecord file, record after record: the data's length (uint64, little
endian), the masked CRC-32C of those 8 bytes (uint32), the data, the masked CRC-32C of the
data (uint32). `read_records` checks both checksums and names the file, the record and its
byte offset where a file is truncated or corrupted; `frame` writes the same bytes
TensorFlow's writer does.

`parse_examples` turns a batch of serialised `tf.train.Example`s whose features are int64
lists (the builder's `input_ids`, `input_mask`, `segment_ids`) into int32 arrays of one
length, in NumPy: the Example's few headers walked in Python, every value decoded in one
vectorised pass. Packed and unpacked int64 lists are both read, the features in any order.

Nothing here imports TensorFlow: this is what a runtime without it reads the builder's
shards with. tests/test_records.py holds it to TensorFlow's writer, reader and
`tf.io.parse_example`."""

import struct
from typing import BinaryIO, Dict, Iterable, Iterator, List, Sequence, Tuple

import numpy as np

from electra_tf import wire
from electra_tf.wire import crc32c, masked_crc32c  # noqa: F401 (re-exported)

FEATURE_NAMES = ("input_ids", "input_mask", "segment_ids")
_HEADER = struct.Struct("<QI")  # length, masked CRC of the length


class RecordError(ValueError):
    """A file that is not whole, intact TFRecords, or an Example outside the schema asked
    for: one line naming the file, the record and its byte offset."""


# --------------------------------------------------------------------------- framing


frame = wire.frame_record  # one record as a TFRecord file holds it


def write_records(stream: BinaryIO, records: Iterable[bytes]) -> int:
    """Writes `records` framed to a binary stream -> the bytes written."""
    written = 0
    for data in records:
        framed = frame(data)
        stream.write(framed)
        written += len(framed)
    return written


def read_records(stream: BinaryIO, name: str, verify: bool = True) -> Iterator[bytes]:
    """The records of a TFRecord file, in order; a RecordError naming `name`, the record
    and its offset where the file ends inside a record or a checksum does not match (with
    `verify`; without, only the framing is checked)."""
    offset, index = 0, 0
    while True:
        header = stream.read(_HEADER.size)
        if not header:
            return
        where = f"{name}: record {index} at byte {offset}"
        if len(header) < _HEADER.size:
            raise RecordError(f"{where}: truncated (the file ends inside the record's "
                              f"length, {len(header)} of {_HEADER.size} bytes)")
        length, length_crc = _HEADER.unpack(header)
        if verify and masked_crc32c(header[:8]) != length_crc:
            raise RecordError(f"{where}: corrupted (the length's checksum does not match): "
                              "not a TFRecord file, or damaged")
        body = stream.read(length + 4)
        if len(body) < length + 4:
            raise RecordError(f"{where}: truncated (the file ends inside a record of "
                              f"{length} bytes)")
        data = body[:length]
        if verify and masked_crc32c(data) != struct.unpack("<I", body[length:])[0]:
            raise RecordError(f"{where}: corrupted (the data's checksum does not match)")
        yield data
        offset += _HEADER.size + length + 4
        index += 1


# --------------------------------------------------------------------------- Examples


def _int64_spans(buf: bytes, base: int, wanted: Sequence[str]) -> Dict[str, List[Tuple]]:
    """For one Example in `buf`: {feature name: [(start, end)]}, the byte spans of its
    int64 values (a packed run of varints, or one unpacked varint), offsets plus `base`."""
    out: Dict[str, List[Tuple]] = {}
    for number, kind, fs, fe in wire.fields(buf, 0, len(buf)):
        if number != 1 or kind != 2:  # Example.features
            continue
        for n2, w2, es, ee in wire.fields(buf, fs, fe):
            if n2 != 1 or w2 != 2:  # Features.feature: a map entry
                continue
            key, value = None, None
            for n3, w3, s, e in wire.fields(buf, es, ee):
                if n3 == 1 and w3 == 2:
                    key = bytes(buf[s:e]).decode("utf-8", "replace")
                elif n3 == 2 and w3 == 2:
                    value = (s, e)
            if key not in wanted or value is None:
                continue
            spans = []
            for n4, w4, s, e in wire.fields(buf, *value):
                if n4 != 3 or w4 != 2:  # Feature.int64_list
                    other = {1: "bytes_list", 2: "float_list"}.get(n4, f"field {n4}")
                    raise ValueError(f"feature {key!r} is a {other}, not an int64 list")
                for n5, w5, vs, ve in wire.fields(buf, s, e):
                    if n5 == 1 and w5 in (0, 2) and ve > vs:  # Int64List.value
                        spans.append((base + vs, base + ve))
            out[key] = spans  # a repeated map key: the last wins, as in protobuf
    return out


def int64_list_lengths(record: bytes) -> Dict[str, int]:
    """{feature name: number of int64 values} of one serialised Example (0 for a bytes or
    float feature; a ValueError or IndexError for bytes that are not an Example)."""
    buf = bytes(record)
    found = {}
    for number, kind, fs, fe in wire.fields(buf, 0, len(buf)):
        if number != 1 or kind != 2:
            continue
        for n2, w2, es, ee in wire.fields(buf, fs, fe):
            if n2 == 1 and w2 == 2:
                for n3, w3, s, e in wire.fields(buf, es, ee):
                    if n3 == 1 and w3 == 2:
                        found[bytes(buf[s:e]).decode("utf-8", "replace")] = None
    out = {}
    for name in found:
        try:
            spans = _int64_spans(buf, 0, [name]).get(name, [])
        except ValueError:  # not an int64 list
            spans = []
        data = np.frombuffer(b"".join(buf[s:e] for s, e in spans), np.uint8)
        out[name] = int(np.count_nonzero(data < 0x80))
    return out


def _decode_varints(data: np.ndarray) -> np.ndarray:
    """Consecutive unsigned varints in uint8 `data` -> their int64 values (two's
    complement for the 10-byte encodings of negative numbers)."""
    if data.size == 0:
        return np.zeros([0], np.int64)
    last = data < 0x80
    if not last[-1]:
        raise ValueError("an int64 list ends inside a varint")
    ends = np.flatnonzero(last)
    starts = np.concatenate([[0], ends[:-1] + 1])
    position = np.arange(data.size) - np.repeat(starts, ends - starts + 1)
    if position.max() > 9:
        raise ValueError("a varint longer than 10 bytes")
    parts = (data & 0x7F).astype(np.uint64) << (7 * position).astype(np.uint64)
    return np.add.reduceat(parts, starts).view(np.int64)


def parse_examples(records: Sequence[bytes], length: int,
                   names: Sequence[str] = FEATURE_NAMES,
                   where: str = "examples") -> Dict[str, np.ndarray]:
    """Serialised Examples -> {name: int32 [len(records), length]}, each feature an int64
    list of exactly `length` values; a RecordError naming `where` and the record otherwise."""
    if not records:
        return {name: np.zeros([0, length], np.int32) for name in names}
    buf = b"".join(records)
    array = np.frombuffer(buf, np.uint8)
    spans = {name: [] for name in names}
    base = 0
    for index, record in enumerate(records):
        try:
            found = _int64_spans(record, base, names)
        except (ValueError, IndexError) as e:
            raise RecordError(f"{where}: record {index} is not a readable Example "
                              f"({e})") from None
        for name in names:
            if name not in found:
                raise RecordError(f"{where}: record {index} has no int64 feature {name!r}")
            spans[name].append(found[name])
        base += len(record)
    out = {}
    for name in names:
        for index, per_record in enumerate(spans[name]):
            if not per_record:
                raise RecordError(f"{where}: record {index} has 0 values of {name!r}, "
                                  f"expected {length} (max_seq_length)")
        flat = [span for per_record in spans[name] for span in per_record]
        data = np.concatenate([array[s:e] for s, e in flat])
        span_ends = np.cumsum([e - s for s, e in flat]) - 1  # spans are never empty
        if np.any(data[span_ends] >= 0x80):  # a packed run cut inside a varint
            raise RecordError(f"{where}: {name!r}: an int64 list ends inside a varint")
        try:
            values = _decode_varints(data)
        except ValueError as e:
            raise RecordError(f"{where}: {name!r}: {e}") from None
        # values per record: the varints of its spans (a packed span holds several)
        span_starts = np.cumsum([0] + [e - s for s, e in flat[:-1]])
        per_span = np.add.reduceat((data < 0x80).astype(np.int64), span_starts)
        record_starts = np.cumsum([0] + [len(p) for p in spans[name][:-1]])
        sizes = np.add.reduceat(per_span, record_starts)
        bad = np.flatnonzero(sizes != length)
        if bad.size:
            i = int(bad[0])
            raise RecordError(f"{where}: record {i} has {int(sizes[i])} values of {name!r}, "
                              f"expected {length} (max_seq_length)")
        if np.any((values < -2 ** 31) | (values >= 2 ** 31)):
            raise RecordError(f"{where}: {name!r} holds a value outside int32")
        out[name] = values.astype(np.int32).reshape(len(records), length)
    return out
