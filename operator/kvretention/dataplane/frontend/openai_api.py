"""The OpenAI endpoints: Chat Completions (``openai_chat``) and Responses (``openai_responses``
parses, ``openai_responses_output`` answers).

Both share field checks, images, schemas and usage in ``openai_shared``; this module is the name
the app and the tests import them by.
"""

from __future__ import annotations

from kvretention.dataplane.frontend.openai_chat import (
    ChatStream,
    chat_response,
    parse_chat,
)
from kvretention.dataplane.frontend.openai_responses import parse_responses
from kvretention.dataplane.frontend.openai_responses_output import (
    ResponsesStream,
    responses_response,
)

__all__ = [
    "ChatStream",
    "ResponsesStream",
    "chat_response",
    "parse_chat",
    "parse_responses",
    "responses_response",
]
