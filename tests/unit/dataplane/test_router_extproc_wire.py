"""The ext_proc wire codec: messages built here field by field (numbers as go-control-plane/envoy
v1.40.0's generated types tag them) decode to what Envoy meant; answers encode to those numbers;
unknown fields are skipped; truncated input is a clear error."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from kvretention.dataplane.router.extproc_wire import (
    Body,
    Continue,
    Headers,
    Immediate,
    JsonValue,
    WireError,
    decode_health_request,
    decode_request,
    decode_struct,
    decode_value,
    encode_health_response,
    encode_response,
    encode_struct,
    encode_value,
    iter_fields,
)


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def ld(number: int, payload: bytes | str) -> bytes:
    """A length-delimited field."""
    data = payload.encode() if isinstance(payload, str) else payload
    return varint(number << 3 | 2) + varint(len(data)) + data


def vi(number: int, value: int) -> bytes:
    return varint(number << 3) + varint(value)


def header(key: str, value: str, *, raw: bool = True) -> bytes:
    """``HeaderValue``: Envoy sends ``raw_value`` (3); older senders ``value`` (2)."""
    return ld(1, key) + (ld(3, value) if raw else ld(2, value))


def headers_msg(pairs: list[tuple[str, str]], *, eos: bool = False, raw: bool = True) -> bytes:
    """``HttpHeaders{headers=1 HeaderMap{headers=1}, end_of_stream=3}``."""
    out = ld(1, b"".join(ld(1, header(k, v, raw=raw)) for k, v in pairs))
    return out + (vi(3, 1) if eos else b"")


def struct_msg(fields: dict[str, bytes]) -> bytes:
    """``Struct``, each value already a ``Value`` message."""
    return b"".join(ld(1, ld(1, k) + ld(2, v)) for k, v in fields.items())


def metadata_msg(namespaces: dict[str, bytes]) -> bytes:
    """``config.core.v3.Metadata{filter_metadata=1 map<string, Struct>}``."""
    return b"".join(ld(1, ld(1, ns) + ld(2, fields)) for ns, fields in namespaces.items())


UNKNOWN = (
    vi(99, 7)
    + varint(98 << 3 | 1)
    + b"\x00" * 8
    + varint(97 << 3 | 5)
    + b"\x00" * 4
    + ld(96, b"\x01\x02")
    + varint(95 << 3 | 3)
    + vi(1, 5)
    + varint(95 << 3 | 4)
)
"""Fields of every wire type (a group too) that no decoder here knows."""


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param(
            ld(2, headers_msg([(":path", "/v1/messages"), ("x-session-id", "s1")])),
            {
                "phase": "request_headers",
                "headers": Headers(((":path", "/v1/messages"), ("x-session-id", "s1"))),
            },
            id="request-headers-raw-value",
        ),
        pytest.param(
            ld(2, headers_msg([("x-a", "b")], eos=True, raw=False)),
            {"phase": "request_headers", "headers": Headers((("x-a", "b"),), end_of_stream=True)},
            id="request-headers-value-eos",
        ),
        pytest.param(
            ld(4, ld(1, b'{"a":1}') + vi(2, 1)),
            {"phase": "request_body", "body": Body(b'{"a":1}', end_of_stream=True)},
            id="request-body",
        ),
        pytest.param(
            ld(5, ld(1, b"chunk")),
            {"phase": "response_body", "body": Body(b"chunk")},
            id="response-body-chunk",
        ),
        pytest.param(
            ld(3, headers_msg([(":status", "200")], eos=True))
            + ld(
                8,
                metadata_msg(
                    {
                        "envoy.lb": struct_msg(
                            {"x-gateway-destination-endpoint-served": ld(3, "10.0.0.1:8000")}
                        )
                    }
                ),
            ),
            {
                "phase": "response_headers",
                "headers": Headers(((":status", "200"),), end_of_stream=True),
                "metadata": {
                    "envoy.lb": {"x-gateway-destination-endpoint-served": "10.0.0.1:8000"}
                },
            },
            id="response-headers-served-metadata",
        ),
        pytest.param(
            ld(6, ld(1, b"")),
            {"phase": "request_trailers"},
            id="request-trailers",
        ),
        pytest.param(
            ld(7, b""),
            {"phase": "response_trailers"},
            id="response-trailers",
        ),
        pytest.param(
            ld(2, headers_msg([])) + ld(11, vi(1, 4) + vi(2, 0) + vi(3, 1)),
            {
                "phase": "request_headers",
                "headers": Headers(),
                "request_body_mode": 4,
                "response_body_mode": 0,
            },
            id="protocol-config-full-duplex",
        ),
        pytest.param(
            UNKNOWN + ld(2, UNKNOWN + headers_msg([("k", "v")]) + UNKNOWN) + UNKNOWN,
            {"phase": "request_headers", "headers": Headers((("k", "v"),))},
            id="unknown-fields-skipped",
        ),
        pytest.param(b"", {"phase": None}, id="empty"),
    ],
)
def test_decode_request(raw: bytes, expected: dict[str, Any]) -> None:
    message = decode_request(raw)
    for name, value in expected.items():
        assert getattr(message, name) == value
    if "metadata" not in expected:
        assert message.metadata == {}


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        pytest.param(b"\x80", "truncated varint", id="varint"),
        pytest.param(ld(2, b"abc")[:-1], "truncated field", id="length-past-end"),
        pytest.param(varint(9 << 3 | 1) + b"\x00\x00", "truncated field", id="fixed64"),
        pytest.param(varint(9 << 3 | 3) + vi(1, 1), "truncated group", id="open-group"),
        pytest.param(varint(9 << 3 | 4), "unbalanced group", id="stray-end-group"),
        pytest.param(varint(9 << 3 | 7), "wire type 7", id="bad-wire-type"),
        pytest.param(b"\x00", "field number 0", id="field-zero"),
        pytest.param(ld(2, ld(1, b"\x0a\x05ab")), "truncated field", id="nested-header-map"),
        pytest.param(vi(2, 1), "expected a length-delimited field", id="phase-as-varint"),
    ],
)
def test_malformed_input_raises_a_clear_error(raw: bytes, error: str) -> None:
    with pytest.raises(WireError, match=error):
        decode_request(raw)


STRUCTS: list[dict[str, JsonValue]] = [
    {},
    {"x-gateway-destination-endpoint": "10.1.2.3:8000"},
    {"n": None, "t": True, "f": False, "i": 3.0, "x": -0.5, "s": "é"},
    {"nested": {"a": [1.0, "two", None, {"b": False}]}, "empty": [], "inner": {}},
]


@pytest.mark.parametrize("value", STRUCTS)
def test_struct_round_trip(value: dict[str, JsonValue]) -> None:
    assert decode_struct(encode_struct(value)) == value


@pytest.mark.parametrize(
    ("value", "wire"),
    [
        (None, vi(1, 0)),
        (3, varint(2 << 3 | 1) + struct.pack("<d", 3.0)),
        ("a", ld(3, "a")),
        (True, vi(4, 1)),
        ({"k": "v"}, ld(5, struct_msg({"k": ld(3, "v")}))),
        (["a"], ld(6, ld(1, ld(3, "a")))),
    ],
)
def test_value_field_numbers(value: JsonValue, wire: bytes) -> None:
    """``google.protobuf.Value``: null=1, number=2 (double), string=3, bool=4, struct=5, list=6."""
    assert encode_value(value) == wire
    assert decode_value(wire) == value


def fields(raw: bytes) -> dict[int, Any]:
    """Field number -> value (the last of repeated ones) of one message."""
    return {number: value for number, _kind, value in iter_fields(raw)}


def test_headers_response_sets_the_header_and_the_metadata() -> None:
    answer = Continue(
        "request_headers",
        set_headers=(("x-gateway-destination-endpoint", "10.0.0.9:8000"),),
        clear_route_cache=True,
    )
    raw = encode_response(
        answer,
        dynamic_metadata={"envoy.lb": {"x-gateway-destination-endpoint": "10.0.0.9:8000"}},
    )
    top = fields(raw)
    assert set(top) == {1, 8}  # request_headers, dynamic_metadata
    common = fields(fields(top[1])[1])  # HeadersResponse.response (CommonResponse)
    assert common.get(1, 0) == 0  # status CONTINUE
    assert common[5] == 1  # clear_route_cache
    option = fields(fields(common[2])[1])  # HeaderMutation.set_headers[0]
    assert option[3] == 2  # append_action OVERWRITE_IF_EXISTS_OR_ADD
    value = fields(option[1])
    assert value == {1: b"x-gateway-destination-endpoint", 3: b"10.0.0.9:8000"}
    assert decode_struct(top[8]) == {
        "envoy.lb": {"x-gateway-destination-endpoint": "10.0.0.9:8000"}
    }


@pytest.mark.parametrize(
    ("phase", "number"),
    [
        ("request_headers", 1),
        ("response_headers", 2),
        ("request_body", 3),
        ("response_body", 4),
        ("request_trailers", 5),
        ("response_trailers", 6),
    ],
)
def test_continue_goes_in_the_phase_field(phase: Any, number: int) -> None:
    assert set(fields(encode_response(Continue(phase)))) == {number}


def test_full_duplex_body_is_sent_on_as_a_streamed_response() -> None:
    raw = encode_response(Continue("request_body", streamed_body=b"{}", end_of_stream=True))
    common = fields(fields(fields(raw)[3])[1])
    streamed = fields(fields(common[3])[3])  # body_mutation.streamed_response
    assert streamed == {1: b"{}", 2: 1}


def test_immediate_response() -> None:
    raw = encode_response(
        Immediate(
            503, body=b'{"e":1}', headers=(("content-type", "application/json"),), details="x"
        )
    )
    immediate = fields(fields(raw)[7])
    assert fields(immediate[1]) == {1: 503}  # HttpStatus.code
    assert immediate[3] == b'{"e":1}'
    assert immediate[5] == b"x"
    option = fields(fields(immediate[2])[1])
    assert fields(option[1]) == {1: b"content-type", 3: b"application/json"}


def test_health_messages() -> None:
    assert decode_health_request(ld(1, "readiness") + UNKNOWN) == "readiness"
    assert decode_health_request(b"") == ""
    assert encode_health_response(2) == vi(1, 2)
