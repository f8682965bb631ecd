"""Key rotation on a running frontend process: its mounted Secret is rewritten the way the kubelet
does it (a new timestamped directory, ``..data`` swapped), and the same process refuses the old
key and serves the new one; a key file it cannot use stops it from starting, naming the file."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from support.processes import StartKvretention
from support.router_standin import RouterStandIn
from support.secret_mount import write_secret

OLD = "sk-team-a-0000000000000old"
NEW = "sk-team-a-0000000000000new"


def status(base_url: str, key: str) -> int:
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    request = urllib.request.Request(
        base_url + "/v1/messages",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "x-api-key": key},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def eventually(base_url: str, key: str, want: int) -> None:
    deadline = time.monotonic() + 10
    while status(base_url, key) != want:
        assert time.monotonic() < deadline, f"{key[-3:]} never got {want}"
        time.sleep(0.1)


def test_a_rotated_key_reaches_the_running_process(
    kvretention_process: StartKvretention, router_standin: RouterStandIn, tmp_path: Path
) -> None:
    mount = tmp_path / "fleet-keys"
    write_secret(mount, {"team-a": OLD})
    frontend = kvretention_process(
        [
            *("frontend", "--router-url", router_standin.base_url),
            *("--auth-keys-dir", str(mount), "--auth-reload-seconds", "0.2"),
        ]
    )
    pid = frontend.proc.pid
    assert status(frontend.base_url, OLD) == 200
    assert status(frontend.base_url, NEW) == 401
    write_secret(mount, {"team-a": f"{OLD}\n{NEW}\n"})
    eventually(frontend.base_url, NEW, 200)
    assert status(frontend.base_url, OLD) == 200
    write_secret(mount, {"team-a": NEW})
    eventually(frontend.base_url, OLD, 401)
    assert status(frontend.base_url, NEW) == 200
    assert frontend.proc.pid == pid and frontend.alive()
    log = frontend.log()
    assert "auth keys reloaded" in log
    assert OLD not in log and NEW not in log


def test_a_key_file_it_cannot_use_stops_the_start(tmp_path: Path) -> None:
    mount = tmp_path / "keys"
    mount.mkdir()
    (mount / "Team A").write_text(OLD)
    done = subprocess.run(
        [
            *(sys.executable, "-m", "kvretention", "frontend"),
            *("--router-url", "http://127.0.0.1:9", "--auth-keys-dir", str(mount)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "Team A" in done.stderr and "not a tenant name" in done.stderr
    assert OLD not in done.stderr
