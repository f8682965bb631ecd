"""Envoy ``ext_proc`` messages on the protobuf wire, for just the fields the endpoint picker uses.

No generated code: pure encoders and decoders of ``envoy.service.ext_proc.v3`` ``ProcessingRequest``
and ``ProcessingResponse`` (field numbers checked against go-control-plane/envoy v1.40.0's
generated ``external_processor.pb.go`` and ``config/core/v3/base.pb.go``), of the
``google.protobuf.Struct`` that carries metadata, and of the gRPC health check. A field this
module does not know is skipped, as protobuf requires; input that ends inside a field raises
:class:`WireError`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, TypeAlias

JsonValue: TypeAlias = "bool | float | str | list[JsonValue] | dict[str, JsonValue] | None"
Metadata: TypeAlias = "dict[str, dict[str, JsonValue]]"
"""Namespace (``envoy.lb``) -> its ``google.protobuf.Struct`` as plain values."""

Phase = Literal[
    "request_headers",
    "response_headers",
    "request_body",
    "response_body",
    "request_trailers",
    "response_trailers",
]

_REQUEST_PHASES: Final[dict[int, Phase]] = {
    2: "request_headers",
    3: "response_headers",
    4: "request_body",
    5: "response_body",
    6: "request_trailers",
    7: "response_trailers",
}
_RESPONSE_FIELD: Final[dict[Phase, int]] = {
    "request_headers": 1,
    "response_headers": 2,
    "request_body": 3,
    "response_body": 4,
    "request_trailers": 5,
    "response_trailers": 6,
}
_METADATA_CONTEXT: Final = 8
_PROTOCOL_CONFIG: Final = 11
_IMMEDIATE_RESPONSE: Final = 7
_DYNAMIC_METADATA: Final = 8

FULL_DUPLEX_STREAMED: Final = 4
"""``ProcessingMode.BodySendMode`` value of the mode the upstream EPP runs in."""
BUFFERED: Final = 2
OVERWRITE_IF_EXISTS_OR_ADD: Final = 2
"""``HeaderValueOption.HeaderAppendAction``: a client cannot smuggle in its own destination."""

VARINT, FIXED64, LENGTH, START_GROUP, END_GROUP, FIXED32 = 0, 1, 2, 3, 4, 5


class WireError(ValueError):
    """Bytes that are not a protobuf message (truncated, or a malformed tag)."""


# ---------------------------------------------------------------- the wire itself


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise WireError("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise WireError("varint longer than 10 bytes")


def _take(buf: bytes, pos: int, size: int) -> tuple[bytes, int]:
    end = pos + size
    if end > len(buf):
        raise WireError(f"truncated field: {size} bytes announced, {len(buf) - pos} left")
    return buf[pos:end], end


def iter_fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """``(field number, wire type, value)`` for each field: an int for varints and fixed
    widths (little-endian), the bytes of length-delimited fields; groups are skipped."""
    pos = 0
    depth: list[int] = []
    while pos < len(buf):
        tag, pos = _varint(buf, pos)
        number, kind = tag >> 3, tag & 7
        if number == 0:
            raise WireError("field number 0")
        value: int | bytes
        if kind == VARINT:
            value, pos = _varint(buf, pos)
        elif kind == FIXED64:
            raw, pos = _take(buf, pos, 8)
            value = int.from_bytes(raw, "little")
        elif kind == FIXED32:
            raw, pos = _take(buf, pos, 4)
            value = int.from_bytes(raw, "little")
        elif kind == LENGTH:
            size, pos = _varint(buf, pos)
            value, pos = _take(buf, pos, size)
        elif kind == START_GROUP:
            depth.append(number)
            continue
        elif kind == END_GROUP:
            if not depth or depth.pop() != number:
                raise WireError("unbalanced group")
            continue
        else:
            raise WireError(f"wire type {kind}")
        if not depth:
            yield number, kind, value
    if depth:
        raise WireError("truncated group")


def _key(number: int, kind: int) -> bytes:
    return _encode_varint(number << 3 | kind)


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _key(number, LENGTH) + _encode_varint(len(payload)) + payload


def _varint_field(number: int, value: int) -> bytes:
    return _key(number, VARINT) + _encode_varint(value)


def _bytes(value: int | bytes) -> bytes:
    if not isinstance(value, bytes):
        raise WireError("expected a length-delimited field")
    return value


def _int(value: int | bytes) -> int:
    if isinstance(value, bytes):
        raise WireError("expected a number field")
    return value


# ---------------------------------------------------------------- google.protobuf.Struct


def encode_value(value: JsonValue) -> bytes:
    """``google.protobuf.Value`` (null=1, number=2, string=3, bool=4, struct=5, list=6)."""
    if value is None:
        return _varint_field(1, 0)
    if isinstance(value, bool):
        return _varint_field(4, int(value))
    if isinstance(value, int | float):
        return _key(2, FIXED64) + struct.pack("<d", float(value))
    if isinstance(value, str):
        return _len_field(3, value.encode())
    if isinstance(value, dict):
        return _len_field(5, encode_struct(value))
    return _len_field(6, b"".join(_len_field(1, encode_value(v)) for v in value))


def encode_struct(fields: Mapping[str, JsonValue]) -> bytes:
    """``google.protobuf.Struct``: ``fields`` (1) is a map, one entry message per key."""
    return b"".join(
        _len_field(1, _len_field(1, k.encode()) + _len_field(2, encode_value(v)))
        for k, v in fields.items()
    )


def decode_value(buf: bytes) -> JsonValue:
    result: JsonValue = None
    for number, _kind, value in iter_fields(buf):
        if number == 1:
            result = None
        elif number == 2:
            result = struct.unpack("<d", _int(value).to_bytes(8, "little"))[0]
        elif number == 3:
            result = _bytes(value).decode("utf-8", "replace")
        elif number == 4:
            result = bool(_int(value))
        elif number == 5:
            result = decode_struct(_bytes(value))
        elif number == 6:
            result = [decode_value(_bytes(v)) for n, _k, v in iter_fields(_bytes(value)) if n == 1]
    return result


def decode_struct(buf: bytes) -> dict[str, JsonValue]:
    out: dict[str, JsonValue] = {}
    for number, _kind, entry in iter_fields(buf):
        if number == 1:
            key, value = _map_entry(_bytes(entry))
            out[key] = decode_value(value)
    return out


def _map_entry(buf: bytes) -> tuple[str, bytes]:
    key, value = "", b""
    for number, _kind, raw in iter_fields(buf):
        if number == 1:
            key = _bytes(raw).decode("utf-8", "replace")
        elif number == 2:
            value = _bytes(raw)
    return key, value


def encode_metadata(metadata: Mapping[str, Mapping[str, JsonValue]]) -> bytes:
    """A ``Struct`` of namespaces, each a ``Struct`` (what ``dynamic_metadata`` carries)."""
    return encode_struct({ns: dict(fields) for ns, fields in metadata.items()})


# ---------------------------------------------------------------- ProcessingRequest


@dataclass(frozen=True)
class Headers:
    """``HttpHeaders``: the header map (keys as Envoy sends them, lower case) and end of stream."""

    headers: tuple[tuple[str, str], ...] = ()
    end_of_stream: bool = False

    def as_dict(self) -> dict[str, str]:
        """Lower-cased name -> value (the first of repeated names)."""
        out: dict[str, str] = {}
        for key, value in self.headers:
            out.setdefault(key.lower(), value)
        return out


@dataclass(frozen=True)
class Body:
    """``HttpBody``: one chunk (the whole body in buffered mode) and end of stream."""

    body: bytes = b""
    end_of_stream: bool = False


@dataclass(frozen=True)
class ProcessingRequest:
    """One message Envoy sends: which phase, its headers or body, and the metadata it attached."""

    phase: Phase | None
    headers: Headers | None = None
    body: Body | None = None
    metadata: Metadata = field(default_factory=dict)
    """``metadata_context.filter_metadata``: namespace -> fields."""
    request_body_mode: int | None = None
    response_body_mode: int | None = None
    """``protocol_config`` (sent on a stream's first message by Envoy >= 1.33)."""


def _decode_header_value(buf: bytes) -> tuple[str, str]:
    key, value, raw = "", "", b""
    for number, _kind, item in iter_fields(buf):
        if number == 1:
            key = _bytes(item).decode("utf-8", "replace")
        elif number == 2:
            value = _bytes(item).decode("utf-8", "replace")
        elif number == 3:
            raw = _bytes(item)
    # Envoy sends ``raw_value`` (bytes) and leaves ``value`` empty.
    return key, value or raw.decode("utf-8", "replace")


def decode_header_map(buf: bytes) -> tuple[tuple[str, str], ...]:
    return tuple(_decode_header_value(_bytes(v)) for n, _k, v in iter_fields(buf) if n == 1)


def _decode_headers(buf: bytes) -> Headers:
    pairs: tuple[tuple[str, str], ...] = ()
    eos = False
    for number, _kind, value in iter_fields(buf):
        if number == 1:
            pairs = decode_header_map(_bytes(value))
        elif number == 3:
            eos = bool(_int(value))
    return Headers(headers=pairs, end_of_stream=eos)


def _decode_body(buf: bytes) -> Body:
    data, eos = b"", False
    for number, _kind, value in iter_fields(buf):
        if number == 1:
            data = _bytes(value)
        elif number == 2:
            eos = bool(_int(value))
    return Body(body=data, end_of_stream=eos)


def _decode_metadata(buf: bytes) -> Metadata:
    """``config.core.v3.Metadata``: ``filter_metadata`` (1) map<string, Struct>."""
    out: Metadata = {}
    for number, _kind, entry in iter_fields(buf):
        if number == 1:
            key, value = _map_entry(_bytes(entry))
            out[key] = decode_struct(value)
    return out


def decode_request(buf: bytes) -> ProcessingRequest:
    """One ``ProcessingRequest``; trailers carry no fields the picker reads."""
    phase: Phase | None = None
    headers: Headers | None = None
    body: Body | None = None
    metadata: Metadata = {}
    modes: dict[int, int] = {}
    for number, _kind, value in iter_fields(buf):
        if number in _REQUEST_PHASES:
            phase = _REQUEST_PHASES[number]
            if phase.endswith("_headers"):
                headers = _decode_headers(_bytes(value))
            elif phase.endswith("_body"):
                body = _decode_body(_bytes(value))
            else:
                _bytes(value)
        elif number == _METADATA_CONTEXT:
            metadata = _decode_metadata(_bytes(value))
        elif number == _PROTOCOL_CONFIG:
            modes = {n: _int(v) for n, _k, v in iter_fields(_bytes(value)) if n in (1, 2)}
    return ProcessingRequest(
        phase=phase,
        headers=headers,
        body=body,
        metadata=metadata,
        request_body_mode=modes.get(1),
        response_body_mode=modes.get(2),
    )


# ---------------------------------------------------------------- ProcessingResponse


@dataclass(frozen=True)
class Continue:
    """A ``HeadersResponse``/``BodyResponse``/``TrailersResponse`` for ``phase``: status CONTINUE,
    optional header mutation, and in full-duplex mode the body sent on (``streamed_body``)."""

    phase: Phase
    set_headers: tuple[tuple[str, str], ...] = ()
    clear_route_cache: bool = False
    streamed_body: bytes | None = None
    end_of_stream: bool = False
    """With ``streamed_body``: this chunk ends the body."""


@dataclass(frozen=True)
class Immediate:
    """``ImmediateResponse``: Envoy answers the client itself with this status and body."""

    status: int
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    details: str = ""


def _header_mutation(pairs: Sequence[tuple[str, str]]) -> bytes:
    """``HeaderMutation.set_headers`` (1): ``HeaderValueOption{header=1, append_action=3}``,
    each ``HeaderValue{key=1, raw_value=3}``."""
    return b"".join(
        _len_field(
            1,
            _len_field(1, _len_field(1, k.encode()) + _len_field(3, v.encode()))
            + _varint_field(3, OVERWRITE_IF_EXISTS_OR_ADD),
        )
        for k, v in pairs
    )


def _common(answer: Continue) -> bytes:
    """``CommonResponse{status=1 (CONTINUE=0 is the default), header_mutation=2,
    body_mutation=3, clear_route_cache=5}``."""
    out = b""
    if answer.set_headers:
        out += _len_field(2, _header_mutation(answer.set_headers))
    if answer.streamed_body is not None:
        # BodyMutation.streamed_response (3): StreamedBodyResponse{body=1, end_of_stream=2}.
        streamed = _len_field(1, answer.streamed_body)
        if answer.end_of_stream:
            streamed += _varint_field(2, 1)
        out += _len_field(3, _len_field(3, streamed))
    if answer.clear_route_cache:
        out += _varint_field(5, 1)
    return out


def encode_response(
    answer: Continue | Immediate, *, dynamic_metadata: Mapping[str, Mapping[str, JsonValue]] = {}
) -> bytes:
    """One ``ProcessingResponse``."""
    if isinstance(answer, Immediate):
        immediate = _len_field(1, _varint_field(1, answer.status))  # HttpStatus{code=1}
        if answer.headers:
            immediate += _len_field(2, _header_mutation(answer.headers))
        if answer.body:
            immediate += _len_field(3, answer.body)
        if answer.details:
            immediate += _len_field(5, answer.details.encode())
        out = _len_field(_IMMEDIATE_RESPONSE, immediate)
    elif answer.phase.endswith("_trailers"):
        # TrailersResponse{header_mutation=1}: the picker never changes trailers.
        out = _len_field(_RESPONSE_FIELD[answer.phase], b"")
    else:
        # HeadersResponse / BodyResponse{response=1 CommonResponse}
        out = _len_field(_RESPONSE_FIELD[answer.phase], _len_field(1, _common(answer)))
    if dynamic_metadata:
        out += _len_field(_DYNAMIC_METADATA, encode_metadata(dynamic_metadata))
    return out


# ---------------------------------------------------------------- grpc.health.v1


def decode_health_request(buf: bytes) -> str:
    """``HealthCheckRequest{service=1}``."""
    for number, _kind, value in iter_fields(buf):
        if number == 1:
            return _bytes(value).decode("utf-8", "replace")
    return ""


def encode_health_response(status: int) -> bytes:
    """``HealthCheckResponse{status=1}`` (SERVING=1, NOT_SERVING=2, SERVICE_UNKNOWN=3)."""
    return _varint_field(1, status)
