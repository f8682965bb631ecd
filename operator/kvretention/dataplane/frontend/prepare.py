"""What the router gets for a parsed request: the envelope after the fleet's hint policy, the
placement headers, and the ``PreprocessedRequest`` itself."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from typing import Any

from kvretention.dataplane.breakpoints import Marker
from kvretention.dataplane.features import features_of
from kvretention.dataplane.frontend.affinity import header_safe, prefix_chain
from kvretention.dataplane.frontend.common import ParsedRequest
from kvretention.dataplane.frontend.config import FrontendConfig
from kvretention.dataplane.frontend.repeats import conversation_markers
from kvretention.dataplane.frontend.tokenizer import ChatTokenizer
from kvretention.dataplane.protocol import HEADER_PREFIX, HEADER_SESSION, PreprocessedRequest
from kvretention.dataplane.template_input import TemplateInputError
from kvretention.hints.envelope import KvHintEnvelope, KvPrefixRetention
from kvretention.hints.intent import CacheHints, build_envelope


def router_headers(
    parsed: ParsedRequest,
    session_id: str | None,
    *,
    config: FrontendConfig,
    tenant: str | None = None,
) -> dict[str, str]:
    """Placement data for the router, in headers so it never parses the body: the session key
    and, for cache-aware placement, the prompt's prefix-hash chain."""
    headers: dict[str, str] = {}
    if session_id is not None:
        headers[HEADER_SESSION] = header_safe(session_id)
    if config.prefix_routing:
        chain = prefix_chain(parsed.messages, parsed.tools, tenant=tenant)
        headers[HEADER_PREFIX] = ",".join(chain)
    return headers


def apply_hint_policy(parsed: ParsedRequest, *, config: FrontendConfig) -> ParsedRequest:
    """The envelope the router gets: the breakpoint count the conversation really carries (a
    normalisation may have dropped a marked block), the fleet's priority, and its default TTL
    for a request that sent no cache control."""
    return hint_policy(parsed, config=config)[0]


def hint_policy(
    parsed: ParsedRequest, *, config: FrontendConfig
) -> tuple[ParsedRequest, int | None]:
    """:func:`apply_hint_policy` and the result's :func:`longest_ttl`, finding the conversation's
    markers once (a walk of every block of a 200 KB agent body)."""
    envelope = parsed.envelope
    markers: list[Marker] | None = None
    if envelope is not None and envelope.prefix_count:
        markers = conversation_markers(parsed.messages, parsed.tools)
        envelope = with_prefix_count(envelope, len(markers))
    hints = CacheHints(envelope=envelope, client_controls=parsed.client_controls)
    final = build_envelope(
        hints, priority=config.hint_priority, default_ttl_seconds=config.default_ttl_seconds
    )
    if final is not parsed.envelope:
        parsed = dataclasses.replace(parsed, envelope=final)
    return parsed, longest_ttl(parsed, markers=markers)


def with_prefix_count(envelope: KvHintEnvelope | None, count: int) -> KvHintEnvelope | None:
    """``envelope`` announcing ``count`` breakpoints (``None`` when nothing is left to retain)."""
    if envelope is None or envelope.prefix_count == count:
        return envelope
    prefixes = KvPrefixRetention(breakpoints=count) if count else None
    updated = envelope.model_copy(update={"retain_prefixes": prefixes})
    return None if updated.is_empty() else updated


def longest_ttl(parsed: ParsedRequest, *, markers: Sequence[Marker] | None = None) -> int | None:
    """The longest TTL the request's envelope retains anything for (the hints metric's label);
    ``markers`` are the conversation's, when the caller found them already."""
    envelope = parsed.envelope
    if envelope is None:
        return None
    ttls = []
    if envelope.prefix_count:
        if markers is None:
            markers = conversation_markers(parsed.messages, parsed.tools)
        ttls = [m.ttl_seconds for m in markers]
    if envelope.retain_full_prompt is not None:
        ttls.append(envelope.retain_full_prompt.ttl_seconds)
    return max(ttls, default=None)


def build_preprocessed(
    parsed: ParsedRequest,
    *,
    request_id: str,
    session_id: str | None,
    tokenizer: ChatTokenizer | None,
    model: str | None = None,
    count_only: bool = False,
    kv_hints: dict[str, Any] | None = None,
) -> PreprocessedRequest:
    """The router request: token ids when a tokenizer can render it, messages always; same hint.

    ``model`` is the served name when the client used an alias; ``kv_hints`` the envelope's wire
    form when the caller made it already (the request flow records it in the trace), so it is
    made once per request.
    """
    wire = kv_hints
    if wire is None and parsed.envelope is not None:
        wire = parsed.envelope.to_wire()
    request = PreprocessedRequest(
        request_id=request_id,
        model=model or parsed.model,
        messages=parsed.messages,
        tools=parsed.tools,
        deferred_tools=parsed.deferred_tools,
        tool_choice=parsed.tool_choice,
        parallel_tool_calls=parsed.parallel_tool_calls,
        response_format=parsed.response_format,
        reasoning=parsed.reasoning,
        template_kwargs=parsed.template_kwargs,
        continue_final_message=parsed.continue_final_message,
        separate_reasoning=parsed.separate_reasoning,
        stream_reasoning=parsed.stream_reasoning,
        sampling=parsed.sampling,
        session_id=session_id,
        stream=parsed.stream,
        count_only=count_only,
        kv_hints=wire,
    )
    request.requires = features_of(request)
    if tokenizer is not None and (parsed.envelope is None or not parsed.envelope.prefix_count):
        # Breakpoints are resolved against the worker's own rendering, so those travel as
        # messages only. The conversation still travels: the worker needs the tools to parse the answer.
        # Same rendering as the worker (tools, tool choice, thinking switches); None for images.
        # A conversation the template refuses travels as messages: the worker answers its 400.
        with contextlib.suppress(TemplateInputError):
            request.token_ids = tokenizer.encode_request(request)
    return request
