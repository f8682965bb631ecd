"""The ports kvretention processes listen on: one home for the numbers the operator renders into
pods and Services and the ``--port`` defaults of the CLI, so a process started by hand listens where
the cluster would put it."""

from __future__ import annotations

from typing import Final

FRONTEND_PORT: Final = 8000
"""``kvretention frontend``: the OpenAI/Anthropic HTTP API (the Service's default port too)."""
ROUTER_PORT: Final = 8001
"""``kvretention router``: ``POST /v1/generate`` from the frontend."""
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
