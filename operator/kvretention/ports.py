"""The ports kvretention processes listen on: one home for the numbers the operator renders into
pods and Services and the ``--port`` defaults of the CLI, so a process started by hand listens where
the cluster would put it; and how a process picks a free loopback port for a child it starts.

A port the kernel hands out for ``bind(("127.0.0.1", 0))`` comes from the ephemeral range, the same
range outgoing connections take their source ports from: between picking it and the child binding
it, any client on the machine (an API server's watches, a test's requests, a second test worker)
can take it, and the child dies with "address already in use". Free ports are picked instead at
random below the ephemeral range, where only a listener can take them, and checked by binding."""

from __future__ import annotations

import random
import socket
from pathlib import Path
from typing import Final

FRONTEND_PORT: Final = 8000
"""``kvretention frontend``: the OpenAI/Anthropic HTTP API (the Service's default port too)."""
ROUTER_PORT: Final = 8001
"""``kvretention router``: ``POST /v1/generate`` from the frontend."""
ROUTER_EXT_PROC_PORT: Final = 9004
"""``kvretention router --ext-proc-port``: Envoy ``ext_proc`` (gRPC, cleartext HTTP/2), where a
Gateway asks the router which frontend pod serves a request (the InferencePool's picker, with
``gateway.inferencePool.enabled``)."""
WORKER_PORT: Final = 8002
"""``kvretention worker``: ``POST /v1/generate`` from the router."""
OPERATOR_HEALTH_PORT: Final = 8080
"""``kvretention operator``: ``/healthz`` and ``/readyz``."""
OPERATOR_METRICS_PORT: Final = 9090
"""``kvretention operator``: Prometheus ``/metrics``."""
METRICS_PORT: Final = 9100
"""``--metrics-port`` of the frontend, router and worker in a pod: Prometheus ``/metrics`` and
nothing else, so a scraper that ``networkPolicy.metricsFrom`` lets in reaches no API route and
needs no key. The CLIs open no such port unless told (several processes on one host would
collide on a fixed default); their ``/metrics`` on the client port stays as it was."""

EPHEMERAL_RANGE: Final = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST: Final = 11000
"""Below this, well-known services and Kubernetes' own defaults (kubelet 10250, kube-proxy 10256...)."""


def _listen_range() -> range:
    """Ports below the ephemeral range (empty where that range starts too low to leave room)."""
    try:
        ephemeral_low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768  # Linux's default
    return range(LOWEST, ephemeral_low)


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports that nothing listens on right now."""
    candidates = _listen_range()
    held: list[socket.socket] = []
    try:
        tries = 0
        while len(held) < count:
            tries += 1
            sock = socket.socket()
            port = random.choice(candidates) if len(candidates) > 1000 and tries < 200 else 0
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                sock.close()
                continue
            held.append(sock)
        return [int(s.getsockname()[1]) for s in held]
    finally:
        for sock in held:
            sock.close()


def free_port() -> int:
    """One loopback port that nothing listens on right now."""
    (port,) = free_ports(1)
    return port
