"""Helpers for integration tests against the local control plane (the fixtures are in conftest.py).

Import them as ``from support.controlplane import Cluster, wait_until`` (pytest puts this folder on sys.path).
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

WAIT_S = 60.0
STOP_GRACE_S = 10.0


@dataclass(frozen=True)
class Cluster:
    """A reachable control plane: its kubeconfig, server URL and our own kubectl."""

    kubeconfig: Path
    server: str
    bin_dir: Path
    state_dir: Path | None = None
    """Set when this session started the plane (its logs are in ``state_dir/logs``)."""

    @property
    def env(self) -> dict[str, str]:
        """Environment for a process that should talk to this plane."""
        return {"KUBECONFIG": str(self.kubeconfig)}

    def kubectl(
        self, *args: str, check: bool = True, stdin: str | None = None, timeout_s: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run our kubectl (never the one on PATH) against this plane."""
        argv = [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args]
        done = subprocess.run(
            argv, input=stdin, capture_output=True, text=True, timeout=timeout_s, check=False
        )
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr}")
        return done

    @classmethod
    def from_kubeconfig(cls, kubeconfig: Path, *, bin_dir: Path) -> Cluster:
        """A plane started elsewhere (``kvretention cluster up``), reached through its kubeconfig."""
        data = yaml.safe_load(kubeconfig.read_text())
        context = next(
            c["context"] for c in data["contexts"] if c["name"] == data["current-context"]
        )
        server = next(
            c["cluster"]["server"] for c in data["clusters"] if c["name"] == context["cluster"]
        )
        return cls(kubeconfig=kubeconfig, server=str(server), bin_dir=bin_dir)

    def api_client(self) -> client.ApiClient:
        return config.new_client_from_config(config_file=str(self.kubeconfig))


def wait_until(what: str, check: Callable[[], Any], *, timeout_s: float = WAIT_S) -> Any:
    """Poll ``check`` until it returns something truthy; fail with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.2)


@dataclass
class RunningProcess:
    """A real process started by ``start_process``, with its combined stdout/stderr in a file."""

    argv: list[str]
    proc: subprocess.Popen[bytes]
    log_path: Path
    _stopped: bool = field(default=False, repr=False)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_for_log(self, pattern: str, *, timeout_s: float = WAIT_S) -> re.Match[str]:
        """Wait until the log matches ``pattern`` (a regex); fail early if the process exits."""
        regex = re.compile(pattern)

        def seen() -> re.Match[str] | None:
            found = regex.search(self.log())
            if found is None and not self.alive():
                pytest.fail(
                    f"{self.argv[0]} exited ({self.proc.returncode}):\n{self.log()[-4000:]}"
                )
            return found

        match: re.Match[str] = wait_until(
            f"{pattern!r} in {self.log_path}", seen, timeout_s=timeout_s
        )
        return match

    def stop(self) -> int:
        """SIGTERM, then SIGKILL after a grace period; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._stopped = True
        return self.proc.returncode


StartProcess = Callable[..., RunningProcess]


ApplyCrd = Callable[[Path | str | Mapping[str, Any]], dict[str, Any]]
StartProcess = Callable[..., RunningProcess]
