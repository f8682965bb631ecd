"""The real coding-agent CLIs (Claude Code, Codex from npm) pointed at a data plane.

``installed()`` runs ``scripts/install-clients.sh`` (the pins live there; cached under
``~/.cache/kvretention/clients``) and fails with its message when npm is missing: the tier's gap
shows as a failure, never a skip. ``Recorder`` is a pass-through proxy in front of the frontend: the
bytes go through unchanged and streamed, and each request and answer is kept, so a refused request
is reported with the frontend's own error message and a release's new fields can be listed.
``run_claude`` / ``run_codex`` run one non-interactive task with the client's defaults: no model
flag, no feature switched off, only the offline switches and the endpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp
from aiohttp import web

from support.rendered_plane import RenderedPlane
from support.threaded_app import ThreadedApp
from support.worker_client import wait_for

ROOT: Final = Path(__file__).resolve().parents[2]
AGENTS_EXAMPLE: Final = ROOT / "examples" / "agents.yaml"
"""The fleet the clients tier renders and runs the CLIs against."""
INSTALL: Final = ROOT / "scripts" / "install-clients.sh"
RUN_TIMEOUT_S: Final = 480.0
"""One CLI task's bound. On SGLang's CPU engine a task's first request prefills the CLI's whole
prompt (25-31 k tokens of the tiny model): 60-100 s on 2 idle cores, and 180 s was passed in a
CI run where another tier shared the cores. A task that hangs still fails, within this bound."""
HOP_HEADERS: Final = frozenset(
    {"host", "content-length", "connection", "transfer-encoding", "keep-alive"}
)
CLAUDE_OFFLINE: Final = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
}
"""FACTS.md: what keeps Claude Code off Anthropic's other services; no feature of a request."""
CODEX_KEY_ENV: Final = "KVR_FLEET_API_KEY"
GENERATE_PATHS: Final = ("/v1/messages", "/v1/responses", "/v1/chat/completions")


@dataclass(frozen=True)
class Client:
    name: str
    version: str
    binary: Path


def installed(*, latest: bool = False) -> dict[str, Client]:
    """The CLIs, installed by ``scripts/install-clients.sh`` if not cached; name -> client."""
    argv = [str(INSTALL), *(["--latest"] if latest else [])]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    clients = {}
    for line in done.stdout.splitlines():
        name, version, binary = line.split(" ", 2)
        clients[name] = Client(name, version, Path(binary))
    return clients


# -- the recording proxy ---------------------------------------------------------------------


@dataclass
class Exchange:
    """One request through the recorder and the frontend's answer (its start, for streams)."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    status: int = 0
    answer: str = ""

    @property
    def refused(self) -> bool:
        return self.status >= 400

    @property
    def is_generation(self) -> bool:
        """A request for an answer (not a model list or a token count)."""
        return self.method == "POST" and self.path.split("?")[0] in GENERATE_PATHS


class Recorder(ThreadedApp):
    """A pass-through proxy to ``upstream``; ``start()``, read ``exchanges``, ``stop()``."""

    def __init__(self, upstream: str) -> None:
        super().__init__()
        self.upstream = upstream
        self.exchanges: list[Exchange] = []
        self._session: aiohttp.ClientSession | None = None

    def build_app(self) -> web.Application:
        self._session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        app.on_cleanup.append(self._close_session)
        return app

    async def _close_session(self, app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    def mark(self) -> int:
        return len(self.exchanges)

    def since(self, mark: int) -> list[Exchange]:
        return list(self.exchanges[mark:])

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        raw = await request.read()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        exchange = Exchange(request.method, request.path_qs, dict(request.headers), body)
        self.exchanges.append(exchange)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        async with self._session.request(
            request.method, self.upstream + request.path_qs, data=raw or None, headers=headers
        ) as upstream:
            exchange.status = upstream.status
            response = web.StreamResponse(status=upstream.status)
            for key, value in upstream.headers.items():
                if key.lower() not in HOP_HEADERS:
                    response.headers[key] = value
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                if len(exchange.answer) < 4000:
                    exchange.answer += chunk.decode(errors="replace")
                await response.write(chunk)
            await response.write_eof()
            return response


@dataclass
class Fleet:
    """A rendered plane and the recorder in front of its frontend, which the clients talk to."""

    plane: RenderedPlane
    recorder: Recorder


def run_report(
    result: subprocess.CompletedProcess[str], exchanges: list[Exchange], *, tail: int = 1500
) -> str:
    """What a failed client run shows: its exit, the ends of its output, the refused requests."""
    refused = [(e.path, e.status, e.answer[:300]) for e in exchanges if e.refused]
    return (
        f"exit {result.returncode}\nstdout: {result.stdout[-tail:]}\n"
        f"stderr: {result.stderr[-tail:]}\nrefused: {refused}"
    )


@dataclass
class Task:
    """One CLI task through a fleet's recorder (:func:`run_task`)."""

    result: subprocess.CompletedProcess[str]
    exchanges: list[Exchange]
    """What went through the recorder during the task."""
    trace: list[dict[str, Any]]
    """The frontend's trace entries the task left."""
    calls: list[tuple[str, dict[str, Any]]]
    """(worker, engine call) of each request the frontend forwarded, in the trace's order."""

    def failure(self) -> str:
        return run_report(self.result, self.exchanges)


Launch = Callable[..., subprocess.CompletedProcess[str]]
""":func:`run_claude` or :func:`run_codex` (or either with some of its options bound)."""


def run_task(
    fleet: Fleet, client: Client, launch: Launch, prompt: str, tmp: Path, **options: Any
) -> Task:
    """``launch`` runs ``prompt`` (with ``options``) in ``tmp/work``, its home in ``tmp/home``,
    through the fleet's recorder; the task's trace is read once every generation the frontend
    accepted is in it (written as a stream ends)."""
    plane, recorder = fleet.plane, fleet.recorder
    mark, trace_mark = recorder.mark(), len(plane.trace())
    workdir = tmp / "work"
    workdir.mkdir()
    result = launch(
        client, prompt, base_url=recorder.base_url, workdir=workdir, home=tmp / "home", **options
    )
    exchanges = recorder.since(mark)
    accepted = sum(e.is_generation and not e.refused for e in exchanges)

    def settled() -> tuple[list[dict[str, Any]]] | None:
        trace = plane.trace()[trace_mark:]
        return (trace,) if sum(e["status"] == 200 for e in trace) >= accepted else None

    (trace,) = wait_for(settled, timeout=10.0)
    engine = plane.engine_calls()
    calls = [engine[e["request_id"]] for e in trace if e["request_id"] in engine]
    return Task(result, exchanges, trace, calls)


# -- running the CLIs ------------------------------------------------------------------------


def _base_env(home: Path) -> dict[str, str]:
    """A clean environment: no provider keys or endpoints leak in from the caller's."""
    home.mkdir(parents=True, exist_ok=True)
    keep = {k: os.environ[k] for k in ("PATH", "LANG", "TERM") if k in os.environ}
    return {**keep, "HOME": str(home), "TMPDIR": str(home)}


def _run_cli(
    argv: list[str], *, workdir: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """One non-interactive CLI run in ``workdir``: no stdin, output captured, bounded."""
    return subprocess.run(
        argv,
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


def run_claude(
    client: Client,
    prompt: str,
    *,
    base_url: str,
    workdir: Path,
    home: Path,
    key: str = "kvretention-test",
    extra_env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``claude -p PROMPT`` with Claude Code's defaults (and ``extra_env``: a user's switches),
    against ``base_url``."""
    env = {
        **_base_env(home),
        **CLAUDE_OFFLINE,
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": key,
        **(extra_env or {}),
    }
    return _run_cli([str(client.binary), "-p", prompt], workdir=workdir, env=env)


def codex_config(base_url: str, *, catalog: bool = False) -> str:
    """The README's ``config.toml``: a model provider on the fleet's Responses API; ``catalog``:
    the provider's model discovery on (its ``model_catalog_url`` and the feature switch that 0.171.0
    needs, docs/frontend.md)."""
    provider = (
        "[model_providers.kvretention]\n"
        'name = "kvretention fleet"\n'
        f'base_url = "{base_url}/v1"\n'
        'wire_api = "responses"\n'
        f'env_key = "{CODEX_KEY_ENV}"\n'
    )
    if not catalog:
        return f'model_provider = "kvretention"\n\n{provider}'
    return (
        'model_provider = "kvretention"\n\n'
        f'{provider}model_catalog_url = "{base_url}/v1/models"\n\n'
        "[features]\napi_key_model_discovery = true\n"
    )


def run_codex(
    client: Client,
    prompt: str,
    *,
    base_url: str,
    workdir: Path,
    home: Path,
    key: str = "kvretention-test",
    catalog: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``codex exec PROMPT`` with Codex's defaults (model, tools, sandbox), against ``base_url``;
    ``catalog``: with the fleet's model catalog (:func:`codex_config`)."""
    codex_home = home / "codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(codex_config(base_url, catalog=catalog))
    env = {**_base_env(home), "CODEX_HOME": str(codex_home), CODEX_KEY_ENV: key}
    return _run_cli(
        [str(client.binary), "exec", "--skip-git-repo-check", prompt], workdir=workdir, env=env
    )


# -- what a client sent ----------------------------------------------------------------------


def shape(value: Any, prefix: str = "") -> set[str]:
    """The key paths of a JSON body (list items merged as ``[]``; ``type`` values named, since
    a new item or tool type is a new shape): ``tools[].defer_loading``, ``input[].type=...``."""
    paths: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{prefix}.{key}" if prefix else key
            paths.add(f"{path}={item}" if key == "type" and isinstance(item, str) else path)
            paths |= shape(item, path)
    elif isinstance(value, list):
        for item in value:
            paths |= shape(item, f"{prefix}[]")
    return paths
