"""The whole request path as real processes: official SDK -> frontend -> router -> worker -> engine.

Only the GPU engine is a stand-in (``--engine standin:<dialect>``, the exact signature of
``sglang.Engine.async_generate``); each worker records every engine call to a JSONL file, so the
assertions read what the engine was actually called with.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from support.processes import StartKvretention as Start

MODEL = "standin"
REPLY = "Hello from the kvretention stand-in."


class Fleet:
    """A frontend, a router and the workers behind it, with each worker's engine-call record."""

    def __init__(self, frontend: Any, router: Any, records: dict[str, Path]) -> None:
        self.frontend, self.router, self.records = frontend, router, records
        self.openai = openai.OpenAI(
            base_url=frontend.base_url + "/v1", api_key="unused", max_retries=0, timeout=20
        )
        self.anthropic = anthropic.Anthropic(
            base_url=frontend.base_url, api_key="unused", max_retries=0, timeout=20
        )

    def engine_calls(self, word: str) -> dict[str, list[dict[str, Any]]]:
        """Engine calls whose prompt mentions ``word``, by worker name."""
        out: dict[str, list[dict[str, Any]]] = {}
        for name, record in self.records.items():
            lines = record.read_text().splitlines() if record.exists() else []
            hits = [
                c
                for c in map(json.loads, lines)
                if c["event"] == "generate" and word in json.dumps(c["kwargs"].get("prompt"))
            ]
            if hits:
                out[name] = hits
        return out

    def only_call(self, word: str) -> dict[str, Any]:
        calls = self.engine_calls(word)
        assert len(calls) == 1, calls
        ((call,),) = calls.values()
        return call


def make_fleet(
    start: Start,
    tmp: Path,
    workers: dict[str, tuple[str, list[str], dict[str, str]]],
    *,
    disaggregated: bool = False,
) -> Fleet:
    """``workers``: name -> (dialect, extra worker args, extra env)."""
    records: dict[str, Path] = {}
    urls: dict[str, str] = {}
    for name, (dialect, args, env) in workers.items():
        records[name] = tmp / f"{name}.jsonl"
        proc = start(
            ["worker", "--engine", f"standin:{dialect}", *args],
            env={"KVR_STANDIN_RECORD": str(records[name]), **env},
        )
        urls[name] = proc.base_url
    if disaggregated:
        router_args = ["--prefill-worker", urls["prefill"], "--decode-worker", urls["decode"]]
    else:
        router_args = [a for url in urls.values() for a in ("--worker", url)]
    router = start(["router", *router_args, "--health-interval", "0.3"])
    frontend = start(["frontend", "--router-url", router.base_url, "--model", MODEL])
    return Fleet(frontend, router, records)


def word() -> str:
    return f"w{uuid.uuid4().hex[:10]}"


def versioned_ttl(call: dict[str, Any]) -> int:
    hints = call["kwargs"]["kv_hints"]
    (action,) = hints["actions"]
    assert (action["action_type"], action["action_version"]) == ("kv.retain", "1.0")
    assert hints["message_id"] == call["rid"]
    (directive,) = action["payload"]["directives"]  # the full prompt: [0, prompt_tokens)
    assert directive["start"] == 0 and directive["end"] > 0
    ttl: int = directive["duration"]
    return ttl


# ------------------------------------------------------------------ aggregated, versioned (0.5.23)


@pytest.fixture(scope="module")
def versioned(start: Start, tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    tmp = tmp_path_factory.mktemp("versioned")
    return make_fleet(start, tmp, {"w0": ("versioned", [], {}), "w1": ("versioned", [], {})})


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_openai_chat_hint_reaches_the_engine_as_versioned_1800s(
    versioned: Fleet, stream: bool
) -> None:
    w = word()
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": w}],
        "prompt_cache_options": {"mode": "implicit", "ttl": "30m"},
    }
    if stream:
        chunks = list(versioned.openai.chat.completions.create(stream=True, **kwargs))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        text = versioned.openai.chat.completions.create(**kwargs).choices[0].message.content or ""
    assert text == REPLY
    assert versioned_ttl(versioned.only_call(w)) == 1800


def test_openai_responses_hint_reaches_the_engine(versioned: Fleet) -> None:
    w = word()
    response = versioned.openai.responses.create(
        model=MODEL, input=w, prompt_cache_options={"mode": "implicit"}
    )
    assert response.output_text == REPLY
    assert versioned_ttl(versioned.only_call(w)) == 1800


@pytest.mark.parametrize(
    ("cache_control", "ttl"),
    [({"type": "ephemeral"}, 300), ({"type": "ephemeral", "ttl": "1h"}, 3600)],
)
def test_anthropic_top_level_cache_control_reaches_the_engine(
    versioned: Fleet, cache_control: Any, ttl: int
) -> None:
    w = word()
    message = versioned.anthropic.messages.create(
        model=MODEL,
        max_tokens=32,
        messages=[{"role": "user", "content": w}],
        cache_control=cache_control,
    )
    assert "".join(b.text for b in message.content if b.type == "text") == REPLY
    assert versioned_ttl(versioned.only_call(w)) == ttl


def test_unhinted_requests_call_the_engine_without_kv_hints(versioned: Fleet) -> None:
    plain_chat, keyed_chat, plain_msg = word(), word(), word()
    versioned.openai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": plain_chat}]
    )
    # prompt_cache_key is routing metadata for OpenAI, not retention intent.
    versioned.openai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": keyed_chat}], prompt_cache_key="k1"
    )
    versioned.anthropic.messages.create(
        model=MODEL, max_tokens=16, messages=[{"role": "user", "content": plain_msg}]
    )
    for w in (plain_chat, keyed_chat, plain_msg):
        call = versioned.only_call(w)
        assert call["kv_hints_passed"] is False
        assert "kv_hints" not in call["kwargs"]


def test_sticky_session_keeps_one_worker(versioned: Fleet) -> None:
    words = [word() for _ in range(4)]
    for w in words:
        versioned.openai.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": w}],
            extra_headers={"x-session-id": "e2e-session"},
        )
    owners = {name for w in words for name in versioned.engine_calls(w)}
    assert len(owners) == 1


# ------------------------------------------------------------------ an engine without kv_hints


@pytest.fixture(scope="module")
def legacy(start: Start, tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    tmp = tmp_path_factory.mktemp("legacy")
    return make_fleet(start, tmp, {"old": ("none", [], {})})


def test_hinted_openai_on_old_engine_is_a_visible_compatibility_error(legacy: Fleet) -> None:
    w = word()
    with pytest.raises(openai.APIStatusError) as info:
        legacy.openai.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": w}],
            prompt_cache_options={"mode": "implicit"},
        )
    assert info.value.status_code == 501
    assert "kv_hints" in info.value.message
    assert legacy.engine_calls(w) == {}


def test_hinted_anthropic_on_old_engine_is_a_visible_compatibility_error(legacy: Fleet) -> None:
    w = word()
    with pytest.raises(anthropic.APIStatusError) as info:
        legacy.anthropic.messages.create(
            model=MODEL,
            max_tokens=16,
            messages=[{"role": "user", "content": w}],
            cache_control={"type": "ephemeral"},
        )
    assert info.value.status_code == 501
    assert "kv_hints" in str(info.value)
    assert legacy.engine_calls(w) == {}


def test_unhinted_traffic_on_old_engine_still_works(legacy: Fleet) -> None:
    w = word()
    completion = legacy.openai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": w}]
    )
    assert completion.choices[0].message.content == REPLY
    assert "kv_hints" not in legacy.only_call(w)["kwargs"]


# ------------------------------------------------------------------ disaggregated, flat dialect


@pytest.fixture(scope="module")
def disaggregated(start: Start, tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    tmp = tmp_path_factory.mktemp("pd")
    return make_fleet(
        start,
        tmp,
        {
            "prefill": ("flat", ["--role", "prefill", "--bootstrap-port", "8998"], {}),
            "decode": ("flat", ["--role", "decode"], {}),
        },
        disaggregated=True,
    )


def test_disaggregated_prefill_and_decode_both_get_the_hint(disaggregated: Fleet) -> None:
    w = word()
    message = disaggregated.anthropic.messages.create(
        model=MODEL,
        max_tokens=32,
        messages=[{"role": "user", "content": w}],
        cache_control={"type": "ephemeral", "ttl": "1h"},
    )
    assert "".join(b.text for b in message.content if b.type == "text") == REPLY
    calls = disaggregated.engine_calls(w)
    assert set(calls) == {"prefill", "decode"}
    (p,), (d,) = calls["prefill"], calls["decode"]
    for call in (p, d):
        assert call["kwargs"]["kv_hints"] == {"retain_full_prompt": {"ttl_seconds": 3600}}
        assert call["kwargs"]["bootstrap_port"] == 8998
    assert p["kwargs"]["bootstrap_room"] == d["kwargs"]["bootstrap_room"]


def test_disaggregated_unhinted_has_no_kv_hints(disaggregated: Fleet) -> None:
    w = word()
    disaggregated.openai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": w}]
    )
    calls = disaggregated.engine_calls(w)
    assert set(calls) == {"prefill", "decode"}
    assert all("kv_hints" not in c["kwargs"] for cs in calls.values() for c in cs)


# ------------------------------------------------------------------ a worker that dies


def test_killed_worker_gives_the_client_a_clean_error(
    start: Start, tmp_path_factory: pytest.TempPathFactory
) -> None:
    fleet = make_fleet(
        start,
        tmp_path_factory.mktemp("dying"),
        {"doomed": ("versioned", [], {"KVR_STANDIN_FAIL": "die"})},
    )
    with pytest.raises(openai.APIStatusError) as info:
        fleet.openai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": word()}]
        )
    assert info.value.status_code == 502
    assert info.value.code == "worker_unavailable"
    assert "Traceback" not in info.value.message
    # The router has ejected it: the next request is refused at once with no_workers.
    with pytest.raises(openai.APIStatusError) as again:
        fleet.openai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": word()}]
        )
    assert (again.value.status_code, again.value.code) == (503, "no_workers")
