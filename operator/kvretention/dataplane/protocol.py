"""The internal request protocol: frontend -> router -> worker, and the stream that comes back.

A ``PreprocessedRequest`` is provider-neutral. Its top-level ``kv_hints`` key carries the KV-hint
envelope's wire form and is absent when there is no hint. The router forwards request bodies as
the bytes it received; per-hop placement data (role, bootstrap room) travels in headers so the body,
and with it the envelope, is never rewritten.

Responses are NDJSON (one JSON object per line): ``GenerateChunk`` objects, or a single final
``{"error": {...}}`` line when something fails after the stream has started. Failures before the
stream starts are a non-2xx status with the same ``{"error": {...}}`` body.

Over 600 lines on purpose: it is the one definition of the wire between the three hops, and
splitting it would put a message's fields apart from the encoders that keep its bytes stable.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Final, Literal, TypeVar, cast

import msgspec
from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer
from pydantic_core import to_json

from kvretention.common.sessions import DEFAULT_SESSION_KEYS as DEFAULT_SESSION_KEYS
from kvretention.common.sessions import HEADER_SESSION as HEADER_SESSION

GENERATE_PATH: Final = "/v1/generate"
RESIDENCY_PATH: Final = "/kv/residency"
"""A worker's resident KV blocks per tenant salt and session (``kvretention worker --kv-events``)."""
NDJSON: Final = "application/x-ndjson"

# Per-hop placement headers set by the router; the body is never changed.
HEADER_ROLE: Final = "x-kvr-role"  # "aggregated" | "prefill" | "decode"
HEADER_BOOTSTRAP_HOST: Final = "x-kvr-bootstrap-host"
HEADER_BOOTSTRAP_PORT: Final = "x-kvr-bootstrap-port"
HEADER_BOOTSTRAP_ROOM: Final = "x-kvr-bootstrap-room"
BODY_SESSION_OBJECTS: Final = ("metadata", "client_metadata")
"""The body objects a session key may name a field of (``metadata.<field>``)."""
_ENCODE: Final = msgspec.json.Encoder().encode
HEADER_PREFIX: Final = "x-kvr-prefix"
"""Frontend -> router: the prompt's prefix-hash chain for cache-aware placement (no body parse)."""
MAX_PREFIX_HASHES: Final = 448
"""The most hashes ``x-kvr-prefix`` carries and the router and workers read: 448 of 16 hex digits and
their commas are 7,615 bytes, under aiohttp's 8,190 for a header value (a longer one is refused)."""


class ErrorCode(StrEnum):
    """Typed failures that cross process boundaries; the frontend maps each to a provider error."""

    INVALID_REQUEST = "invalid_request"
    KV_HINTS_UNSUPPORTED = "kv_hints_unsupported"
    NO_WORKERS = "no_workers"
    WORKER_UNAVAILABLE = "worker_unavailable"
    UPSTREAM_TIMEOUT = "upstream_timeout"
    ENGINE_ERROR = "engine_error"
    DRAINING = "draining"
    HOP_UNAUTHENTICATED = "hop_unauthenticated"  # a tenant the fleet's frontend did not sign
    WORKER_OUTDATED = "worker_outdated"  # the request needs what this worker predates


ERROR_STATUS: Final[dict[ErrorCode, int]] = {
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.KV_HINTS_UNSUPPORTED: 501,
    ErrorCode.NO_WORKERS: 503,
    ErrorCode.WORKER_UNAVAILABLE: 502,
    ErrorCode.UPSTREAM_TIMEOUT: 504,
    ErrorCode.ENGINE_ERROR: 500,
    ErrorCode.DRAINING: 503,
    ErrorCode.HOP_UNAUTHENTICATED: 403,
    ErrorCode.WORKER_OUTDATED: 503,
}
"""HTTP status used between our own processes for each error code."""


class ContextOverflow(BaseModel):
    """A prompt the model's context cannot hold: what each provider's own error reports."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    prompt_tokens: int
    context_length: int


class ErrorBody(BaseModel):
    """The ``error`` object of a failure line or a non-2xx body."""

    model_config = ConfigDict(extra="ignore")

    code: ErrorCode
    message: str
    param: str | None = None
    overflow: ContextOverflow | None = None
    """With ``invalid_request``: the prompt is longer than the context (older readers ignore
    it and show the message)."""


class ErrorLine(BaseModel):
    """``{"error": {...}}``: a failure, before or during a stream."""

    error: ErrorBody


class SamplingParams(BaseModel):
    """Sampling parameters, named as SGLang's ``sampling_params`` dict names them."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int | None = Field(default=None, ge=0)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    min_new_tokens: int | None = Field(default=None, ge=0)
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    seed: int | None = Field(default=None, alias="sampling_seed")
    logit_bias: dict[str, float] | None = None
    """Token id (as a string) -> bias, as SGLang's ``logit_bias`` takes it."""
    # Structure constraints (SGLang's names; at most one is set): the worker fills these in from
    # tool_choice / response_format, as SGLang's OpenAI server does.
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    skip_special_tokens: bool | None = None
    no_stop_trim: bool | None = None

    def to_sglang(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True, by_alias=True)


def _compact(data: dict[str, Any], *, keep: frozenset[str]) -> dict[str, Any]:
    """Drop empty optional fields so the common, text-only case stays as small as before."""
    return {k: v for k, v in data.items() if k in keep or v not in (None, "", False, [])}


class _Compact(BaseModel):
    """A model whose JSON omits empty optional fields (``[]``, ``""``, ``false``, ``null``)."""

    _keep: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _compact(handler(self), keep=self._keep)


class _Retainable(BaseModel):
    """An element that may carry a breakpoint; ``retain_ttl`` is left out of the JSON when unset,
    so a request without breakpoints keeps its v1 bytes."""

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("retain_ttl", 0) is None:
            del data["retain_ttl"]
        return data


_Model = TypeVar("_Model", bound=BaseModel)
_Spec = tuple[
    dict[str, Any], tuple[tuple[str, Callable[[], Any]], ...], frozenset[str], frozenset[str]
]
_SPECS: Final[dict[type[BaseModel], _Spec]] = {}


def trusted(cls: type[_Model], /, **fields: Any) -> _Model:
    """``cls(**fields)`` without pydantic's validation, for values a parser already checked.

    The frontend's parsers check every field of a client's body and answer their own errors, so
    validating the ~1,500 messages, parts and calls of an agent's conversation again only costs
    CPU (about a tenth of the parse). The object equals ``cls(**fields)``; a missing required or an
    unknown field is still a ``TypeError`` (a bug here, never a client's error)."""
    spec = _SPECS.get(cls)
    if spec is None:
        spec = _SPECS[cls] = _spec(cls)
    defaults, factories, required, known = spec
    if not required <= fields.keys() <= known:
        raise TypeError(f"{cls.__name__}: fields {sorted(fields)} (required {sorted(required)})")
    values = defaults.copy()
    for name, factory in factories:
        if name not in fields:
            values[name] = factory()
    values.update(fields)
    model = _new(cls)
    _set(model, "__dict__", values)
    _set(model, "__pydantic_fields_set__", set(fields))
    _set(model, "__pydantic_extra__", None)
    _set(model, "__pydantic_private__", None)
    return model


_new: Final = object.__new__
_set: Final = object.__setattr__


def _spec(cls: type[BaseModel]) -> _Spec:
    defaults: dict[str, Any] = {}
    factories: list[tuple[str, Callable[[], Any]]] = []
    for name, info in cls.model_fields.items():
        if info.alias is not None and info.alias != name:
            raise TypeError(f"{cls.__name__}.{name} has an alias: build it with validation")
        defaults[name] = None if info.is_required() else info.get_default()
        if info.default_factory is not None:
            factories.append((name, cast("Callable[[], Any]", info.default_factory)))
    required = frozenset(n for n, i in cls.model_fields.items() if i.is_required())
    return defaults, tuple(factories), required, frozenset(defaults)


# -- the provider-neutral conversation ---------------------------------------------------------
#
# Both providers' requests reduce to these models at the frontend; the worker renders them with the
# model's own chat template. Provider field names stop at the frontend: nothing below is OpenAI- or
# Anthropic-shaped, and every field here is one the worker acts on.


class TextPart(_Retainable):
    """A piece of text in a message."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["text"] = "text"
    text: str
    retain_ttl: int | None = Field(default=None, ge=1)
    """Retain the rendered prompt up to the end of this part for this many seconds (a breakpoint
    the worker resolves to a token offset); ``None``: no breakpoint here."""


class ImagePart(_Retainable):
    """An image, as a ``data:`` URL (base64 sources become one) or an ``http(s)`` URL."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["image"] = "image"
    url: str = Field(min_length=1)
    detail: Literal["auto", "low", "high"] | None = None
    retain_ttl: int | None = Field(default=None, ge=1)
    """Retain the rendered prompt up to the end of this image for this many seconds (a breakpoint
    the worker resolves to a token offset); ``None``: no breakpoint here."""


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class ToolCall(_Retainable):
    """A tool call the assistant made (history) or makes (output).

    ``arguments`` is the JSON text of a function's arguments, or the free-form input of a
    ``custom`` tool (Codex's ``apply_patch``), exactly as the model wrote it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str = ""
    kind: Literal["function", "custom"] = "function"
    retain_ttl: int | None = Field(default=None, ge=1)
    """Retain the rendered prompt up to the end of this call for this many seconds (a breakpoint
    the worker resolves to a token offset); ``None``: no breakpoint here."""


class Reasoning(BaseModel):
    """Prior reasoning replayed in history.

    ``text`` is what the model sees again (Anthropic ``thinking`` text, Responses reasoning summary
    text); ``signature`` / ``encrypted_content`` are opaque provider blobs that cannot be read here,
    kept only so the trace can say they were present.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str = ""
    signature: str | None = None
    encrypted: bool = False
    """The client sent an encrypted blob (``encrypted_content`` / ``redacted_thinking``)."""


MessageRole = Literal["system", "developer", "user", "assistant", "tool"]


class ChatMessage(_Compact):
    """One message of the neutral conversation.

    ``content`` is a plain string or a list of text / image parts. An assistant message may carry
    ``reasoning`` (before its content) and ``tool_calls`` (after it). A ``tool`` message is one tool
    result: ``tool_call_id`` names the call it answers, ``name`` the tool when known, ``is_error``
    the client's error flag.
    """

    model_config = ConfigDict(extra="forbid")
    _keep: ClassVar[frozenset[str]] = frozenset({"role", "content"})

    role: MessageRole
    content: str | list[ContentPart] = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    reasoning: Reasoning | None = None
    tool_call_id: str | None = None
    name: str | None = None
    is_error: bool = False
    retain_ttl: int | None = Field(default=None, ge=1)
    """Retain the rendered prompt up to the end of this whole message for this many seconds (a breakpoint
    the worker resolves to a token offset); ``None``: no breakpoint here."""

    def text(self) -> str:
        """The text of the content, parts joined by newlines (images are skipped)."""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(p.text for p in self.content if isinstance(p, TextPart))

    def images(self) -> list[ImagePart]:
        if isinstance(self.content, str):
            return []
        return [p for p in self.content if isinstance(p, ImagePart)]


def message_wire(message: ChatMessage) -> dict[str, Any]:
    """``message`` as ``model_dump(exclude_none=True)`` gives it, by plain attribute reads."""
    if type(message) is not ChatMessage:
        dumped: dict[str, Any] = message.model_dump(exclude_none=True, by_alias=True)
        return dumped
    content = message.content
    out: dict[str, Any] = {
        "role": message.role,
        "content": content if isinstance(content, str) else [_part_wire(p) for p in content],
    }
    if message.tool_calls:
        out["tool_calls"] = [_call_wire(c) for c in message.tool_calls]
    reasoning = message.reasoning
    if reasoning is not None:
        wire: dict[str, Any] = {"text": reasoning.text}
        if reasoning.signature is not None:
            wire["signature"] = reasoning.signature
        wire["encrypted"] = reasoning.encrypted
        out["reasoning"] = wire
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    if message.name:
        out["name"] = message.name
    if message.is_error:
        out["is_error"] = message.is_error
    if message.retain_ttl:
        out["retain_ttl"] = message.retain_ttl
    return out


class MessageMemo(weakref.ref):  # type: ignore[type-arg]  # of ChatMessage
    """What the frontend derives from one message object, kept while the message lives: an
    agent's next request repeats the last one's messages as the same objects
    (``frontend/resume.py``), so each is encoded and hashed once. A weak reference itself, so
    one small object per message carries it all and leaves with the message."""

    __slots__ = ("after", "before", "key", "wire")
    key: int
    wire: msgspec.Raw | None
    """The message's router JSON."""
    before: Any
    """The prefix chain's hasher this message was hashed after (``frontend/affinity.py``)."""
    after: Any
    """The hasher once this message was hashed into ``before``."""


_MEMOS: Final[dict[int, MessageMemo]] = {}


def memo_of(message: ChatMessage) -> MessageMemo:
    """The message's memo (a new, empty one the first time)."""
    key = id(message)
    memo = _MEMOS.get(key)
    if memo is not None and memo() is message:
        return memo
    memo = MessageMemo(message, _forget)
    memo.key, memo.wire, memo.before, memo.after = key, None, None, None
    _MEMOS[key] = memo
    return memo


def _forget(memo: MessageMemo) -> None:
    if _MEMOS.get(memo.key) is memo:
        del _MEMOS[memo.key]


def _message_json(message: ChatMessage) -> msgspec.Raw | dict[str, Any]:
    """``message_wire(message)``, encoded once per message object."""
    memo = memo_of(message)
    if memo.wire is not None:
        return memo.wire
    wire = message_wire(message)
    try:
        memo.wire = msgspec.Raw(_ENCODE(wire))
    except (OverflowError, TypeError, msgspec.EncodeError):
        return wire
    return memo.wire


message_json: Final = _message_json
"""A message's router JSON (what :meth:`PreprocessedRequest.to_json_bytes` writes for it)."""


def _part_wire(part: TextPart | ImagePart) -> dict[str, Any]:
    if type(part) is TextPart:
        out: dict[str, Any] = {"type": part.type, "text": part.text}
    elif type(part) is ImagePart:
        out = {"type": part.type, "url": part.url}
        if part.detail is not None:
            out["detail"] = part.detail
    else:
        dumped: dict[str, Any] = part.model_dump(exclude_none=True, by_alias=True)
        return dumped
    if part.retain_ttl is not None:
        out["retain_ttl"] = part.retain_ttl
    return out


def _call_wire(call: ToolCall) -> dict[str, Any]:
    if type(call) is not ToolCall:
        dumped: dict[str, Any] = call.model_dump(exclude_none=True, by_alias=True)
        return dumped
    out: dict[str, Any] = {
        "id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "kind": call.kind,
    }
    if call.retain_ttl is not None:
        out["retain_ttl"] = call.retain_ttl
    return out


class ToolGrammar(BaseModel):
    """The input grammar of a ``custom`` tool (Responses ``format: {type: grammar}``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    syntax: Literal["lark", "regex"]
    definition: str


class ToolDefinition(_Retainable):
    """A tool the model may call.

    ``function`` tools have a JSON-schema ``parameters`` object. ``custom`` tools take free text,
    optionally constrained by ``grammar``; the template shows them as a function with one string
    parameter ``input`` (see docs/frontend.md).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["function", "custom"] = "function"
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    grammar: ToolGrammar | None = None
    retain_ttl: int | None = Field(default=None, ge=1)
    """Retain the rendered prompt up to the end of this tool's definition for this many seconds (a breakpoint
    the worker resolves to a token offset); ``None``: no breakpoint here."""


class ToolChoice(BaseModel):
    """``auto`` (the default), ``none``, ``required`` (any tool), or ``named`` (one tool)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["auto", "none", "required", "named"] = "auto"
    name: str | None = None


class ResponseFormat(BaseModel):
    """Structured output: any JSON object, or JSON matching ``json_schema``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None
    name: str | None = None
    strict: bool | None = None


class ReasoningControl(BaseModel):
    """Whether the model should think, and how much (passed as chat-template kwargs)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    effort: Literal["minimal", "low", "medium", "high"] | None = None
    budget_tokens: int | None = Field(default=None, ge=0)


class PreprocessedRequest(BaseModel):
    """What the frontend sends the router: provider-neutral, hint attached at top level."""

    model_config = ConfigDict(extra="ignore")

    request_id: str = Field(min_length=1)
    model: str
    token_ids: list[int] | None = None
    messages: list[ChatMessage] | None = None
    tools: list[ToolDefinition] = Field(default_factory=list)
    deferred_tools: list[ToolDefinition] = Field(default_factory=list)
    """Tools the client marked ``defer_loading``: the template does not show them (a tool search
    result in the conversation carries their definitions), but the answer's tool calls are parsed
    against them too. A worker that predates the field ignores it."""
    tool_choice: ToolChoice = Field(default_factory=ToolChoice)
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    reasoning: ReasoningControl | None = None
    """``None``: the template's default; otherwise passed to the template as thinking switches."""
    template_kwargs: dict[str, Any] | None = None
    """The client's own chat-template arguments (SGLang's ``chat_template_kwargs``), passed to
    the template after the thinking switches, so the client's win."""
    continue_final_message: bool = False
    """The conversation ends with the start of the answer (an Anthropic prefill, SGLang's
    ``continue_final_message``): the model continues that assistant text instead of starting a
    turn. A worker that predates the field renders it as a finished turn."""
    separate_reasoning: bool = True
    """``False`` (SGLang's field): the reasoning stays in the answer's text, markers and all."""
    stream_reasoning: bool = True
    """``False`` (SGLang's field): the reasoning is sent in one piece once it ends."""
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    session_id: str | None = None
    stream: bool = True
    """``False``: the client reads the answer whole, so the worker sends it in a few larger
    writes (the first chunk at once, the rest held up to ``WHOLE_ANSWER_FLUSH_S``) instead of
    one per token: each hop wakes per write. A worker that predates the field streams."""
    count_only: bool = False
    """Render and count the prompt, answer one chunk with ``usage.prompt_tokens``, generate nothing
    (``/v1/messages/count_tokens``)."""
    kv_hints: dict[str, Any] | None = None
    """The envelope's wire form, opaque to the router; absent when there is no hint."""
    requires: list[str] = Field(default_factory=list)
    """The request's features a worker must implement to answer it as asked
    (:mod:`kvretention.dataplane.features`): a worker refuses one it does not know, before doing
    anything, where one that predates this field takes a newer field as absent."""

    def to_json_bytes(
        self,
        *,
        messages_json: Sequence[Any] | None = None,
        tools_json: Sequence[Any] | None = None,
    ) -> bytes:
        """Serialize with absent optional keys omitted (so no ``"kv_hints": null``).

        ``messages_json``: :func:`message_json` of each message, when the caller has them.
        ``tools_json``: each tool's ``model_dump(exclude_none=True, by_alias=True)``, likewise.

        The same bytes as ``model_dump_json(exclude_none=True, by_alias=True)``, built faster: an
        agent's conversation holds ~1,500 messages and parts, and pydantic's per-model Python
        serializers cost ~2-4 ms of CPU per 200 KB request; the messages become plain dicts here
        and the whole body is encoded once by msgspec (pydantic-core for what msgspec refuses:
        integers past 64 bits in a tool schema). Only a float's exponent may be written
        differently (``1e22`` for ``1e+22``), the same number to any JSON parser."""
        tools = (
            list(tools_json)
            if tools_json is not None and len(tools_json) == len(self.tools)
            else None
        )
        data = self.model_dump(
            exclude_none=True,
            by_alias=True,
            exclude={"messages"} if tools is None else {"messages", "tools"},
        )
        if self.messages is not None or tools is not None:
            ordered: dict[str, Any] = {}
            before = "tools" if tools is None else "deferred_tools"  # both always dumped
            for key, value in data.items():
                if key == before:
                    if self.messages is not None:
                        ordered["messages"] = (
                            [_message_json(m) for m in self.messages]
                            if messages_json is None or len(messages_json) != len(self.messages)
                            else list(messages_json)
                        )
                    if tools is not None:
                        ordered["tools"] = tools
                ordered[key] = value
            data = ordered
        try:
            return _ENCODE(data)
        except (OverflowError, TypeError, msgspec.EncodeError):
            if self.messages is not None:
                data["messages"] = [message_wire(m) for m in self.messages]
            return to_json(data, inf_nan_mode="null")


# The stream's types are msgspec structs, not pydantic models: one is made, written and read per
# generated token at the worker and the frontend, where a model costs ~2 µs to build, ~5 µs to
# write and ~2.5 µs to read, and a struct a tenth of that. Fields equal to their default (``""``,
# ``[]``, ``None``, zero counts) are left out of the JSON, so a text delta stays small; a reader
# takes a missing field as its default.


class Usage(msgspec.Struct, kw_only=True, omit_defaults=True):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    retained_tokens: int | None = None
    """How many leading prompt tokens the engine was asked to retain (the end of the last
    ``kv.retain`` range; the whole prompt for the flat dialect); ``None`` when not hinted. Anthropic
    usage counts the retained part the cache did not already hold as the cache write."""


class ToolCallDelta(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A piece of an output tool call, streamed by ``index`` (0, 1, ... within one answer).

    The first delta of a call carries ``id`` and ``name``; later ones only argument fragments.
    """

    index: Annotated[int, msgspec.Meta(ge=0)]
    id: str | None = None
    name: str | None = None
    arguments: str = ""
    kind: Literal["function", "custom"] = "function"


FinishReason = Literal["stop", "length", "tool_calls", "abort"]


class GenerateChunk(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One streamed piece of the answer, already parsed by the worker: text, reasoning and tool-call
    deltas; the last chunk carries the finish reason (``tool_calls`` when the answer called tools)
    and the usage."""

    text: str = ""
    reasoning: str = ""
    """A delta of the model's reasoning, separated from ``text`` by SGLang's reasoning parser."""
    tool_calls: list[ToolCallDelta] = msgspec.field(default_factory=list)
    token_ids: list[int] = msgspec.field(default_factory=list)
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    prompt_usage: Usage | None = None
    """Optional, on the first chunk: the prompt-side counts (``prompt_tokens``, ``cached_tokens``)
    as soon as they are known, so Anthropic's ``message_start`` can carry the real
    ``input_tokens``. The final chunk's ``usage`` stays the authoritative total."""


chunk_line: Final = msgspec.json.Encoder().encode
"""A ``GenerateChunk`` as one NDJSON line's JSON (without the newline)."""
read_chunk: Final = msgspec.json.Decoder(GenerateChunk).decode
"""One NDJSON line's JSON as a ``GenerateChunk`` (``msgspec.ValidationError`` / ``DecodeError``)."""
