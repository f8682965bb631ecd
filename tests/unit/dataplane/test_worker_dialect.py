"""Dialect detection and the kv_hints argument built for each dialect (pure)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvretention.dataplane.worker.dialect import (
    ACTION_TYPE,
    Dialect,
    build_kv_hints,
    detect_dialect,
    parameter_names,
)
from kvretention.dataplane.worker.standin import STANDINS
from kvretention.hints import KvHintEnvelope, envelope_or_none

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


@pytest.mark.parametrize("entry", hinted_wire_entries(), ids=lambda e: e["name"])
def test_flat_is_the_normalized_envelope(entry: dict[str, Any]) -> None:
    env = envelope_or_none(entry["wire"])
    assert env is not None
    assert build_kv_hints(env, Dialect.FLAT, request_id="r") == entry["expected"]


@pytest.mark.parametrize("entry", hinted_wire_entries(), ids=lambda e: e["name"])
def test_versioned_carries_one_retain_action_with_the_ttl(entry: dict[str, Any]) -> None:
    env = envelope_or_none(entry["wire"])
    assert env is not None
    hints = build_kv_hints(env, Dialect.VERSIONED, request_id="req-7")
    assert hints is not None
    assert hints["message_id"] == "req-7"
    assert isinstance(hints["protocol_version"], str)
    (action,) = hints["actions"]
    assert action["action_type"] == ACTION_TYPE == "retain_full_prompt"
    assert action["payload"] == entry["expected"]["retain_full_prompt"]
    assert isinstance(action["action_id"], str) and isinstance(action["action_version"], str)


@pytest.mark.parametrize("dialect", list(Dialect))
def test_no_hint_builds_nothing(dialect: Dialect) -> None:
    assert build_kv_hints(KvHintEnvelope(), dialect, request_id="r") is None


def test_none_dialect_builds_nothing_even_for_a_hint() -> None:
    assert build_kv_hints(KvHintEnvelope.retain(300), Dialect.NONE, request_id="r") is None
