"""A worker loading SGLang's real engine stops on SIGTERM, and leaves no engine process behind.

Loading takes tens of seconds on a CPU (minutes for a large model on a GPU): a pod deleted or
rolled meanwhile must not wait out its grace period, and as a container's PID 1 the worker would
ignore SIGTERM without a handler of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from support.cpu_engine import SERVED_NAME, cpu_engine_env, tiny_model_dir
from support.processes import free_port

pytestmark = pytest.mark.cpu_engine

STOP_S = 15.0


def test_sigterm_while_the_engine_loads_stops_the_worker_and_its_engine(tmp_path: Path) -> None:
    argv = [
        sys.executable, "-m", "kvretention", "worker", "--engine", "sglang", "--device", "cpu",
        "--host", "127.0.0.1", "--port", str(free_port()), "--",
        "--model-path", str(tiny_model_dir()), "--served-model-name", SERVED_NAME,
    ]  # fmt: skip
    log = (tmp_path / "worker.log").open("wb")
    env = {**os.environ, **cpu_engine_env(tmp_path / "shim-calls.txt")}
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    worker = psutil.Process(proc.pid)
    deadline = time.monotonic() + 120
    while not worker.children(recursive=True) and time.monotonic() < deadline:
        time.sleep(0.2)  # SGLang has begun spawning its scheduler: the engine is loading
    engine = worker.children(recursive=True)
    assert engine, "the engine never started loading"
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=STOP_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 128 + signal.SIGTERM, (tmp_path / "worker.log").read_text()[-3000:]
    assert time.monotonic() - started < STOP_S
    _, alive = psutil.wait_procs(engine, timeout=STOP_S)
    assert alive == [], f"engine processes left behind: {alive}"
