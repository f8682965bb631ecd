"""Helpers for the observability tier: what the processes export (read from their real
registries), the dashboards' queries, and the Prometheus binaries (``prometheus``, ``promtool``)
that ``scripts/install-prometheus.sh`` installs.

Import them as ``from promlib import ...`` (pytest puts this folder on sys.path).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.metric_registries import DATA_PLANE_LABELS as DATA_PLANE_LABELS
from support.metric_registries import exported_series as exported_series
from support.prometheus_bin import prometheus_binary

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "deploy" / "dashboards"
CHART_DASHBOARDS = ROOT / "charts" / "kvretention" / "dashboards"

SCRAPE_LABELS = ("job", "instance", "namespace", "pod", "container", "endpoint", "service")
"""What Prometheus and the Prometheus Operator attach to every scraped series."""

GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$fleet_namespace": ".*",
    "$fleet": ".*",
}


@dataclass(frozen=True)
class Query:
    dashboard: str
    panel: str
    ref: str
    expr: str

    def concrete(self, variables: dict[str, str] | None = None) -> str:
        """The expression with Grafana's variables replaced (longest name first)."""
        text = self.expr
        for name, value in sorted(
            (variables or GRAFANA_VARIABLES).items(), key=lambda kv: -len(kv[0])
        ):
            text = text.replace(name, value)
        return text


def load_dashboards(folder: Path = DASHBOARDS) -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}


def queries(dashboards: dict[str, dict[str, Any]]) -> Iterator[Query]:
    for name, dash in dashboards.items():
        for panel in dash["panels"]:
            for target in panel["targets"]:
                yield Query(name, panel["title"], target["refId"], target["expr"])


_METRIC = re.compile(r"\b(kvretention_[a-z0-9_]+)\b\s*(\{[^}]*\})?")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")


def metric_refs(expr: str) -> list[tuple[str, frozenset[str]]]:
    """``(series name, label names its selector matches on)`` for every kvretention series."""
    return [
        (m.group(1), frozenset(_MATCHER.findall(m.group(2) or ""))) for m in _METRIC.finditer(expr)
    ]


def grouping_labels(expr: str) -> set[str]:
    return {x.strip() for g in _GROUPING.findall(expr) for x in g.split(",") if x.strip()}


def promtool() -> Path:
    return prometheus_binary("promtool")


def prometheus() -> Path:
    return prometheus_binary("prometheus")


def run_promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool()), *args], capture_output=True, text=True, timeout=120, check=False, cwd=cwd
    )
