"""Dialect detection and the kv_hints argument built for each dialect (pure).

The versioned payload is checked against the published ``kv.retain`` 1.0 rules
(``tests/support/kv_retain_rules.py``); the engine tier runs SGLang's own decoder on it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvretention.dataplane.breakpoints import ResolvedBreakpoint
from kvretention.dataplane.worker.dialect import (
    ACTION_TYPE,
    ACTION_VERSION,
    PROTOCOL_VERSION,
    Dialect,
    PrefixHintUnsupported,
    build_kv_hints,
    detect_dialect,
    parameter_names,
    require_support,
    retained_tokens,
)
from kvretention.dataplane.worker.standin import STANDINS
from kvretention.hints import (
    DEFAULT_PRIORITY,
    KvHintEnvelope,
    KvPrefixRetention,
    KvRetentionHint,
    envelope_or_none,
)
from support.kv_retain_rules import RuleViolation, check_envelope

WIRE = Path(__file__).resolve().parents[2] / "fixtures" / "kv_hints_wire.json"


def hinted_wire_entries() -> list[dict[str, Any]]:
    """Valid entries of the shared wire fixture that carry a hint."""
    valid: list[dict[str, Any]] = json.loads(WIRE.read_text())["valid"]
    return [e for e in valid if e["expected"] is not None]


@pytest.mark.parametrize(
    ("params", "has_decoder", "expected"),
    [
        (["prompt", "rid"], False, Dialect.NONE),
        (["prompt", "rid"], True, Dialect.NONE),
        (["prompt", "kv_hints", "rid"], False, Dialect.FLAT),
        (["prompt", "kv_hints", "rid"], True, Dialect.VERSIONED),
    ],
)
def test_detect_dialect(params: list[str], has_decoder: bool, expected: Dialect) -> None:
    assert detect_dialect(params, has_versioned_decoder=has_decoder) is expected


@pytest.mark.parametrize("dialect", list(Dialect))
def test_each_standin_is_detected_as_its_own_dialect(dialect: Dialect) -> None:
    cls = STANDINS[dialect]
    engine = cls()
    detected = detect_dialect(
        parameter_names(engine.async_generate), has_versioned_decoder=cls.has_versioned_decoder
    )
    assert detected is dialect


PROMPT_TOKENS = 1_000


def resolved(*prefixes: tuple[int, int]) -> list[ResolvedBreakpoint]:
    return [
        ResolvedBreakpoint(f"messages[{i}]", ttl, 0, end) for i, (end, ttl) in enumerate(prefixes)
    ]


@pytest.mark.parametrize("entry", hinted_wire_entries(), ids=lambda e: e["name"])
def test_flat_is_the_v1_envelope(entry: dict[str, Any]) -> None:
    env = envelope_or_none(entry["wire"])
    assert env is not None
    hints = build_kv_hints(env, Dialect.FLAT, request_id="r", prompt_tokens=PROMPT_TOKENS)
    assert hints == {"retain_full_prompt": {"ttl_seconds": env.retain_full_prompt.ttl_seconds}}


@pytest.mark.parametrize("entry", hinted_wire_entries(), ids=lambda e: e["name"])
def test_versioned_full_prompt_is_one_directive_over_the_prompt(entry: dict[str, Any]) -> None:
    env = envelope_or_none(entry["wire"])
    assert env is not None and env.retain_full_prompt is not None
    hints = build_kv_hints(env, Dialect.VERSIONED, request_id="req-7", prompt_tokens=PROMPT_TOKENS)
    directives = check_envelope(hints)
    assert hints is not None and hints["message_id"] == "req-7"
    (action,) = hints["actions"]
    assert (action["action_type"], action["action_version"]) == (ACTION_TYPE, ACTION_VERSION)
    assert action["action_type"] == "kv.retain" and action["action_version"] == "1.0"
    assert hints["protocol_version"] == PROTOCOL_VERSION == "0.1"
    assert action["payload"]["scope"] is None
    assert directives == [
        {
            "start": 0,
            "end": PROMPT_TOKENS,
            "priority": DEFAULT_PRIORITY,
            "duration": env.retain_full_prompt.ttl_seconds,
        }
    ]


PREFIX_ENV = KvHintEnvelope(retain_prefixes=KvPrefixRetention(breakpoints=2))
FULL_AND_PREFIX_ENV = KvHintEnvelope(
    retain_full_prompt=KvRetentionHint(ttl_seconds=300),
    retain_prefixes=KvPrefixRetention(breakpoints=2),
    priority=70,
)

# (row id, envelope, resolved prefixes (token_end, ttl), expected directives (start, end, prio, dur))
VERSIONED_ROWS: list[
    tuple[str, KvHintEnvelope, list[tuple[int, int]], list[tuple[int, int, int, int]]]
] = [
    (
        "claude_code_1h_system_5m_tail",
        PREFIX_ENV,
        [(400, 3600), (900, 300)],
        [(0, 400, 50, 3600), (400, 900, 50, 300)],
    ),
    (
        "a_later_longer_ttl_covers_the_earlier",
        PREFIX_ENV,
        [(400, 300), (900, 3600)],
        [(0, 900, 50, 3600)],
    ),
    (
        "prefixes_and_full_prompt_with_fleet_priority",
        FULL_AND_PREFIX_ENV,
        [(400, 3600), (900, 300)],
        [(0, 400, 70, 3600), (400, 1000, 70, 300)],
    ),
    (
        "breakpoint_at_the_prompt_end_merges_with_full",
        FULL_AND_PREFIX_ENV,
        [(1000, 3600), (10, 300)],
        [(0, 1000, 70, 3600)],
    ),
    (
        "policy_full_prompt",
        KvHintEnvelope(retain_full_prompt=KvRetentionHint(ttl_seconds=600, origin="policy")),
        [],
        [(0, 1000, 50, 600)],
    ),
]


@pytest.mark.parametrize(
    ("envelope", "prefixes", "expected"),
    [pytest.param(e, p, x, id=n) for n, e, p, x in VERSIONED_ROWS],
)
def test_versioned_prefix_directives(
    envelope: KvHintEnvelope,
    prefixes: list[tuple[int, int]],
    expected: list[tuple[int, int, int, int]],
) -> None:
    hints = build_kv_hints(
        envelope,
        Dialect.VERSIONED,
        request_id="r",
        prompt_tokens=PROMPT_TOKENS,
        prefixes=resolved(*prefixes),
        scope="fleet-a",
    )
    directives = check_envelope(hints)
    assert [(d["start"], d["end"], d["priority"], d["duration"]) for d in directives] == expected
    assert hints is not None and hints["actions"][0]["payload"]["scope"] == "fleet-a"


def test_prefix_hint_whose_breakpoints_were_all_dropped_builds_nothing() -> None:
    assert (
        build_kv_hints(PREFIX_ENV, Dialect.VERSIONED, request_id="r", prompt_tokens=PROMPT_TOKENS)
        is None
    )


@pytest.mark.parametrize("envelope", [PREFIX_ENV, FULL_AND_PREFIX_ENV], ids=["prefix", "both"])
def test_flat_dialect_refuses_prefix_hints_never_widens(envelope: KvHintEnvelope) -> None:
    with pytest.raises(PrefixHintUnsupported, match="can retain only the full prompt"):
        require_support(envelope, Dialect.FLAT)
    with pytest.raises(PrefixHintUnsupported) as info:
        build_kv_hints(
            envelope,
            Dialect.FLAT,
            request_id="r",
            prompt_tokens=PROMPT_TOKENS,
            prefixes=resolved((400, 300)),
        )
    assert info.value.dialect is Dialect.FLAT
    require_support(envelope, Dialect.VERSIONED)  # no error


def test_a_breakpoint_past_the_prompt_is_a_bug_not_a_hint() -> None:
    with pytest.raises(ValueError, match="past the prompt"):
        build_kv_hints(
            PREFIX_ENV,
            Dialect.VERSIONED,
            request_id="r",
            prompt_tokens=10,
            prefixes=resolved((11, 300)),
        )


@pytest.mark.parametrize("dialect", list(Dialect))
def test_no_hint_builds_nothing(dialect: Dialect) -> None:
    assert build_kv_hints(KvHintEnvelope(), dialect, request_id="r", prompt_tokens=5) is None


@pytest.mark.parametrize("envelope", [KvHintEnvelope.retain(300), PREFIX_ENV])
def test_none_dialect_builds_nothing_even_for_a_hint(envelope: KvHintEnvelope) -> None:
    assert build_kv_hints(envelope, Dialect.NONE, request_id="r", prompt_tokens=5) is None


# The checker itself must fail on each broken rule, or the tests above prove nothing.
GOOD = {"start": 0, "end": 10, "priority": 50, "duration": 300}


def valid_envelope(*directives: dict[str, Any], actions: int = 1) -> dict[str, Any]:
    return {
        "protocol_version": "0.1",
        "message_id": "m",
        "actions": [
            {
                "action_id": f"a{n}",
                "action_type": "kv.retain",
                "action_version": "1.0",
                "payload": {"scope": None, "directives": list(directives or [GOOD])},
            }
            for n in range(actions)
        ],
    }


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def change(envelope: dict[str, Any]) -> dict[str, Any]:
        node = envelope
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        return envelope

    return change


ACTION = ("actions", 0)
FIRST = (*ACTION, "payload", "directives", 0)
BROKEN_ROWS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "protocol_version": _set(("protocol_version",), "1"),
    "empty_message_id": _set(("message_id",), ""),
    "action_version": _set((*ACTION, "action_version"), "1"),
    "unknown_payload_key": _set((*ACTION, "payload", "ttl_seconds"), 3),
    "unknown_directive_key": _set((*FIRST, "ttl_seconds"), 3),
    "end_not_after_start": _set((*FIRST, "start"), 10),
    "negative_start": _set((*FIRST, "start"), -1),
    "priority_over_100": _set((*FIRST, "priority"), 101),
    "priority_boolean": _set((*FIRST, "priority"), True),
    "duration_over_30_days": _set((*FIRST, "duration"), 2_592_001),
    "priority_increases_along_tokens": lambda _: valid_envelope(
        GOOD, {"start": 10, "end": 20, "priority": 60, "duration": 300}
    ),
    "too_many_directives": lambda _: valid_envelope(*[GOOD] * 129),
    "too_many_actions": lambda _: valid_envelope(actions=17),
    "scopes_differ": lambda e: _set(("actions", 1, "payload", "scope"), "b")(
        valid_envelope(actions=2)
    ),
}


def test_the_rule_checker_accepts_a_valid_envelope() -> None:
    assert check_envelope(valid_envelope()) == [GOOD]
    assert len(check_envelope(valid_envelope(*[GOOD] * 128, actions=1))) == 128


@pytest.mark.parametrize("breaks", BROKEN_ROWS.values(), ids=BROKEN_ROWS.keys())
def test_the_rule_checker_catches_each_broken_rule(
    breaks: Callable[[dict[str, Any]], dict[str, Any]],
) -> None:
    with pytest.raises(RuleViolation):
        check_envelope(breaks(valid_envelope()))


def _directives(*ends: int) -> dict[str, Any]:
    directives = [{"start": 0, "end": e, "priority": 50, "duration": 60} for e in ends]
    return {"actions": [{"payload": {"directives": directives}}]}


@pytest.mark.parametrize(
    ("kv_hints", "expected"),
    [
        pytest.param(None, None, id="not-hinted"),
        pytest.param({"retain_full_prompt": {"ttl_seconds": 60}}, 120, id="flat-whole-prompt"),
        pytest.param(_directives(120), 120, id="versioned-whole-prompt"),
        pytest.param(_directives(40, 90), 90, id="versioned-prefixes-last-end"),
        pytest.param({"actions": []}, 0, id="versioned-nothing"),
    ],
)
def test_retained_tokens_is_where_the_retained_prefix_ends(
    kv_hints: dict[str, Any] | None, expected: int | None
) -> None:
    assert retained_tokens(kv_hints, prompt_tokens=120) == expected
