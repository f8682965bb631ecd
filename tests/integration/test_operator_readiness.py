"""The operator's ``/readyz`` follows the API server: 503 while it cannot be reached, 200 again after.

The operator reaches the real local API server through a TCP forwarder this test can cut and
restore on the same port (TLS passes through untouched), which is what a network partition or an
API server outage looks like from the operator's side. ``/healthz`` must stay 200 throughout: a
liveness probe that failed with the API server would restart every operator in the cluster.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml
from operator_fixtures import CRD_PATH, Operator, free_port, start_operator

from kvretention.controller.operator import API_STALE_AFTER_S
from support.controlplane import ApplyCrd, Cluster, wait_until

pytestmark = pytest.mark.integration


class Forwarder:
    """127.0.0.1:port -> the API server, byte for byte, until cut."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._server: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()

    def start(self) -> None:
        self._server = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, args=(self._server,), daemon=True).start()

    def cut(self) -> None:
        """Refuse new connections and drop every open one."""
        if self._server is not None:
            # shutdown() wakes the thread blocked in accept(); close() alone does not on Linux.
            with contextlib.suppress(OSError):
                self._server.shutdown(socket.SHUT_RDWR)
            self._server.close()
            self._server = None
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._open.clear()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return  # cut
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open.update((client, upstream))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def forwarder(cluster: Cluster) -> Iterator[Forwarder]:
    url = urlparse(cluster.server)
    assert url.hostname and url.port, cluster.server
    fwd = Forwarder((url.hostname, url.port))
    fwd.start()
    try:
        yield fwd
    finally:
        fwd.cut()


def kubeconfig_through(cluster: Cluster, port: int, path: Path) -> Path:
    """The plane's kubeconfig with its server moved to the forwarder (same host: the TLS
    certificate's IP still matches)."""
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    for entry in config["clusters"]:
        url = urlparse(entry["cluster"]["server"])
        entry["cluster"]["server"] = url._replace(netloc=f"{url.hostname}:{port}").geturl()
    path.write_text(yaml.safe_dump(config))
    return path


def test_readyz_is_503_while_the_api_server_is_unreachable_and_200_once_it_answers(
    cluster: Cluster, apply_crd: ApplyCrd, forwarder: Forwarder, tmp_path: Path
) -> None:
    apply_crd(CRD_PATH)
    kubeconfig = kubeconfig_through(cluster, forwarder.port, tmp_path / "kubeconfig")
    op: Operator = start_operator(
        cluster,
        tmp_path,
        "--all-namespaces",
        "--no-leader-elect",
        env={"KUBECONFIG": str(kubeconfig)},
    )
    try:
        op.wait_ready()
        assert op.readyz()["apiServer"] == "reachable"

        forwarder.cut()

        # Within the staleness window plus a probe or two, never at once (no request per probe).
        def not_ready() -> dict[str, Any] | None:
            body = op.readyz()
            return body if body.get("ok") is False else None

        unready = wait_until(
            "/readyz 503 with the API server cut off", not_ready, timeout_s=API_STALE_AFTER_S + 20
        )
        assert unready["apiServer"] == "unreachable"
        assert unready["apiServerAnsweredSecondsAgo"] >= API_STALE_AFTER_S  # rounded to 0.1 s
        status, _ = op.get(op.health_port, "/readyz")
        assert status == 503
        status, _ = op.get(op.health_port, "/healthz")
        assert status == 200
        assert op.process.alive(), "losing the API server must not stop the operator"

        forwarder.start()
        op.wait_ready(timeout_s=30)
        assert op.readyz()["apiServer"] == "reachable"
    finally:
        forwarder.cut()
        forwarder.start()  # let it stop cleanly (kopf says goodbye to the API server)
        code = op.stop()
        print(f"--- operator (exit {code}):\n{op.process.log()[-4000:]}")
