"""TensorFlow's checkpoint files (a "tensor bundle") read without TensorFlow.

A checkpoint `P` is `P.index`, a sorted table (LevelDB's block format, uncompressed) from
each tensor's name to a `BundleEntryProto` (dtype, shape, data shard, offset, size,
checksum), the empty name holding the `BundleHeaderProto` (the number of data shards);
and the shards `P.data-0000i-of-0000n`, each tensor's bytes little-endian at its offset
(a string tensor: its elements' lengths as varints, their masked CRC-32C, the bytes).
Every tensor's entry carries the masked CRC-32C of its bytes (a string tensor's: of its
lengths as uint32s, their checksum and the strings).
`index_entries` parses the index (`training/checkpoints.py` checks a checkpoint with it),
`read_tensors` reads the arrays, checksums checked. tests/test_bundle.py holds both to
`tf.train.load_checkpoint`."""

import dataclasses
import struct
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from electra_tf import wire

_TABLE_MAGIC = 0xdb4775248b80fb57  # the last 8 bytes of every checkpoint index
_FOOTER_BYTES = 48
# TensorFlow's DataType enum -> NumPy, for the types a checkpoint of ours holds
# (bfloat16: read as its 16 bits, widened to float32 by `_bfloat16`).
DTYPES = {1: np.float32, 2: np.float64, 3: np.int32, 4: np.uint8, 5: np.int16, 6: np.int8,
          9: np.int64, 10: np.bool_, 14: "bfloat16", 17: np.uint16, 19: np.float16,
          22: np.uint32, 23: np.uint64}
DT_STRING = 7


@dataclasses.dataclass(frozen=True)
class Entry:
    """Where a tensor is: its dtype (TensorFlow's enum), shape, data shard, byte offset and
    size, and the masked CRC-32C of its bytes."""
    dtype: int
    shape: Tuple[int, ...]
    shard: int
    offset: int
    size: int
    crc32c: int
    sliced: bool = False  # saved in slices (a partitioned variable): not read here


def _table_block(data: bytes, handle: bytes) -> List[tuple]:
    """The (key, value) entries of the table block `handle` (offset, size varints) points
    to: keys prefix-compressed against the previous one, a restart array at the end."""
    offset, i = wire.varint(handle, 0)
    size, _ = wire.varint(handle, i)
    if offset + size + 5 > len(data):
        raise ValueError(f"a block at byte {offset} runs past the end of the file")
    if data[offset + size] != 0:  # the trailer's compression type
        raise ValueError("compressed index blocks are not supported")
    block = data[offset:offset + size]
    restarts = struct.unpack("<I", block[-4:])[0]
    end = len(block) - 4 - 4 * restarts
    if end < 0:
        raise ValueError("a block's restart array is larger than the block")
    entries, key, i = [], b"", 0
    while i < end:
        shared, i = wire.varint(block, i)
        unshared, i = wire.varint(block, i)
        length, i = wire.varint(block, i)
        key = key[:shared] + block[i:i + unshared]
        i += unshared
        entries.append((key, block[i:i + length]))
        i += length
    return entries


def _entry(value: bytes) -> Entry:
    dtype = shard = offset = size = crc = 0
    sliced = False
    shape: List[int] = []
    for number, kind, s, e in wire.fields(value):
        if number == 1 and kind == 0:
            dtype = wire.varint_field(value, s, e)
        elif number == 2 and kind == 2:  # TensorShapeProto: dim (2) {size (1)}
            for n2, k2, ds, de in wire.fields(value, s, e):
                if n2 == 2 and k2 == 2:
                    dim = 0
                    for n3, k3, vs, ve in wire.fields(value, ds, de):
                        if n3 == 1 and k3 == 0:
                            dim = wire.varint_field(value, vs, ve)
                    shape.append(dim)
        elif number == 3 and kind == 0:
            shard = wire.varint_field(value, s, e)
        elif number == 4 and kind == 0:
            offset = wire.varint_field(value, s, e)
        elif number == 5 and kind == 0:
            size = wire.varint_field(value, s, e)
        elif number == 6 and kind == 5:
            crc = struct.unpack("<I", value[s:e])[0]
        elif number == 7:
            sliced = True
    return Entry(dtype, tuple(shape), shard, offset, size, crc, sliced)


def index_entries(data: bytes) -> Tuple[int, Dict[str, Entry]]:
    """-> (number of data shards, {tensor name: Entry}) from the bytes of a checkpoint's
    `.index` file; a ValueError for anything but a complete index."""
    if len(data) < _FOOTER_BYTES or struct.unpack("<Q", data[-8:])[0] != _TABLE_MAGIC:
        raise ValueError("no table footer at its end")
    footer = data[-_FOOTER_BYTES:]
    _, i = wire.varint(footer, 0)  # the meta-index block's handle: unused
    _, i = wire.varint(footer, i)
    num_shards, tensors = None, {}
    for _, handle in _table_block(data, footer[i:]):
        for key, value in _table_block(data, handle):
            if key == b"":
                num_shards = 0
                for number, kind, s, e in wire.fields(value):
                    if number == 1 and kind == 0:
                        num_shards = wire.varint_field(value, s, e)
                    elif number == 2 and kind == 0 and wire.varint_field(value, s, e):
                        raise ValueError("a big-endian checkpoint: not supported")
                continue
            tensors[key.decode("utf-8", "replace")] = _entry(value)
    if num_shards is None:
        raise ValueError("the checkpoint index has no header")
    return num_shards, tensors


def _bfloat16(raw: np.ndarray) -> np.ndarray:
    return (raw.astype(np.uint32) << np.uint32(16)).view(np.float32)


def _strings(raw: bytes, count: int) -> Tuple[np.ndarray, bytes]:
    """A string tensor's elements, and the bytes its checksum covers: each length as a
    uint32 (not the varint stored), the lengths' own checksum, the strings."""
    lengths, i = [], 0
    for _ in range(count):
        n, i = wire.varint(raw, i)
        lengths.append(n)
    covered = b"".join(struct.pack("<I", n) for n in lengths) + raw[i:i + 4]
    i += 4
    out = []
    for n in lengths:
        out.append(bytes(raw[i:i + n]))
        i += n
    return np.array(out + [None], dtype=object)[:-1], covered + b"".join(out)


def read_tensors(prefix: str, read_bytes: Callable[[str], bytes],
                 names: Optional[Sequence[str]] = None,
                 verify: bool = True) -> Dict[str, np.ndarray]:
    """The tensors of checkpoint `prefix` (all, or `names`) as arrays; `read_bytes(path)`:
    a file's bytes (the file layer's, so any filesystem). String tensors come back as
    object arrays of bytes; bfloat16 ones widened to float32. A ValueError naming the
    tensor where a checksum does not match (with `verify`) or its bytes are missing."""
    num_shards, entries = index_entries(read_bytes(prefix + ".index"))
    wanted = list(entries) if names is None else list(names)
    shards: Dict[int, bytes] = {}
    out = {}
    for name in wanted:
        if name not in entries:
            raise KeyError(f"{prefix}: no tensor {name!r}")
        e = entries[name]
        if e.sliced:
            raise ValueError(f"{prefix}: tensor {name!r} is saved in slices (a partitioned "
                             "variable): read it with TensorFlow")
        if e.shard not in shards:
            shards[e.shard] = read_bytes(f"{prefix}.data-{e.shard:05d}-of-{num_shards:05d}")
        raw = shards[e.shard][e.offset:e.offset + e.size]
        if len(raw) < e.size:
            raise ValueError(f"{prefix}: tensor {name!r}: its data shard ends before its "
                             f"{e.size} bytes")
        count = int(np.prod(e.shape)) if e.shape else 1
        covered = raw
        if e.dtype == DT_STRING:
            strings, covered = _strings(raw, count)
        if verify and wire.masked_crc32c(covered) != e.crc32c:
            raise ValueError(f"{prefix}: tensor {name!r}: checksum mismatch (damaged data)")
        if e.dtype == DT_STRING:
            out[name] = strings.reshape(e.shape)
            continue
        dtype = DTYPES.get(e.dtype)
        if dtype is None:
            raise ValueError(f"{prefix}: tensor {name!r} has TensorFlow dtype {e.dtype}, "
                             "not one this reader knows")
        if dtype == "bfloat16":
            out[name] = _bfloat16(np.frombuffer(raw, "<u2")).reshape(e.shape)
        else:
            out[name] = np.frombuffer(raw, np.dtype(dtype).newbyteorder("<")).reshape(
                e.shape).copy()
    return out
