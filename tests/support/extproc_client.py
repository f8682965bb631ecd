"""The ext_proc client that stands in for Envoy (``devtools/extproc-client``, Go, on
go-control-plane's generated types): built on first use by ``scripts/build-extproc-client.sh``
into ``~/.cache/kvretention`` (keyed by version), then run once per request it plays."""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "scripts" / "build-extproc-client.sh"


def build_extproc_client() -> Path:
    """The client binary, built now if the cache does not hold it (a failed build fails)."""
    done = subprocess.run([str(BUILD)], capture_output=True, text=True, check=False, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{BUILD.name} failed:\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1]) / "extproc-client"


def play(
    binary: Path,
    addr: str,
    *,
    path: str = "/v1/messages",
    method: str = "POST",
    headers: Mapping[str, str] = {},
    body: Mapping[str, Any] | None = None,
    mode: str = "buffered",
    send: bool = False,
    health: str | None = None,
    subset: list[str] | None = None,
) -> dict[str, Any]:
    """One request through the picker as Envoy sends it; the client's JSON report."""
    argv = [
        str(binary),
        "-addr",
        addr,
        "-path",
        path,
        "-method",
        method,
        "-mode",
        mode,
        "-timeout",
        "20s",
    ]
    for name, value in headers.items():
        argv += ["-header", f"{name}:{value}"]
    if send:
        argv.append("-send")
    if health is not None:
        argv += ["-health", health]
    if subset is not None:
        argv += ["-subset", ",".join(subset)]
    with tempfile.NamedTemporaryFile(suffix=".json") as file:
        if body is not None:
            file.write(json.dumps(body).encode())
            file.flush()
            argv += ["-body-file", file.name]
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    if not done.stdout.strip():
        raise AssertionError(f"extproc-client printed nothing: {done.stderr}")
    report: dict[str, Any] = json.loads(done.stdout)
    return report
