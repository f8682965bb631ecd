"""The envelope against the shared wire fixture: one table for every component."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvretention.hints import InvalidKvHint, KvHintEnvelope, envelope_or_none

WIRE = json.loads((Path(__file__).parents[1] / "fixtures" / "kv_hints_wire.json").read_text())


@pytest.mark.parametrize("case", WIRE["valid"], ids=lambda c: c["name"])
def test_valid_wire_examples_parse_to_expected(case: dict[str, Any]) -> None:
    env = envelope_or_none(case["wire"])
    assert (env.to_wire() if env else None) == case["expected"]


@pytest.mark.parametrize("case", WIRE["invalid"], ids=lambda c: c["name"])
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
