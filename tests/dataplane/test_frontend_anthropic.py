"""The frontend as a real process, driven by the official ``anthropic`` SDK, against the stand-in."""

from __future__ import annotations

import json
import urllib.request
import uuid
from typing import Any

import anthropic
import pytest
from router_standin import CANNED, RouterStandIn, parse_sse

EPHEMERAL = {"type": "ephemeral"}
MARK = {"cache_control": EPHEMERAL}


@pytest.fixture(scope="module")
def frontend(router_standin: RouterStandIn, kvretention_process: Any) -> Any:
    args = ["frontend", "--router-url", router_standin.base_url, "--model", "claude-test"]
    return kvretention_process([*args, "--upstream-timeout", "1"])


@pytest.fixture(scope="module")
def client(frontend: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=frontend.base_url, api_key="unused", max_retries=0, timeout=15
    )


def _any(value: object) -> Any:
    """SDK params are TypedDicts; these tests send shapes the SDK does not model on purpose."""
    return value


def tag() -> str:
    return f"tag-{uuid.uuid4().hex[:12]}"


def user(text: str) -> Any:
    return [{"role": "user", "content": text}]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize(
    ("cache_control", "ttl"),
    [
        pytest.param(None, None, id="unhinted"),
        pytest.param(EPHEMERAL, 300, id="ephemeral_default"),
        pytest.param({"type": "ephemeral", "ttl": "5m"}, 300, id="ttl_5m"),
        pytest.param({"type": "ephemeral", "ttl": "1h"}, 3600, id="ttl_1h"),
    ],
)
def test_messages_forward_hint_exactly_when_asked(
    client: anthropic.Anthropic,
    router_standin: RouterStandIn,
    cache_control: dict[str, Any] | None,
    ttl: int | None,
    stream: bool,
) -> None:
    word = tag()
    kwargs: dict[str, Any] = {
        "model": "claude-test",
        "max_tokens": 64,
        "system": [{"type": "text", "text": "be brief"}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": word}]}],
    }
    if cache_control is not None:
        kwargs["cache_control"] = cache_control
    if stream:
        with client.messages.stream(**kwargs) as events:
            text = "".join(events.text_stream)
            message = events.get_final_message()
    else:
        message = client.messages.create(**kwargs)
        text = "".join(b.text for b in message.content if b.type == "text")
    assert text == "".join(CANNED)
    assert message.stop_reason == "end_turn"
    assert message.usage.output_tokens == 4
    [body] = router_standin.bodies_for(word)
    expected = None if ttl is None else {"retain_full_prompt": {"ttl_seconds": ttl}}
    assert body.get("kv_hints") == expected
    assert ("kv_hints" in body) == (ttl is not None)
    assert "cache_control" not in json.dumps(body)
    assert body["messages"][0] == {"role": "system", "content": "be brief"}
    assert body["sampling"]["max_new_tokens"] == 64


def test_messages_map_sampling_and_session(frontend: Any, router_standin: RouterStandIn) -> None:
    word = tag()
    client = anthropic.Anthropic(
        base_url=frontend.base_url,
        api_key="unused",
        max_retries=0,
        default_headers={"x-session-id": "claude-sess"},
    )
    message = client.messages.create(
        model="claude-test",
        max_tokens=2,
        stop_sequences=["\n\nHuman:"],
        messages=user(word),
        # this SDK release no longer types the sampling knobs; the Messages API still takes them
        extra_body={"temperature": 0.2, "top_p": 0.8, "top_k": 20},
    )
    assert message.stop_reason == "max_tokens"
    [body] = router_standin.bodies_for(word)
    assert body["session_id"] == "claude-sess"
    assert body["sampling"] == {
        "max_new_tokens": 2,
        "temperature": 0.2,
        "top_p": 0.8,
        "top_k": 20,
        "stop": ["\n\nHuman:"],
    }


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize(
    ("fields", "param"),
    [
        pytest.param(
            {"system": [{"type": "text", "text": "sys", **MARK}]},
            "system.0.cache_control",
            id="system_block",
        ),
        pytest.param(
            {
                "tools": [
                    {"name": "t", "input_schema": {"type": "object"}, **MARK},
                ]
            },
            "tools.0.cache_control",
            id="tool_definition",
        ),
        pytest.param(
            {"messages_block": {"type": "text", "text": "x", **MARK}},
            "messages.0.content.1.cache_control",
            id="message_text_block",
        ),
        pytest.param(
            {
                "messages_block": {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
                    **MARK,
                }
            },
            "messages.0.content.1.cache_control",
            id="message_image_block",
        ),
        pytest.param(
            {"cache_control": {"type": "ephemeral", "ttl": "2h"}},
            "cache_control.ttl",
            id="top_level_bad_ttl",
        ),
    ],
)
@pytest.mark.parametrize("top_level", [False, True], ids=["alone", "with_top_level"])
def test_messages_rejections_never_reach_the_router(
    client: anthropic.Anthropic,
    router_standin: RouterStandIn,
    fields: dict[str, Any],
    param: str,
    top_level: bool,
    stream: bool,
) -> None:
    word = tag()
    fields = dict(fields)
    content: list[dict[str, Any]] = [{"type": "text", "text": word}]
    if "messages_block" in fields:
        content.append(fields.pop("messages_block"))
    if top_level and "cache_control" not in fields:
        fields["cache_control"] = EPHEMERAL
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(
            model="claude-test",
            max_tokens=16,
            messages=_any([{"role": "user", "content": content}]),
            stream=stream,
            **fields,
        )
    assert info.value.status_code == 400
    assert info.value.response.headers["content-type"].startswith("application/json")
    body = info.value.body
    assert isinstance(body, dict)
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith(f"{param}: ")
    assert router_standin.bodies_for(word) == []


def test_messages_unknown_model_is_404(
    client: anthropic.Anthropic, router_standin: RouterStandIn
) -> None:
    word = tag()
    with pytest.raises(anthropic.NotFoundError) as info:
        client.messages.create(model="claude-nope", max_tokens=8, messages=user(word))
    assert isinstance(info.value.body, dict)
    assert info.value.body["error"]["type"] == "not_found_error"
    assert router_standin.bodies_for(word) == []


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_messages_kv_hints_unsupported_before_stream(
    client: anthropic.Anthropic, router_standin: RouterStandIn, stream: bool
) -> None:
    word = tag()
    with pytest.raises(anthropic.APIStatusError) as info:
        client.messages.create(
            model="claude-test",
            max_tokens=8,
            messages=user(f"{word} [[kv_unsupported]]"),
            cache_control=_any(EPHEMERAL),
            stream=stream,
        )
    assert info.value.status_code == 501
    assert isinstance(info.value.body, dict)
    assert "kv_hints" in info.value.body["error"]["message"]
    assert "cache_control" in info.value.body["error"]["message"]
    [body] = router_standin.bodies_for(word)
    assert body["kv_hints"] == {"retain_full_prompt": {"ttl_seconds": 300}}


def test_messages_kv_hints_unsupported_mid_stream(client: anthropic.Anthropic) -> None:
    texts: list[str] = []
    with (
        pytest.raises(anthropic.APIStatusError) as info,
        client.messages.stream(
            model="claude-test",
            max_tokens=8,
            messages=user(f"{tag()} [[kv_unsupported_midstream]]"),
            cache_control=_any(EPHEMERAL),
        ) as events,
    ):
        texts.extend(events.text_stream)
    assert texts == [CANNED[0]]
    assert isinstance(info.value.body, dict)
    assert info.value.body["error"]["type"] == "api_error"
    assert "kv_hints" in info.value.body["error"]["message"]


def test_messages_sse_is_well_formed(frontend: Any) -> None:
    body = {
        "model": "claude-test",
        "max_tokens": 16,
        "stream": True,
        "cache_control": EPHEMERAL,
        "messages": user(tag()),
    }
    request = urllib.request.Request(
        frontend.base_url + "/v1/messages",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=15) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        frames = parse_sse(resp.read())
    events = [(name, json.loads(data)) for name, data in frames]
    assert all(name == data["type"] for name, data in events)
    names = [name for name, _ in events]
    deltas = len(CANNED)
    assert names == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * deltas,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[0][1]["message"]["content"] == []
    assert events[-2][1]["delta"]["stop_reason"] == "end_turn"
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert text == "".join(CANNED)
