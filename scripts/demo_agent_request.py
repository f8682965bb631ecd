#!/usr/bin/env python3
"""Send the fleet Claude Code- and Codex-shaped requests: the real engine's answers, SGLang's own
cached-token count on a second turn of the same conversation, a tool call parsed by SGLang, and what
the worker passed SGLang (its request trace).

usage: demo_agent_request.py --deployments FILE --out-dir DIR
       demo_agent_request.py --deployments FILE --service URL --kubectl BIN --kubeconfig KC
                             --namespace NS --fleet NAME --trace PATH

FILE is ``kubectl get deploy -l app.kubernetes.io/instance=<fleet> -o json``: the frontend, router
and worker commands exactly as the operator rendered them (the frontend's model aliases come from
it in both forms).

The engine is SGLang 0.5.23's real ``sglang.Engine`` on CPU serving the project's tiny random Llama
(``kvretention tiny-model``): its answers are noise, so what the demo shows is their shape, the
token counts SGLang reports (``cached_tokens``: the prompt's prefix read from SGLang's radix cache)
and tool calls that SGLang's ``qwen25`` parser turned into ``tool_use`` / ``function_call``
objects (a forced ``tool_choice``: SGLang constrains the output to the tool's schema).

With ``--service`` (``make demo`` on real pods) every pod is a real process: the requests go to the
frontend Service's URL (its ClusterIP, which kube-proxy routes from this machine), and what the
worker passed SGLang is read from the worker pods themselves (``kubectl exec <pod> -c worker -- cat
PATH``: the worker's request trace, ``$KVR_REQUEST_TRACE``, set to PATH in the fleet's worker pods).

With ``--out-dir`` (``make demo`` on kwok, whose pods run no process) it runs those same commands
as local processes on loopback, changing only what a pod would get from the cluster (addresses,
ports, Service DNS), the model path (the tiny model, built here once and cached:
``tests/support/cpu_engine.py``) and ``--device cpu``, with the ``sgl_kernel`` import shim on
``PYTHONPATH`` as the CPU worker image has it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from kvretention.replay.sessions import claude_code_session, codex_session
from support.argv import set_flag, without_flags
from support.cpu_engine import SHIM_DIR, tiny_model_dir
from support.processes import free_port, http_ok

TRACE_WAIT_S = 30.0
ENGINE_READY_S = 300.0
"""SGLang's CPU engine starts in 25-45 s on two quiet cores; a loaded machine takes longer."""
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"],
}
"""A small tool schema: a forced call fits in a few dozen tokens of the tiny model."""
FORCED_CALL_TOKENS = 256
"""Room for one call: ``strict`` has SGLang constrain the arguments to the schema, so even the
tiny model's noise parses as ``{"city": "..."}`` once the call is complete."""

TraceLookup = Callable[[str], tuple[str, dict[str, Any]]]
"""request id -> (where the worker ran, its request trace record)."""


def _command(deployments: dict[str, Any], component: str) -> list[str]:
    for item in deployments["items"]:
        labels = item["spec"]["template"]["metadata"].get("labels", {})
        if labels.get("app.kubernetes.io/component") == component:
            command: list[str] = item["spec"]["template"]["spec"]["containers"][0]["command"]
            return command
    raise SystemExit(f"no {component} Deployment in the file")


def _local(command: list[str], port: int) -> list[str]:
    argv = [sys.executable, "-m", "kvretention", *command[1:]]
    return set_flag(set_flag(argv, "--host", "127.0.0.1"), "--port", str(port))


def _start(argv: list[str], *, log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env}
        )


def _wait(url: str, proc: subprocess.Popen[bytes], log: Path, *, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{url} exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
        if http_ok(url, timeout=0.5):
            return
        time.sleep(0.1)
    raise SystemExit(f"{url} not ready after {timeout:.0f}s:\n{log.read_text()[-2000:]}")


def _post(url: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    data = json.dumps({**body, "stream": False}).encode()
    request = urllib.request.Request(
        url, data=data, headers={**headers, "content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            answer: dict[str, Any] = json.loads(response.read())
            return answer
    except urllib.error.HTTPError as err:
        raise SystemExit(f"POST {url}: {err.code} {err.read()[:1000]!r}") from err


def _trace_records(lines: str) -> dict[str, dict[str, Any]]:
    records = {}
    for line in lines.splitlines():
        record = json.loads(line)
        if record.get("component") == "worker":
            records[record["request_id"]] = record
    return records


def _local_trace(trace: Path) -> TraceLookup:
    def find(rid: str) -> tuple[str, dict[str, Any]]:
        deadline = time.monotonic() + TRACE_WAIT_S
        while True:
            records = _trace_records(trace.read_text()) if trace.is_file() else {}
            if rid in records:
                return "the local worker process", records[rid]
            if time.monotonic() > deadline:
                raise SystemExit(f"the worker's request trace has no record of {rid}")
            time.sleep(0.5)

    return find


def _pod_trace(kubectl: list[str], namespace: str, fleet: str, trace: str) -> TraceLookup:
    """Each worker pod's own request trace, read inside the pod (``kubectl exec``)."""

    def worker_pods() -> list[str]:
        done = subprocess.run(
            [*kubectl, "-n", namespace, "get", "pods", "-o", "json",
             "-l", f"app.kubernetes.io/instance={fleet},app.kubernetes.io/component=worker"],
            capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
        return [p["metadata"]["name"] for p in json.loads(done.stdout)["items"]]

    def find(rid: str) -> tuple[str, dict[str, Any]]:
        deadline = time.monotonic() + TRACE_WAIT_S
        while True:
            for pod in worker_pods():
                done = subprocess.run(
                    [*kubectl, "-n", namespace, "exec", pod, "-c", "worker", "--", "cat", trace],
                    capture_output=True, text=True, check=False, timeout=60,
                )  # fmt: skip
                records = _trace_records(done.stdout) if done.returncode == 0 else {}
                if rid in records:
                    return f"worker pod {pod}", records[rid]
            if time.monotonic() > deadline:
                raise SystemExit(f"no worker pod's request trace has a record of {rid}")
            time.sleep(1.0)

    return find


def _show(label: str, value: Any) -> None:
    print(f"    {label}: {json.dumps(value, separators=(', ', ': '))}")


def _show_trace(where: str, record: dict[str, Any]) -> None:
    print(f"    the worker in {where} passed SGLang (its request trace):")
    _show("  kv_hints", record.get("kv_hints", "(none: the request asked for no retention)"))
    _show("  outcome", record["outcome"])


def _claude_code(frontend: str, trace: TraceLookup, alias: str) -> None:
    *_, first, second = claude_code_session(turns=2)
    print(
        f"\n  Claude Code-shaped POST {frontend}/v1/messages, two turns of one conversation: model "
        f"{alias!r} (an alias), {len(second[1]['tools'])} tools, {len(second[1]['messages'])} "
        "messages with tool_use/tool_result and thinking history, cache_control on the last "
        "system block and the newest block"
    )
    for turn, (headers, body) in enumerate((first, second), start=1):
        answer = _post(frontend + "/v1/messages", {**body, "model": alias}, headers)
        usage = answer["usage"]
        print(
            f"    turn {turn}: stop_reason {answer['stop_reason']}, "
            f"{len(answer['content'])} content block(s) from SGLang, input_tokens "
            f"{usage['input_tokens']}, cache_read_input_tokens (SGLang's cached_tokens) "
            f"{usage.get('cache_read_input_tokens')}"
        )
    if not usage.get("cache_read_input_tokens"):
        raise SystemExit("the second turn read nothing from SGLang's radix cache")
    _show_trace(*trace(answer["id"].partition("_")[2]))


def _codex(frontend: str, trace: TraceLookup, alias: str) -> None:
    *_, first, second = codex_session(turns=2)
    print(
        f"\n  Codex-shaped POST {frontend}/v1/responses, two turns of one conversation: model "
        f"{alias!r}, {len(second[1]['tools'])} tools (apply_patch a custom grammar tool), "
        "reasoning/function_call history, no cache control"
    )
    for turn, (headers, body) in enumerate((first, second), start=1):
        answer = _post(frontend + "/v1/responses", {**body, "model": alias}, headers)
        usage = answer["usage"]
        cached = (usage.get("input_tokens_details") or {}).get("cached_tokens")
        print(
            f"    turn {turn}: status {answer['status']}, {len(answer['output'])} output item(s) "
            f"from SGLang, input_tokens {usage['input_tokens']}, cached_tokens (SGLang's) {cached}"
        )
    if not cached:
        raise SystemExit("the second turn read nothing from SGLang's radix cache")
    _show_trace(*trace(answer["id"].partition("_")[2]))


def _tool_calls(frontend: str, alias: str, codex_alias: str) -> None:
    print(
        "\n  Forced tool calls (tool_choice, strict, one call): SGLang constrains the tiny model's "
        "output to the tool's schema and its qwen25 parser turns it into the provider's object"
    )
    message = _post(
        frontend + "/v1/messages",
        {
            "model": alias,
            "max_tokens": FORCED_CALL_TOKENS,
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": [{"name": "get_weather", "input_schema": WEATHER, "strict": True}],
            "tool_choice": {
                "type": "tool",
                "name": "get_weather",
                "disable_parallel_tool_use": True,
            },
        },
        {"anthropic-version": "2023-06-01"},
    )
    uses = [
        {"type": b["type"], "id": b["id"], "name": b["name"], "input": b["input"]}
        for b in message["content"]
        if b["type"] == "tool_use"
    ]
    _show(f"Anthropic /v1/messages content (stop_reason {message['stop_reason']})", uses)
    response = _post(
        frontend + "/v1/responses",
        {
            "model": codex_alias,
            "max_output_tokens": FORCED_CALL_TOKENS,
            "input": "What is the weather in Paris?",
            "tools": [
                {"type": "function", "name": "get_weather", "parameters": WEATHER, "strict": True}
            ],
            "tool_choice": "required",
            "parallel_tool_calls": False,
        },
        {},
    )
    calls = [
        {"type": o["type"], "call_id": o["call_id"], "name": o["name"], "arguments": o["arguments"]}
        for o in response["output"]
        if o["type"] == "function_call"
    ]
    _show(f"OpenAI /v1/responses output (status {response['status']})", calls)
    if not uses or not calls:
        raise SystemExit("a forced tool call did not come back as a parsed tool call object")


def _send(frontend: str, trace: TraceLookup, aliases: list[str]) -> None:
    claude_alias = next((a for a in aliases if a.startswith("claude")), aliases[0])
    codex_alias = next((a for a in aliases if not a.startswith("claude")), aliases[0])
    _claude_code(frontend, trace, claude_alias)
    _codex(frontend, trace, codex_alias)
    _tool_calls(frontend, claude_alias, codex_alias)


def _on_loopback(deployments: dict[str, Any], out: Path, aliases: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    ports = {name: free_port() for name in ("worker", "router", "frontend")}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    trace = out / "worker-trace.jsonl"
    trace.unlink(missing_ok=True)

    worker = _local(_command(deployments, "worker"), ports["worker"])
    worker = set_flag(
        without_flags(worker, "--metrics-port"), "--model-path", str(tiny_model_dir())
    )
    split = worker.index("--")
    worker = [*worker[:split], "--device", "cpu", "--trace-file", str(trace), *worker[split:]]
    router = without_flags(
        _local(_command(deployments, "router"), ports["router"]), "--metrics-port"
    )
    router = [*without_flags(router, "--worker-dns"), "--worker", urls["worker"]]
    frontend = _local(_command(deployments, "frontend"), ports["frontend"])
    frontend = set_flag(without_flags(frontend, "--metrics-port"), "--router-url", urls["router"])
    python_path = os.pathsep.join(p for p in (str(SHIM_DIR), os.environ.get("PYTHONPATH")) if p)
    env = {"PYTHONPATH": python_path, "OMP_NUM_THREADS": "1"}

    print("  the rendered commands, run on loopback (model path and device set as described):")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name, argv in (("worker", worker), ("router", router), ("frontend", frontend)):
            print(f"    {name}: kvretention {' '.join(argv[3:])}")
            log = out / f"{name}.log"
            procs.append(_start(argv, log=log, env=env))
            ready = ENGINE_READY_S if name == "worker" else 90.0
            _wait(urls[name] + "/readyz", procs[-1], log, timeout=ready)
        _send(urls["frontend"], _local_trace(trace), aliases)
    finally:
        for proc in reversed(procs):
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deployments", required=True, type=Path)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--out-dir", type=Path, help="run the data plane here on loopback (kwok)")
    where.add_argument("--service", help="the frontend Service's URL (real pods)")
    parser.add_argument("--kubectl", help="with --service: the kubectl binary")
    parser.add_argument("--kubeconfig", help="with --service")
    parser.add_argument("--namespace", help="with --service: the fleet's namespace")
    parser.add_argument("--fleet", help="with --service: the KvRetentionDeployment's name")
    parser.add_argument("--trace", help="with --service: $KVR_REQUEST_TRACE in the worker pods")
    args = parser.parse_args()
    deployments = json.loads(args.deployments.read_text())

    frontend_cmd = _command(deployments, "frontend")
    if "aggregated" not in _command(deployments, "worker"):
        print("  (this demo step runs aggregated fleets only; skipped)")
        return 0
    aliases = [a.split("=", 2)[1] for a in frontend_cmd if a.startswith("--model-alias=")]
    if args.out_dir is not None:
        _on_loopback(deployments, args.out_dir, aliases)
        return 0
    needed = ("kubectl", "kubeconfig", "namespace", "fleet", "trace")
    if missing := [f"--{n}" for n in needed if getattr(args, n) is None]:
        parser.error(f"--service needs {' '.join(missing)}")
    kubectl = [args.kubectl, "--kubeconfig", args.kubeconfig]
    _send(args.service, _pod_trace(kubectl, args.namespace, args.fleet, args.trace), aliases)
    return 0


if __name__ == "__main__":
    sys.exit(main())
