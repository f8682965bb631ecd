"""Frontend -> router -> worker as real processes, the worker on the engine stand-in and the test
tokenizer: the chain the data-plane tests that need all three hops start."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.chat_tokenizer import save
from support.processes import KvrProcess, StartKvretention


@dataclass(frozen=True)
class StandinChain:
    frontend: str
    router: str
    worker: str
    record: Path
    """The stand-in's record (``KVR_STANDIN_RECORD``): what the engine was called with."""


def write_key_files(directory: Path, keys: Mapping[str, str]) -> Path:
    """``directory`` with one file per tenant holding its API key, as ``--auth-keys-dir`` reads."""
    directory.mkdir(parents=True)
    for tenant, key in keys.items():
        (directory / tenant).write_text(key + "\n")
    return directory


def start_recorded_worker(
    start: StartKvretention,
    directory: Path,
    *,
    env: Mapping[str, str],
    engine: str = "standin:flat",
    args: Sequence[str] = (),
) -> tuple[KvrProcess, Path]:
    """One stand-in worker (``engine``, with ``args`` and ``env``) recording its engine calls to
    ``directory/calls.jsonl``; the process and that record."""
    record = directory / "calls.jsonl"
    proc = start(
        ["worker", "--engine", engine, *args], env={"KVR_STANDIN_RECORD": str(record), **env}
    )
    return proc, record


StartRecordedWorker = Callable[..., tuple[KvrProcess, Path]]
""":func:`start_recorded_worker` with its start function and directory bound."""


def start_recorded_workers(
    start: StartKvretention,
    records: Sequence[Path],
    *,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> list[str]:
    """One ``standin:versioned`` worker (with ``args``) per record file, each recording its engine
    calls there; their base URLs, in ``records`` order."""
    return [
        start(
            ["worker", "--engine", "standin:versioned", *args],
            env={"KVR_STANDIN_RECORD": str(record), **(env or {})},
            **kwargs,
        ).base_url
        for record in records
    ]


def worker_flags(urls: Sequence[str]) -> list[str]:
    """``--worker URL`` for each worker, as a router takes its static pool."""
    return [flag for url in urls for flag in ("--worker", url)]


def start_standin_chain(
    start: StartKvretention,
    d: Path,
    *,
    hop_key: Path | None = None,
    trace: Path | None = None,
    frontend_args: Sequence[str] = (),
) -> StandinChain:
    """Start the worker (``standin:versioned``, the tokenizer saved under ``d``), a router in front
    of it and a frontend in front of that (with ``frontend_args``). ``hop_key``: all three sign
    and check the hop with it; ``trace``: the worker's request trace."""
    hop = ["--hop-key-file", str(hop_key)] if hop_key is not None else []
    record = d / "engine.jsonl"
    worker = start(
        [
            *("worker", "--engine", "standin:versioned"),
            *("--model-path", str(save(d / "tokenizer"))),
            *(["--trace-file", str(trace)] if trace is not None else []),
            *hop,
        ],
        env={"KVR_STANDIN_RECORD": str(record)},
        timeout=90.0,
    )
    router = start(["router", "--worker", worker.base_url, *hop])
    frontend = start(["frontend", "--router-url", router.base_url, *frontend_args, *hop])
    return StandinChain(frontend.base_url, router.base_url, worker.base_url, record)


def post_chat(base_url: str, body: dict[str, Any], *, api_key: str) -> dict[str, Any]:
    """POST ``body`` to the frontend's ``/v1/chat/completions`` with ``api_key``; the answer."""
    request = urllib.request.Request(
        base_url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "authorization": f"Bearer {api_key}"},
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        answer: dict[str, Any] = json.load(resp)
    return answer
