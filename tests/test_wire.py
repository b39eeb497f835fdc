"""electra_tf.wire: protobuf's wire format and the masked CRC-32C, against the protobuf
library's own encoding of a message and the CRC's published check value."""

import pytest
from google.protobuf import descriptor_pb2

from electra_tf import wire


def test_varints_decode_with_the_index_after_them():
    assert wire.varint(b"\x00", 0) == (0, 1)
    assert wire.varint(b"\xac\x02", 0) == (300, 2)
    assert wire.varint(b"xx\xff\xff\xff\xff\x0f", 2) == (2 ** 32 - 1, 7)
    minus_one = b"\xff" * 9 + b"\x01"  # int64 -1: ten bytes
    assert wire.varint(minus_one, 0) == (2 ** 64 - 1, 10)
    with pytest.raises(ValueError, match="runs past the end"):
        wire.varint(b"\x80\x80", 0)
    with pytest.raises(ValueError, match="longer than 10 bytes"):
        wire.varint(b"\xff" * 11, 0)


def test_fields_of_a_message_the_protobuf_library_wrote():
    message = descriptor_pb2.FieldDescriptorProto(name="input_ids", number=300,
                                                  json_name="x" * 200)
    buf = message.SerializeToString()
    found = {n: (kind, buf[s:e]) for n, kind, s, e in wire.fields(buf)}
    assert found[1] == (2, b"input_ids")  # name: length-delimited, the span its bytes
    assert found[3][0] == 0 and wire.varint_field(buf, *_span(buf, 3)) == 300
    assert found[10] == (2, b"x" * 200)  # a two-byte length


def _span(buf, number):
    return next((s, e) for n, _, s, e in wire.fields(buf) if n == number)


def test_a_message_cut_short_or_of_an_unknown_wire_type_is_an_error():
    buf = descriptor_pb2.FieldDescriptorProto(name="abc").SerializeToString()
    with pytest.raises(ValueError, match="runs past its message"):
        list(wire.fields(buf[:-1]))
    with pytest.raises(ValueError, match="wire type 3"):
        list(wire.fields(b"\x0b"))  # field 1, start-group


def test_crc32c_check_value_and_the_mask():
    assert wire.crc32c(b"123456789") == 0xE3069283
    crc = wire.crc32c(b"abc")
    assert wire.masked_crc32c(b"abc") == \
        ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF
