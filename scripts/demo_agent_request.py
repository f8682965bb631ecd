#!/usr/bin/env python3
"""Run the fleet's data plane on this machine and send it one Claude Code- and one Codex-shaped
request: what the agent gets back, and what the engine was called with.

usage: demo_agent_request.py --deployments FILE --out-dir DIR

FILE is ``kubectl get deploy -l app.kubernetes.io/instance=<fleet> -o json``: the frontend, router
and worker commands exactly as the operator rendered them. kwok pods run no process, so this script
runs those same commands as local processes on loopback, changing only what a pod would get from
the cluster (addresses, ports, Service DNS) and, because no GPU is here, the worker's engine:
``--engine sglang`` becomes ``--engine standin:versioned`` (``sglang.Engine.async_generate``'s
signature, SGLang 0.5.23's kv_hints dialect, recording every call), and the model path becomes a
small local tokenizer with a tool-aware Qwen-style chat template (``tests/support/chat_tokenizer.py``;
no model hub is reachable). SGLang's own tool-call and reasoning parsers, named by the rendered
``--tool-call-parser`` / ``--reasoning-parser``, parse what the stand-in writes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.agent_sessions import claude_code_session, codex_session
from support.chat_tokenizer import save
from support.processes import free_port, http_ok

TOOL_MARKER = "[[standin:reasoning]] [[standin:tool_call:Bash]]"
"""Asks the stand-in to think, then call Bash, in Qwen's native format (see its docstring)."""
STANDIN = "standin:versioned"


def _command(deployments: dict[str, Any], component: str) -> list[str]:
    for item in deployments["items"]:
        labels = item["spec"]["template"]["metadata"].get("labels", {})
        if labels.get("app.kubernetes.io/component") == component:
            command: list[str] = item["spec"]["template"]["spec"]["containers"][0]["command"]
            return command
    raise SystemExit(f"no {component} Deployment in the file")


def _set(argv: list[str], flag: str, value: str) -> list[str]:
    """``flag value`` (or ``flag=value``) replaced in ``argv``."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == flag:
            out[i + 1] = value
            return out
        if arg.startswith(flag + "="):
            out[i] = f"{flag}={value}"
            return out
    raise SystemExit(f"{flag} is not in {argv}")


def _without(argv: list[str], flag: str) -> list[str]:
    """``argv`` without ``flag value`` pairs (the Service DNS a pod would resolve)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == flag:
            skip = True
        elif not arg.startswith(flag + "="):
            out.append(arg)
    return out


def _local(command: list[str], port: int) -> list[str]:
    argv = [sys.executable, "-m", "kvretention", *command[1:]]
    return _set(_set(argv, "--host", "127.0.0.1"), "--port", str(port))


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
    with urllib.request.urlopen(request, timeout=60) as response:
        answer: dict[str, Any] = json.loads(response.read())
        return answer


def _engine_call(record: Path, response_id: str) -> dict[str, Any]:
    rid = response_id.partition("_")[2]
    for line in record.read_text().splitlines():
        call = json.loads(line)
        if call.get("event") == "generate" and call["rid"] == rid:
            return call
    raise SystemExit(f"the engine stand-in recorded no call for {rid}")


def _show(label: str, value: Any) -> None:
    print(f"    {label}: {json.dumps(value, separators=(', ', ': '))}")


def _claude_code(frontend: str, record: Path, alias: str) -> None:
    headers, body = claude_code_session(turns=2, marker=TOOL_MARKER, result_marker=TOOL_MARKER)[-1]
    body["model"] = alias
    print(
        f"\n  Claude Code-shaped POST /v1/messages: model {alias!r} (an alias), "
        f"{len(body['tools'])} tools, {len(body['messages'])} messages with tool_use/tool_result "
        "and thinking history, cache_control on the last system block and the newest block"
    )
    answer = _post(frontend + "/v1/messages", body, headers)
    blocks = [
        {
            "type": b["type"],
            **({"name": b["name"], "input": b["input"]} if b["type"] == "tool_use" else {}),
        }
        for b in answer["content"]
    ]
    _show("answer content", blocks)
    _show("stop_reason", answer["stop_reason"])
    _show("usage", answer["usage"])
    call = _engine_call(record, answer["id"])
    print("    ENGINE STAND-IN (no GPU here) was called with:")
    _show(
        "  input_ids",
        f"{len(call['kwargs']['input_ids'])} tokens, rendered with the chat template and the tools",
    )
    _show("  kv_hints", call["kwargs"]["kv_hints"])


def _codex(frontend: str, record: Path, alias: str) -> None:
    headers, body = codex_session(turns=2, result_marker="[[standin:tool_call:shell]]")[-1]
    body["model"] = alias
    print(
        f"\n  Codex-shaped POST /v1/responses: model {alias!r}, {len(body['tools'])} tools "
        "(apply_patch a custom grammar tool), reasoning/function_call history, no cache control"
    )
    answer = _post(frontend + "/v1/responses", body, headers)
    calls = [
        {"type": o["type"], "name": o["name"], "arguments": o["arguments"]}
        for o in answer["output"]
        if o["type"] == "function_call"
    ]
    _show("answer output", calls)
    call = _engine_call(record, answer["id"])
    print("    ENGINE STAND-IN (no GPU here) was called with:")
    _show(
        "  kv_hints", call["kwargs"].get("kv_hints", "(none: the request asked for no retention)")
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deployments", required=True, type=Path)
    parser.add_argument("--out-dir", required=True, type=Path)
    args = parser.parse_args()
    deployments = json.loads(args.deployments.read_text())
    out: Path = args.out_dir
    out.mkdir(parents=True, exist_ok=True)

    frontend_cmd = _command(deployments, "frontend")
    worker_cmd = _command(deployments, "worker")
    if "aggregated" not in worker_cmd:
        print("  (this demo step runs aggregated fleets only; skipped)")
        return 0
    aliases = [a.split("=", 2)[1] for a in frontend_cmd if a.startswith("--model-alias=")]
    ports = {name: free_port() for name in ("worker", "router", "frontend")}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    record = out / "engine-calls.jsonl"
    record.unlink(missing_ok=True)

    worker = _set(_local(worker_cmd, ports["worker"]), "--engine", STANDIN)
    worker = _set(worker, "--model-path", str(save(out / "tokenizer")))
    router = _local(_command(deployments, "router"), ports["router"])
    router = [*_without(router, "--worker-dns"), "--worker", urls["worker"]]
    frontend = _set(_local(frontend_cmd, ports["frontend"]), "--router-url", urls["router"])

    print("  the rendered commands, run on loopback (engine and model path swapped as described):")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name, argv in (("worker", worker), ("router", router), ("frontend", frontend)):
            print(f"    {name}: kvretention {' '.join(argv[3:])}")
            log = out / f"{name}.log"
            procs.append(_start(argv, log=log, env={"KVR_STANDIN_RECORD": str(record)}))
            _wait(urls[name] + "/healthz", procs[-1], log)
        _wait(urls["frontend"] + "/readyz", procs[-1], out / "frontend.log")
        claude_alias = next((a for a in aliases if a.startswith("claude")), aliases[0])
        codex_alias = next((a for a in aliases if not a.startswith("claude")), aliases[0])
        _claude_code(urls["frontend"], record, claude_alias)
        _codex(urls["frontend"], record, codex_alias)
    finally:
        for proc in reversed(procs):
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
