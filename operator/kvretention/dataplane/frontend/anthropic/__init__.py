"""Anthropic Messages: request parsing (``request``: ``fields``, ``tools``, ``conversation``) and
response/SSE formatting (``answer``).

The top-level ``cache_control`` is normalized (and block-level ones refused) by
``kvretention.hints.anthropic`` before the rest of the body is checked. Every other top-level field,
block type and block key is one of: honoured, accepted and ignored (``NO_OPS``, counted by
``compat``), or a 400 naming it (``REFUSED``). Keys this server does not know are ignored and
counted; block and tool types it does not know are refused (``compat``'s rule). Deferred tools
(``defer_loading``) stay out of the prompt's tool list until a ``tool_reference`` block in a tool
result loads them, as Anthropic's tool search does. The stream follows the
Messages event sequence the official SDK parses: ``message_start``, then for each content block
(``thinking``, ``text``, ``tool_use``, each its own index) ``content_block_start``,
``content_block_delta``..., ``content_block_stop``; then ``message_delta`` and ``message_stop``.
"""

from kvretention.dataplane.frontend.anthropic.answer import (
    MessagesStream,
    count_tokens_response,
    messages_response,
    tool_input,
    tool_use_id,
    usage_object,
)
from kvretention.dataplane.frontend.anthropic.fields import NO_OPS, REFUSED
from kvretention.dataplane.frontend.anthropic.request import parse_count_tokens, parse_messages

__all__ = [
    "NO_OPS",
    "REFUSED",
    "MessagesStream",
    "count_tokens_response",
    "messages_response",
    "parse_count_tokens",
    "parse_messages",
    "tool_input",
    "tool_use_id",
    "usage_object",
]
