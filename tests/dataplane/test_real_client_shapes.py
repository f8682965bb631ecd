"""Request shapes real clients send, one row each, driven through the frontend app in-process.

Each row is a body (and headers) as Codex CLI (``codex-rs``: ``ResponsesApiRequest``, the chat wire's
``ChatRequestBuilder``, ``ResponseItem`` / ``ContentItem`` / ``ToolSpec``), Claude Code (FACTS.md,
"What coding agents send") or the official SDKs' request types (openai-python
``ResponseCreateParams`` / ``ChatCompletionMessageParam``, anthropic-python ``MessageCreateParams``)
put it on the wire, or as the pinned CLIs sent it to a fleet (``shapes/*.json``: recorded request
bodies of Claude Code 2.1.328 and Codex 0.169.0, long strings cut). A row is either served (200;
what the router got is checked) or refused with the provider's error shape and a message naming the
field, for what a self-hosted SGLang cannot do. Every served row also checks the hint contract:
cache controls make ``kv_hints``, none make no key; a row may also name the session the router must
get.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pytest
from aiohttp.test_utils import TestClient, TestServer

from kvretention.common.trace import RequestTrace
from kvretention.dataplane.frontend.app import create_app
from kvretention.dataplane.frontend.config import FrontendConfig
from kvretention.dataplane.protocol import HEADER_SESSION
from kvretention.replay.plan import MESSAGES_PATH, RESPONSES_PATH
from kvretention.replay.sessions import Request, claude_code_session, codex_session
from support.openai_shapes import APPLY_PATCH, SHELL, codex_body
from support.router_standin import RouterStandIn, parse_sse

PNG: Final = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
DATA_URL: Final = f"data:image/png;base64,{PNG}"
CODEX_HEADERS: Final = {
    "session_id": "019a2b3c-conversation",
    "originator": "codex_cli_rs",
    "openai-beta": "responses=experimental",
    "x-codex-turn-metadata": '{"turn_id":"t1"}',
    "accept": "text/event-stream",
}
CLAUDE_HEADERS: Final = {
    "anthropic-version": "2023-06-01",
    "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,"
    "fine-grained-tool-streaming-2025-05-14,context-management-2025-06-27,effort-2025-11-24",
    "x-app": "cli",
    "anthropic-dangerous-direct-browser-access": "true",
    "x-stainless-lang": "js",
}
Check = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class Shape:
    """One request as a client sends it, and what must happen to it."""

    id: str
    source: str
    path: str
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    check: Check | None = None
    """For served rows: asserts on the ``PreprocessedRequest`` the router received."""
    hinted: bool = False
    """The body carries cache controls: the router must get ``kv_hints`` (else no key at all)."""
    refused: str | None = None
    """For refused rows: the field the 400 must name (OpenAI ``param``, Anthropic message prefix)."""
    session: str | None = None
    """For served rows: the session key the router must get (``x-session-id``), when one is set."""


SHAPES: Final = Path(__file__).parent / "shapes"


def recorded(name: str) -> dict[str, Any]:
    """A recorded CLI request (``shapes/<name>.json``: source, path, headers, body)."""
    loaded: dict[str, Any] = json.loads((SHAPES / f"{name}.json").read_text())
    return loaded


CLAUDE_CODE: Final = recorded("claude-code-2.1.328")
CODEX: Final = recorded("codex-0.169.0")


def _session_turn(
    name: str, session: Callable[..., list[Request]], turns: int, note: str, **expect: Any
) -> Shape:
    """The last request of a replayed ``session`` of ``turns`` turns, on the path the replay sends
    it to, with the headers of a one-turn replay's first request."""
    path = MESSAGES_PATH if session is claude_code_session else RESPONSES_PATH
    source = f"kvretention.replay.sessions.{session.__name__} ({note})"
    body = session(turns=turns)[-1][1]
    return Shape(name, source, path, body, headers=session(turns=1)[0][0], **expect)


def _claude_code(**changes: Any) -> dict[str, Any]:
    body = copy.deepcopy(CLAUDE_CODE["body"])
    body.update(changes)
    return body


def _tools(received: dict[str, Any]) -> list[str]:
    return [t["name"] for t in received.get("tools") or []]


def _messages(received: dict[str, Any]) -> list[dict[str, Any]]:
    return list(received["messages"])


# -- OpenAI Responses (Codex CLI, openai-python) ------------------------------------------------

WEB_SEARCH_CACHED: Final = {"type": "web_search", "external_web_access": False}
"""codex-rs ``ToolSpec::WebSearch`` in its default ``cached`` mode; sent to custom providers too."""


def _codex(**changes: Any) -> dict[str, Any]:
    body = codex_body()
    body.update(changes)
    return body


def _responses(text: str, **fields: Any) -> dict[str, Any]:
    return {"model": "m", "input": [{"role": "user", "content": text}], **fields}


def _no_web_search(received: dict[str, Any]) -> None:
    assert _tools(received) == ["shell", "apply_patch"], "hosted web_search is not offered"


def _original_image(*, index: int, part: int) -> Check:
    """``detail: original`` reaches the worker as the neutral ``high``."""

    def check(received: dict[str, Any]) -> None:
        content = _messages(received)[index]["content"]
        assert content[part] == {"type": "image", "url": DATA_URL, "detail": "high"}, content

    return check


def _reasoning_replayed(text: str) -> Check:
    def check(received: dict[str, Any]) -> None:
        texts = [(m.get("reasoning") or {}).get("text") for m in _messages(received)]
        assert text in texts, texts

    return check


def _code_mode_tools(received: dict[str, Any]) -> None:
    """Codex's code mode: every tool in an ``additional_tools`` item, grouped in namespaces."""
    names = _tools(received)
    assert {"exec", "wait", "sleep", "spawn_agent", "wait_agent"} <= set(names), names
    assert next(t for t in received["tools"] if t["name"] == "exec")["kind"] == "custom"
    assert "instructions" not in CODEX["body"]  # the developer messages carry them


RESPONSES_ROWS: Final = [
    Shape(
        "codex-turn",
        "codex-rs ResponsesApiRequest (FACTS.md)",
        "/v1/responses",
        codex_body(),
        headers=CODEX_HEADERS,
    ),
    Shape(
        "codex-turn-with-cached-web-search-tool",
        "codex-rs ToolSpec::WebSearch {external_web_access: false} (web_search = cached, the default)",
        "/v1/responses",
        _codex(tools=[SHELL, APPLY_PATCH, WEB_SEARCH_CACHED]),
        headers=CODEX_HEADERS,
        check=_no_web_search,
    ),
    Shape(
        "codex-turn-with-live-web-search-tool",
        "codex-rs hosted_spec.rs: live / indexed modes, filters, content types",
        "/v1/responses",
        _codex(
            tools=[
                SHELL,
                {
                    "type": "web_search",
                    "external_web_access": True,
                    "indexed_web_access": True,
                    "filters": {"allowed_domains": ["docs.python.org"]},
                    "search_context_size": "medium",
                    "search_content_types": ["text", "image"],
                    "user_location": {"type": "approximate", "country": "US"},
                },
                APPLY_PATCH,
            ]
        ),
        check=_no_web_search,
    ),
    Shape(
        "sdk-web-search-preview-tool",
        "openai-python WebSearchPreviewToolParam",
        "/v1/responses",
        _responses(
            "search-preview",
            tools=[SHELL, {"type": "web_search_preview", "search_context_size": "low"}],
        ),
        check=lambda r: _tools(r) == ["shell"] or pytest.fail(str(_tools(r))),
    ),
    Shape(
        "codex-only-web-search-tool-and-auto-choice",
        "codex-rs: a turn whose only tool is the hosted search (tools disabled but search)",
        "/v1/responses",
        _responses("only-search", tools=[WEB_SEARCH_CACHED], tool_choice="auto"),
        check=lambda r: not r.get("tools") or pytest.fail(str(r.get("tools"))),
    ),
    Shape(
        "codex-view-image-original-detail",
        "codex-rs ContentItem::InputImage {detail: ImageDetail::Original}; SDK ImageDetail",
        "/v1/responses",
        _responses(
            "see-original",
            input=[
                {
                    "type": "message",
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "what is in this picture? see-original"},
                        {"type": "input_image", "image_url": DATA_URL, "detail": "original"},
                    ],
                }
            ],
        ),
        check=_original_image(index=0, part=1),
    ),
    Shape(
        "codex-function-output-with-image",
        "codex-rs FunctionCallOutputPayload as content items (view_image / MCP image results)",
        "/v1/responses",
        {
            "model": "m",
            "input": [
                {"type": "message", "role": "user", "content": "look at the screenshot"},
                {
                    "type": "function_call",
                    "call_id": "call_img",
                    "name": "view_image",
                    "arguments": '{"path": "/tmp/s.png"}',
                },
                {
                    "type": "function_call_output",
                    "call_id": "call_img",
                    "output": [
                        {"type": "input_text", "text": "fn-output-image"},
                        {"type": "input_image", "image_url": DATA_URL, "detail": "original"},
                    ],
                },
            ],
            "tools": [
                {
                    "type": "function",
                    "name": "view_image",
                    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
                    "strict": False,
                }
            ],
        },
        check=_original_image(index=2, part=1),
    ),
    Shape(
        "codex-assistant-message-end-turn",
        "codex-rs ResponseItem::Message {end_turn} replayed from a finished turn",
        "/v1/responses",
        {
            "model": "m",
            "input": [
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "a"}],
                },
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "done"}],
                    "end_turn": True,
                    "phase": "final_answer",
                },
                {"type": "message", "role": "user", "content": "end-turn-next"},
            ],
        },
    ),
    Shape(
        "codex-service-tier-and-null-reasoning",
        "codex-rs ResponsesApiRequest: reasoning None serializes as null; service_tier",
        "/v1/responses",
        _codex(reasoning=None, service_tier="priority", text=None, include=[]),
    ),
    Shape(
        "codex-reasoning-without-effort-or-summary",
        "codex-rs Reasoning {effort: None, summary: None} serializes as an empty object",
        "/v1/responses",
        _codex(reasoning={}),
    ),
    Shape(
        "codex-exec-output-schema",
        "codex-rs create_text_param_for_request (codex exec --output-schema)",
        "/v1/responses",
        _codex(
            text={
                "verbosity": "low",
                "format": {
                    "type": "json_schema",
                    "strict": True,
                    "schema": {
                        "type": "object",
                        "properties": {"ok": {"type": "boolean"}},
                        "required": ["ok"],
                        "additionalProperties": False,
                    },
                    "name": "codex_output_schema",
                },
            }
        ),
        check=lambda r: r["response_format"]["type"] == "json_schema" or pytest.fail(str(r)),
    ),
    Shape(
        "codex-reasoning-text-content",
        "codex-rs ReasoningItemContent::ReasoningText (raw reasoning replayed)",
        "/v1/responses",
        {
            "model": "m",
            "input": [
                {"role": "user", "content": "think first"},
                {
                    "type": "reasoning",
                    "id": "rs_9",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": "raw-thought"}],
                    "encrypted_content": None,
                },
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "ok"}],
                },
                {"role": "user", "content": "reasoning-text-next"},
            ],
        },
        check=_reasoning_replayed("raw-thought"),
    ),
    _session_turn("codex-session-turn-12", codex_session, 12, "12 turns of history"),
    Shape(
        "sdk-function-tool-sdk-only-fields",
        "openai-python FunctionToolParam: allowed_callers, defer_loading, output_schema",
        "/v1/responses",
        _responses(
            "sdk-tool-fields",
            tools=[
                {
                    **SHELL,
                    "allowed_callers": ["direct"],
                    "defer_loading": False,
                    "output_schema": {"type": "object"},
                }
            ],
        ),
        check=lambda r: _tools(r) == ["shell"] or pytest.fail(str(r)),
    ),
    Shape(
        "sdk-replayed-calls-with-direct-caller-and-name",
        "openai-python ResponseFunctionToolCallParam.caller / FunctionCallOutput.caller, .name",
        "/v1/responses",
        {
            "model": "m",
            "input": [
                {"role": "user", "content": "list files"},
                {
                    "type": "function_call",
                    "id": "fc_1",
                    "call_id": "call_1",
                    "name": "shell",
                    "arguments": '{"command": ["ls"]}',
                    "caller": {"type": "direct"},
                    "status": "completed",
                },
                {
                    "type": "function_call_output",
                    "call_id": "call_1",
                    "output": "README.md caller-direct",
                    "caller": {"type": "direct"},
                    "name": "shell",
                },
            ],
            "tools": [SHELL],
        },
    ),
    Shape(
        "sdk-prompt-cache-options-implicit",
        "openai-python PromptCacheOptions",
        "/v1/responses",
        _responses("pco-implicit", prompt_cache_options={"mode": "implicit", "ttl": "30m"}),
        hinted=True,
    ),
    Shape(
        "sdk-defer-loading-tool-offered",
        "openai-python FunctionToolParam.defer_loading: tool search cannot run here, so it is offered",
        "/v1/responses",
        _responses("defer", tools=[{**SHELL, "defer_loading": True}]),
        check=lambda r: _tools(r) == ["shell"] or pytest.fail(str(r)),
    ),
    Shape(
        "future-keys-responses",
        "docs/frontend.md Forward compatibility: a later client's new keys, top level to items",
        "/v1/responses",
        _codex(
            input=[
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "future", "render_hint": "bold"}],
                    "turn_origin": "exec",
                }
            ],
            tools=[{**SHELL, "ownership": "core"}],
            reasoning={"effort": "low", "budget_hint": "small"},
            window_id="w1",
        ),
        headers=CODEX_HEADERS,
    ),
    Shape(
        "codex-0.169.0-first-turn-code-mode",
        CODEX["source"],
        CODEX["path"],
        CODEX["body"],
        headers=CODEX["headers"],
        check=lambda r: _code_mode_tools(r),
        session=CODEX["headers"]["thread-id"],
    ),
    Shape(
        "codex-namespaces-tool-search-deferred-tools",
        "codex-rs ToolSpec::Namespace (multi_agent_v1) and ToolSpec::ToolSearch; openai-python "
        "NamespaceToolParam, ToolSearchToolParam, Reasoning.context",
        "/v1/responses",
        _codex(
            tools=[
                SHELL,
                {
                    "type": "namespace",
                    "name": "multi_agent_v1",
                    "description": "Tools for spawning and managing sub-agents.",
                    "tools": [
                        {**SHELL, "name": "spawn_agent", "description": "Spawn an agent."},
                        {**SHELL, "name": "close_agent", "defer_loading": True},
                    ],
                },
                {
                    "type": "tool_search",
                    "execution": "client",
                    "description": "Search deferred tools.",
                    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
                },
                {**SHELL, "name": "mcp_lookup", "defer_loading": True},
            ],
            reasoning={"effort": "low", "summary": "auto", "context": "all_turns"},
        ),
        headers={**CODEX_HEADERS, "session-id": "root", "thread-id": "sub-agent-thread"},
        check=lambda r: (
            (
                _tools(r) == ["shell", "spawn_agent", "close_agent", "mcp_lookup"]
                and r["tools"][1]["description"].startswith("Tools for spawning")
            )
            or pytest.fail(str(r["tools"]))
        ),
        session="sub-agent-thread",
    ),
    Shape(
        "codex-namespaced-call-replayed",
        "codex-rs ResponseItem::FunctionCall {namespace} and its function_call_output",
        "/v1/responses",
        _codex(
            tools=[
                {
                    "type": "namespace",
                    "name": "collaboration",
                    "description": "Agents.",
                    "tools": [{**SHELL, "name": "spawn_agent"}],
                }
            ],
            input=[
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "go"}],
                },
                {
                    "type": "function_call",
                    "call_id": "call_1",
                    "name": "spawn_agent",
                    "namespace": "collaboration",
                    "arguments": "{}",
                },
                {"type": "function_call_output", "call_id": "call_1", "output": "spawned"},
            ],
        ),
        headers=CODEX_HEADERS,
        check=lambda r: (
            r["messages"][-2]["tool_calls"][0]["name"] == "spawn_agent"
            or pytest.fail(str(r["messages"]))
        ),
    ),
    Shape(
        "sdk-file-search-tool-refused",
        "openai-python FileSearchToolParam: needs stored vector stores",
        "/v1/responses",
        _responses("files", tools=[{"type": "file_search", "vector_store_ids": ["vs_1"]}]),
        refused="tools[0].type",
    ),
    Shape(
        "codex-local-shell-call-refused",
        "codex-rs ResponseItem::LocalShellCall (codex-mini's local_shell tool)",
        "/v1/responses",
        _responses(
            "local-shell",
            input=[
                {"role": "user", "content": "ls"},
                {
                    "type": "local_shell_call",
                    "call_id": "c1",
                    "status": "completed",
                    "action": {"type": "exec", "command": ["ls"]},
                },
            ],
        ),
        refused="input[1].type",
    ),
]

# -- OpenAI Chat Completions (Codex chat wire, openai-python) -----------------------------------

CHAT_SHELL: Final = {
    "type": "function",
    "function": {
        "name": "shell",
        "description": "Runs a shell command.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "array", "items": {"type": "string"}}},
            "required": ["command"],
        },
    },
}


def _codex_chat(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """codex-rs ChatRequestBuilder: system instructions first, tools always, stream on."""
    return {
        "model": "m",
        "messages": [{"role": "system", "content": "You are Codex."}, *messages],
        "stream": True,
        "tools": [CHAT_SHELL],
        **fields,
    }


CHAT_ROWS: Final = [
    Shape(
        "future-keys-chat",
        "docs/frontend.md Forward compatibility: a later client's new keys, top level to parts",
        "/v1/chat/completions",
        {
            "model": "m",
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "future", "render_hint": "bold"}],
                    "client_message_id": "m1",
                }
            ],
            "client_trace": {"id": "t"},
            "stream_options": {"include_usage": True, "include_timing": True},
        },
    ),
    Shape(
        "dynamo-gateway-session",
        "Dynamo's gateway: X-Dynamo-Session-ID on whatever the agent sent",
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "gateway"}]},
        headers={"X-Dynamo-Session-ID": "dyn-1", "X-Dynamo-Parent-Session-ID": "dyn-0"},
        session="dyn-1",
    ),
    Shape(
        "codex-chat-reasoning-on-tool-call",
        "codex-rs ChatRequestBuilder: assistant 'reasoning' beside tool_calls",
        "/v1/chat/completions",
        _codex_chat(
            {"role": "user", "content": "list the files"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "shell", "arguments": '{"command":["ls"]}'},
                    }
                ],
                "reasoning": "I should list them.",
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "README.md chat-reasoning"},
        ),
        check=_reasoning_replayed("I should list them."),
    ),
    Shape(
        "codex-chat-reasoning-on-message",
        "codex-rs ChatRequestBuilder: assistant 'reasoning' beside text",
        "/v1/chat/completions",
        _codex_chat(
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello", "reasoning": "greet back"},
            {"role": "user", "content": "chat-reasoning-text"},
        ),
        check=_reasoning_replayed("greet back"),
    ),
    Shape(
        "codex-chat-tool-output-image",
        "codex-rs ChatRequestBuilder: FunctionCallOutput content items as image_url parts",
        "/v1/chat/completions",
        _codex_chat(
            {"role": "user", "content": "view it"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_v",
                        "type": "function",
                        "function": {"name": "shell", "arguments": "{}"},
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "call_v",
                "content": [
                    {"type": "text", "text": "chat-tool-image"},
                    {"type": "image_url", "image_url": {"url": DATA_URL}},
                ],
            },
        ),
        check=lambda r: _messages(r)[-1]["role"] == "tool" or pytest.fail(str(r)),
    ),
    Shape(
        "sdk-chat-agent-loop",
        "openai-python ChatCompletionMessageParam: developer, tool_calls, tool, stream_options",
        "/v1/chat/completions",
        {
            "model": "m",
            "messages": [
                {"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
                {"role": "user", "content": "weather?", "name": "alice"},
                {
                    "role": "assistant",
                    "content": None,
                    "refusal": None,
                    "tool_calls": [
                        {
                            "id": "call_w",
                            "type": "function",
                            "function": {"name": "shell", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_w", "content": "sunny sdk-chat-loop"},
            ],
            "tools": [CHAT_SHELL],
            "tool_choice": "auto",
            "parallel_tool_calls": False,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_completion_tokens": 64,
            "reasoning_effort": "low",
            "verbosity": "low",
            "prompt_cache_key": "session-1",
            "store": False,
        },
    ),
    Shape(
        "sdk-chat-legacy-functions-refused",
        "openai-python CompletionCreateParams.functions (deprecated)",
        "/v1/chat/completions",
        {
            "model": "m",
            "messages": [{"role": "user", "content": "legacy"}],
            "functions": [{"name": "f", "parameters": {"type": "object"}}],
        },
        refused="functions",
    ),
]

# -- Anthropic Messages (Claude Code, anthropic-python) ----------------------------------------

CLAUDE_TOOL: Final = {
    "name": "Bash",
    "description": "Run a command.",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
        "additionalProperties": False,
        "$schema": "http://json-schema.org/draft-07/schema#",
    },
}


def _claude(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 32000,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.0; cch=ab12c;"},
            {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
        ],
        "messages": list(messages),
        "tools": [CLAUDE_TOOL],
        "metadata": {"user_id": json.dumps({"device_id": "d", "session_id": "s"})},
        "stream": True,
        **fields,
    }


def _tool_turn(
    result: dict[str, Any], *, thinking: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": [{"type": "text", "text": "run it"}]},
        {
            "role": "assistant",
            "content": [
                *(thinking or []),
                {"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": {"command": "ls"}},
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", **result}]},
    ]


def _deferred(names: list[str]) -> Check:
    def check(received: dict[str, Any]) -> None:
        assert "DeferredToolPlaceholder" not in _tools(received), _tools(received)
        assert "ToolSearch" in _tools(received)
        assert [t["name"] for t in received.get("deferred_tools") or []] == names

    return check


_CRON: Final = {
    "name": "CronCreate",
    "description": "Schedule a prompt.",
    "input_schema": {"type": "object", "properties": {"cron": {"type": "string"}}},
    "defer_loading": True,
}


def _tool_search_turn() -> dict[str, Any]:
    """Claude Code's ToolSearch answered: its tool_result holds one ``tool_reference`` per match
    (cli.js: ``content: e.matches.map(r => ({type: "tool_reference", tool_name: r}))``), and the
    loaded tool joins ``tools`` with ``defer_loading: true``."""
    body = _claude_code(tools=[*CLAUDE_CODE["body"]["tools"], _CRON])
    body["messages"] += [
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_search",
                    "name": "ToolSearch",
                    "input": {"query": "select:CronCreate", "max_results": 5},
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_search",
                    "content": [{"type": "tool_reference", "tool_name": "CronCreate"}],
                }
            ],
        },
    ]
    return body


def _loaded_cron(received: dict[str, Any]) -> None:
    _deferred(["DeferredToolPlaceholder", "CronCreate"])(received)
    loaded = received["messages"][-1]
    assert loaded["role"] == "tool" and "<functions>" in loaded["content"], loaded
    assert '"name": "CronCreate"' in loaded["content"], loaded


MESSAGES_ROWS: Final = [
    Shape(
        "future-keys-messages",
        "docs/frontend.md Forward compatibility: a later client's new keys, top level to blocks",
        "/v1/messages?beta=true",
        _claude(
            {
                "role": "user",
                "content": [{"type": "text", "text": "future", "render_hint": "bold"}],
                "client_message_id": "m1",
            },
            tools=[{**CLAUDE_TOOL, "ownership_metadata": {"plugin": "p"}}],
            resumption={"type": "enabled"},
            data_flow={"child": "note"},
        ),
        headers=CLAUDE_HEADERS,
    ),
    Shape(
        "claude-code-2.1.328-first-turn",
        CLAUDE_CODE["source"],
        CLAUDE_CODE["path"],
        CLAUDE_CODE["body"],
        headers=CLAUDE_CODE["headers"],
        hinted=True,
        check=_deferred(["DeferredToolPlaceholder"]),
        session=CLAUDE_CODE["headers"]["X-Claude-Code-Session-Id"],
    ),
    Shape(
        "claude-code-2.1.328-tool-turn",
        CLAUDE_CODE["source"] + "; then its tool turn (thinking, tool_use, tool_result)",
        CLAUDE_CODE["path"],
        _claude_code(messages=[*CLAUDE_CODE["body"]["messages"], *CLAUDE_CODE["tool_turn"]]),
        headers=CLAUDE_CODE["headers"],
        hinted=True,
        check=lambda r: r["messages"][-1]["role"] == "tool" or pytest.fail(str(r["messages"])),
    ),
    Shape(
        "claude-code-tool-search-loads-a-deferred-tool",
        "Claude Code 2.1.328 cli.js: ToolSearch's tool_result of tool_reference blocks",
        CLAUDE_CODE["path"],
        _tool_search_turn(),
        headers=CLAUDE_CODE["headers"],
        hinted=True,
        check=_loaded_cron,
    ),
    Shape(
        "claude-code-mid-conversation-tool-changes",
        "Claude Code 2.1.328 cli.js (the SDK tool runner it bundles, beta "
        "mid-conversation-tool-changes-2026-07-01): a system message of tool_addition / "
        "tool_removal blocks",
        CLAUDE_CODE["path"],
        _claude_code(
            messages=[
                *CLAUDE_CODE["body"]["messages"],
                {
                    "role": "system",
                    "content": [
                        {
                            "type": "tool_addition",
                            "tool": {
                                "type": "tool_definition",
                                "definition": {
                                    k: v for k, v in _CRON.items() if k != "defer_loading"
                                },
                            },
                        },
                        {
                            "type": "tool_removal",
                            "tool": {"type": "tool_reference", "name": "Agent"},
                        },
                    ],
                },
                {"role": "user", "content": "schedule it"},
            ]
        ),
        headers=CLAUDE_CODE["headers"],
        hinted=True,
        check=_deferred(["DeferredToolPlaceholder", "CronCreate"]),
    ),
    Shape(
        "claude-code-thinking-updates",
        "Claude Code 2.1.328 cli.js: thinking {display: 'updates'}",
        CLAUDE_CODE["path"],
        _claude_code(thinking={"type": "adaptive", "display": "updates"}),
        headers=CLAUDE_CODE["headers"],
        hinted=True,
    ),
    Shape(
        "claude-code-auto-mode-safeguards",
        "Claude Code 2.1.332 in auto mode: safeguards [{type: 'dangerous_tool_use', "
        "classifier_context}]; its gateway contract (/protocol) asks a server without the "
        "safety check for a 400 naming safeguards, after which it runs the check itself",
        CLAUDE_CODE["path"],
        _claude_code(
            safeguards=[{"type": "dangerous_tool_use", "classifier_context": "auto mode"}],
        ),
        headers=CLAUDE_CODE["headers"],
        refused="safeguards",
    ),
    _session_turn("claude-code-session-turn", claude_code_session, 6, "FACTS.md", hinted=True),
    Shape(
        "claude-code-adaptive-thinking-effort-context-management",
        "Claude Code: thinking adaptive, output_config.effort, clear_thinking keep all",
        "/v1/messages?beta=true",
        _claude(
            {"role": "user", "content": "adaptive-effort"},
            thinking={"type": "adaptive"},
            output_config={"effort": "medium"},
            context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        ),
        headers=CLAUDE_HEADERS,
    ),
    Shape(
        "claude-code-tool-result-blocks-image-error",
        "anthropic-python ToolResultBlockParam: content text + image blocks, is_error",
        "/v1/messages?beta=true",
        _claude(
            *_tool_turn(
                {
                    "content": [
                        {"type": "text", "text": "screenshot follows"},
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                        },
                    ],
                    "is_error": True,
                }
            )
        ),
        headers=CLAUDE_HEADERS,
        check=lambda r: r["messages"][-1].get("is_error") is True or pytest.fail(str(r)),
    ),
    Shape(
        "claude-code-empty-tool-result",
        "Claude Code: a tool that printed nothing (content [] or absent)",
        "/v1/messages?beta=true",
        _claude(*_tool_turn({"content": []})),
        headers=CLAUDE_HEADERS,
    ),
    Shape(
        "claude-code-signed-and-redacted-thinking-history",
        "anthropic-python ThinkingBlockParam (signature) and RedactedThinkingBlockParam",
        "/v1/messages?beta=true",
        _claude(
            *_tool_turn(
                {"content": "ok"},
                thinking=[
                    {"type": "thinking", "thinking": "plan it", "signature": "EqQBCkYIBxgCKkB"},
                    {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"},
                ],
            ),
            thinking={"type": "enabled", "budget_tokens": 4000},
        ),
        headers=CLAUDE_HEADERS,
    ),
    Shape(
        "claude-code-block-cache-control-1h-scope",
        "Claude Code: cache_control {ttl: 1h, scope} on system, the last tool and the newest block",
        "/v1/messages?beta=true",
        {
            **_claude(
                *_tool_turn(
                    {"content": "done", "cache_control": {"type": "ephemeral", "ttl": "1h"}}
                )
            ),
            "system": [
                {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.0; cch=1;"},
                {
                    "type": "text",
                    "text": "You are Claude Code.",
                    "cache_control": {"type": "ephemeral", "ttl": "1h", "scope": "global"},
                },
            ],
            "tools": [{**CLAUDE_TOOL, "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        },
        headers=CLAUDE_HEADERS,
        hinted=True,
    ),
    Shape(
        "claude-code-haiku-side-call",
        "Claude Code: title / quota side call on the small model, no tools",
        "/v1/messages?beta=true",
        {
            "model": "m",
            "max_tokens": 512,
            "messages": [{"role": "user", "content": "quota"}],
            "system": [{"type": "text", "text": "Summarize in a title."}],
            "temperature": 0,
            "metadata": {"user_id": "user_abc_account__session_1"},
            "stream": True,
        },
        headers=CLAUDE_HEADERS,
    ),
    Shape(
        "claude-code-count-tokens",
        "Claude Code: /v1/messages/count_tokens?beta=true with tools and thinking",
        "/v1/messages/count_tokens?beta=true",
        {
            "model": "m",
            "messages": [{"role": "user", "content": "count me"}],
            "tools": [CLAUDE_TOOL],
            "system": "You are Claude Code.",
            "thinking": {"type": "enabled", "budget_tokens": 1024},
        },
        headers=CLAUDE_HEADERS,
    ),
    Shape(
        "sdk-top-level-cache-control",
        "anthropic-python MessageCreateParams.cache_control (automatic caching)",
        "/v1/messages",
        {
            "model": "m",
            "max_tokens": 64,
            "messages": [{"role": "user", "content": "auto-cache"}],
            "cache_control": {"type": "ephemeral", "ttl": "1h"},
        },
        hinted=True,
    ),
    Shape(
        "claude-code-web-search-server-tool-refused",
        "Claude Code WebSearch side call: tools [{type: web_search_20250305, max_uses: 8}]",
        "/v1/messages?beta=true",
        {
            "model": "m",
            "max_tokens": 1024,
            "messages": [{"role": "user", "content": "Perform a web search for: x"}],
            "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 8}],
        },
        headers=CLAUDE_HEADERS,
        refused="tools.0.type",
    ),
    Shape(
        "claude-code-pdf-tool-result-refused",
        "Claude Code Read on a PDF: document block with a base64 PDF source in a tool_result",
        "/v1/messages?beta=true",
        _claude(
            *_tool_turn(
                {
                    "content": [
                        {
                            "type": "document",
                            "source": {
                                "type": "base64",
                                "media_type": "application/pdf",
                                "data": "JVBERi0x",
                            },
                        }
                    ]
                }
            )
        ),
        headers=CLAUDE_HEADERS,
        refused="messages.2.content.0.content.0.source.type",
    ),
]

ROWS: Final = [*RESPONSES_ROWS, *CHAT_ROWS, *MESSAGES_ROWS]


@pytest.fixture(scope="module")
def app_config(router_standin: RouterStandIn) -> FrontendConfig:
    return FrontendConfig(router_url=router_standin.base_url)


@pytest.mark.parametrize("shape", ROWS, ids=[s.id for s in ROWS])
async def test_real_client_shape(
    router_standin: RouterStandIn, app_config: FrontendConfig, shape: Shape
) -> None:
    router_standin.clear()
    client: TestClient[Any, Any] = TestClient(TestServer(create_app(app_config)))
    await client.start_server()
    try:
        resp = await client.post(shape.path, json=shape.body, headers=shape.headers)
        raw = await resp.read()
    finally:
        await client.close()
    if shape.refused is not None:
        _assert_refused(shape, resp.status, raw)
        assert not router_standin.received, "a refused request never reaches the router"
        return
    assert resp.status == 200, raw.decode()
    if shape.body.get("stream"):
        frames = parse_sse(raw)
        assert frames, "an empty stream"
        assert not any(event == "error" or '"error"' in data[:12] for event, data in frames)
    [sent] = router_standin.received
    received = sent.body
    assert ("kv_hints" in received) == shape.hinted, received.get("kv_hints")
    if shape.session is not None:
        assert sent.headers.get(HEADER_SESSION) == shape.session, sent.headers
    if shape.check is not None:
        shape.check(received)


def _assert_refused(shape: Shape, status: int, raw: bytes) -> None:
    assert status == 400, raw.decode()
    body = json.loads(raw)
    if shape.path.startswith("/v1/messages"):
        assert body["type"] == "error"
        assert body["error"]["type"] == "invalid_request_error"
        assert body["error"]["message"].startswith(f"{shape.refused}: "), body
    else:
        assert body["error"]["type"] == "invalid_request_error"
        assert body["error"]["param"] == shape.refused, body
    assert "not" in json.dumps(body).lower(), "the message says what is not supported"


@pytest.mark.parametrize("marker", ["[[reasoning]] [[tool_call]]", "[[custom_tool]]"])
async def test_a_responses_output_replayed_as_input_is_served(
    router_standin: RouterStandIn, app_config: FrontendConfig, marker: str
) -> None:
    """openai-python / openai-agents loops send ``input += response.output`` plus the tool's output."""
    client: TestClient[Any, Any] = TestClient(TestServer(create_app(app_config)))
    await client.start_server()
    try:
        first: dict[str, Any] = {
            "model": "m",
            "input": [{"role": "user", "content": f"replay {marker}"}],
            "tools": [SHELL, APPLY_PATCH],
            "reasoning": {"effort": "low", "summary": "auto"},
        }
        resp = await client.post("/v1/responses", json=first)
        assert resp.status == 200, await resp.text()
        output = (await resp.json())["output"]
        call = next(i for i in output if i["type"] in ("function_call", "custom_tool_call"))
        answer = {"type": f"{call['type']}_output", "call_id": call["call_id"], "output": "ok"}
        second = {**first, "input": [*first["input"], *output, answer]}
        resp = await client.post("/v1/responses", json=second)
        assert resp.status == 200, await resp.text()
    finally:
        await client.close()


async def test_ignored_fields_are_counted_and_traced(
    router_standin: RouterStandIn, app_config: FrontendConfig, tmp_path: Path
) -> None:
    """What the pinned Claude Code sends that nothing here acts on is counted per field on
    ``/metrics`` and named in the request's trace record; the request is served."""
    trace = RequestTrace(tmp_path / "trace.jsonl", component="frontend")
    body = _claude_code(messages=[*CLAUDE_CODE["body"]["messages"], *CLAUDE_CODE["tool_turn"]])
    client: TestClient[Any, Any] = TestClient(TestServer(create_app(app_config, trace=trace)))
    await client.start_server()
    try:
        resp = await client.post(CLAUDE_CODE["path"], json=body, headers=CLAUDE_CODE["headers"])
        assert resp.status == 200, await resp.text()
        await resp.read()
        metrics = await (await client.get("/metrics")).text()
    finally:
        await client.close()
    expected = ["context_management", "messages.*.output_config"]
    for name in expected:
        line = (
            f'kvretention_frontend_ignored_fields_total{{endpoint="messages",field="{name}"}} 1.0'
        )
        assert line in metrics, metrics
    record = json.loads((tmp_path / "trace.jsonl").read_text().splitlines()[-1])
    assert record["ignored_fields"] == expected
