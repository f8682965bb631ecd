"""SGLang's real engine on CPU for the tests: the tiny model (built once, cached) and a worker on it.

The model is :mod:`kvretention.dataplane.worker.cpu.tiny_model`, built into
``~/.cache/kvretention/tiny-model/<key>`` where the key hashes the builder's source, so an edit to
the builder builds it again and nothing else does. The worker runs ``kvretention worker --engine
sglang --device cpu`` with the repository's ``sgl_kernel`` import shim on ``PYTHONPATH`` and
``KVR_SGL_KERNEL_SHIM_CALLS`` naming a file, so a test fails when serving called a shim function.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvretention.dataplane.worker.cpu import chat_format, tiny_model
from support.processes import KvrProcess, StartKvretention
from support.worker_client import post

REPO = Path(__file__).resolve().parents[2]
SHIM_DIR = REPO / "images" / "worker" / "cpu-shim"
SHIM_CALLS_ENV = "KVR_SGL_KERNEL_SHIM_CALLS"
SERVED_NAME = tiny_model.SERVED_NAME
ENGINE_READY_S = 240.0
"""SGLang's CPU engine starts in 25-45 s on two quiet cores; a loaded CI machine takes longer."""


def _cache_root() -> Path:
    return Path(os.environ.get("KVR_CACHE", Path.home() / ".cache" / "kvretention"))


def tiny_model_dir() -> Path:
    """The tiny model's directory, built on first use (under a lock: test processes may race)."""
    sources = (Path(tiny_model.__file__), Path(chat_format.__file__))
    key = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:16]
    directory = _cache_root() / "tiny-model" / key
    directory.parent.mkdir(parents=True, exist_ok=True)
    with (directory.parent / f"{key}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not tiny_model.is_built(directory):
            tiny_model.save(directory)
    return directory


@dataclass
class CpuWorker:
    """A worker process serving the real engine, and the file its shim would record calls in."""

    process: KvrProcess
    shim_calls: Path

    @property
    def base_url(self) -> str:
        return self.process.base_url

    def shim_functions_called(self) -> list[str]:
        """The ``sgl_kernel`` shim functions serving called (each raised)."""
        if not self.shim_calls.exists():
            return []
        return self.shim_calls.read_text().split()


def cpu_engine_env(shim_calls: Path) -> dict[str, str]:
    """What a worker process on the CPU engine needs in its environment."""
    python_path = os.pathsep.join(p for p in (str(SHIM_DIR), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": python_path, SHIM_CALLS_ENV: str(shim_calls)}


def start_cpu_worker(
    start: StartKvretention,
    tmp: Path,
    *,
    sglang_args: Sequence[str] = (),
    worker_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> CpuWorker:
    """``kvretention worker --engine sglang --device cpu`` on the tiny model, ready to serve."""
    shim_calls = tmp / "sgl-kernel-shim-calls.txt"
    process = start(
        [
            "worker",
            "--engine",
            "sglang",
            "--device",
            "cpu",
            *worker_args,
            "--",
            "--model-path",
            str(tiny_model_dir()),
            "--served-model-name",
            SERVED_NAME,
            "--tool-call-parser",
            "qwen25",
            *sglang_args,
        ],
        env={**cpu_engine_env(shim_calls), **(env or {})},
        ready_path="/readyz",
        timeout=ENGINE_READY_S,
    )
    return CpuWorker(process=process, shim_calls=shim_calls)


StartCpuWorker = Callable[..., CpuWorker]
"""The ``cpu_worker`` fixture: ``cpu_worker(name, sglang_args=..., worker_args=...)``."""


@dataclass(frozen=True)
class CpuFleet:
    """A CPU worker, a router in front of it and a frontend serving the tiny model's name."""

    worker: CpuWorker
    router: KvrProcess
    frontend: KvrProcess


def start_cpu_fleet(
    start: StartKvretention,
    tmp: Path,
    *,
    sglang_args: Sequence[str] = (),
    router_args: Sequence[str] = (),
    frontend_args: Sequence[str] = (),
) -> CpuFleet:
    """:func:`start_cpu_worker`, then ``router --worker`` it, then ``frontend --model`` the tiny
    model's served name through that router, each with its extra arguments."""
    worker = start_cpu_worker(start, tmp, sglang_args=sglang_args)
    router = start(["router", "--worker", worker.base_url, *router_args])
    frontend = start(
        ["frontend", "--router-url", router.base_url, "--model", SERVED_NAME, *frontend_args]
    )
    return CpuFleet(worker=worker, router=router, frontend=frontend)


def generate_tokens(
    worker: CpuWorker,
    ids: Sequence[int],
    *,
    headers: dict[str, str] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """One greedy one-token request of token ``ids`` straight to the worker (``fields`` added to
    its body); the usage its stream ends with."""
    body = {
        "request_id": uuid.uuid4().hex,
        "model": SERVED_NAME,
        "token_ids": list(ids),
        "sampling": {"max_new_tokens": 1, "temperature": 0},
        **fields,
    }
    status, lines = post(worker.base_url, json.dumps(body).encode(), headers)
    assert status == 200, lines
    usage: dict[str, Any] = next(line["usage"] for line in reversed(lines) if line.get("usage"))
    return usage
