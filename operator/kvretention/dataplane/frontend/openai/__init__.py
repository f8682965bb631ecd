"""The OpenAI endpoints: Chat Completions (``chat_request``, ``chat_conversation``, ``chat_answer``)
and Responses (``responses_request``, ``responses_conversation``, ``responses_tools``,
``responses_answer``).

Both share field checks, images, schemas and sampling in ``fields``; this package is the name the
app and the tests import them by.
"""

from __future__ import annotations

from kvretention.dataplane.frontend.openai.chat_answer import ChatStream, chat_response
from kvretention.dataplane.frontend.openai.chat_request import parse_chat
from kvretention.dataplane.frontend.openai.responses_answer import (
    ResponsesStream,
    responses_response,
)
from kvretention.dataplane.frontend.openai.responses_request import parse_responses

__all__ = [
    "ChatStream",
    "ResponsesStream",
    "chat_response",
    "parse_chat",
    "parse_responses",
    "responses_response",
]
