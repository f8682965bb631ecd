"""The gateway contract Claude Code expects, read from the pinned CLI itself.

``claude gateway --config FILE`` (Claude Code 2.1.332; ``claude gateway --help``) runs Anthropic's
enterprise auth/telemetry gateway, and its ``GET /protocol`` answers the wire contract the CLI
uses against a gateway, as Markdown ("served from the gateway itself so it always matches the
version you're running"). The gateway will not start without a Postgres store (it runs its
migrations at boot) nor without an identity provider, except as a customer-routed-inference-only
deployment (``cri.enabled``): :func:`read_protocol` starts a throwaway Postgres on loopback
(Debian's ``postgresql``; ``initdb`` as the ``postgres`` user when run as root, which Postgres
refuses to run as), the gateway on loopback with that minimal config and no network (its JWKS
prefetch fails and only the CRI wall would answer 503), reads ``/protocol`` and stops both.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from support.processes import free_port

START_TIMEOUT_S: Final = 60.0
JWT_SECRET: Final = "kvretention-conformance-" + "0" * 40
"""The gateway's session-signing secret: required in the config, never used (no sign-in here)."""


@dataclass(frozen=True)
class Section:
    """One ``## `` section of the contract: its title (``Messages — required``) and text."""

    title: str
    text: str

    @property
    def name(self) -> str:
        """The title without its ``— required`` / ``— optional`` tag."""
        return self.title.split(" — ")[0].strip()


def sections(protocol: str) -> list[Section]:
    """The contract's ``## `` sections, in order (the text before the first one is left out)."""
    out: list[Section] = []
    title: str | None = None
    lines: list[str] = []
    for line in protocol.splitlines():
        if line.startswith("## "):
            if title is not None:
                out.append(Section(title, "\n".join(lines)))
            title, lines = line[3:].strip(), []
        elif title is not None:
            lines.append(line)
    if title is not None:
        out.append(Section(title, "\n".join(lines)))
    return out


def _postgres_bin(name: str) -> str:
    found = shutil.which(name) or next(
        iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))), None
    )
    if found is None:
        raise RuntimeError(
            f"no {name}: apt-get install postgresql (the gateway needs a Postgres store)"
        )
    return found


def _as_postgres() -> dict[str, Any]:
    """Popen arguments that run a Postgres program as the ``postgres`` user when this is root."""
    if os.geteuid() != 0:
        return {}
    user = pwd.getpwnam("postgres")
    return {"user": user.pw_uid, "group": user.pw_gid}


def _stop(process: subprocess.Popen[Any]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_for(what: str, check: Any, process: subprocess.Popen[Any], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if check():
            return
        if process.poll() is not None:
            break
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not start:\n{log.read_text(errors='replace')[-3000:]}")


@contextmanager
def _postgres() -> Iterator[str]:
    """A throwaway Postgres on loopback: its URL (trust auth, user ``kvr``)."""
    root = Path(tempfile.mkdtemp(prefix="kvr-gateway-pg-"))
    as_postgres = _as_postgres()
    if as_postgres:
        os.chown(root, as_postgres["user"], as_postgres["group"])
    log = root / "postgres.log"
    try:
        subprocess.run(
            [_postgres_bin("initdb"), "-D", str(root / "data"), "-A", "trust", "-U", "kvr"],
            check=True,
            capture_output=True,
            timeout=120,
            **as_postgres,
        )
        port = free_port()
        with log.open("wb") as out:
            server = subprocess.Popen(
                [
                    _postgres_bin("postgres"),
                    "-D",
                    str(root / "data"),
                    "-p",
                    str(port),
                    "-k",
                    str(root),
                    "-c",
                    "listen_addresses=127.0.0.1",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                **as_postgres,
            )
        try:
            _wait_for(
                "postgres",
                lambda: "ready to accept connections" in log.read_text(errors="replace"),
                server,
                log,
            )
            yield f"postgres://kvr@127.0.0.1:{port}/postgres"
        finally:
            _stop(server)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def read_protocol(claude: Path) -> str:
    """``GET /protocol`` of ``claude gateway`` (``claude``: the CLI binary)."""
    with _postgres() as store, tempfile.TemporaryDirectory(prefix="kvr-gateway-") as tmp:
        home = Path(tmp)
        port = free_port()
        config = {
            "listen": {"host": "127.0.0.1", "port": port},
            "upstreams": [{"provider": "anthropic", "auth": {"api_key": "sk-unused"}}],
            "session": {"jwt_secret": JWT_SECRET},
            "store": {"postgres_url": store},
            "cri": {
                "enabled": True,
                "audience": ["kvretention-conformance"],
                "org_allowlist": ["00000000-0000-0000-0000-000000000000"],
            },
        }
        (home / "gateway.yaml").write_text(yaml.safe_dump(config))
        log = home / "gateway.log"
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "DISABLE_AUTOUPDATER": "1"}
        url = f"http://127.0.0.1:{port}/protocol"

        def protocol() -> str | None:
            try:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    return str(resp.read().decode())
            except OSError:
                return None

        with log.open("wb") as out:
            gateway = subprocess.Popen(
                [str(claude), "gateway", "--config", str(home / "gateway.yaml")],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=home,
            )
        try:
            _wait_for("claude gateway", lambda: protocol() is not None, gateway, log)
            text = protocol()
            assert text is not None
            return text
        finally:
            _stop(gateway)
