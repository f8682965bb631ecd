"""Pure parts of a replay: the requests to send, the usage a provider answers with, and the table.

A turn's *ideal* share is the previous turn's prompt over this one's: a client resends the whole
conversation, so everything but the new tail could be read from the cache. The engine's own count
(``cached_tokens``, which SGLang reports and the frontend passes on) says how much was.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from kvretention.replay.sessions import CLAUDE_SMALL_MODEL, claude_code_session, codex_session

MESSAGES_PATH: Final = "/v1/messages?beta=true"
RESPONSES_PATH: Final = "/v1/responses"
SESSIONS: Final = ("claude-code", "codex")
ANSWER_TOKENS: Final = 8
"""Each turn asks for a few tokens only: the prompt is what a replay measures."""


@dataclass(frozen=True)
class Step:
    """One request of a session: where it goes and what it carries."""

    session: str
    turn: int
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass(frozen=True)
class Turn:
    """What the fleet answered for one step."""

    session: str
    turn: int
    prompt_tokens: int
    cached_tokens: int
    seconds: float


def plan_sessions(names: Sequence[str], *, turns: int, model: str) -> list[list[Step]]:
    """Each named session's steps, non-streaming, every body on ``model``. Claude Code's title side
    call (its small model) is left out: it is not part of the conversation."""
    plans = []
    for name in names:
        if name == "claude-code":
            requests, path = claude_code_session(turns=turns), MESSAGES_PATH
        elif name == "codex":
            requests, path = codex_session(turns=turns), RESPONSES_PATH
        else:
            raise ValueError(f"unknown session {name!r}: choose from {', '.join(SESSIONS)}")
        steps: list[Step] = []
        for headers, body in requests:
            if body.get("model") == CLAUDE_SMALL_MODEL:
                continue
            steps.append(Step(name, len(steps), path, headers, _short(path, body, model)))
        plans.append(steps)
    return plans


def _short(path: str, body: Mapping[str, Any], model: str) -> dict[str, Any]:
    out = {**body, "model": model, "stream": False}
    if path == MESSAGES_PATH:
        out.pop("thinking", None)  # a thinking budget must stay under max_tokens
        out["max_tokens"] = ANSWER_TOKENS
    else:
        out["max_output_tokens"] = ANSWER_TOKENS
    return out


def interleave(plans: Sequence[Sequence[Step]]) -> list[Step]:
    """Round by round, every session's next step: sessions compete for the cache as live ones do."""
    rounds = max((len(p) for p in plans), default=0)
    return [p[t] for t in range(rounds) for p in plans if t < len(p)]


def usage_of(path: str, answer: Mapping[str, Any]) -> tuple[int, int]:
    """(prompt tokens, cached tokens) from a provider's answer. Anthropic counts cache reads and
    writes apart from ``input_tokens``; the Responses API counts cached tokens inside them."""
    usage = answer.get("usage")
    if not isinstance(usage, Mapping):
        raise ValueError("the answer has no usage")
    if path.startswith("/v1/messages"):
        cached = int(usage.get("cache_read_input_tokens") or 0)
        written = int(usage.get("cache_creation_input_tokens") or 0)
        return int(usage["input_tokens"]) + cached + written, cached
    details = usage.get("input_tokens_details") or {}
    return int(usage["input_tokens"]), int(details.get("cached_tokens") or 0)


def rows(turns: Sequence[Turn]) -> list[dict[str, Any]]:
    """One row per turn: its prompt, the share the engine read from cache, and the ideal share."""
    previous: dict[str, int] = {}
    out = []
    for t in turns:
        before = previous.get(t.session)
        ideal = min(before, t.prompt_tokens) / t.prompt_tokens if before and t.prompt_tokens else 0
        share = t.cached_tokens / t.prompt_tokens if t.prompt_tokens else 0.0
        out.append(
            {
                "session": t.session,
                "turn": t.turn,
                "prompt_tokens": t.prompt_tokens,
                "cached_tokens": t.cached_tokens,
                "share": round(share, 3),
                "ideal": round(ideal, 3),
                "seconds": t.seconds,
            }
        )
        previous[t.session] = t.prompt_tokens
    return out


def summary(table: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Medians over the turns after each session's first (a first turn has nothing to reuse)."""
    later = [r for r in table if r["turn"] > 0]
    if not later:
        return {"turns": 0}
    return {
        "turns": len(later),
        "median_share": statistics.median(r["share"] for r in later),
        "median_ideal": statistics.median(r["ideal"] for r in later),
        "cached_tokens": sum(r["cached_tokens"] for r in later),
        "prompt_tokens": sum(r["prompt_tokens"] for r in later),
    }
