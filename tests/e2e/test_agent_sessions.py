"""Coding-agent sessions replayed through the whole request path as real processes.

A Codex-shaped session (``/v1/responses``) and a Claude Code-shaped session (``/v1/messages``),
written from the clients' public request shapes (``kvretention.replay.sessions``), are sent turn after
turn with the official SDKs' streaming helpers, through frontend -> router -> two workers. The
workers render each prompt with a real tool-aware chat template (``support.chat_tokenizer``) and
parse the engine's text with SGLang's own ``qwen25`` tool-call and ``qwen3`` reasoning parsers;
only the GPU engine is a stand-in, answering in Qwen's native ``<think>`` / ``<tool_call>`` format
and recording every call it got.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from kvretention.replay.sessions import (
    CLAUDE_MODEL,
    CLAUDE_SMALL_MODEL,
    CODEX_MODEL,
    Request,
    claude_code_session,
    codex_session,
)
from support.chat_tokenizer import build_tokenizer, save
from support.processes import StartKvretention
from support.worker_client import wait_for

SERVED = "standin"
PARSERS = ["--tool-call-parser", "qwen25", "--reasoning-parser", "qwen3"]
CODEX_TURNS = 12
CLAUDE_TURNS = 14
BILLING = "x-anthropic-billing-header"
SYSTEM_TEXT = "You are an interactive CLI tool that helps users with software engineering tasks. "


class AgentFleet:
    """Frontend, router and two workers; each worker's engine calls are read back by request id."""

    def __init__(self, frontend: Any, records: dict[str, Path], traces: dict[str, Path]) -> None:
        self.records, self.traces = records, traces
        self.openai = openai.OpenAI(
            base_url=frontend.base_url + "/v1", api_key="unused", max_retries=0, timeout=30
        )
        self.anthropic = anthropic.Anthropic(
            base_url=frontend.base_url, api_key="unused", max_retries=0, timeout=30
        )

    def call_for(self, response_id: str) -> tuple[str, dict[str, Any]]:
        """The worker and engine call behind a response (``resp_<rid>`` / ``msg_<rid>``)."""
        return self.calls()[response_id.partition("_")[2]]

    def breakpoints(self, rid: str) -> list[dict[str, Any]]:
        """Where the worker resolved each breakpoint of a request (its trace record)."""

        def entry() -> dict[str, Any] | None:  # the worker writes its trace after answering
            for trace in self.traces.values():
                for line in trace.read_text().splitlines() if trace.exists() else []:
                    if (found := json.loads(line))["request_id"] == rid:
                        return dict(found)
            return None

        breakpoints: list[dict[str, Any]] = wait_for(entry, timeout=5.0)["breakpoints"]
        return breakpoints

    def calls(self) -> dict[str, tuple[str, dict[str, Any]]]:
        """Every engine ``generate`` call so far: request id -> (worker, call)."""
        out: dict[str, tuple[str, dict[str, Any]]] = {}
        for name, record in self.records.items():
            for line in record.read_text().splitlines() if record.exists() else []:
                call = json.loads(line)
                if call["event"] == "generate":
                    out[call["rid"]] = (name, call)
        return out


@pytest.fixture(scope="module")
def fleet(start: StartKvretention, tmp_path_factory: pytest.TempPathFactory) -> AgentFleet:
    tmp = tmp_path_factory.mktemp("agents")
    tokenizer = save(tmp / "tokenizer")
    records = {name: tmp / f"{name}.jsonl" for name in ("w0", "w1")}
    traces = {name: tmp / f"{name}-trace.jsonl" for name in records}
    workers = [
        start(
            [
                *("worker", "--engine", "standin:versioned", "--trace-file", str(traces[name])),
                *("--model-path", str(tokenizer), *PARSERS),
            ],
            env={"KVR_STANDIN_RECORD": str(record)},
            timeout=90.0,
        )
        for name, record in records.items()
    ]
    router = start(["router", *(a for w in workers for a in ("--worker", w.base_url))])
    aliases = (f"{name}={SERVED}" for name in (CODEX_MODEL, CLAUDE_MODEL, CLAUDE_SMALL_MODEL))
    frontend = start(
        [
            *("frontend", "--router-url", router.base_url, "--model", SERVED),
            *(a for alias in aliases for a in ("--model-alias", alias)),
        ]
    )
    return AgentFleet(frontend, records, traces)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer()


Turn = tuple[Any, str, dict[str, Any]]
"""A turn's final answer as the SDK parsed it, the worker that served it, and its engine call."""


def _replay(
    fleet: AgentFleet, session: list[Request], stream: Callable[..., Any], final: str
) -> list[Turn]:
    """Send each request with an SDK streaming helper (which sets ``stream`` itself)."""
    turns = []
    for headers, body in session:
        kwargs = {k: v for k, v in body.items() if k != "stream"}
        with stream(**kwargs, extra_headers=headers) as events:
            answer = getattr(events, final)()
        turns.append((answer, *fleet.call_for(answer.id)))
    return turns


# ------------------------------------------------------------------ Codex on /v1/responses


@pytest.fixture(scope="module")
def codex(fleet: AgentFleet) -> list[Turn]:
    marker = "[[standin:tool_call:shell]]"
    session = codex_session(turns=CODEX_TURNS, marker=marker, result_marker=marker)
    return _replay(fleet, session, fleet.openai.responses.stream, "get_final_response")


def test_every_codex_turn_is_served_with_a_parsed_tool_call(
    codex: list[Turn],
) -> None:
    assert len(codex) == CODEX_TURNS
    for response, _, _ in codex:
        assert response.status == "completed"
        (call,) = [item for item in response.output if item.type == "function_call"]
        assert call.name == "shell" and call.call_id
        assert set(json.loads(call.arguments)) >= {"command"}


def test_codex_session_header_keeps_the_conversation_on_one_worker(
    codex: list[Turn],
) -> None:
    assert len({worker for _, worker, _ in codex}) == 1


def test_codex_sends_no_cache_control_so_the_engine_gets_no_hint(
    codex: list[Turn],
) -> None:
    for _, _, call in codex:
        assert "kv_hints" not in call["kwargs"]
        assert call["kv_hints_passed"] is False


def test_each_codex_turn_reuses_the_previous_prompt_as_its_cached_prefix(
    codex: list[Turn],
) -> None:
    """The history renders the same way every turn, so the prompt the engine saw last turn is a
    prefix of this turn's, and the cached tokens the client is told are the engine's."""
    for (_, _, before), (response, _, call) in itertools.pairwise(codex):
        earlier, ids = before["kwargs"]["input_ids"], call["kwargs"]["input_ids"]
        assert ids[: len(earlier)] == earlier
        usage = response.usage
        assert usage.input_tokens == len(ids)
        assert usage.input_tokens_details.cached_tokens >= len(earlier)


# ------------------------------------------------------------------ Claude Code on /v1/messages


@pytest.fixture(scope="module")
def claude(fleet: AgentFleet) -> list[Turn]:
    marker = "[[standin:reasoning]] [[standin:tool_call:Bash]]"
    session = claude_code_session(turns=CLAUDE_TURNS, marker=marker, result_marker=marker)
    return _replay(fleet, session, fleet.anthropic.beta.messages.stream, "get_final_message")


def test_every_claude_code_request_is_served_and_parsed_by_the_sdk(
    claude: list[Turn],
) -> None:
    title, *turns = claude
    assert len(turns) == CLAUDE_TURNS
    assert title[0].stop_reason == "end_turn"
    for message, _, _ in turns:
        assert message.stop_reason == "tool_use"
        kinds = [block.type for block in message.content]
        assert kinds[0] == "thinking" and kinds[-1] == "tool_use", kinds
        tool_use = message.content[-1]
        assert tool_use.name == "Bash" and tool_use.id.startswith("toolu_")
        assert set(tool_use.input) >= {"command"}


def test_claude_code_session_stays_on_one_worker(
    claude: list[Turn],
) -> None:
    assert len({worker for _, worker, _ in claude}) == 1


def _ranges(call: dict[str, Any]) -> list[tuple[int, int, int, int]]:
    (action,) = call["kwargs"]["kv_hints"]["actions"]
    assert (action["action_type"], action["action_version"]) == ("kv.retain", "1.0")
    return [
        (d["start"], d["end"], d["priority"], d["duration"])
        for d in action["payload"]["directives"]
    ]


def _ends(fleet: AgentFleet, call: dict[str, Any]) -> list[int]:
    """Token ends of the request's breakpoints, in prompt order (from the worker's trace)."""
    return sorted(b["token_end"] for b in fleet.breakpoints(call["rid"]))


def test_claude_code_breakpoints_reach_the_engine_as_one_hour_prefix_retention(
    fleet: AgentFleet, claude: list[Turn], tokenizer: Any
) -> None:
    """Two breakpoints (the last system block, the newest message block) resolve to the token
    where each block ends; both are 1 h, so the engine gets one range [0, newest block)."""
    system_text = SYSTEM_TEXT * 20
    _, *turns = claude
    for n, (message, _, call) in enumerate(turns):
        ids = call["kwargs"]["input_ids"]
        system_end, newest_end = _ends(fleet, call)
        assert 0 < system_end < newest_end <= len(ids)
        # The block's end, plus at most the newline every continuation shares (the part joiner,
        # or the template's own before the tools section): never into the tools.
        head = tokenizer.decode(ids[:system_end])
        assert head.removesuffix("\n").endswith(system_text) and "# Tools" not in head
        newest = "FAILED tests/test_parser.py" if n else "Fix the failing test"  # a tool result
        assert newest in tokenizer.decode(ids[system_end:newest_end]).rsplit("<|im_start|>", 1)[1]
        assert _ranges(call) == [(0, newest_end, 50, 3600)]
        # Anthropic's accounting: read from cache, written up to the last breakpoint, the rest
        usage = message.usage
        assert usage.cache_read_input_tokens + usage.cache_creation_input_tokens == newest_end
        assert usage.input_tokens == len(ids) - newest_end


def test_claude_code_billing_header_never_reaches_the_engine_so_the_system_prefix_is_stable(
    fleet: AgentFleet, claude: list[Turn], tokenizer: Any
) -> None:
    _, *turns = claude
    system_prefixes = set()
    for _, _, call in turns:
        ids = call["kwargs"]["input_ids"]
        assert BILLING not in tokenizer.decode(ids)
        system_prefixes.add(tuple(ids[: _ends(fleet, call)[0]]))
    assert len(system_prefixes) == 1


def test_what_a_claude_code_turn_retains_is_the_next_turns_prefix(
    claude: list[Turn],
) -> None:
    """The range retained up to the newest block is exactly the start of the next turn's prompt,
    and the next turn reads at least that much from the cache (as the SDK reports it)."""
    _, *turns = claude
    for (_, _, before), (message, _, call) in itertools.pairwise(turns):
        retained = _ranges(before)[-1][1]
        assert call["kwargs"]["input_ids"][:retained] == before["kwargs"]["input_ids"][:retained]
        assert message.usage.cache_read_input_tokens >= retained
