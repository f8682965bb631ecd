"""The provider endpoints the frontend serves, as data: a name (the metrics and trace label), the
provider whose error shape it speaks, and the pure functions that parse a body and answer it.

The request flow in :mod:`kvretention.dataplane.frontend.app` is the same for every endpoint; only
these functions differ, so an endpoint is a table row, not a class.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Protocol

from kvretention.dataplane.frontend.anthropic import (
    MessagesStream,
    messages_response,
    parse_count_tokens,
    parse_messages,
)
from kvretention.dataplane.frontend.common import (
    Completion,
    ParseBody,
    ParsedRequest,
    StreamFormatter,
)
from kvretention.dataplane.frontend.errors import Provider
from kvretention.dataplane.frontend.openai import (
    ChatStream,
    ResponsesStream,
    chat_response,
    parse_chat,
    parse_responses,
    responses_response,
)


class BuildResponse(Protocol):
    def __call__(
        self, parsed: ParsedRequest, result: Completion, /, *, request_id: str
    ) -> dict[str, Any]: ...


class BuildStream(Protocol):
    def __call__(self, parsed: ParsedRequest, /, *, request_id: str) -> StreamFormatter: ...


@dataclass(frozen=True)
class Endpoint:
    """What admission needs: the endpoint's label, its provider, and its body parser."""

    endpoint: str
    provider: Provider
    parse: ParseBody


@dataclass(frozen=True)
class GenerateEndpoint(Endpoint):
    """An endpoint that generates: a full answer, or a stream formatter for SSE."""

    response: BuildResponse
    formatter: BuildStream


CHAT: Final = GenerateEndpoint(
    endpoint="chat.completions",
    provider=Provider.OPENAI,
    parse=parse_chat,
    response=chat_response,
    formatter=ChatStream,
)
RESPONSES: Final = GenerateEndpoint(
    endpoint="responses",
    provider=Provider.OPENAI,
    parse=parse_responses,
    response=responses_response,
    formatter=ResponsesStream,
)
MESSAGES: Final = GenerateEndpoint(
    endpoint="messages",
    provider=Provider.ANTHROPIC,
    parse=parse_messages,
    response=messages_response,
    formatter=MessagesStream,
)
COUNT_TOKENS: Final = Endpoint(
    endpoint="messages.count_tokens",
    provider=Provider.ANTHROPIC,
    parse=parse_count_tokens,
)
"""``/v1/messages/count_tokens``: parsed like Messages, answered from the worker's count."""
