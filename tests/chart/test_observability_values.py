"""The chart's dashboards (ConfigMaps for the Grafana sidecar) and the PodMonitor that scrapes the
fleets' data plane: off by default, and when on they carry what Grafana and Prometheus select on
and select what the operator renders."""

from __future__ import annotations

import json
from typing import Any

import pytest
from chartlib import CHART, RELEASE_NAMESPACE, Helm, select

from kvretention.api.models import KvRetentionDeployment
from kvretention.api.names import APP_NAME, FIELD_MANAGER, LABEL_MANAGED_BY, LABEL_NAME
from kvretention.controller.resources import build_children
from kvretention.controller.resources.common import (
    COMPONENT_DECODE,
    COMPONENT_FRONTEND,
    COMPONENT_PREFILL,
    COMPONENT_ROUTER,
    COMPONENT_WORKER,
    METRICS_PORT,
    METRICS_PORT_NAME,
)
from support.metric_registries import DATA_PLANE_LABELS

DASHBOARDS = CHART.parents[1] / "deploy" / "dashboards"


def dashboard_maps(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in select(docs, "ConfigMap") if "dashboard" in d["metadata"]["name"]]


def test_nothing_observability_is_rendered_by_default(helm: Helm) -> None:
    docs = helm.template()
    assert dashboard_maps(docs) == []
    assert select(docs, "PodMonitor") == []


def test_each_dashboard_is_a_configmap_the_grafana_sidecar_loads(helm: Helm) -> None:
    maps = dashboard_maps(helm.template({"metrics": {"dashboards": {"enabled": True}}}))
    shipped = {p.name: p.read_text() for p in DASHBOARDS.glob("*.json")}
    assert len(maps) == len(shipped) == 5
    for cm in maps:
        assert cm["metadata"]["namespace"] == RELEASE_NAMESPACE
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert len(cm["metadata"]["name"]) <= 63
        ((key, text),) = cm["data"].items()
        assert json.loads(text) == json.loads(shipped[key])


def test_dashboard_namespace_labels_and_annotations_are_configurable(helm: Helm) -> None:
    values = {
        "enabled": True,
        "namespace": "monitoring",
        "labels": {"dashboards": "kvretention"},
        "annotations": {"grafana_folder": "kvretention"},
    }
    maps = dashboard_maps(helm.template({"metrics": {"dashboards": values}}))
    assert len(maps) == 5
    for cm in maps:
        assert cm["metadata"]["namespace"] == "monitoring"
        assert cm["metadata"]["labels"]["dashboards"] == "kvretention"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "kvretention"}


@pytest.mark.parametrize(
    ("watch", "selector"),
    [
        ({}, {"matchNames": [RELEASE_NAMESPACE]}),
        ({"namespaces": ["team-a", "team-b"]}, {"matchNames": ["team-a", "team-b"]}),
        ({"clusterWide": True}, {"any": True}),
    ],
    ids=["release-namespace", "watched-namespaces", "cluster-wide"],
)
def test_pod_monitor_scrapes_the_namespaces_the_operator_watches(
    helm: Helm, watch: dict[str, Any], selector: dict[str, Any]
) -> None:
    docs = helm.template({"watch": watch, "metrics": {"podMonitor": {"enabled": True}}})
    (monitor,) = select(docs, "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == selector


def test_pod_monitor_selects_the_data_plane_pods_and_names_their_fleet(helm: Helm) -> None:
    values = {"podMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "prom"}}}
    (monitor,) = select(helm.template({"metrics": values}), "PodMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    spec = monitor["spec"]
    assert spec["selector"]["matchLabels"] == {
        LABEL_NAME: APP_NAME,
        LABEL_MANAGED_BY: FIELD_MANAGER,
    }
    ((expression),) = spec["selector"]["matchExpressions"]
    assert expression["key"] == "app.kubernetes.io/component"
    assert set(expression["values"]) == {
        COMPONENT_FRONTEND,
        COMPONENT_ROUTER,
        COMPONENT_WORKER,
        COMPONENT_PREFILL,
        COMPONENT_DECODE,
    }
    (endpoint,) = spec["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["interval"]) == (
        METRICS_PORT_NAME,
        "/metrics",
        "15s",
    )
    targets = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
    assert tuple(targets) == DATA_PLANE_LABELS
    assert targets["fleet"] == ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"]
    assert targets["component"] == ["__meta_kubernetes_pod_label_app_kubernetes_io_component"]


@pytest.mark.parametrize(
    "workers",
    [{}, {"mode": "disaggregated", "prefill": {}, "decode": {}}],
    ids=["aggregated", "disaggregated"],
)
def test_every_pod_the_pod_monitor_selects_declares_its_metrics_port(
    helm: Helm, workers: dict[str, Any]
) -> None:
    """The PodMonitor scrapes the port named ``metrics``, not ``http``: with ``frontend.auth`` the
    frontend's ``http`` port answers ``/metrics`` only with a key, and ``metricsFrom`` opens no
    other port. Each data-plane pod the operator renders serves its ``/metrics`` there."""
    values = {"podMonitor": {"enabled": True}}
    (monitor,) = select(helm.template({"metrics": values}), "PodMonitor")
    (expression,) = monitor["spec"]["selector"]["matchExpressions"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    cr = KvRetentionDeployment.from_k8s(
        {
            "apiVersion": "kvretention.io/v1alpha1",
            "kind": "KvRetentionDeployment",
            "metadata": {"name": "f", "namespace": "ns"},
            "spec": {
                "model": {"name": "m", "path": "p"},
                "workers": workers,
                "frontend": {"auth": {"secretRefs": [{"name": "keys"}]}},
            },
        }
    )
    scraped = {}
    for manifest in build_children(cr):
        if manifest["kind"] != "Deployment":
            continue
        template = manifest["spec"]["template"]
        if template["metadata"]["labels"]["app.kubernetes.io/component"] in expression["values"]:
            (container,) = template["spec"]["containers"]
            command = container["command"]
            ports = {p["name"]: p["containerPort"] for p in container["ports"]}
            flag = int(command[command.index("--metrics-port") + 1])
            scraped[manifest["metadata"]["name"]] = (ports.get(endpoint["port"]), flag)
    expected = ["f-frontend", "f-router", *(["f-prefill", "f-decode"] if workers else ["f-worker"])]
    assert scraped == {name: (METRICS_PORT, METRICS_PORT) for name in expected}


@pytest.mark.parametrize(
    "values",
    [
        {"metrics": {"dashboards": {"namespace": "Not_A_Namespace"}}},
        {"metrics": {"podMonitor": {"interval": "often"}}},
        {"metrics": {"podMonitor": {"unknown": True}}},
    ],
    ids=["bad-namespace", "bad-interval", "unknown-key"],
)
def test_bad_observability_values_are_rejected(helm: Helm, values: dict[str, Any]) -> None:
    error = helm.template_error(values)
    assert "dashboards" in error or "podMonitor" in error


def test_helm_lint_strict_with_everything_on(helm: Helm) -> None:
    done = helm.run(
        "lint",
        str(CHART),
        "--strict",
        "--set",
        "metrics.dashboards.enabled=true,metrics.podMonitor.enabled=true,"
        "metrics.prometheusRule.enabled=true,metrics.serviceMonitor.enabled=true",
    )
    assert "0 chart(s) failed" in done.stdout
