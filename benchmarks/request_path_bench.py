"""Request-path overhead, side by side: direct vs our frontend/router/worker vs LiteLLM vs sglang-router.

Every target answers the same OpenAI chat request from the same bare upstream
(``stub_openai.py``), or, for our full path, from the worker's engine stand-in (same answer):

===================  ===========================================================================
``direct``           load generator -> stub (the baseline every ratio is taken against)
``frontend``         -> our frontend -> stub speaking the router protocol (frontend alone)
``frontend+router``  -> our frontend -> our router -> stub speaking the worker protocol
``full``             -> our frontend -> our router -> our worker (``--engine standin:versioned``)
``frontend/placing`` -> our frontend placing in its own process (``--worker``) -> stub as the worker
``full/placing``     -> our frontend placing (``--worker``) -> our worker: one Python hop
``litellm``          -> LiteLLM's proxy (``.venv-bench``) -> stub
``sglang-router``    -> SGLang's router (``.venv-bench``) -> stub
``.../uvloop``       ``frontend+router`` again, same code, on uvloop (an event-loop experiment)
===================  ===========================================================================

Scenarios: concurrency 1 and 64, streaming and not, a small and a ~200 KB prompt, plus one long
stream (256 chunks) that measures the per-chunk cost, plus agent-shaped ~200 KB streams
(``agent_bodies.py``): a Claude Code Messages body with tools, thinking / tool_use / tool_result
history and two block-level breakpoints on ``/v1/messages``, a Codex body on ``/v1/responses``, and
the Claude Code conversation as a Chat Completions body with tools, and issue 32's Claude Code body
of ~400 small tool turns with one breakpoint, without a session header (``cc-turns``). LiteLLM bridges Messages and
Responses to the stub's Chat Completions (``use_chat_completions_api``), as our frontend turns them
into its neutral conversation; ``direct`` posts the same bytes to the stub, which reads only
``stream`` and the token limit; ``sglang-router`` takes Chat Completions only. Targets run interleaved inside each repeat,
so every ratio compares runs minutes apart at most; medians over repeats. CPU time per request is
read from ``/proc/<pid>/stat`` of the proxy's own processes (the stub and the load generator are
excluded). By default the servers share CPU 0 and the load generator runs pinned on the last CPU.

    .venv/bin/python benchmarks/request_path_bench.py            # ~5 min on 2 cores
    .venv/bin/python benchmarks/request_path_bench.py --quick    # ~1 min smoke run
    .venv/bin/python benchmarks/request_path_bench.py --agents   # agent scenarios + c64-json-small
    git archive REV operator | (mkdir -p /tmp/before && tar -x -C /tmp/before)
    .venv/bin/python benchmarks/request_path_bench.py --before /tmp/before   # + <target>@before

Needs ``benchmarks/setup.sh`` for the peers (they are skipped, and say so, when it has not run).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Final

HERE: Final = Path(__file__).resolve().parent
REPO: Final = HERE.parent
sys.path.insert(0, str(HERE))

from agent_bodies import (  # noqa: E402
    chat_agent_body,
    claude_code_body,
    claude_code_headers,
    codex_body,
    codex_headers,
    small_turns_body,
)
from loadgen import pin_tree, rss_bytes, tree_cpu_seconds  # noqa: E402
from profiling import start_sampler  # noqa: E402

BENCH_VENV: Final = REPO / ".venv-bench"
RESULTS: Final = HERE / "results" / "request_path.json"
MODEL: Final = "stub-model"
API_KEY: Final = "sk-kvr-bench-0123456789abcdef"
"""LiteLLM's master key; sent to every target (the others ignore it) so the requests are equal."""
LONG_STREAM_TOKENS: Final = 256
UVLOOP_TARGET: Final = "frontend+router/uvloop"
PLACING: Final = "frontend/placing"
"""Our frontend placing requests itself (``--worker``): one Python hop in front of the upstream."""
FULL_PLACING: Final = "full/placing"
CHAT_PATH: Final = "/v1/chat/completions"
MESSAGES_PATH: Final = "/v1/messages"
RESPONSES_PATH: Final = "/v1/responses"
ALL_PATHS: Final = frozenset({CHAT_PATH, MESSAGES_PATH, RESPONSES_PATH})
AGENT_SHAPES: Final[dict[str, str]] = {
    "claude-code": MESSAGES_PATH,
    "cc-turns": MESSAGES_PATH,
    "codex": RESPONSES_PATH,
    "chat-agent": CHAT_PATH,
}
"""Agent-shaped bodies (``agent_bodies.py``) and the endpoint each is sent to. ``cc-turns`` is
sent without a session header (``agent_shapes_bench.py`` runs it and more shapes in detail)."""
SMALL_SHAPES: Final[dict[str, str]] = {"messages": MESSAGES_PATH, "responses": RESPONSES_PATH}
"""A small body on Messages or Responses (the long-answer scenarios: each endpoint's per-token
events are its own)."""
CC_TURNS: Final = 200
"""Tool rounds of the ``cc-turns`` body: 401 messages, ~185 KB."""
BASELINE_SCENARIO: Final = "c64-json-small"
READY_TIMEOUT_S: Final = 90.0


def _load_dataplane_helpers() -> ModuleType:
    """The data-plane tier's process helpers (start a ``kvretention`` subcommand on a free port)."""
    candidates = [
        REPO / "tests" / "support" / "processes.py",
        REPO / "tests" / "dataplane" / "conftest.py",  # where they lived before tests/support
    ]
    path = next((p for p in candidates if p.exists()), candidates[0])
    spec = importlib.util.spec_from_file_location("kvr_dataplane_helpers", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


helpers = _load_dataplane_helpers()


# --- what is measured -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    concurrency: int
    stream: bool
    prompt_bytes: int
    max_tokens: int
    requests: int
    """Request budget per run (the run also stops at ``max_seconds``)."""
    shape: str = "chat"
    """``chat`` (a system turn and a padded user turn), or one of :data:`AGENT_SHAPES`."""

    @property
    def path(self) -> str:
        return AGENT_SHAPES.get(self.shape) or SMALL_SHAPES.get(self.shape, CHAT_PATH)

    @property
    def agent(self) -> bool:
        return self.shape in AGENT_SHAPES


@dataclass(frozen=True)
class Target:
    name: str
    base_url: str
    proxy_pids: tuple[int, ...]
    """The processes whose CPU is this target's cost (empty for ``direct``)."""
    worker_pids: tuple[int, ...] = ()
    """Processes that stand for the engine host (our worker); reported apart from the proxy."""
    max_tokens_cap: int | None = None
    """Answers longer than this are not possible (the engine stand-in's fixed reply)."""
    paths: frozenset[str] = ALL_PATHS
    """The endpoints it serves; ``direct`` answers every body on the stub's one path."""
    fixed_path: str | None = None

    def url_for(self, scenario: Scenario) -> str | None:
        if self.fixed_path is not None:
            return self.base_url + self.fixed_path
        return self.base_url + scenario.path if scenario.path in self.paths else None


def build_scenarios(*, quick: bool) -> list[Scenario]:
    """The default matrix; ``quick`` shrinks request budgets for a smoke run."""
    scale = 0.25 if quick else 1.0

    def n(value: int) -> int:
        return max(20, int(value * scale))

    out = []
    for prompt_bytes, label in ((64, "small"), (200_000, "200KB")):
        for concurrency in (1, 64):
            for stream in (False, True):
                big = prompt_bytes > 1000
                budget = (150 if big else 300) if concurrency == 1 else (400 if big else 1500)
                out.append(
                    Scenario(
                        name=f"c{concurrency}-{'stream' if stream else 'json'}-{label}",
                        concurrency=concurrency,
                        stream=stream,
                        prompt_bytes=prompt_bytes,
                        max_tokens=6,
                        requests=n(budget),
                    )
                )
    # a long answer, streamed and read whole; and streamed as Messages and Responses events
    for shape, stream in (("chat", True), ("chat", False), *((s, True) for s in SMALL_SHAPES)):
        endpoint = "" if shape == "chat" else f"{shape}-"
        out.append(
            Scenario(
                name=f"c64-{'stream' if stream else 'json'}-{endpoint}small-{LONG_STREAM_TOKENS}tok",
                concurrency=64,
                stream=stream,
                prompt_bytes=64,
                max_tokens=LONG_STREAM_TOKENS,
                requests=n(400),
                shape=shape,
            )
        )
    out += agent_scenarios(n(400))
    return out


def agent_scenarios(requests: int) -> list[Scenario]:
    """Agents stream: one c=64 stream per agent shape, each body ~200 KB."""
    return [
        Scenario(
            name=f"c64-stream-{shape}-200KB",
            concurrency=64,
            stream=True,
            prompt_bytes=200_000,
            max_tokens=6,
            requests=requests,
            shape=shape,
        )
        for shape in AGENT_SHAPES
    ]


def agent_body(scenario: Scenario) -> dict[str, Any]:
    """The agent's own body, with the served model's name and a 6-token answer: Claude Code's
    ``max_tokens`` becomes 6 and its ``thinking`` control is dropped (a budget must stay below
    ``max_tokens``; the thinking blocks in the history stay); Codex sends no token limit."""
    if scenario.shape == "codex":
        body = codex_body(scenario.prompt_bytes)
    elif scenario.shape == "cc-turns":  # issue 32's: ~400 small tool turns, one breakpoint
        body = small_turns_body(CC_TURNS)
        body["max_tokens"] = scenario.max_tokens
    else:
        body = claude_code_body(scenario.prompt_bytes)
        body["max_tokens"] = scenario.max_tokens
        body.pop("thinking", None)
        if scenario.shape == "chat-agent":
            body = chat_agent_body(body)
    body["model"] = MODEL
    body["stream"] = scenario.stream
    return body


def agent_headers(scenario: Scenario) -> list[str]:
    """The client's own headers (its session key among them), as ``NAME: VALUE``."""
    if scenario.shape == "codex":
        headers = codex_headers()
    elif scenario.shape == "claude-code":
        headers = claude_code_headers()
    else:
        return []
    return [f"{k}: {v}" for k, v in headers.items() if k.lower() != "accept"]


def build_body(scenario: Scenario) -> bytes:
    """One request: an agent's body, or a system turn plus a user turn padded to ``prompt_bytes``
    as Chat Completions (or as Messages or Responses for those shapes)."""
    if scenario.agent:
        return json.dumps(agent_body(scenario)).encode()
    words = "the quick brown fox jumps over a lazy dog "
    filler = (words * (scenario.prompt_bytes // len(words) + 1))[: scenario.prompt_bytes]
    if scenario.shape == "messages":
        return json.dumps(
            {
                "model": MODEL,
                "system": "You are terse.",
                "messages": [{"role": "user", "content": filler}],
                "max_tokens": scenario.max_tokens,
                "stream": scenario.stream,
            }
        ).encode()
    if scenario.shape == "responses":
        return json.dumps(
            {
                "model": MODEL,
                "instructions": "You are terse.",
                "input": filler,
                "max_output_tokens": scenario.max_tokens,
                "stream": scenario.stream,
            }
        ).encode()
    return json.dumps(
        {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": filler},
            ],
            "max_tokens": scenario.max_tokens,
            "stream": scenario.stream,
        }
    ).encode()


# --- processes ------------------------------------------------------------------------------------


def start_external(
    argv: Sequence[str], *, name: str, ready_url: str, log_dir: Path, env: dict[str, str]
) -> Any:
    """Start a non-``kvretention`` server (stub, LiteLLM, sglang-router) and wait for ``ready_url``."""
    log_path = log_dir / f"{name}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            list(argv), stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env}
        )
    port = int(ready_url.split(":")[2].split("/")[0])
    started = helpers.KvrProcess(
        proc=proc, base_url=f"http://127.0.0.1:{port}", port=port, log_path=log_path
    )
    started.args = list(argv)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{started.log()[-3000:]}")
        if helpers.http_ok(ready_url, timeout=0.5):
            return started
        time.sleep(0.1)
    started.stop()
    raise RuntimeError(f"{name} not ready after {READY_TIMEOUT_S}s:\n{started.log()[-3000:]}")


@dataclass
class Stack:
    targets: list[Target] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    processes: dict[str, Any] = field(default_factory=dict)


def _kvr(
    stack: ExitStack,
    args: list[str],
    *,
    log_dir: Path,
    ready: str = "/healthz",
    env: dict[str, str] | None = None,
) -> Any:
    proc = helpers.start_kvretention(
        args, log_dir=log_dir, ready_path=ready, timeout=READY_TIMEOUT_S, env=env
    )
    stack.callback(proc.stop)
    return proc


@contextmanager
def start_stack(
    *,
    log_dir: Path,
    peers: bool,
    only: set[str] | None,
    server_cpus: set[int] | None,
    before: Path | None = None,
) -> Iterator[Stack]:
    """Start every target's processes (once, for all scenarios) and stop them all at the end;
    with ``before``, ``frontend``, ``frontend+router`` and ``frontend/placing`` run a second time
    from that tree's ``operator/`` as ``<target>@before``."""
    out = Stack()

    def want(name: str) -> bool:
        return only is None or name in only

    with ExitStack() as stack:
        stub_port = helpers.free_port()
        stub = start_external(
            [sys.executable, str(HERE / "stub_openai.py"), "--port", str(stub_port),
             "--model-dir", str(log_dir / "stub-model")],
            name="stub", ready_url=f"http://127.0.0.1:{stub_port}/health", log_dir=log_dir, env={},
        )  # fmt: skip
        stack.callback(stub.stop)
        out.processes["stub"] = stub
        out.targets.append(Target("direct", stub.base_url, (), fixed_path=CHAT_PATH))
        fe_args = ["frontend", "--model", MODEL, "--log-level", "warning"]

        def router_and_frontend(
            upstream: str, env: dict[str, str] | None = None
        ) -> tuple[Any, Any]:
            """A router over ``upstream`` and a frontend in front of it."""
            rt = _kvr(
                stack,
                ["router", "--worker", upstream, "--log-level", "WARNING"],
                log_dir=log_dir,
                ready="/readyz",
                env=env,
            )
            fe = _kvr(stack, [*fe_args, "--router-url", rt.base_url], log_dir=log_dir, env=env)
            return rt, fe

        trees: list[tuple[str, dict[str, str] | None]] = [("", None)]
        if before is not None:
            trees.append(("@before", {"PYTHONPATH": str(before.resolve() / "operator")}))
        for tag, env in trees:
            if want("frontend"):
                fe = _kvr(
                    stack, [*fe_args, "--router-url", stub.base_url], log_dir=log_dir, env=env
                )
                out.processes["frontend" + tag] = fe
                out.targets.append(Target("frontend" + tag, fe.base_url, (fe.proc.pid,)))
            if want("frontend+router"):
                rt, fe = router_and_frontend(stub.base_url, env)
                out.processes |= {"fr.router" + tag: rt, "fr.frontend" + tag: fe}
                pids = (fe.proc.pid, rt.proc.pid)
                out.targets.append(Target("frontend+router" + tag, fe.base_url, pids))
            if want(PLACING):
                fe = _kvr(stack, [*fe_args, "--worker", stub.base_url], log_dir=log_dir, env=env)
                out.processes["placing.frontend" + tag] = fe
                out.targets.append(Target(PLACING + tag, fe.base_url, (fe.proc.pid,)))
        if want("full") or want(FULL_PLACING):
            wk = _kvr(
                stack,
                ["worker", "--engine", "standin:versioned", "--log-level", "WARNING"],
                log_dir=log_dir,
            )
            out.processes["full.worker"] = wk
        if want("full"):
            rt, fe = router_and_frontend(wk.base_url)
            out.processes |= {"full.router": rt, "full.frontend": fe}
            out.targets.append(
                Target(
                    "full",
                    fe.base_url,
                    (fe.proc.pid, rt.proc.pid),
                    worker_pids=(wk.proc.pid,),
                    max_tokens_cap=6,
                )
            )
        if want(FULL_PLACING):
            fe = _kvr(stack, [*fe_args, "--worker", wk.base_url], log_dir=log_dir)
            out.processes["full.placing"] = fe
            out.targets.append(
                Target(
                    FULL_PLACING,
                    fe.base_url,
                    (fe.proc.pid,),
                    worker_pids=(wk.proc.pid,),
                    max_tokens_cap=6,
                )
            )
        bench_python = BENCH_VENV / "bin" / "python"
        if peers and want(UVLOOP_TARGET):
            if _has_uvloop(bench_python):
                out.targets.append(_start_uvloop_pair(stack, out, stub=stub, log_dir=log_dir))
            else:
                out.skipped[UVLOOP_TARGET] = "run benchmarks/setup.sh first"
        if peers and want("litellm"):
            if (BENCH_VENV / "bin" / "litellm").exists():
                out.targets.append(_start_litellm(stack, out, stub=stub, log_dir=log_dir))
            else:
                out.skipped["litellm"] = "run benchmarks/setup.sh first"
        if peers and want("sglang-router"):
            if bench_python.exists():
                out.targets.append(_start_sglang_router(stack, out, stub=stub, log_dir=log_dir))
            else:
                out.skipped["sglang-router"] = "run benchmarks/setup.sh first"
        if server_cpus:
            for proc in out.processes.values():
                pin_tree(proc.proc.pid, server_cpus)
        yield out


def _has_uvloop(python: Path) -> bool:
    if not python.exists():
        return False
    probe = [str(python), "-c", "import uvloop, prometheus_client"]
    return subprocess.run(probe, capture_output=True, check=False).returncode == 0


def _start_uvloop_pair(stack: ExitStack, out: Stack, *, stub: Any, log_dir: Path) -> Target:
    """Our router and frontend again, on uvloop (``uvloop_launch.py`` from ``.venv-bench``)."""
    launch = [str(BENCH_VENV / "bin" / "python"), str(HERE / "uvloop_launch.py")]
    env = {"PYTHONPATH": str(REPO / "operator"), "PYTHONUNBUFFERED": "1"}
    rport, fport = helpers.free_port(), helpers.free_port()
    rt = start_external(
        [*launch, "router", "--host", "127.0.0.1", "--port", str(rport),
         "--worker", stub.base_url, "--log-level", "WARNING"],
        name="uvloop-router", ready_url=f"http://127.0.0.1:{rport}/readyz", log_dir=log_dir, env=env,
    )  # fmt: skip
    stack.callback(rt.stop)
    fe = start_external(
        [*launch, "frontend", "--host", "127.0.0.1", "--port", str(fport), "--model", MODEL,
         "--router-url", rt.base_url, "--log-level", "warning"],
        name="uvloop-frontend", ready_url=f"http://127.0.0.1:{fport}/healthz", log_dir=log_dir, env=env,
    )  # fmt: skip
    stack.callback(fe.stop)
    out.processes |= {"uv.router": rt, "uv.frontend": fe}
    return Target(UVLOOP_TARGET, fe.base_url, (fe.proc.pid, rt.proc.pid))


def _start_litellm(stack: ExitStack, out: Stack, *, stub: Any, log_dir: Path) -> Target:
    port = helpers.free_port()
    config = log_dir / "litellm.yaml"
    config.write_text(
        json.dumps(
            {
                "model_list": [
                    {
                        "model_name": MODEL,
                        "litellm_params": {
                            "model": f"openai/{MODEL}",
                            "api_base": f"{stub.base_url}/v1",
                            "api_key": "sk-stub",
                            # /v1/responses bridged to the stub's Chat Completions
                            "use_chat_completions_api": True,
                        },
                    }
                ],
                "litellm_settings": {"drop_params": True, "telemetry": False},
                "general_settings": {"master_key": API_KEY},
            }
        )
    )
    proc = start_external(
        [str(BENCH_VENV / "bin" / "litellm"), "--config", str(config), "--host", "127.0.0.1",
         "--port", str(port), "--num_workers", "1"],
        name="litellm", ready_url=f"http://127.0.0.1:{port}/health/liveliness", log_dir=log_dir,
        env={"LITELLM_LOG": "ERROR", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
             # /v1/messages bridged to the stub's Chat Completions (not its Responses API)
             "LITELLM_USE_CHAT_COMPLETIONS_URL_FOR_ANTHROPIC_MESSAGES": "True",
             "LITELLM_DONT_SHOW_FEEDBACK_BOX": "true", "NO_DOCS": "True"},
    )  # fmt: skip
    stack.callback(proc.stop)
    out.processes["litellm"] = proc
    return Target("litellm", proc.base_url, (proc.proc.pid,))


def _start_sglang_router(stack: ExitStack, out: Stack, *, stub: Any, log_dir: Path) -> Target:
    port, metrics_port = helpers.free_port(), helpers.free_port()
    proc = start_external(
        [str(BENCH_VENV / "bin" / "python"), "-m", "sglang_router.launch_router",
         "--host", "127.0.0.1", "--port", str(port), "--worker-urls", stub.base_url,
         "--policy", "round_robin", "--log-level", "warn",
         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port)],
        name="sglang-router", ready_url=f"http://127.0.0.1:{port}/health", log_dir=log_dir,
        env={"HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    stack.callback(proc.stop)
    out.processes["sglang-router"] = proc
    return Target("sglang-router", proc.base_url, (proc.proc.pid,), paths=frozenset({CHAT_PATH}))


# --- one measurement ------------------------------------------------------------------------------


@dataclass
class Run:
    """One (repeat, scenario, target) measurement."""

    repeat: int
    scenario: str
    target: str
    requests: int
    errors: int
    p50_ms: float
    p99_ms: float
    ttfb_p50_ms: float
    throughput_rps: float
    chunks: int
    proxy_cpu_ms_per_req: float
    worker_cpu_ms_per_req: float
    upstream_cpu_ms_per_req: float
    loadgen_cpu_ms_per_req: float
    chunks_per_proxy_cpu_s: float
    first_error: str | None


def measure(
    scenario: Scenario,
    target: Target,
    *,
    body_file: Path,
    repeat: int,
    stub_pid: int,
    loadgen_cpu: int | None,
    max_seconds: float,
) -> Run:
    """Run the load generator once against ``target`` and account every process's CPU."""
    warmup = min(5, scenario.requests)
    url = target.url_for(scenario)
    if url is None:
        raise ValueError(f"{target.name} does not serve {scenario.path}")
    argv = [
        sys.executable, str(HERE / "loadgen.py"), "--url", url,
        "--body-file", str(body_file), "--concurrency", str(scenario.concurrency),
        "--requests", str(scenario.requests), "--max-seconds", str(max_seconds),
        "--warmup", str(warmup), "--header", f"Authorization: Bearer {API_KEY}",
    ]  # fmt: skip
    if scenario.stream:
        argv.append("--stream")
    for header in agent_headers(scenario):
        argv += ["--header", header]
    if loadgen_cpu is not None:
        argv += ["--cpu", str(loadgen_cpu)]

    def cpu(pids: Sequence[int]) -> float:
        return sum(tree_cpu_seconds(p) for p in pids)

    before = (cpu(target.proxy_pids), cpu(target.worker_pids), cpu([stub_pid]))
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=max_seconds + 120, check=False
    )
    after = (cpu(target.proxy_pids), cpu(target.worker_pids), cpu([stub_pid]))
    if done.returncode != 0:
        raise RuntimeError(f"loadgen failed for {target.name}/{scenario.name}:\n{done.stderr}")
    result = json.loads(done.stdout)
    # Every request the server started work on, including those cancelled at the run's bound.
    served = max(1, result["requests"] + result["errors"] + result.get("cancelled", 0) + warmup)
    proxy_s = after[0] - before[0]
    return Run(
        repeat=repeat,
        scenario=scenario.name,
        target=target.name,
        requests=result["requests"],
        errors=result["errors"],
        p50_ms=result["p50_ms"],
        p99_ms=result["p99_ms"],
        ttfb_p50_ms=result["ttfb_p50_ms"],
        throughput_rps=result["throughput_rps"],
        chunks=result["chunks"],
        proxy_cpu_ms_per_req=proxy_s / served * 1e3,
        worker_cpu_ms_per_req=(after[1] - before[1]) / served * 1e3,
        upstream_cpu_ms_per_req=(after[2] - before[2]) / served * 1e3,
        loadgen_cpu_ms_per_req=result["loadgen_cpu_s"] / max(1, result["requests"]) * 1e3,
        chunks_per_proxy_cpu_s=(result["chunks"] / proxy_s) if proxy_s > 0 else float("nan"),
        first_error=result["first_error"],
    )


# --- profiling --------------------------------------------------------------------------------------


def _file_safe(name: str) -> str:
    """A target's name as part of a file name (``frontend/placing`` holds a slash)."""
    return name.replace("/", "_")


def profile_run(
    scenario: Scenario,
    target: Target,
    *,
    body_file: Path,
    stub_pid: int,
    loadgen_cpu: int | None,
    max_seconds: float,
    out_dir: Path,
) -> dict[str, Any]:
    """One measurement with py-spy sampling every proxy process; returns the top frames of each."""
    samplers = [
        start_sampler(
            pid,
            out_dir / f"{_file_safe(target.name)}-{scenario.name}-{pid}.txt",
            max_seconds=max_seconds + 60,
        )
        for pid in target.proxy_pids + target.worker_pids
    ]
    time.sleep(1.0)  # let py-spy attach
    run = measure(
        scenario, target, body_file=body_file, repeat=0, stub_pid=stub_pid,
        loadgen_cpu=loadgen_cpu, max_seconds=max_seconds,
    )  # fmt: skip
    return {"run": asdict(run), "processes": [s.stop() for s in samplers]}


# --- summary --------------------------------------------------------------------------------------


def _median(values: list[float]) -> float:
    clean = [v for v in values if v == v]  # drop NaN
    return statistics.median(clean) if clean else float("nan")


def summarize(runs: list[Run]) -> dict[str, dict[str, dict[str, float]]]:
    """Per scenario and target: medians over repeats, and per-repeat ratios to ``direct``."""
    by_key: dict[tuple[str, str, int], Run] = {(r.scenario, r.target, r.repeat): r for r in runs}
    out: dict[str, dict[str, dict[str, float]]] = {}
    for scenario in dict.fromkeys(r.scenario for r in runs):
        out[scenario] = {}
        for target in dict.fromkeys(r.target for r in runs if r.scenario == scenario):
            mine = [r for r in runs if r.scenario == scenario and r.target == target]
            pairs = [(r, by_key.get((scenario, "direct", r.repeat))) for r in mine]
            pairs_ok = [(r, d) for r, d in pairs if d is not None]
            litellm = [by_key.get((scenario, "litellm", r.repeat)) for r in mine]
            rust = [by_key.get((scenario, "sglang-router", r.repeat)) for r in mine]
            out[scenario][target] = {
                "repeats": len(mine),
                "requests": sum(r.requests for r in mine),
                "errors": sum(r.errors for r in mine),
                "p50_ms": _median([r.p50_ms for r in mine]),
                "p99_ms": _median([r.p99_ms for r in mine]),
                "ttfb_p50_ms": _median([r.ttfb_p50_ms for r in mine]),
                "throughput_rps": _median([r.throughput_rps for r in mine]),
                "added_p50_ms": _median([r.p50_ms - d.p50_ms for r, d in pairs_ok]),
                "added_p99_ms": _median([r.p99_ms - d.p99_ms for r, d in pairs_ok]),
                "p50_ratio": _median([r.p50_ms / d.p50_ms for r, d in pairs_ok]),
                "throughput_ratio": _median(
                    [r.throughput_rps / d.throughput_rps for r, d in pairs_ok]
                ),
                "proxy_cpu_ms_per_req": _median([r.proxy_cpu_ms_per_req for r in mine]),
                "worker_cpu_ms_per_req": _median([r.worker_cpu_ms_per_req for r in mine]),
                "upstream_cpu_ms_per_req": _median([r.upstream_cpu_ms_per_req for r in mine]),
                "loadgen_cpu_ms_per_req": _median([r.loadgen_cpu_ms_per_req for r in mine]),
                "cpu_ratio_to_litellm": _median(
                    [
                        r.proxy_cpu_ms_per_req / ll.proxy_cpu_ms_per_req
                        for r, ll in zip(mine, litellm, strict=True)
                        if ll is not None and ll.proxy_cpu_ms_per_req > 0
                    ]
                ),
                "cpu_ratio_to_sglang_router": _median(
                    [
                        r.proxy_cpu_ms_per_req / sr.proxy_cpu_ms_per_req
                        for r, sr in zip(mine, rust, strict=True)
                        if sr is not None and sr.proxy_cpu_ms_per_req > 0
                    ]
                ),
                "chunks_per_request": _median([r.chunks / max(1, r.requests) for r in mine]),
                "chunks_per_proxy_cpu_s": _median([r.chunks_per_proxy_cpu_s for r in mine]),
            }
    return out


@dataclass(frozen=True)
class Goal:
    name: str
    target: str
    scenario: str
    metric: str
    op: str
    bound: float


def build_goals() -> list[Goal]:
    """The issue's four goals, each checked on the scenarios it names; the CPU goal also on every
    agent-shaped body."""
    long_stream = f"c64-stream-small-{LONG_STREAM_TOKENS}tok"
    goals = []
    for ours in ("frontend+router", "full"):
        for kind in ("json", "stream"):
            goals.append(Goal("added p50 < 1 ms at c=1", ours, f"c1-{kind}-small", "added_p50_ms", "<", 1.0))  # fmt: skip
            goals.append(Goal(">= 80% of direct throughput at c=64", ours, f"c64-{kind}-small", "throughput_ratio", ">=", 0.8))  # fmt: skip
            goals.append(Goal("<= 1/3 of LiteLLM CPU/request", ours, f"c64-{kind}-small", "cpu_ratio_to_litellm", "<=", 1 / 3))  # fmt: skip
    goals.append(Goal(">= 5000 streamed chunks/s per core", "frontend+router", long_stream, "chunks_per_proxy_cpu_s", ">=", 5000.0))  # fmt: skip
    # Issue 32: one Python hop, beside SGLang's Rust router in the same run.
    for ours in ("frontend+router", PLACING):
        for kind in ("json", "stream"):
            goals.append(Goal("small-body CPU <= 2x sglang-router", ours, f"c1-{kind}-small", "cpu_ratio_to_sglang_router", "<=", 2.0))  # fmt: skip
            goals.append(Goal("added p50 <= 0.5 ms at c=1", ours, f"c1-{kind}-small", "added_p50_ms", "<=", 0.5))  # fmt: skip
    for scenario in agent_scenarios(0):
        for ours in ("frontend+router", "full"):
            goals.append(Goal("<= 1/3 of LiteLLM CPU/request", ours, scenario.name, "cpu_ratio_to_litellm", "<=", 1 / 3))  # fmt: skip
    return goals


def check_goals(
    goals: list[Goal], summary: dict[str, dict[str, dict[str, float]]]
) -> list[dict[str, Any]]:
    """Every goal whose scenario and target (and LiteLLM, for a ratio to it) were measured."""
    out = []
    for goal in goals:
        measured = summary.get(goal.scenario, {})
        peer = {"cpu_ratio_to_litellm": "litellm", "cpu_ratio_to_sglang_router": "sglang-router"}
        if goal.target not in measured or (
            goal.metric in peer and peer[goal.metric] not in measured
        ):
            continue
        value = measured[goal.target].get(goal.metric, float("nan"))
        ok = value == value and (
            value < goal.bound if goal.op == "<" else
            value <= goal.bound if goal.op == "<=" else value >= goal.bound
        )  # fmt: skip
        out.append({**asdict(goal), "value": value, "met": bool(ok)})
    return out


def format_table(summary: dict[str, dict[str, dict[str, float]]]) -> str:
    head = (
        f"{'scenario':<26} {'target':<16} {'p50 ms':>8} {'+p50':>7} {'p99 ms':>8} {'+p99':>8} "
        f"{'req/s':>8} {'x direct':>8} {'cpu ms/req':>10} {'x litellm':>9} {'chunks/cpu-s':>12}"
    )
    lines = [head, "-" * len(head)]
    for scenario, targets in summary.items():
        for target, m in targets.items():
            lines.append(
                f"{scenario:<26} {target:<16} {m['p50_ms']:>8.2f} {m['added_p50_ms']:>+7.2f} "
                f"{m['p99_ms']:>8.2f} {m['added_p99_ms']:>+8.2f} {m['throughput_rps']:>8.0f} "
                f"{m['throughput_ratio']:>8.2f} {m['proxy_cpu_ms_per_req']:>10.3f} "
                f"{m['cpu_ratio_to_litellm']:>9.2f} {m['chunks_per_proxy_cpu_s']:>12.0f}"
            )
        lines.append("")
    return "\n".join(lines)


def format_goals(results: list[dict[str, Any]]) -> str:
    return "\n".join(
        f"{'MET ' if g['met'] else 'MISS'} {g['name']:<38} {g['target']:<16} {g['scenario']:<26} "
        f"{g['metric']}={g['value']:.3f} (goal {g['op']} {g['bound']:.3g})"
        for g in results
    )


def machine_info() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "loadavg": list(os.getloadavg()),
        "uptime": subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip(),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }  # fmt: skip


def peer_versions() -> dict[str, str]:
    pip = BENCH_VENV / "bin" / "pip"
    if not pip.exists():
        return {}
    listing = subprocess.run(
        [str(pip), "list", "--format=json"], capture_output=True, text=True, check=False
    )
    wanted = {"litellm", "sglang-router", "sglang_router"}
    return {p["name"]: p["version"] for p in json.loads(listing.stdout or "[]") if p["name"] in wanted}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="small budgets, 1 repeat: a smoke run")
    parser.add_argument(
        "--agents",
        action="store_true",
        help=f"only the agent-shaped scenarios and {BASELINE_SCENARIO} (a baseline)",
    )
    parser.add_argument("--max-seconds", type=float, default=5.0, help="time bound of each run")
    parser.add_argument(
        "--targets", default=None, help="comma-separated subset (direct is always in)"
    )
    parser.add_argument(
        "--scenarios", default=None, help="comma-separated subset of scenario names"
    )
    parser.add_argument("--no-peers", action="store_true", help="skip LiteLLM and sglang-router")
    parser.add_argument("--no-pin", action="store_true", help="do not pin servers / load generator")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--before",
        type=Path,
        default=None,
        metavar="DIR",
        help="also run our targets from DIR/operator as <target>@before (git archive REV operator)",
    )
    parser.add_argument(
        "--profile",
        metavar="TARGET:SCENARIO",
        default=None,
        help="instead of the matrix: one run of TARGET under py-spy (needs .venv-bench)",
    )
    args = parser.parse_args(argv)  # fmt: skip
    repeats = 1 if args.quick else args.repeats
    scenarios = build_scenarios(quick=args.quick)
    if args.scenarios or args.agents:
        chosen = set(args.scenarios.split(",")) if args.scenarios else set()
        if args.agents:
            chosen |= {BASELINE_SCENARIO} | {s.name for s in scenarios if s.agent}
        scenarios = [s for s in scenarios if s.name in chosen]
    only = set(args.targets.split(",")) if args.targets else None
    cpus = sorted(os.sched_getaffinity(0))
    pin = not args.no_pin and len(cpus) >= 2
    server_cpus = set(cpus[:-1]) if pin else None
    loadgen_cpu = cpus[-1] if pin else None
    if server_cpus:
        os.sched_setaffinity(0, server_cpus)  # every server we start inherits this
    runs: list[Run] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kvr-bench-") as tmp:
        log_dir = Path(tmp)
        bodies = {}
        for s in scenarios:
            bodies[s.name] = log_dir / f"{s.name}.json"
            bodies[s.name].write_bytes(build_body(s))
        with start_stack(
            log_dir=log_dir,
            peers=not args.no_peers,
            only=only,
            server_cpus=server_cpus,
            before=args.before,
        ) as stack:
            for name, why in stack.skipped.items():
                print(f"skipping {name}: {why}", file=sys.stderr)
            stub_pid = stack.processes["stub"].proc.pid
            if args.profile:
                target_name, _, scenario_name = args.profile.partition(":")
                target = next(t for t in stack.targets if t.name == target_name)
                scenario = next(s for s in scenarios if s.name == scenario_name)
                prof = profile_run(
                    scenario, target, body_file=bodies[scenario.name], stub_pid=stub_pid,
                    loadgen_cpu=loadgen_cpu, max_seconds=args.max_seconds,
                    out_dir=HERE / "results" / "profiles",
                )  # fmt: skip
                out = (
                    HERE
                    / "results"
                    / "profiles"
                    / f"{_file_safe(target_name)}-{scenario_name}.json"
                )
                out.write_text(json.dumps(prof, indent=2) + "\n")
                print(json.dumps(prof, indent=2))
                return
            for repeat in range(repeats):
                for scenario in scenarios:
                    for target in stack.targets:
                        if target.max_tokens_cap and scenario.max_tokens > target.max_tokens_cap:
                            continue
                        if target.url_for(scenario) is None:
                            continue  # e.g. sglang-router serves Chat Completions only
                        run = measure(
                            scenario, target, body_file=bodies[scenario.name], repeat=repeat,
                            stub_pid=stub_pid, loadgen_cpu=loadgen_cpu,
                            max_seconds=args.max_seconds,
                        )  # fmt: skip
                        runs.append(run)
                        print(
                            f"[{time.monotonic() - started:6.0f}s] r{repeat} {scenario.name:<26} "
                            f"{target.name:<24} p50 {run.p50_ms:7.2f} ms  {run.throughput_rps:7.0f} "
                            f"req/s  cpu {run.proxy_cpu_ms_per_req:6.3f} ms/req  err {run.errors}",
                            file=sys.stderr,
                        )  # fmt: skip
            rss = {name: rss_bytes(p.proc.pid) for name, p in stack.processes.items()}
            skipped = dict(stack.skipped)
    summary = summarize(runs)
    goals = check_goals(build_goals(), summary)
    report = {
        "benchmark": "request_path",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": machine_info(),
        "pinning": {"server_cpus": sorted(server_cpus or []), "loadgen_cpu": loadgen_cpu},
        "peers": peer_versions(),
        "skipped": skipped,
        "scenarios": [asdict(s) for s in scenarios],
        "max_seconds_per_run": args.max_seconds,
        "repeats": repeats,
        "elapsed_s": round(time.monotonic() - started, 1),
        "rss_bytes_after": rss,
        "summary": summary,
        "goals": goals,
        "runs": [asdict(r) for r in runs],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n")
    print(format_table(summary))
    if goals:
        print(format_goals(goals))
    print(f"\nwrote {args.out} ({report['elapsed_s']} s; {report['machine']['uptime']})")


if __name__ == "__main__":
    main()
