#!/usr/bin/env python3
"""Send the fleet one Claude Code- and one Codex-shaped request: what the agent gets back, and
what the worker's engine was called with.

usage: demo_agent_request.py --deployments FILE --out-dir DIR
       demo_agent_request.py --deployments FILE --service URL --kubectl BIN --kubeconfig KC
                             --namespace NS --fleet NAME --record PATH

FILE is ``kubectl get deploy -l app.kubernetes.io/instance=<fleet> -o json``: the frontend, router
and worker commands exactly as the operator rendered them (the frontend's model aliases come from
it in both forms).

With ``--service`` (``make demo`` on real pods) every pod is a real process: the requests go to the
frontend Service's URL (its ClusterIP, which kube-proxy routes from this machine), and the engine
calls are read from the worker pods themselves (``kubectl exec <pod> -c worker -- cat PATH``: the
stand-in image's engine appends each call it gets to ``$KVR_STANDIN_RECORD``, set to PATH in the
fleet's worker pods). That image leaves out SGLang's tool-call and reasoning parsers (they import
torch), so the model's native tool call comes back in the text, unparsed: the script says so.

With ``--out-dir`` (``make demo`` on kwok, whose pods run no process) it runs those same commands
as local processes on loopback, changing only what a pod would get from the cluster (addresses,
ports, Service DNS) and, because no GPU is here, the worker's engine: ``--engine sglang`` becomes
``--engine standin:versioned`` (``sglang.Engine.async_generate``'s signature, SGLang 0.5.23's
kv_hints dialect, recording every call), and the model path becomes a small local tokenizer with a
tool-aware Qwen-style chat template (``tests/support/chat_tokenizer.py``; no model hub is
reachable). SGLang's own tool-call and reasoning parsers, named by the rendered
``--tool-call-parser`` / ``--reasoning-parser``, parse what the stand-in writes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.agent_sessions import claude_code_session, codex_session
from support.chat_tokenizer import save
from support.processes import free_port, http_ok

TOOL_MARKER = "[[standin:reasoning]] [[standin:tool_call:Bash]]"
"""Asks the stand-in to think, then call Bash, in Qwen's native format (see its docstring)."""
STANDIN = "standin:versioned"
NATIVE_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
CALL_WAIT_S = 30.0

EngineCall = Callable[[str], tuple[str, dict[str, Any]]]
"""rid -> (where the engine ran, the call it recorded)."""


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


def _generate_calls(lines: str) -> dict[str, dict[str, Any]]:
    calls = {}
    for line in lines.splitlines():
        call = json.loads(line)
        if call.get("event") == "generate":
            calls[call["rid"]] = call
    return calls


def _local_engine(record: Path) -> EngineCall:
    def find(rid: str) -> tuple[str, dict[str, Any]]:
        calls = _generate_calls(record.read_text()) if record.is_file() else {}
        if rid not in calls:
            raise SystemExit(f"the engine stand-in recorded no call for {rid}")
        return "the local worker process", calls[rid]

    return find


def _pod_engine(kubectl: list[str], namespace: str, fleet: str, record: str) -> EngineCall:
    """Each worker pod's own record, read inside the pod (``kubectl exec``)."""

    def worker_pods() -> list[str]:
        done = subprocess.run(
            [*kubectl, "-n", namespace, "get", "pods", "-o", "json",
             "-l", f"app.kubernetes.io/instance={fleet},app.kubernetes.io/component=worker"],
            capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
        return [p["metadata"]["name"] for p in json.loads(done.stdout)["items"]]

    def find(rid: str) -> tuple[str, dict[str, Any]]:
        deadline = time.monotonic() + CALL_WAIT_S
        while True:
            for pod in worker_pods():
                done = subprocess.run(
                    [*kubectl, "-n", namespace, "exec", pod, "-c", "worker", "--", "cat", record],
                    capture_output=True, text=True, check=False, timeout=60,
                )  # fmt: skip
                calls = _generate_calls(done.stdout) if done.returncode == 0 else {}
                if rid in calls:
                    return f"worker pod {pod}", calls[rid]
            if time.monotonic() > deadline:
                raise SystemExit(f"no worker pod's engine recorded a call for {rid}")
            time.sleep(1.0)

    return find


def _show(label: str, value: Any) -> None:
    print(f"    {label}: {json.dumps(value, separators=(', ', ': '))}")


def _show_native_calls(text: str) -> None:
    """A tool call left in the text (no SGLang parser in the stand-in worker image)."""
    found = NATIVE_CALL.findall(text)
    if not found:
        _show("answer text", text[-300:])
        return
    for raw in found:
        _show("tool call, in the text (Qwen's native <tool_call>)", json.loads(raw))
    print(
        "    (the stand-in worker image leaves out SGLang's parsers, which import torch: the GPU"
        " image's qwen25 parser turns this into a tool call object)"
    )


def _show_engine(where: str, call: dict[str, Any], *, tokens: bool) -> None:
    print(f"    ENGINE STAND-IN (no GPU here) in {where} was called with:")
    if tokens:
        _show(
            "  input_ids",
            f"{len(call['kwargs']['input_ids'])} tokens, rendered with the chat template and the "
            "tools",
        )
    _show(
        "  kv_hints", call["kwargs"].get("kv_hints", "(none: the request asked for no retention)")
    )


def _claude_code(frontend: str, engine: EngineCall, alias: str) -> None:
    headers, body = claude_code_session(turns=2, marker=TOOL_MARKER, result_marker=TOOL_MARKER)[-1]
    body["model"] = alias
    print(
        f"\n  Claude Code-shaped POST {frontend}/v1/messages: model {alias!r} (an alias), "
        f"{len(body['tools'])} tools, {len(body['messages'])} messages with tool_use/tool_result "
        "and thinking history, cache_control on the last system block and the newest block"
    )
    answer = _post(frontend + "/v1/messages", body, headers)
    blocks = answer["content"]
    if any(b["type"] == "tool_use" for b in blocks):
        _show(
            "answer content",
            [
                {
                    "type": b["type"],
                    **({"name": b["name"], "input": b["input"]} if b["type"] == "tool_use" else {}),
                }
                for b in blocks
            ],
        )
    else:
        _show_native_calls("".join(b.get("text", "") for b in blocks if b["type"] == "text"))
    _show("stop_reason", answer["stop_reason"])
    _show("usage", answer["usage"])
    where, call = engine(answer["id"].partition("_")[2])
    _show_engine(where, call, tokens=True)


def _codex(frontend: str, engine: EngineCall, alias: str) -> None:
    headers, body = codex_session(turns=2, result_marker="[[standin:tool_call:shell]]")[-1]
    body["model"] = alias
    print(
        f"\n  Codex-shaped POST {frontend}/v1/responses: model {alias!r}, {len(body['tools'])} tools "
        "(apply_patch a custom grammar tool), reasoning/function_call history, no cache control"
    )
    answer = _post(frontend + "/v1/responses", body, headers)
    calls = [
        {"type": o["type"], "name": o["name"], "arguments": o["arguments"]}
        for o in answer["output"]
        if o["type"] == "function_call"
    ]
    if calls:
        _show("answer output", calls)
    else:
        _show_native_calls(
            "".join(
                part.get("text", "")
                for o in answer["output"]
                if o["type"] == "message"
                for part in o["content"]
            )
        )
    where, call = engine(answer["id"].partition("_")[2])
    _show_engine(where, call, tokens=False)


def _send(frontend: str, engine: EngineCall, aliases: list[str]) -> None:
    claude_alias = next((a for a in aliases if a.startswith("claude")), aliases[0])
    codex_alias = next((a for a in aliases if not a.startswith("claude")), aliases[0])
    _claude_code(frontend, engine, claude_alias)
    _codex(frontend, engine, codex_alias)


def _on_loopback(deployments: dict[str, Any], out: Path, aliases: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    ports = {name: free_port() for name in ("worker", "router", "frontend")}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    record = out / "engine-calls.jsonl"
    record.unlink(missing_ok=True)

    worker = _set(_local(_command(deployments, "worker"), ports["worker"]), "--engine", STANDIN)
    worker = _set(worker, "--model-path", str(save(out / "tokenizer")))
    router = _local(_command(deployments, "router"), ports["router"])
    router = [*_without(router, "--worker-dns"), "--worker", urls["worker"]]
    frontend = _local(_command(deployments, "frontend"), ports["frontend"])
    frontend = _set(frontend, "--router-url", urls["router"])

    print("  the rendered commands, run on loopback (engine and model path swapped as described):")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name, argv in (("worker", worker), ("router", router), ("frontend", frontend)):
            print(f"    {name}: kvretention {' '.join(argv[3:])}")
            log = out / f"{name}.log"
            procs.append(_start(argv, log=log, env={"KVR_STANDIN_RECORD": str(record)}))
            _wait(urls[name] + "/healthz", procs[-1], log)
        _wait(urls["frontend"] + "/readyz", procs[-1], out / "frontend.log")
        _send(urls["frontend"], _local_engine(record), aliases)
    finally:
        for proc in reversed(procs):
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=10)
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
    parser.add_argument("--record", help="with --service: $KVR_STANDIN_RECORD in the worker pods")
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
    needed = ("kubectl", "kubeconfig", "namespace", "fleet", "record")
    if missing := [f"--{n}" for n in needed if getattr(args, n) is None]:
        parser.error(f"--service needs {' '.join(missing)}")
    kubectl = [args.kubectl, "--kubeconfig", args.kubeconfig]
    _send(args.service, _pod_engine(kubectl, args.namespace, args.fleet, args.record), aliases)
    return 0


if __name__ == "__main__":
    sys.exit(main())
