"""py-spy helpers shared by the benchmarks: sample a running server, summarize where time went.

py-spy lives in ``.venv-bench`` (``benchmarks/setup.sh``); it attaches to a pid from outside, so
the process under test runs unmodified. The summary is the share of samples per function, self
(the frame on top of the stack) and inclusive (anywhere in the stack), with line numbers dropped.
"""

from __future__ import annotations

import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

REPO: Final = Path(__file__).resolve().parent.parent
PY_SPY: Final = REPO / ".venv-bench" / "bin" / "py-spy"


@dataclass
class Sampler:
    pid: int
    path: Path
    proc: subprocess.Popen[bytes]

    def stop(self, *, timeout_s: float = 30.0) -> dict[str, Any]:
        """Stop sampling (py-spy writes its file on SIGINT) and summarize it."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return {"pid": self.pid, "file": str(self.path), **summarize_collapsed(self.path)}


def start_sampler(pid: int, path: Path, *, max_seconds: float, rate: int = 250) -> Sampler:
    """Sample ``pid`` into ``path`` (collapsed stacks) until stopped or ``max_seconds`` pass."""
    if not PY_SPY.exists():
        raise SystemExit("py-spy is in .venv-bench: run benchmarks/setup.sh first")
    path.parent.mkdir(parents=True, exist_ok=True)
    argv = [
        str(PY_SPY), "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw",
        "--duration", str(max(1, int(max_seconds))), "--nonblocking", "-o", str(path),
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return Sampler(pid=pid, path=path, proc=proc)


def _frame(raw: str) -> str:
    """``func (path/to/file.py:12)`` -> ``func (file.py)``."""
    name, _, where = raw.partition(" (")
    return f"{name} ({where.split(':')[0].rsplit('/', 1)[-1]})" if where else name


def summarize_collapsed(path: Path, *, top: int = 15) -> dict[str, Any]:
    """Self and inclusive sample shares per function from py-spy's collapsed-stack output."""
    self_n: dict[str, int] = {}
    incl_n: dict[str, int] = {}
    total = 0
    if not path.exists():
        return {"samples": 0, "self": [], "inclusive": []}
    for line in path.read_text().splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        frames = [_frame(f) for f in stack.split(";") if f]
        if not frames:
            continue
        count = int(count_s)
        total += count
        self_n[frames[-1]] = self_n.get(frames[-1], 0) + count
        for frame in set(frames):
            incl_n[frame] = incl_n.get(frame, 0) + count

    def share(table: dict[str, int]) -> list[tuple[str, float]]:
        ranked = sorted(table.items(), key=lambda kv: -kv[1])[:top]
        return [(name, round(n / total, 3)) for name, n in ranked] if total else []

    return {"samples": total, "self": share(self_n), "inclusive": share(incl_n)}
