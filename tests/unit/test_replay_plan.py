"""``kvretention replay``'s pure parts: the requests it sends, the usage it reads, its table."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from kvretention.replay.plan import (
    ANSWER_TOKENS,
    MESSAGES_PATH,
    RESPONSES_PATH,
    Step,
    Turn,
    interleave,
    plan_sessions,
    rows,
    summary,
    usage_of,
)


@pytest.mark.parametrize("name, path", [("claude-code", MESSAGES_PATH), ("codex", RESPONSES_PATH)])
def test_every_step_asks_the_chosen_model_for_a_short_json_answer(name: str, path: str) -> None:
    (steps,) = plan_sessions([name], turns=4, model="served-model")
    # one step per model call: Claude Code's title side call (its small model) is not one
    assert [s.turn for s in steps] == [0, 1, 2, 3]
    for step in steps:
        assert step.session == name and step.path == path
        assert step.body["model"] == "served-model" and step.body["stream"] is False
        limit = "max_tokens" if path == MESSAGES_PATH else "max_output_tokens"
        assert step.body[limit] == ANSWER_TOKENS
        assert "thinking" not in step.body


def test_each_turn_resends_the_conversation_so_far() -> None:
    (steps,) = plan_sessions(["codex"], turns=3, model="m")
    inputs = [s.body["input"] for s in steps]
    for before, after in itertools.pairwise(inputs):
        assert after[: len(before)] == before and len(after) > len(before)


def test_an_unknown_session_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'gemini'"):
        plan_sessions(["gemini"], turns=1, model="m")


def test_sessions_are_interleaved_round_by_round() -> None:
    def steps(name: str, n: int) -> list[Step]:
        return [Step(name, t, "/p", {}, {}) for t in range(n)]

    order = interleave([steps("a", 3), steps("b", 1)])
    assert [(s.session, s.turn) for s in order] == [("a", 0), ("b", 0), ("a", 1), ("a", 2)]


USAGE: list[tuple[str, dict[str, Any], tuple[int, int]]] = [
    (MESSAGES_PATH, {"input_tokens": 10, "cache_read_input_tokens": 90}, (100, 90)),
    (
        MESSAGES_PATH,
        {"input_tokens": 5, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 95},
        (100, 0),
    ),
    (MESSAGES_PATH, {"input_tokens": 7}, (7, 0)),
    (
        RESPONSES_PATH,
        {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 64}},
        (100, 64),
    ),
    (RESPONSES_PATH, {"input_tokens": 100, "input_tokens_details": None}, (100, 0)),
]


@pytest.mark.parametrize("path, usage, expected", USAGE)
def test_usage_is_read_in_each_providers_shape(
    path: str, usage: dict[str, Any], expected: tuple[int, int]
) -> None:
    assert usage_of(path, {"usage": usage}) == expected


def test_an_answer_without_usage_is_an_error() -> None:
    with pytest.raises(ValueError, match="no usage"):
        usage_of(RESPONSES_PATH, {"output": []})


def test_rows_put_the_engines_share_beside_the_ideal_one() -> None:
    turns = [
        Turn("a", 0, 100, 0, 0.1),
        Turn("b", 0, 50, 0, 0.1),
        Turn("a", 1, 200, 90, 0.1),
        Turn("b", 1, 100, 50, 0.1),
    ]
    table = rows(turns)
    assert [(r["session"], r["share"], r["ideal"]) for r in table] == [
        ("a", 0.0, 0.0),
        ("b", 0.0, 0.0),
        ("a", 0.45, 0.5),
        ("b", 0.5, 0.5),
    ]
    totals = summary(table)
    assert totals == {
        "turns": 2,
        "median_share": 0.475,
        "median_ideal": 0.5,
        "cached_tokens": 140,
        "prompt_tokens": 300,
    }


def test_a_replay_of_first_turns_only_has_nothing_to_summarize() -> None:
    assert summary(rows([Turn("a", 0, 10, 0, 0.1)])) == {"turns": 0}
