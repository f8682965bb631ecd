"""One metric prefix: every registry a kvretention process serves names its series
``kvretention_<component>_*`` (dashboards and the PrometheusRule select on it)."""

from __future__ import annotations

import tempfile

import pytest
from prometheus_client import CollectorRegistry

from kvretention.controller.metrics import Metrics
from kvretention.dataplane.frontend.metrics import FrontendMetrics
from kvretention.dataplane.router.state import RouterMetrics
from kvretention.dataplane.worker.app import WorkerMetrics


def _names(registry: CollectorRegistry) -> list[str]:
    return [family.name for family in registry.collect()]


@pytest.mark.parametrize(
    ("registry", "prefixes"),
    [
        (FrontendMetrics().registry, ("kvretention_frontend_",)),
        (RouterMetrics().registry, ("kvretention_router_",)),
        (WorkerMetrics().registry, ("kvretention_worker_",)),
        (
            WorkerMetrics(retention_stats_dir=tempfile.mkdtemp()).registry,
            # the plugin's, from SGLang's child
            ("kvretention_worker_", "kvretention_retention_", "kvretention_l3_"),
        ),
        (Metrics().registry, ("kvretention_operator_", "kvretention_kvstore_")),
    ],
    ids=["frontend", "router", "worker", "worker-with-plugin", "operator"],
)
def test_every_series_has_the_component_prefix(
    registry: CollectorRegistry, prefixes: tuple[str, ...]
) -> None:
    names = _names(registry)
    assert names, "the registry should define metrics"
    assert [n for n in names if not n.startswith(prefixes)] == []
