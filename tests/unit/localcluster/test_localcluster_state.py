"""The local plane's bookkeeping: the admin token file, state.json, ports, pids, the bin dir.

``down`` trusts only what ``state.json`` recorded and only a pid that still runs the binary it
started, so a stale file or a recycled pid must never lead to signalling a stranger.
"""

from __future__ import annotations

import csv
import io
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvretention_devtools.localcluster import (
    ClusterError,
    ClusterState,
    cluster_status,
    load_state,
    pki,
    process,
)
from kvretention_devtools.localcluster import cluster as plane
from kvretention_devtools.localcluster.binaries import (
    BIN_ENV,
    KWOK_STAGES,
    REQUIRED,
    check_bin_dir,
    resolve_bin_dir,
)
from kvretention_devtools.localcluster.cli import STATE_ENV, default_state_dir
from kvretention_devtools.localcluster.components import ORDER, Layout, Ports
from kvretention_devtools.localcluster.httpjson import _decode, request

PORTS = Ports(etcd_client=1, etcd_peer=2, apiserver=3, controller_manager=4, scheduler=5, kwok=6)


def make_state(root: Path, **pids: int) -> ClusterState:
    return ClusterState(
        state_dir=root,
        bin_dir=root / "bin",
        server="https://127.0.0.1:3",
        kubeconfig=Layout(root).kubeconfig,
        token="abc",
        ports=PORTS,
        pids=pids,
        nodes=("kvr-node-0", "kvr-node-1"),
        started_at=1700000000.5,
    )


# --- the admin token -------------------------------------------------------------------------


def test_token_file_line_is_what_kube_apiserver_parses() -> None:
    text = pki.build_token_file("s3cr3t")
    assert text.endswith("\n") and text.count("\n") == 1
    [row] = list(csv.reader(io.StringIO(text)))
    assert row == ["s3cr3t", pki.ADMIN_USER, pki.ADMIN_USER, pki.ADMIN_GROUP]
    assert pki.ADMIN_GROUP == "system:masters"


def test_tokens_are_long_random_and_csv_safe() -> None:
    tokens = {pki.new_token() for _ in range(50)}
    assert len(tokens) == 50
    for token in tokens:
        assert len(token) >= 32
        assert token.isalnum()


# --- state.json ------------------------------------------------------------------------------


def test_state_round_trips_through_json(tmp_path: Path) -> None:
    state = make_state(tmp_path, etcd=101, kwok=105)
    assert ClusterState.from_json(state.to_json()) == state


def test_load_state_of_an_empty_dir_is_none(tmp_path: Path) -> None:
    assert load_state(tmp_path) is None
    assert cluster_status(tmp_path) == {"running": False, "state_dir": str(tmp_path)}


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        "{}",
        '{"state_dir": "/x"}',
        make_state(Path("/x")).to_json().replace('"kwok": 6', '"kubelet": 6'),
        make_state(Path("/x"), etcd=1).to_json().replace('"etcd": 1', '"etcd": "one"'),
    ],
    ids=["garbage", "empty", "partial", "unknown-port", "bad-pid"],
)
def test_an_unreadable_state_file_is_a_cluster_error(tmp_path: Path, content: str) -> None:
    Layout(tmp_path).state_file.write_text(content)
    with pytest.raises(ClusterError, match="unreadable"):
        load_state(tmp_path)


def test_components_without_a_recorded_pid_are_down(tmp_path: Path) -> None:
    assert make_state(tmp_path).alive() == dict.fromkeys(ORDER, False)


def test_a_recorded_pid_running_another_binary_is_down(tmp_path: Path) -> None:
    # Our own pid runs python, not etcd: a recycled pid must read as "not ours".
    state = make_state(tmp_path, etcd=os.getpid())
    assert state.alive()["etcd"] is False


# --- ports -----------------------------------------------------------------------------------


def test_allocated_ports_are_distinct_and_free_on_loopback() -> None:
    ports = plane._allocate_ports(0)
    values = [
        ports.etcd_client,
        ports.etcd_peer,
        ports.apiserver,
        ports.controller_manager,
        ports.scheduler,
        ports.kwok,
    ]
    assert len(set(values)) == 6
    for port in values:
        assert 1024 < port < 65536
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_requested_api_server_port_is_used_as_is() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert plane._allocate_ports(port).apiserver == port


def test_a_taken_api_server_port_is_refused_with_the_fix() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ClusterError, match=rf"port {port} on 127.0.0.1 is taken.*--port"):
            plane._allocate_ports(port)


# --- pids ------------------------------------------------------------------------------------


def test_stop_never_signals_a_pid_running_something_else(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        # Right after fork the child may not have exec'd yet: its cmdline is still Python's or
        # empty, which ``is_alive`` counts as our child running anything (so it cannot be the
        # wait here; on a loaded machine the exec takes a while).
        cmdline = Path(f"/proc/{sleeper.pid}/cmdline")
        deadline = time.monotonic() + 5
        while not cmdline.read_bytes().startswith(b"sleep\0") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert process.is_alive(sleeper.pid, "/usr/bin/sleep")
        assert not process.is_alive(sleeper.pid, "etcd")
        assert process.stop(sleeper.pid, "etcd", grace_s=1) is False
        assert sleeper.poll() is None, "a pid that is not ours was signalled"
        assert process.stop(sleeper.pid, "sleep", grace_s=5) is True
        assert not process.is_alive(sleeper.pid, "sleep")
        sleeper.wait(timeout=5)  # (stop reaped it already: the exit status is gone)
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()


def test_a_pid_that_does_not_exist_is_not_alive() -> None:
    with open("/proc/sys/kernel/pid_max") as f:
        pid_max = int(f.read())
    assert process.is_alive(pid_max + 1, "etcd") is False
    assert process.stop(pid_max + 1, "etcd") is False


def test_spawned_process_outlives_nothing_and_logs_to_its_file(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "echo.log"
    pid = process.spawn([sys.executable, "-c", "print('hello from the plane')"], log=log)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert log.read_text() == "hello from the plane\n"
    assert process.tail(log, 1) == "hello from the plane"


@pytest.mark.parametrize(("lines", "expected"), [(1, "c"), (2, "b\nc"), (10, "a\nb\nc")])
def test_tail(tmp_path: Path, lines: int, expected: str) -> None:
    log = tmp_path / "x.log"
    log.write_text("a\nb\nc\n")
    assert process.tail(log, lines) == expected


def test_tail_of_a_missing_log() -> None:
    assert process.tail(Path("/nonexistent/x.log")) == "(no log)"


# --- the bin dir -----------------------------------------------------------------------------


def fill_bin_dir(bin_dir: Path, *, skip: str = "", not_executable: str = "") -> None:
    bin_dir.mkdir(exist_ok=True)
    for name in REQUIRED:
        if name == skip:
            continue
        path = bin_dir / name
        path.write_text("#!/bin/sh\n")
        path.chmod(0o644 if name == not_executable else 0o755)
    if skip != KWOK_STAGES:
        (bin_dir / KWOK_STAGES).write_text("{}\n")


def test_a_complete_bin_dir_passes(tmp_path: Path) -> None:
    fill_bin_dir(tmp_path)
    check_bin_dir(tmp_path)


@pytest.mark.parametrize(
    ("skip", "not_executable", "missing"),
    [
        ("kube-apiserver", "", "kube-apiserver"),
        ("kubectl", "", "kubectl"),
        (KWOK_STAGES, "", KWOK_STAGES),
        ("", "etcd", "etcd"),
    ],
)
def test_an_incomplete_bin_dir_names_what_is_missing_and_the_fix(
    tmp_path: Path, skip: str, not_executable: str, missing: str
) -> None:
    fill_bin_dir(tmp_path, skip=skip, not_executable=not_executable)
    with pytest.raises(ClusterError) as err:
        check_bin_dir(tmp_path)
    assert f"missing in {tmp_path}: {missing};" in str(err.value)
    assert "scripts/build-kube.sh" in str(err.value)


def test_the_bin_dir_env_var_wins_over_the_build_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill_bin_dir(tmp_path)
    monkeypatch.setenv(BIN_ENV, str(tmp_path))
    assert resolve_bin_dir() == tmp_path


@pytest.mark.parametrize(("env", "expected"), [("/tmp/kvr-x", Path("/tmp/kvr-x")), ("", None)])
def test_default_state_dir(
    monkeypatch: pytest.MonkeyPatch, env: str, expected: Path | None
) -> None:
    monkeypatch.setenv(STATE_ENV, env)
    got = default_state_dir()
    assert got == expected if expected else got.name == ".kvr-cluster"


# --- the start-up HTTP client ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"), [(b'{"ok": true}', {"ok": True}), (b"ok", "ok"), (b"\xff", "\ufffd")]
)
def test_bodies_decode_as_json_else_text(raw: bytes, expected: object) -> None:
    assert _decode(raw) == expected


def test_a_closed_port_reads_as_status_zero_so_callers_poll() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    status, body = request("GET", f"https://127.0.0.1:{port}/readyz", timeout_s=1)
    assert status == 0
    assert "Connection refused" in body, "the error is the body, for a caller's message"
