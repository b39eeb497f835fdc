"""TensorFlow's checkpoint files (a "tensor bundle") read and written without TensorFlow.

A checkpoint `P` is `P.index`, a sorted table (LevelDB's block format, uncompressed) from
each tensor's name to a `BundleEntryProto` (dtype, shape, data shard, offset, size,
checksum), the empty name holding the `BundleHeaderProto` (the number of data shards);
and the shards `P.data-0000i-of-0000n`, each tensor's bytes little-endian at its offset
(a string tensor: its elements' lengths as varints, their masked CRC-32C, the bytes).
Every tensor's entry carries the masked CRC-32C of its bytes (a string tensor's: of its
lengths as uint32s, their checksum and the strings).
`index_entries` parses the index (`training/checkpoints.py` checks a checkpoint with it),
`read_tensors` reads the arrays, checksums checked, `Reader` is TensorFlow's checkpoint
reader's interface over them; `write_tensors` writes a checkpoint byte for byte as
TensorFlow's SaveV2 does. tests/test_bundle.py and tests/test_bundle_writer.py hold them
to TensorFlow's reader and writer."""

import dataclasses
import struct
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

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
    return _read(prefix, num_shards, entries, read_bytes, {}, names, verify)


def _read(prefix: str, num_shards: int, entries: Dict[str, Entry],
          read_bytes: Callable[[str], bytes], shards: Dict[int, bytes],
          names: Optional[Sequence[str]], verify: bool) -> Dict[str, np.ndarray]:
    """`read_tensors` of a parsed index; `shards` caches the data shards read."""
    wanted = list(entries) if names is None else list(names)
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


class Reader:
    """TensorFlow's checkpoint reader's interface (`get_tensor`, `has_tensor`,
    `get_variable_to_shape_map`, `get_variable_to_dtype_map`) over `read_tensors`: the
    index read once, a tensor's shard when asked for. A scalar string comes back as
    bytes, as TensorFlow's reader gives it."""

    def __init__(self, prefix: str, read_bytes: Callable[[str], bytes]):
        self.prefix, self._read_bytes = prefix, read_bytes
        self._num_shards, self._entries = index_entries(read_bytes(prefix + ".index"))
        self._shards: Dict[int, bytes] = {}

    def has_tensor(self, name: str) -> bool:
        return name in self._entries

    def get_tensors(self, names: Sequence[str]) -> Dict[str, np.ndarray]:
        """{name: array} of `names`, as `read_tensors` gives them."""
        return _read(self.prefix, self._num_shards, self._entries, self._read_bytes,
                     self._shards, names, True)

    def get_tensor(self, name: str):
        value = self.get_tensors([name])[name]
        return value.item() if value.dtype == object and value.shape == () else value

    def get_variable_to_shape_map(self) -> Dict[str, List[int]]:
        return {n: list(e.shape) for n, e in self._entries.items()}

    def get_variable_to_dtype_map(self) -> Dict[str, np.dtype]:
        return {n: np.dtype(object) if e.dtype == DT_STRING else np.dtype(
            np.float32 if DTYPES.get(e.dtype) == "bfloat16" else DTYPES.get(e.dtype, np.void))
            for n, e in self._entries.items()}


# --- writing ------------------------------------------------------------------------
# What TensorFlow's BundleWriter writes (SaveV2 with one shard): the tensors' bytes in the
# order given, then the index: a table of 256 KiB data blocks (a restart point every 16
# keys), an empty meta-index block, an index block (a restart at every key) of each data
# block's last key shortened to a separator, and the footer.

_BLOCK_BYTES = 262144
_RESTART_INTERVAL = 16
_DTYPE_ENUMS = {np.dtype(t): n for n, t in DTYPES.items() if t != "bfloat16"}


def _int_field(number: int, value: int) -> bytes:
    """A varint field as proto3 writes it: nothing for 0."""
    return wire.encode_varint_field(number, value) if value else b""


_HEADER = _int_field(1, 1) + wire.encode_bytes_field(3, _int_field(1, 1))  # 1 shard, v1


class _Block:
    """A table block being built: keys prefix-compressed against the one before, a full
    key (a restart point) every `interval` keys."""

    def __init__(self, interval: int):
        self.interval, self.buf, self.restarts = interval, bytearray(), [0]
        self.count, self.last, self.entries = 0, b"", 0

    def add(self, key: bytes, value: bytes):
        shared = 0
        if self.count < self.interval:
            limit = min(len(key), len(self.last))
            while shared < limit and key[shared] == self.last[shared]:
                shared += 1
        else:
            self.restarts.append(len(self.buf))
            self.count = 0
        self.buf += (wire.encode_varint(shared) + wire.encode_varint(len(key) - shared)
                     + wire.encode_varint(len(value)) + key[shared:] + value)
        self.last, self.count, self.entries = key, self.count + 1, self.entries + 1

    def size(self) -> int:
        return len(self.buf) + 4 * len(self.restarts) + 4

    def finish(self) -> bytes:
        return bytes(self.buf) + struct.pack(f"<{len(self.restarts) + 1}I", *self.restarts,
                                             len(self.restarts))


def _separator(start: bytes, limit: bytes) -> bytes:
    """A short key >= `start` and < `limit`: `start` cut after its first differing byte,
    that byte raised by one, where that stays below `limit`."""
    i = 0
    while i < min(len(start), len(limit)) and start[i] == limit[i]:
        i += 1
    if i < min(len(start), len(limit)) and start[i] < 0xFF and start[i] + 1 < limit[i]:
        return start[:i] + bytes([start[i] + 1])
    return start


def _successor(key: bytes) -> bytes:
    """A short key >= `key`: cut after its first byte below 0xff, that byte raised by one."""
    for i, byte in enumerate(key):
        if byte != 0xFF:
            return key[:i] + bytes([byte + 1])
    return key


def table(items: Iterable[Tuple[bytes, bytes]]) -> bytes:
    """The table file of (key, value) items in increasing key order."""
    out = bytearray()

    def write_block(block: _Block) -> bytes:
        raw = block.finish()
        handle = wire.encode_varint(len(out)) + wire.encode_varint(len(raw))
        out.extend(raw + b"\0" + struct.pack("<I", wire.masked_crc32c(raw + b"\0")))
        return handle

    data, index, pending, last = _Block(_RESTART_INTERVAL), _Block(1), None, None
    for key, value in items:
        if last is not None and key <= last:
            raise ValueError(f"table keys out of order: {key!r} after {last!r}")
        if pending is not None:
            index.add(_separator(last, key), pending)
            pending = None
        data.add(key, value)
        last = key
        if data.size() >= _BLOCK_BYTES:
            pending, data = write_block(data), _Block(_RESTART_INTERVAL)
    if data.entries:
        pending = write_block(data)
    meta = write_block(_Block(_RESTART_INTERVAL))
    if pending is not None:
        index.add(_successor(last), pending)
    footer = meta + write_block(index)
    return bytes(out) + footer.ljust(_FOOTER_BYTES - 8, b"\0") + struct.pack("<Q", _TABLE_MAGIC)


def _dtype_enum(array: np.ndarray) -> int:
    if array.dtype.kind in "SUO":
        return DT_STRING
    if array.dtype.name == "bfloat16":
        return 14
    enum = _DTYPE_ENUMS.get(array.dtype.newbyteorder("="))
    if enum is None:
        raise ValueError(f"dtype {array.dtype} has no TensorFlow checkpoint type here")
    return enum


def _tensor_bytes(array: np.ndarray, dtype: int) -> Tuple[List[bytes], int]:
    """(the bytes a tensor takes in a data shard, the masked CRC-32C its entry records)."""
    if dtype != DT_STRING:
        raw = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"),
                                                 copy=False).tobytes()
        return [raw], wire.masked_crc32c(raw)
    strings = [s.encode("utf-8") if isinstance(s, str) else bytes(s) for s in array.ravel()]
    lengths = b"".join(wire.encode_varint(len(s)) for s in strings)
    as_u32 = b"".join(struct.pack("<I", len(s)) for s in strings)
    checksum = struct.pack("<I", wire.masked_crc32c(as_u32))
    return ([lengths, checksum] + strings,
            wire.masked_crc32c(as_u32 + checksum + b"".join(strings)))


def _entry_bytes(dtype: int, shape: Sequence[int], offset: int, size: int, crc: int) -> bytes:
    dims = b"".join(wire.encode_bytes_field(2, _int_field(1, d)) for d in shape)
    return (_int_field(1, dtype) + wire.encode_bytes_field(2, dims) + _int_field(4, offset)
            + _int_field(5, size) + (wire.encode_key(6, 5) + struct.pack("<I", crc)
                                     if crc else b""))


def write_tensors(prefix: str, arrays: Dict[str, object],
                  write_file: Callable[[str, Iterator[bytes]], None]):
    """Writes {name: array} as the checkpoint `prefix` (one data shard, the tensors in the
    dict's order, as SaveV2 writes the names it is given): `write_file(path, chunks)`
    writes a file's bytes (the file layer's, so any filesystem); the data shard first, the
    index, which makes the checkpoint, last. Strings (str or bytes, any shape) are string
    tensors; bfloat16 (ml_dtypes) keeps its 16 bits."""
    entries: Dict[bytes, bytes] = {}

    def chunks() -> Iterator[bytes]:
        offset = 0
        for name, value in arrays.items():
            array = np.asarray(value)
            dtype = _dtype_enum(array)
            parts, crc = _tensor_bytes(array, dtype)
            size = sum(len(p) for p in parts)
            key = name.encode("utf-8")
            if not key or key in entries:
                raise ValueError(f"{prefix}: tensor name {name!r} is empty or repeated")
            entries[key] = _entry_bytes(dtype, array.shape, offset, size, crc)
            offset += size
            yield from parts

    write_file(f"{prefix}.data-00000-of-00001", chunks())
    write_file(prefix + ".index", iter([table([(b"", _HEADER)] + sorted(entries.items()))]))
