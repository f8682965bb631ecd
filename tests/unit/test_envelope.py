"""The envelope against the shared wire fixture: one table for every component."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from kvretention.hints import (
    DEFAULT_PRIORITY,
    CacheHints,
    InvalidKvHint,
    KvHintEnvelope,
    build_envelope,
    envelope_or_none,
)

WIRE = json.loads((Path(__file__).parents[1] / "fixtures" / "kv_hints_wire.json").read_text())


def cases(*tables: str) -> list[Any]:
    """The fixture's cases from ``tables`` (v1 and v2), each named ``table-name``."""
    return [pytest.param(c, id=f"{table}-{c['name']}") for table in tables for c in WIRE[table]]


@pytest.mark.parametrize("case", cases("valid", "valid_v2"))
def test_valid_wire_examples_parse_to_expected(case: dict[str, Any]) -> None:
    env = envelope_or_none(case["wire"])
    assert (env.to_wire() if env else None) == case["expected"]


@pytest.mark.parametrize("case", cases("invalid", "invalid_v2"))
def test_invalid_wire_examples_are_rejected_naming_the_field(case: dict[str, Any]) -> None:
    with pytest.raises(InvalidKvHint) as info:
        KvHintEnvelope.from_wire(case["wire"])
    assert info.value.field == case["field"]


def test_envelope_serializes_to_the_one_wire_form() -> None:
    assert json.dumps(KvHintEnvelope.retain(1800).to_wire()) == (
        '{"retain_full_prompt": {"ttl_seconds": 1800}}'
    )


def test_empty_envelope_serializes_without_null_actions() -> None:
    assert KvHintEnvelope().to_wire() == {}
    assert envelope_or_none(None) is None


@pytest.mark.parametrize("case", WIRE["valid_v2"], ids=lambda c: c["name"])
def test_a_v1_receiver_keeps_what_it_knows_of_a_v2_wire(case: dict[str, Any]) -> None:
    """The v1 model (only retain_full_prompt.ttl_seconds) ignores every key v2 adds."""

    class V1Hint(BaseModel):
        model_config = ConfigDict(extra="ignore")
        ttl_seconds: int

    class V1Envelope(BaseModel):
        model_config = ConfigDict(extra="ignore")
        retain_full_prompt: V1Hint | None = None

    v1 = V1Envelope.model_validate(case["wire"])
    full = case["wire"].get("retain_full_prompt")
    assert (v1.retain_full_prompt is None) is (full is None)


POLICY_ROWS: list[tuple[str, CacheHints, dict[str, Any], dict[str, Any] | None]] = [
    ("no_controls_no_policy", CacheHints(), {}, None),
    (
        "no_controls_gets_the_fleet_default_as_policy",
        CacheHints(),
        {"default_ttl_seconds": 600},
        {"retain_full_prompt": {"ttl_seconds": 600, "origin": "policy"}},
    ),
    (
        "explicit_nothing_is_not_overridden",
        CacheHints(client_controls=True),
        {"default_ttl_seconds": 600},
        None,
    ),
    (
        "client_intent_wins_over_the_default",
        CacheHints(envelope=KvHintEnvelope.retain(300), client_controls=True),
        {"default_ttl_seconds": 600},
        {"retain_full_prompt": {"ttl_seconds": 300}},
    ),
    (
        "default_priority_keeps_the_v1_bytes",
        CacheHints(envelope=KvHintEnvelope.retain(300), client_controls=True),
        {"priority": DEFAULT_PRIORITY},
        {"retain_full_prompt": {"ttl_seconds": 300}},
    ),
    (
        "fleet_priority_is_written",
        CacheHints(envelope=KvHintEnvelope.retain(300), client_controls=True),
        {"priority": 80},
        {"retain_full_prompt": {"ttl_seconds": 300}, "priority": 80},
    ),
    (
        "policy_with_priority",
        CacheHints(),
        {"default_ttl_seconds": 60, "priority": 10},
        {"retain_full_prompt": {"ttl_seconds": 60, "origin": "policy"}, "priority": 10},
    ),
    ("priority_alone_makes_no_hint", CacheHints(), {"priority": 80}, None),
]


@pytest.mark.parametrize(
    ("hints", "policy", "expected"), [pytest.param(h, p, e, id=n) for n, h, p, e in POLICY_ROWS]
)
def test_build_envelope_applies_the_fleet_policy(
    hints: CacheHints, policy: dict[str, Any], expected: dict[str, Any] | None
) -> None:
    envelope = build_envelope(hints, **policy)
    assert (envelope.to_wire() if envelope else None) == expected


@pytest.mark.parametrize("priority", [-1, 101])
def test_build_envelope_refuses_a_priority_out_of_range(priority: int) -> None:
    with pytest.raises(ValidationError):
        build_envelope(
            CacheHints(envelope=KvHintEnvelope.retain(300), client_controls=True), priority=priority
        )
