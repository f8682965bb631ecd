"""Run a fleet's data plane on loopback exactly as the operator renders it.

``start_rendered_plane(example)`` renders a ``KvRetentionDeployment`` file with the operator's own
builders (no cluster), takes the frontend, router and worker commands from the Deployments, and
runs them as local processes, changing only what a pod would get from the cluster and the GPU:
``--host``/``--port`` (loopback; ``--metrics-port`` left out), the router's ``--worker-dns`` (the workers' URLs instead), the
frontend's ``--router-url``, the worker's ``--engine sglang`` (the stand-in that records its calls,
``sglang.Engine.async_generate``'s signature), its ``--model-path`` (the test tokenizer with a
Qwen-style tool-aware template, ``support.chat_tokenizer``) and ``--drain-seconds 0`` (no
Endpoints controller to wait for when the test stops it), and with ``secrets`` each auth Secret's
mount path (a local directory laid out as the kubelet mounts it) and the hop key's (one random key
file the components share). One worker per rendered replica.
Every other flag (aliases, session keys, hint policy, parsers, ...) is what a pod would run.
"""

from __future__ import annotations

import json
import secrets as secrets_module
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kvretention.controller.render import load_documents, parse_cr
from kvretention.controller.resources import build_children
from support.argv import set_flag, without_flags
from support.chat_tokenizer import save
from support.cpu_engine import ENGINE_READY_S, cpu_engine_env, tiny_model_dir
from support.processes import KvrProcess

STANDIN = "standin:versioned"
CPU_ENGINE_POOL = ("--context-length", "65536", "--max-total-tokens", "131072")
"""Room for an agent's whole prompt (Claude Code's tools and system prompt) in the KV pool."""
Start = Callable[..., KvrProcess]


@dataclass
class RenderedPlane:
    """The running processes and the files they record to."""

    frontend: KvrProcess
    router: KvrProcess
    workers: dict[str, KvrProcess]
    frontend_trace: Path
    engine_records: dict[str, Path]
    commands: dict[str, list[str]] = field(default_factory=dict)
    """The rendered commands, as the operator wrote them (before the loopback changes)."""
    frontend_args: list[str] = field(default_factory=list)
    """The frontend's arguments here (after the loopback changes, without its trace file): another
    frontend on the same router starts from them."""

    def trace(self) -> list[dict[str, Any]]:
        """The frontend's trace: one entry per request (``request_id``, outcome, status, ...)."""
        if not self.frontend_trace.exists():
            return []
        return [json.loads(line) for line in self.frontend_trace.read_text().splitlines()]

    def engine_calls(self) -> dict[str, tuple[str, dict[str, Any]]]:
        """Every ``generate`` call the stand-in engines recorded: rid -> (worker, call). The rid
        is the frontend's ``request_id``, so a trace entry finds its call."""
        calls: dict[str, tuple[str, dict[str, Any]]] = {}
        for name, record in self.engine_records.items():
            for line in record.read_text().splitlines() if record.exists() else []:
                call = json.loads(line)
                if call.get("event") == "generate":
                    calls[call["rid"]] = (name, call)
        return calls

    def router_metric(self, name: str) -> float:
        """A router counter's value (summed over labels), read from its ``/metrics``."""
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(self.router.base_url + "/metrics", timeout=5) as resp:
            text = resp.read().decode()
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name
        )


def rendered_commands(example: Path) -> tuple[dict[str, list[str]], int]:
    """Each data-plane component's container command, and the worker replica count."""
    (doc,) = load_documents(example)
    cr = parse_cr(doc, source=str(example), namespace="default")
    commands: dict[str, list[str]] = {}
    replicas = 1
    for manifest in build_children(cr):
        if manifest["kind"] != "Deployment":
            continue
        template = manifest["spec"]["template"]
        component = template["metadata"]["labels"].get("app.kubernetes.io/component", "")
        if component in ("frontend", "router", "worker"):
            commands[component] = list(template["spec"]["containers"][0]["command"])
            if component == "worker":
                replicas = int(manifest["spec"].get("replicas", 1))
    missing = {"frontend", "router", "worker"} - set(commands)
    assert not missing, f"{example} renders no {missing} (an aggregated fleet is needed)"
    return commands, replicas


def _mounted(argv: list[str], mount: str, directory: Path) -> list[str]:
    """``--auth-keys-dir=MOUNT`` pointed at the local directory; the flag must be there."""
    flag = f"--auth-keys-dir={mount}"
    assert flag in argv, f"{flag} is not in the rendered command {argv}"
    return [f"--auth-keys-dir={directory}" if a == flag else a for a in argv]


def _hop_key(argv: list[str], key_file: Path) -> list[str]:
    """``--hop-key-file`` (an auth fleet's mounted hop-key Secret) pointed at a local key file that
    every component of the plane shares; unchanged without the flag."""
    flag = "--hop-key-file"
    return [f"{flag}={key_file}" if a.startswith(flag + "=") else a for a in argv]


def _subcommand(command: list[str]) -> list[str]:
    """The arguments after ``kvretention`` (the image's entry point), without the pod's address
    and its metrics port (every process here shares one host: a fixed port would collide)."""
    assert command[0] == "kvretention", command
    cut = command.index("--") if "--" in command else len(command)
    pod_address = ("--host", "--port", "--metrics-port")
    return [*without_flags(command[1:cut], *pod_address), *command[cut:]]


def _cpu_engine_worker(worker: list[str]) -> list[str]:
    """The rendered worker on SGLang's real CPU engine with the tiny model: one rank (SGLang's CPU
    engine runs one here), no ``--reasoning-parser`` (the tiny model has no reasoning format)."""
    worker = set_flag(set_flag(worker, "--model-path", str(tiny_model_dir())), "--tp-size", "1")
    worker = without_flags(worker, "--reasoning-parser")
    cut = worker.index("--")
    return [*worker[:cut], "--device", "cpu", *worker[cut:], *CPU_ENGINE_POOL]


def start_rendered_plane(
    example: Path,
    *,
    start: Start,
    tmp: Path,
    secrets: dict[str, Path] | None = None,
    engine: Literal["standin", "cpu"] = "standin",
) -> RenderedPlane:
    """Start the example's workers (in parallel: each imports SGLang's parsers), router and
    frontend with ``start`` (a process fixture); ``secrets``: Secret name -> the local directory
    that stands for its mount. ``engine="cpu"``: one worker on SGLang's real engine on CPU serving
    the tiny model (``support.cpu_engine``), in place of the stand-in workers; ``engine_records``
    is then empty and the workers' traces say what they served."""
    commands, replicas = rendered_commands(example)
    hop_key = tmp / "hop-key"
    hop_key.write_text(secrets_module.token_hex(32) + "\n")
    worker = _hop_key(_subcommand(commands["worker"]), hop_key)
    worker = set_flag(worker, "--drain-seconds", "0")
    if engine == "cpu":
        worker, replicas = _cpu_engine_worker(worker), 1
    else:
        tokenizer = save(tmp / "tokenizer")
        worker = set_flag(set_flag(worker, "--engine", STANDIN), "--model-path", str(tokenizer))
    cut = worker.index("--")
    records = {f"w{i}": tmp / f"w{i}-engine.jsonl" for i in range(replicas)}

    def start_worker(name: str) -> KvrProcess:
        trace = ["--trace-file", str(tmp / f"{name}-trace.jsonl")]
        if engine == "cpu":
            env = cpu_engine_env(tmp / f"{name}-shim-calls.txt")
            argv = [*worker[:cut], *trace, *worker[cut:]]
            return start(argv, env=env, timeout=ENGINE_READY_S)
        env = {"KVR_STANDIN_RECORD": str(records[name])}
        return start([*worker[:cut], *trace, *worker[cut:]], env=env, timeout=120.0)

    with ThreadPoolExecutor(max_workers=replicas) as pool:
        workers = dict(zip(records, pool.map(start_worker, records), strict=True))
    router_args = without_flags(_hop_key(_subcommand(commands["router"]), hop_key), "--worker-dns")
    router = start([*router_args, *(a for w in workers.values() for a in ("--worker", w.base_url))])
    trace = tmp / "frontend-trace.jsonl"
    frontend_args = set_flag(
        _hop_key(_subcommand(commands["frontend"]), hop_key), "--router-url", router.base_url
    )
    for name, directory in (secrets or {}).items():
        frontend_args = _mounted(frontend_args, f"/etc/kvretention/auth/{name}", directory)
    frontend = start([*frontend_args, "--trace-file", str(trace)])
    return RenderedPlane(
        frontend=frontend,
        router=router,
        workers=workers,
        frontend_trace=trace,
        engine_records={} if engine == "cpu" else records,
        commands=commands,
        frontend_args=frontend_args,
    )
