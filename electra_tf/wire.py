"""TensorFlow's on-disk encodings without TensorFlow or a protobuf library: protobuf's wire
format (varints, a message's fields) and the masked CRC-32C that TFRecord files and
checkpoints carry. What the TensorFlow-free readers and writers need (`data/records.py`:
TFRecords and Examples; `bundle.py`: checkpoints; `events.py`: TensorBoard), no more."""

import struct
from typing import Iterator, List, Tuple

try:  # the C implementation (google-crc32c: a dependency of Google's cloud clients)
    from google_crc32c import value as _crc32c_c
except ImportError:  # pragma: no cover - taken where the package is missing
    _crc32c_c = None

_MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF


def _crc32c_table() -> List[int]:
    """CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), a byte at a time."""
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C of `data` (the C implementation where installed, else Python's loop:
    about 5 MB/s, enough for tests and the odd file, not for a run's input)."""
    if _crc32c_c is not None:
        return _crc32c_c(bytes(data))
    crc = _U32
    for byte in bytes(data):
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ _U32


def masked_crc32c(data: bytes) -> int:
    """The masked checksum TFRecords and checkpoints store: the CRC rotated right by 15
    bits plus a constant, so that a checksum of data holding checksums is not degenerate."""
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & _U32) + _MASK_DELTA) & _U32


def varint(buf: bytes, i: int) -> Tuple[int, int]:
    """The unsigned varint at buf[i] -> (value, the index after it)."""
    value, shift = 0, 0
    while True:
        if i >= len(buf):
            raise ValueError("a varint runs past the end")
        byte = buf[i]
        value |= (byte & 0x7F) << shift
        i += 1
        if byte < 0x80:
            return value, i
        shift += 7
        if shift > 63:
            raise ValueError("a varint longer than 10 bytes")


def fields(buf: bytes, start: int = 0, end: int = None) -> Iterator[Tuple[int, int, int, int]]:
    """(field number, wire type, value start, value end) of the message in buf[start:end];
    a length-delimited value's span excludes its length."""
    end = len(buf) if end is None else end
    i = start
    while i < end:
        key, i = varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            after = varint(buf, i)[1]
        elif wire == 1:
            after = i + 8
        elif wire == 2:
            n, i = varint(buf, i)
            after = i + n
        elif wire == 5:
            after = i + 4
        else:
            raise ValueError(f"wire type {wire} at byte {i} is not one these messages hold")
        if after > end:
            raise ValueError("a field runs past its message")
        yield number, wire, i, after
        i = after


def varint_field(buf: bytes, start: int, end: int) -> int:
    """A varint field's value (a span `fields` gave for wire type 0)."""
    return varint(buf, start)[0]


# --------------------------------------------------------------------------- writing
# A message is its fields' encodings concatenated; proto3 leaves out fields at their
# default (0, "", an absent message), and TensorFlow's C++ writes fields in number order.


def encode_varint(value: int) -> bytes:
    """An unsigned varint; a negative int64 as its two's complement (10 bytes)."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_key(number: int, wire_type: int) -> bytes:
    return encode_varint(number << 3 | wire_type)


def encode_varint_field(number: int, value: int) -> bytes:
    """An integer, enum or bool field (wire type 0)."""
    return encode_key(number, 0) + encode_varint(int(value))


def encode_bytes_field(number: int, data) -> bytes:
    """A string (UTF-8), bytes or embedded message field (wire type 2)."""
    data = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    return encode_key(number, 2) + encode_varint(len(data)) + data


def encode_double_field(number: int, value: float) -> bytes:
    return encode_key(number, 1) + struct.pack("<d", value)


def encode_float_field(number: int, value: float) -> bytes:
    return encode_key(number, 5) + struct.pack("<f", value)


def frame_record(data: bytes) -> bytes:
    """One record as a TFRecord file holds it (what TensorFlow's writer writes): the length
    (uint64), its masked CRC-32C, the data, the data's masked CRC-32C, little-endian."""
    length = struct.pack("<Q", len(data))
    return (length + struct.pack("<I", masked_crc32c(length)) + data +
            struct.pack("<I", masked_crc32c(data)))
