"""The envelope the frontend forwards: the client's controls, the fleet's priority and default TTL."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvretention.dataplane.frontend.affinity import drop_billing_header
from kvretention.dataplane.frontend.anthropic import parse_messages
from kvretention.dataplane.frontend.config import FrontendConfig
from kvretention.dataplane.frontend.openai.chat_request import parse_chat
from kvretention.dataplane.frontend.openai.responses_request import parse_responses
from kvretention.dataplane.frontend.prepare import apply_hint_policy

USER = [{"role": "user", "content": "hi"}]
BILLING = {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.0.14; cch=ab12c;"}


def chat(**extra: Any) -> Any:
    return parse_chat({"model": "m", "messages": USER, **extra})


def responses(**extra: Any) -> Any:
    return parse_responses({"model": "m", "input": "hi", **extra})


def messages(**extra: Any) -> Any:
    return parse_messages({"model": "m", "max_tokens": 8, "messages": USER, **extra})


@pytest.mark.parametrize(
    ("parsed", "priority", "default_ttl", "expected"),
    [
        pytest.param(chat(), 50, None, None, id="no_controls_no_policy"),
        pytest.param(
            chat(),
            50,
            600,
            {"retain_full_prompt": {"ttl_seconds": 600, "origin": "policy"}},
            id="codex_like_request_gets_the_fleet_default",
        ),
        pytest.param(
            responses(prompt_cache_key="conv-1"),
            50,
            600,
            {"retain_full_prompt": {"ttl_seconds": 600, "origin": "policy"}},
            id="prompt_cache_key_is_not_a_control",
        ),
        pytest.param(
            chat(prompt_cache_options={"mode": "explicit"}),
            50,
            600,
            None,
            id="explicit_mode_without_breakpoints_keeps_nothing",
        ),
        pytest.param(
            chat(prompt_cache_options={}),
            50,
            600,
            {"retain_full_prompt": {"ttl_seconds": 1800}},
            id="client_ttl_wins_over_policy",
        ),
        pytest.param(
            messages(cache_control={"type": "ephemeral"}),
            80,
            None,
            {"retain_full_prompt": {"ttl_seconds": 300}, "priority": 80},
            id="fleet_priority_written",
        ),
        pytest.param(
            messages(),
            80,
            60,
            {"retain_full_prompt": {"ttl_seconds": 60, "origin": "policy"}, "priority": 80},
            id="policy_at_fleet_priority",
        ),
    ],
)
def test_hint_policy(
    parsed: Any, priority: int, default_ttl: int | None, expected: dict[str, Any] | None
) -> None:
    config = FrontendConfig(
        router_url="http://r", hint_priority=priority, default_ttl_seconds=default_ttl
    )
    envelope = apply_hint_policy(parsed, config=config).envelope
    assert (None if envelope is None else envelope.to_wire()) == expected


@pytest.mark.parametrize(
    ("system", "expected"),
    [
        pytest.param(
            [{**BILLING, "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": "s"}],
            None,
            id="only_marker_was_on_the_dropped_block",
        ),
        pytest.param(
            [
                {**BILLING, "cache_control": {"type": "ephemeral", "ttl": "1h"}},
                {"type": "text", "text": "s", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
            ],
            {"retain_prefixes": {"breakpoints": 1}},
            id="one_of_two_left",
        ),
    ],
)
def test_envelope_counts_the_markers_left_after_normalisation(
    system: list[dict[str, Any]], expected: dict[str, Any] | None
) -> None:
    parsed = messages(system=system)
    dropped, changed = drop_billing_header(parsed.messages)
    assert changed
    parsed = apply_hint_policy(
        dataclasses.replace(parsed, messages=dropped), config=FrontendConfig(router_url="http://r")
    )
    envelope = parsed.envelope
    assert (None if envelope is None else envelope.to_wire()) == expected
