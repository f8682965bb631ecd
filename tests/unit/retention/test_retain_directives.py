"""The executor's lenient read of kv.retain 1.0 and the page-aligned holds it turns into."""

from __future__ import annotations

from typing import Any

import pytest

from kvretention.retention.directives import (
    Directive,
    Hold,
    RetainPlan,
    holds_for,
    read_retain,
)
from support.kv_retain_rules import RuleViolation, check_directive, check_envelope


def _action(directives: list[Any], *, scope: Any = None, **overrides: Any) -> dict[str, Any]:
    action = {
        "action_id": "r/kv.retain",
        "action_type": "kv.retain",
        "action_version": "1.0",
        "payload": {"scope": scope, "directives": directives},
    }
    action.update(overrides)
    return action


def _envelope(*actions: dict[str, Any]) -> dict[str, Any]:
    return {"protocol_version": "0.1", "message_id": "r", "actions": list(actions)}


R = {"start": 0, "end": 64, "priority": 50, "duration": 300}

DIRECTIVE_CASES = [
    ("range", R, Directive(0, 64, 50, 300)),
    ("start defaults to 0", {"end": 8, "priority": 1, "duration": None}, Directive(0, 8, 1, None)),
    ("end null", {"start": 4, "priority": 9, "duration": 0}, Directive(4, None, 9, 0)),
    (
        "output",
        {"covers_output": True, "priority": 5, "duration": 60},
        Directive(0, None, 5, 60, covers_output=True),
    ),
    ("release", {**R, "priority": 0}, Directive(0, 64, 0, 300)),
    ("unknown key", {**R, "ttl": 5}, None),
    ("priority over 100", {**R, "priority": 101}, None),
    ("priority bool", {**R, "priority": True}, None),
    ("priority missing", {"start": 0, "end": 4, "duration": 1}, None),
    ("duration over 30 days", {**R, "duration": 2_592_001}, None),
    ("duration float", {**R, "duration": 1.5}, None),
    ("negative start", {**R, "start": -1}, None),
    ("end not after start", {**R, "start": 64}, None),
    ("covers_output false", {"covers_output": False, "priority": 5, "duration": 1}, None),
    ("output with a range key", {"covers_output": True, "start": 0, "priority": 5}, None),
    ("not an object", [0, 64], None),
]


@pytest.mark.parametrize(
    ("raw", "expected"), [c[1:] for c in DIRECTIVE_CASES], ids=[c[0] for c in DIRECTIVE_CASES]
)
def test_one_directive_is_read_exactly_when_the_published_rules_accept_it(
    raw: Any, expected: Directive | None
) -> None:
    plan = read_retain(_envelope(_action([raw])))
    assert plan == (None if expected is None else RetainPlan(None, (expected,)))
    try:
        check_directive(raw)
        accepted = True
    except RuleViolation:
        accepted = False
    assert accepted is (expected is not None)


LOW = {"start": 0, "end": 32, "priority": 10, "duration": 60}
HIGH_LATER = {"start": 32, "end": 64, "priority": 90, "duration": 60}

ENVELOPE_CASES = [
    ("no hints", None, None),
    ("no actions key", {"protocol_version": "0.1", "message_id": "r"}, None),
    ("other action types only", _envelope(_action([R], action_type="kv.prefetch")), None),
    ("other version skipped", _envelope(_action([R], action_version="2.0")), None),
    (
        "invalid action skipped, valid kept",
        _envelope(_action([{**R, "bogus": 1}]), _action([R])),
        RetainPlan(None, (Directive(0, 64, 50, 300),)),
    ),
    (
        "one bad directive skips its whole action",
        _envelope(_action([R, {"priority": 500}])),
        None,
    ),
    ("increasing priorities inside an action", _envelope(_action([LOW, HIGH_LATER])), None),
    (
        "an action that would make priorities increase is skipped",
        _envelope(_action([LOW]), _action([HIGH_LATER])),
        RetainPlan(None, (Directive(0, 32, 10, 60),)),
    ),
    (
        "a second scope is skipped",
        _envelope(_action([R], scope="a"), _action([{**R, "start": 64, "end": 96}], scope="b")),
        RetainPlan("a", (Directive(0, 64, 50, 300),)),
    ),
    (
        "actions of one scope merge",
        _envelope(_action([R], scope="a"), _action([{**R, "start": 64, "end": 96}], scope="a")),
        RetainPlan("a", (Directive(0, 64, 50, 300), Directive(64, 96, 50, 300))),
    ),
    (
        "bad payload keys",
        _envelope(
            {
                "action_id": "x",
                "action_type": "kv.retain",
                "action_version": "1.0",
                "payload": {"directives": [R], "extra": 1},
            }
        ),
        None,
    ),
    ("empty directives are a valid no-op plan", _envelope(_action([])), RetainPlan(None, ())),
]


@pytest.mark.parametrize(
    ("hints", "expected"), [c[1:] for c in ENVELOPE_CASES], ids=[c[0] for c in ENVELOPE_CASES]
)
def test_envelope_is_read_leniently(hints: Any, expected: RetainPlan | None) -> None:
    assert read_retain(hints) == expected


def test_caps_skip_actions_past_sixteen_and_directives_past_128() -> None:
    ranges = [{"start": i, "end": i + 1, "priority": 5, "duration": 1} for i in range(200)]
    actions = [_action(ranges[i * 10 : i * 10 + 10]) for i in range(20)]
    plan = read_retain(_envelope(*actions))
    assert plan is not None
    # 12 actions of 10 fit under 128; the 13th would pass it; actions 17..20 are past 16.
    assert len(plan.directives) == 120
    assert [d.start for d in plan.directives] == list(range(120))


def test_reads_sglangs_decoded_struct_like_the_json() -> None:
    kv_hints = pytest.importorskip("sglang.srt.managers.kv_hints")
    wire = _envelope(_action([R, {"covers_output": True, "priority": 5, "duration": None}]))
    check_envelope(wire)
    assert read_retain(kv_hints.decode_kv_hints_envelope(wire)) == read_retain(wire)


P = RetainPlan

HOLD_CASES = [
    ("aligned", P(None, (Directive(0, 64, 50, 10),)), 100, 16, None, [Hold(0, 64, 50, 110.0)]),
    (
        "rounded inwards, never widened",
        P(None, (Directive(5, 60, 50, None),)),
        100,
        16,
        None,
        [Hold(16, 48, 50, None)],
    ),
    ("too short for a page", P(None, (Directive(1, 15, 50, 5),)), 100, 16, None, []),
    (
        "cut to the sequence",
        P(None, (Directive(0, 500, 7, 5),)),
        100,
        16,
        None,
        [Hold(0, 96, 7, 105.0)],
    ),
    (
        "end null runs to seq_len",
        P(None, (Directive(0, None, 7, 0),)),
        40,
        8,
        None,
        [Hold(0, 40, 7, 100.0)],
    ),
    ("release kept", P(None, (Directive(0, 32, 0, None),)), 40, 8, None, [Hold(0, 32, 0, None)]),
    (
        "output from the prompt end",
        P(None, (Directive(0, None, 3, 9, covers_output=True),)),
        100,
        16,
        37,
        [Hold(48, 96, 3, 109.0)],
    ),
    (
        "output unknown holds nothing",
        P(None, (Directive(0, None, 3, 9, covers_output=True),)),
        100,
        16,
        None,
        [],
    ),
    ("page size 1", P(None, (Directive(3, 7, 2, 1),)), 10, 1, None, [Hold(3, 7, 2, 101.0)]),
]


@pytest.mark.parametrize(
    ("plan", "seq_len", "page_size", "prompt_len", "expected"),
    [c[1:] for c in HOLD_CASES],
    ids=[c[0] for c in HOLD_CASES],
)
def test_holds_are_whole_pages_inside_the_directive(
    plan: RetainPlan, seq_len: int, page_size: int, prompt_len: int | None, expected: list[Hold]
) -> None:
    holds = holds_for(plan, seq_len=seq_len, page_size=page_size, now=100.0, prompt_len=prompt_len)
    assert list(holds) == expected
    for hold, d in zip(holds, plan.directives, strict=False):
        assert hold.start % page_size == 0 and hold.end % page_size == 0
        if not d.covers_output:
            assert d.start <= hold.start and hold.end <= (d.end or seq_len)
