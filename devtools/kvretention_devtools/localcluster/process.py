"""Start and stop plane processes by pid, surviving the CLI that started them.

A pid is only trusted while ``/proc/<pid>/cmdline`` still names the binary we started, so a
recycled pid is never signalled. A child this process just spawned may still be mid-exec (its
cmdline empty or still ours); it counts as alive until it exits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from kvretention_devtools.localcluster.errors import ClusterError


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
    """True while pid runs ``binary`` (a path or its basename) and is not a zombie; our own
    child counts from the moment it was spawned, before its exec shows in its cmdline."""
    _reap(pid)
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError, UnicodeDecodeError):
        return False
    state, ppid = fields[0], int(fields[1])
    if state == "Z":
        return False
    if Path(cmdline).name == Path(binary).name:
        return True
    # glibc's posix_spawn returns once the child's exec has replaced its memory but before
    # the new argv is in place: for a moment cmdline reads empty, or still as this process.
    return ppid == os.getpid() and cmdline in ("", _own_argv0())


@dataclass(frozen=True)
class Watched:
    """A started process whose exit ends a wait early, with its log's tail as the reason."""

    pid: int
    binary: str
    log: Path


def wait_until(
    what: str,
    check: Callable[[], bool],
    *,
    watched: Mapping[str, Watched],
    deadline: float,
    interval_s: float = 0.2,
) -> None:
    """Poll ``check`` until true; fail at once when a watched process exited, naming it with
    the last lines of its log, or when the monotonic ``deadline`` passes."""
    while not check():
        for name, proc in watched.items():
            if not is_alive(proc.pid, proc.binary):
                raise ClusterError(
                    f"{name} exited while waiting for {what}; last lines of {proc.log}:\n"
                    f"{tail(proc.log)}"
                )
        if time.monotonic() > deadline:
            logs = sorted({str(proc.log.parent) for proc in watched.values()})
            raise ClusterError(f"timed out waiting for {what}; logs are in {', '.join(logs)}")
        time.sleep(interval_s)


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


def _own_argv0() -> str:
    return Path("/proc/self/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
