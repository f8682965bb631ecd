"""Alias patterns: which served name a client's model name goes to, and what a model list shows."""

from __future__ import annotations

import pytest

from kvretention.dataplane.frontend.model_names import listed, matches, resolve

SERVED = ("qwen3-0.6b", "qwen3-coder")
ALIASES = {
    "claude-haiku-4-5": "qwen3-0.6b",
    "claude-*": "qwen3-coder",
    "gpt-*": "qwen3-0.6b",
    "*-codex": "qwen3-coder",
    "qwen3-*": "qwen3-0.6b",
}


@pytest.mark.parametrize(
    ("pattern", "name", "expected"),
    [
        ("claude-*", "claude-opus-5-5", True),
        ("claude-*", "claude-", True),  # * matches nothing too
        ("claude-*", "claude", False),
        ("claude-*", "Claude-opus", False),  # case sensitive
        ("claude-*", "x-claude-opus", False),  # the whole name must match
        ("*-codex", "gpt-5-codex", True),
        ("gpt-*-sol", "gpt-6.1-sol", True),
        ("gpt-*-sol", "gpt-6.1-terra", False),
        ("gpt-6.1-*", "gpt-6x1-sol", False),  # '.' is literal
        ("claude-*[1m]", "claude-sonnet-4-5[1m]", True),  # brackets are literal
        ("claude-*[1m]", "claude-sonnet-4-5m", False),
        ("*", "anything at all", True),
        ("gpt-5-codex", "gpt-5-codex", True),  # an exact alias matches itself only
        ("gpt-5-codex", "gpt-5-codex-mini", False),
    ],
)
def test_only_star_is_a_wildcard_and_the_whole_name_must_match(
    pattern: str, name: str, expected: bool
) -> None:
    assert matches(pattern, name) is expected


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        pytest.param("qwen3-0.6b", "qwen3-0.6b", id="served"),
        pytest.param("qwen3-coder", "qwen3-coder", id="served-beats-a-matching-pattern"),
        pytest.param("claude-haiku-4-5", "qwen3-0.6b", id="exact-beats-a-matching-pattern"),
        pytest.param("claude-opus-5-5", "qwen3-coder", id="pattern"),
        pytest.param("gpt-6.1-sol", "qwen3-0.6b", id="codex-default"),
        pytest.param("gpt-5-codex", "qwen3-0.6b", id="first-matching-pattern-in-order"),
        pytest.param("o4-codex", "qwen3-coder", id="suffix-pattern"),
        pytest.param("llama-3", None, id="nothing-serves-it"),
        pytest.param("", None, id="empty"),
    ],
)
def test_resolve_prefers_served_then_exact_then_patterns_in_order(
    model: str, expected: str | None
) -> None:
    assert resolve(model, served=SERVED, aliases=ALIASES) == expected


def test_a_model_list_shows_served_names_and_exact_aliases_not_patterns() -> None:
    assert listed(SERVED, ALIASES) == ("qwen3-0.6b", "qwen3-coder", "claude-haiku-4-5")
