"""Start and stop plane processes by pid, surviving the CLI that started them.

A pid is only trusted while ``/proc/<pid>/cmdline`` still names the binary we started, so a
recycled pid is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path


def spawn(argv: list[str], *, log: Path, env: Mapping[str, str] | None = None) -> int:
    """Start argv in its own session (Ctrl-C in a shell does not hit it), logging to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    # posix_spawn, not Popen: no Popen object to warn about a child that outlives it.
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, str(log), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644),
        (os.POSIX_SPAWN_DUP2, 1, 2),
    ]
    return os.posix_spawn(
        argv[0], argv, {**os.environ, **(env or {})}, file_actions=actions, setsid=True
    )


def is_alive(pid: int, binary: str) -> bool:
    """True while pid runs ``binary`` (a path or its basename) and is not a zombie."""
    _reap(pid)
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z" and Path(cmdline).name == Path(binary).name


def stop(pid: int, binary: str, *, grace_s: float = 10.0) -> bool:
    """SIGTERM, then SIGKILL after ``grace_s``; False when it was not running."""
    if not is_alive(pid, binary):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not is_alive(pid, binary):
            return True
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    while is_alive(pid, binary):
        time.sleep(0.05)
    return True


def _reap(pid: int) -> None:
    """Collect our own exited children so they do not linger as zombies."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
