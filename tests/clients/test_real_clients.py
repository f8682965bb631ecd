"""Claude Code and Codex, as users run them, against the fleet of ``examples/agents.yaml``.

The pinned npm releases (``scripts/install-clients.sh``) run one non-interactive task each with
their defaults (no model flag, no feature switched off) through a pass-through recorder into the
frontend, router and two workers the operator renders for the example (``support.rendered_plane``;
only the GPU engine is the stand-in that records its calls). The task asks the stand-in for a tool
call that runs ``printf`` in a temporary directory; the client runs it, sends the result, and the
stand-in answers with text (no marker in a tool result's turn), so the client finishes.
"""

from __future__ import annotations

import functools
import json
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from support.chat_tokenizer import build_tokenizer
from support.processes import StartKvretention
from support.real_clients import (
    AGENTS_EXAMPLE,
    Client,
    Fleet,
    Launch,
    Recorder,
    Task,
    run_claude,
    run_codex,
    run_task,
    shape,
)
from support.rendered_plane import RenderedPlane, start_rendered_plane
from support.worker_client import STANDIN_ANSWER

pytestmark = pytest.mark.clients

STICKY = "kvretention_router_sticky_placements_total"
CLAUDE_CODE_TTL = 300
"""Claude Code's ``cache_control`` carries no ``ttl``: Anthropic's default, 5 minutes."""
FLEET_POLICY_TTL = 1800
"""``hints.defaultTtlSeconds`` of the example: what Codex's requests (no cache control) get."""


@dataclass
class Run(Task):
    """One CLI task: the process, what went through the recorder, and the fleet's view of it."""

    client: Client
    sticky: float
    """Router placements decided by a session pin during the run."""
    proof: str
    """What the tool's command prints: it is in no prompt unless the command ran."""

    def refused(self) -> list[tuple[str, int, str]]:
        return [(e.path, e.status, e.answer[:400]) for e in self.exchanges if e.refused]

    def failure(self) -> str:
        return f"{self.client.name} {self.client.version}: {super().failure()}"


@pytest.fixture(scope="module")
def fleet(start: StartKvretention, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    plane = start_rendered_plane(AGENTS_EXAMPLE, start=start, tmp=tmp_path_factory.mktemp("plane"))
    with Recorder(plane.frontend.base_url) as recorder:
        yield Fleet(plane, recorder)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer()


def _run(
    fleet: Fleet, client: Client, launch: Launch, prompt: Callable[[str], str], tmp: Path
) -> Run:
    sticky = fleet.plane.router_metric(STICKY)
    token = uuid.uuid4().hex[:12]
    task = run_task(fleet, client, launch, prompt(token), tmp)
    run = Run(
        **vars(task),
        client=client,
        sticky=fleet.plane.router_metric(STICKY) - sticky,
        proof=f"kvr-{token}",
    )
    _report(run)
    return run


def _report(run: Run) -> None:
    """With ``KVR_CLIENTS_REPORT``, add what this client sent to that JSON file."""
    path = os.environ.get("KVR_CLIENTS_REPORT")
    if not path:
        return
    report_file = Path(path)
    report = json.loads(report_file.read_text()) if report_file.exists() else {}
    bodies = [e.body for e in run.exchanges if isinstance(e.body, dict)]
    report[run.client.name] = {
        "version": run.client.version,
        "exit_code": run.result.returncode,
        "requests": [f"{e.method} {e.path} {e.status}" for e in run.exchanges],
        "refused": run.refused(),
        "ignored_fields": sorted({f for e in run.trace for f in e.get("ignored_fields", [])}),
        "body_shape": sorted(set().union(*(shape(b) for b in bodies))),
        "headers": sorted({h.lower() for e in run.exchanges for h in e.headers}),
    }
    report_file.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")


def _marker(tool: str, arguments: dict[str, Any]) -> str:
    """Asks the stand-in to call ``tool`` with these arguments (see its docstring)."""
    return f"[[standin:tool_call:{tool}]] [[standin:tool_args:{json.dumps(arguments)}]]"


def _command(token: str) -> str:
    """A harmless command whose output (``kvr-TOKEN``) appears in no prompt before it ran."""
    return f"printf 'kvr-%s' {token}"


def _prompt(call: dict[str, Any], tokenizer: Any) -> str:
    return str(tokenizer.decode(call["kwargs"]["input_ids"]))


def _retain_ttls(call: dict[str, Any]) -> set[int]:
    """The TTLs of the ``kv.retain`` directives the engine got."""
    assert call["kv_hints_passed"], "the engine got no kv_hints"
    actions = call["kwargs"]["kv_hints"]["actions"]
    assert {(a["action_type"], a["action_version"]) for a in actions} == {("kv.retain", "1.0")}
    return {d["duration"] for a in actions for d in a["payload"]["directives"]}


# ------------------------------------------------------------------ Claude Code


@pytest.fixture(scope="module")
def claude(
    fleet: Fleet, clients: dict[str, Client], tmp_path_factory: pytest.TempPathFactory
) -> Run:
    def prompt(token: str) -> str:
        return f"Run the check. {_marker('Bash', {'command': _command(token)})}"

    tmp = tmp_path_factory.mktemp("claude")
    return _run(fleet, clients["claude"], run_claude, prompt, tmp)


def test_claude_code_runs_the_tool_and_the_result_reaches_the_engine(
    claude: Run, tokenizer: Any
) -> None:
    """tool_use -> Bash runs printf -> tool_result -> a text answer."""
    results = [
        block
        for e in claude.exchanges
        if isinstance(e.body, dict)
        for m in e.body.get("messages", [])
        if isinstance(m.get("content"), list)
        for block in m["content"]
        if block.get("type") == "tool_result"
    ]
    assert any(claude.proof in json.dumps(r["content"]) for r in results), claude.failure()
    assert not any(r.get("is_error") for r in results)
    first, *later = [_prompt(call, tokenizer) for _, call in claude.calls]
    assert claude.proof not in first
    assert later and claude.proof in later[-1].rsplit("<tool_response>", 1)[-1]


def test_claude_code_breakpoints_reach_the_engine_as_retention(claude: Run) -> None:
    assert claude.calls, claude.failure()
    for _, call in claude.calls:
        assert _retain_ttls(call) == {CLAUDE_CODE_TTL}


# ------------------------------------------------------------------ Codex


@pytest.fixture(scope="module")
def codex(
    fleet: Fleet,
    clients: dict[str, Client],
    claude: Run,
    tmp_path_factory: pytest.TempPathFactory,
) -> Run:
    """Runs after Claude Code (the router's counters are read around each run)."""

    def prompt(token: str) -> str:
        # Codex's default model runs in code mode: one `exec` tool taking JavaScript that calls
        # its nested tools, here exec_command (a shell command in its sandbox).
        script = f"text((await tools.exec_command({{cmd: {json.dumps(_command(token))}}})).output)"
        return f"Run the check. {_marker('exec', {'input': script})}"

    tmp = tmp_path_factory.mktemp("codex")
    return _run(fleet, clients["codex"], run_codex, prompt, tmp)


def test_codex_runs_the_tool_and_the_result_reaches_the_engine(codex: Run, tokenizer: Any) -> None:
    """exec (custom tool) -> exec_command runs printf -> its output -> a text answer."""
    outputs = [
        item
        for e in codex.exchanges
        if isinstance(e.body, dict)
        for item in e.body.get("input", [])
        if isinstance(item, dict) and item.get("type", "").endswith("_call_output")
    ]
    assert any(codex.proof in json.dumps(o.get("output")) for o in outputs), codex.failure()
    first, *later = [_prompt(call, tokenizer) for _, call in codex.calls]
    assert codex.proof not in first
    assert later and codex.proof in later[-1].rsplit("<tool_response>", 1)[-1]


def test_codex_names_its_cache_by_session_and_sends_no_cache_options(codex: Run) -> None:
    """What 0.171.0 sends a custom provider (captured 2026-12-04, docs/frontend.md): every
    Responses body carries ``prompt_cache_key`` = its session id and no ``prompt_cache_options``
    (the field is in its request type but left unset), so retention comes from the fleet default.
    A release that starts sending options fails here, which is the cue to check the frontend
    honours them."""
    posts = [
        e
        for e in codex.exchanges
        if e.path.split("?")[0].endswith("/responses") and isinstance(e.body, dict)
    ]
    assert posts, codex.failure()
    for e in posts:
        session = {v for k, v in e.headers.items() if k.lower() == "session-id"}
        assert session and e.body.get("prompt_cache_key") in session, (e.path, session)
        assert "prompt_cache_options" not in e.body


def test_codex_is_retained_by_the_fleet_policy(codex: Run) -> None:
    """Codex sends no cache control; the example's hints.defaultTtlSeconds retains its prompts."""
    assert codex.calls, codex.failure()
    for _, call in codex.calls:
        assert _retain_ttls(call) == {FLEET_POLICY_TTL}


# ------------------------------------------------------------------ what the clients send back


def _assistant_texts(run: Run) -> list[str]:
    """Every text the client replays as the assistant's (Anthropic text blocks of assistant
    messages; Responses assistant message items' output_text parts)."""
    texts = []
    for e in run.exchanges:
        body = e.body if isinstance(e.body, dict) else {}
        for item in [*body.get("messages", []), *body.get("input", [])]:
            if not isinstance(item, dict) or item.get("role") != "assistant":
                continue
            content = item.get("content")
            parts = content if isinstance(content, list) else [{"text": content}]
            texts += [p["text"] for p in parts if isinstance(p.get("text"), str)]
    return texts


BOTH = pytest.mark.parametrize("name", ["claude", "codex"])


@BOTH
def test_the_client_finishes_its_task_with_its_defaults(
    name: str, request: pytest.FixtureRequest
) -> None:
    run: Run = request.getfixturevalue(name)
    assert run.result.returncode == 0, run.failure()
    assert STANDIN_ANSWER in run.result.stdout, run.failure()


@BOTH
def test_the_client_gets_no_request_refused(name: str, request: pytest.FixtureRequest) -> None:
    run: Run = request.getfixturevalue(name)
    assert run.refused() == [], run.failure()
    assert [e for e in run.trace if e["status"] != 200] == []


@BOTH
def test_the_clients_session_keeps_the_conversation_on_one_worker(
    name: str, request: pytest.FixtureRequest
) -> None:
    """The router pins the session, so every request after the first is placed by it, not by a
    prefix match (Codex names its conversation only in headers: thread-id, session-id)."""
    run: Run = request.getfixturevalue(name)
    assert len(run.calls) >= 2, run.failure()
    assert len({worker for worker, _ in run.calls}) == 1
    assert run.sticky == len(run.calls) - 1


@BOTH
def test_no_whitespace_only_text_comes_back_before_a_tool_call(
    name: str, request: pytest.FixtureRequest
) -> None:
    """The answer before a tool call had no text: the client must not replay an empty one."""
    run: Run = request.getfixturevalue(name)
    assert [t for t in _assistant_texts(run) if not t.strip()] == [], run.failure()


# ------------------------------------------------------------------ model discovery

FLEET_INSTRUCTIONS = "You are the kvretention fleet's coding agent. Keep answers short."
"""What the fleet's Codex catalog serves as ``base_instructions`` (``--codex-instructions-file``)."""
CODEX_OWN_PROMPT = "You are a coding agent running in the Codex CLI"


def _served_name(plane: RenderedPlane) -> str:
    """The frontend's ``--model`` (the name the fleet serves)."""
    args = plane.frontend_args
    for i, arg in enumerate(args):
        if arg == "--model":
            return args[i + 1]
        if arg.startswith("--model="):
            return arg.partition("=")[2]
    raise AssertionError(f"no --model in {args}")


def _say_hello(token: str) -> str:
    return f"Say hello ({token})."


@pytest.fixture(scope="module")
def claude_discovering(
    fleet: Fleet, clients: dict[str, Client], codex: Run, tmp_path_factory: pytest.TempPathFactory
) -> Run:
    """Claude Code with its gateway model discovery switched on (after the default runs)."""
    launch = functools.partial(
        run_claude, extra_env={"CLAUDE_CODE_ENABLE_GATEWAY_MODEL_DISCOVERY": "1"}
    )
    tmp = tmp_path_factory.mktemp("claude-discovery")
    return _run(fleet, clients["claude"], launch, _say_hello, tmp)


@pytest.fixture(scope="module")
def codex_with_catalog(
    fleet: Fleet,
    clients: dict[str, Client],
    start: StartKvretention,
    claude_discovering: Run,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Run]:
    """Codex with the provider's model catalog on, against a second frontend of the same fleet
    that serves Codex's catalog (``frontend.codexInstructions`` in a CR)."""
    tmp = tmp_path_factory.mktemp("codex-catalog")
    instructions = tmp / "instructions.md"
    instructions.write_text(FLEET_INSTRUCTIONS)
    frontend = start(
        [
            *fleet.plane.frontend_args,
            "--codex-instructions-file",
            str(instructions),
            "--trace-file",
            str(fleet.plane.frontend_trace),
        ]
    )
    recorder = Recorder(frontend.base_url)
    recorder.start()
    try:
        launch = functools.partial(run_codex, catalog=True)
        yield _run(Fleet(fleet.plane, recorder), clients["codex"], launch, _say_hello, tmp)
    finally:
        recorder.stop()
        frontend.stop()


def test_claude_code_discovers_the_fleets_models(claude_discovering: Run, fleet: Fleet) -> None:
    run = claude_discovering
    assert run.result.returncode == 0, run.failure()
    asked = [e for e in run.exchanges if e.method == "GET" and e.path == "/v1/models?limit=1000"]
    assert asked, run.failure()
    assert asked[0].status == 200, asked[0].answer
    listed = [m["id"] for m in json.loads(asked[0].answer)["data"]]
    assert _served_name(fleet.plane) in listed


def test_codex_takes_the_fleets_catalog_model_and_instructions(
    codex_with_catalog: Run, fleet: Fleet
) -> None:
    """With the catalog, Codex asks for it, defaults to its first model (the served name) and
    sends the fleet's instructions in place of its own prompt."""
    run = codex_with_catalog
    assert run.result.returncode == 0, run.failure()
    asked = [e for e in run.exchanges if e.method == "GET" and e.path.startswith("/v1/models?")]
    assert asked, run.failure()
    assert asked[0].status == 200, asked[0].answer
    assert f"client_version={run.client.version}" in asked[0].path
    turns = [
        e
        for e in run.exchanges
        if e.path.split("?")[0] == "/v1/responses" and isinstance(e.body, dict)
    ]
    assert turns, run.failure()
    for e in turns:
        assert e.body["model"] == _served_name(fleet.plane)
        sent = json.dumps(e.body)
        assert FLEET_INSTRUCTIONS in sent
        assert CODEX_OWN_PROMPT not in sent
