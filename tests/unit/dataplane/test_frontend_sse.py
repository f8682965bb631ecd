"""``sse.plain_event``: the same bytes as ``sse.event`` for every float-free value, named or not
(Anthropic's and Responses' per-token events are named)."""

from __future__ import annotations

from typing import Any, Final

import pytest

from kvretention.dataplane.frontend import sse

EVERY_CODE_POINT: Final = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)


@pytest.mark.parametrize(
    "value",
    [
        {"text": EVERY_CODE_POINT},
        {EVERY_CODE_POINT[:4096]: "a key that needs escapes"},
        {"ints": [0, 1, -1, 2**63 - 1, -(2**63), 2**64, 10**30]},
        {"literals": [None, True, False], "empty": [{}, [], ""]},
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1764680000,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "run", "arguments": '{"cmd": "ls\\n"}'},
                            }
                        ]
                    },
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        },
        '\u2028\u2029\x7f\x00\x1f"\\/',
    ],
    ids=["every code point", "escaped key", "integers", "literals", "chat chunk", "edge chars"],
)
@pytest.mark.parametrize("name", [None, "content_block_delta", "response.output_text.delta"])
def test_plain_event_is_event(value: Any, name: str | None) -> None:
    assert sse.plain_event(value, name=name) == sse.event(value, name=name)


def test_a_lone_surrogate_is_refused_alike() -> None:
    with pytest.raises(UnicodeEncodeError):
        sse.event({"text": "\ud800"})
    with pytest.raises(UnicodeEncodeError):
        sse.plain_event({"text": "\ud800"})
