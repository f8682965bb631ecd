"""Run ``kvretention <subcommand>`` as a real process: shared by the data-plane, e2e and bench tiers.

``start_kvretention(args)`` launches ``python -m kvretention <args> --host 127.0.0.1 --port <free>``,
waits (bounded) until ``GET /healthz`` answers 200 and returns the process with its base URL. The
``kvretention_process`` fixture factory stops everything it started when its module finishes, so a
test module starts each process once (module scope keeps the tier fast).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvretention.ports import free_port

READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 5.0


@dataclass
class KvrProcess:
    """A running ``kvretention`` subcommand and where to reach it."""

    proc: subprocess.Popen[bytes]
    base_url: str
    port: int
    log_path: Path
    args: list[str] = field(default_factory=list)

    def log(self) -> str:
        """Everything the process wrote to stdout and stderr so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after a bounded wait; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=STOP_TIMEOUT_S)
        return self.proc.returncode


def http_ok(url: str, *, timeout: float = 1.0) -> bool:
    """True when ``GET url`` answers 2xx."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return 200 <= int(resp.status) < 300
    except (urllib.error.URLError, OSError):
        return False


def start_kvretention(
    args: list[str],
    *,
    log_dir: Path,
    env: dict[str, str] | None = None,
    ready_path: str = "/healthz",
    timeout: float = READY_TIMEOUT_S,
    host: str = "127.0.0.1",
) -> KvrProcess:
    """Start ``python -m kvretention <args> --host H --port P`` and wait until ``ready_path`` is 200.

    ``--host``/``--port`` go before a ``--`` in ``args`` (a worker's SGLang flags follow it).
    Raises ``RuntimeError`` with the process log if it exits or does not get ready in time.
    """
    port = free_port()
    cut = args.index("--") if "--" in args else len(args)
    listen = ["--host", host, "--port", str(port)]
    argv = [sys.executable, "-m", "kvretention", *args[:cut], *listen, *args[cut:]]
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{args[0] if args else 'kvretention'}-{port}.log"
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=full_env)
    started = KvrProcess(proc=proc, base_url=f"http://{host}:{port}", port=port, log_path=log_path)
    started.args = argv
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"{' '.join(argv)} exited with {proc.returncode}:\n{started.log()[-4000:]}"
            )
        if http_ok(started.base_url + ready_path, timeout=0.5):
            return started
        time.sleep(0.05)
    started.stop()
    raise RuntimeError(f"{' '.join(argv)} not ready after {timeout}s:\n{started.log()[-4000:]}")


StartKvretention = Callable[..., KvrProcess]


def started_in_module(logs: Path) -> Iterator[StartKvretention]:
    """A module fixture's body: start ``kvretention`` subcommands logging under ``logs``; stop
    them all, newest first, when the module ends."""
    started: list[KvrProcess] = []

    def run(args: list[str], **kwargs: Any) -> KvrProcess:
        process = start_kvretention(args, log_dir=logs, **kwargs)
        started.append(process)
        return process

    yield run
    for process in reversed(started):
        process.stop()
