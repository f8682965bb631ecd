"""Plane processes: a child counts as alive from the moment it is spawned until it exits, and
one wait helper fails fast, with the log's tail, when a watched process has exited."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from kvretention_devtools.localcluster import ClusterError, process

SLEEP = shutil.which("sleep") or "/bin/sleep"


def test_a_just_spawned_process_reads_alive_every_time(tmp_path: Path) -> None:
    # posix_spawn returns while the child is still mid-exec (cmdline empty or still ours); the
    # plane checks at once, and the old check read a live kube-apiserver as dead (169/300).
    log = tmp_path / "sleep.log"
    dead = 0
    for _ in range(300):
        pid = process.spawn([SLEEP, "30"], log=log)
        try:
            dead += not process.is_alive(pid, SLEEP)
        finally:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert dead == 0, f"{dead}/300 just-spawned processes read dead"


def test_a_spawned_child_that_exited_reads_dead_without_being_reaped(tmp_path: Path) -> None:
    pid = process.spawn([SLEEP, "30"], log=tmp_path / "sleep.log")
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while process.is_alive(pid, SLEEP) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not process.is_alive(pid, SLEEP)
    assert not Path(f"/proc/{pid}").exists(), "the exited child was left a zombie"


def test_a_spawned_child_running_another_binary_is_not_that_binary(tmp_path: Path) -> None:
    pid = process.spawn([SLEEP, "30"], log=tmp_path / "sleep.log")
    try:
        deadline = time.monotonic() + 5
        while Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] != SLEEP.encode():
            assert time.monotonic() < deadline, "the child never exec'd"
            time.sleep(0.01)
        assert not process.is_alive(pid, "etcd")
        assert process.stop(pid, "etcd", grace_s=1) is False
        assert process.is_alive(pid, SLEEP), "a pid running something else was signalled"
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


SH = shutil.which("sh") or "/bin/sh"


@pytest.mark.parametrize(
    ("argv", "check_after_s", "deadline_s", "error"),
    [
        ([SLEEP, "30"], 0.0, 5.0, None),
        ([SLEEP, "30"], 0.3, 5.0, None),
        ([SH, "-c", "echo 'bad flag --x'; exit 3"], 60.0, 10.0, "comp exited while waiting for x"),
        ([SLEEP, "30"], 60.0, 0.3, "timed out waiting for x; logs are in .*logs"),
    ],
    ids=["ready-at-once", "ready-later", "exited", "timed-out"],
)
def test_wait_until(
    tmp_path: Path, argv: list[str], check_after_s: float, deadline_s: float, error: str | None
) -> None:
    log = tmp_path / "logs" / "comp.log"
    proc = process.Watched(process.spawn(argv, log=log), argv[0], log)
    began = time.monotonic()

    def wait() -> None:
        process.wait_until(
            "x",
            lambda: time.monotonic() - began >= check_after_s,
            watched={"comp": proc},
            deadline=began + deadline_s,
            interval_s=0.02,
        )

    try:
        if error is None:
            wait()
            return
        with pytest.raises(ClusterError, match=error) as err:
            wait()
        if "exited" in error:
            assert "bad flag --x" in str(err.value), "the log's tail is the reason shown"
    finally:
        process.stop(proc.pid, proc.binary, grace_s=1)
