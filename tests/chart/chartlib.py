"""Helpers for the chart tier: run helm and kubectl from the build cache and read what they print.

Import them as ``from chartlib import ...`` (pytest puts this folder on sys.path).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kvretention"
CRDS = ROOT / "crds"
BUNDLE = ROOT / "deploy" / "install.yaml"
RELEASE_NAMESPACE = "kvretention-system"
CRD_NAME = "kvretentiondeployments.kvretention.io"
LEASE_NAME = "kvretention-operator"
# every alert the chart's PrometheusRule defines
ALERTS = frozenset(
    {
        "KvRetentionPinsOverBudget",
        "KvRetentionKvStoreMetricsDown",
        "KvRetentionNoReadyWorkers",
        "KvRetentionErrorRatioHigh",
        "KvRetentionHintsUnsupported",
        "KvRetentionRetentionNotApplied",
        "KvRetentionHookFailures",
        "KvRetentionMooncakeMasterRestarted",
        "KvRetentionHopRefusals",
        "KvRetentionWorkerFastPathOff",
        "KvRetentionRadixPinsDropped",
    }
)


def find_bin_dir() -> Path | None:
    """The cached control-plane bin dir (helm, kubectl, ...), or None when not built yet."""
    if os.environ.get("KVR_KUBE_BIN"):
        return Path(os.environ["KVR_KUBE_BIN"])
    done = subprocess.run(
        [str(ROOT / "scripts" / "build-kube.sh"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    return Path(lines[-1]) if done.returncode == 0 and lines else None


def flatten_values(values: Mapping[str, Any], prefix: str = "") -> list[str]:
    """``{"a": {"b": 1}}`` -> ``["a.b=1"]`` for ``helm --set-json`` (lists and scalars as JSON)."""
    out: list[str] = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.extend(flatten_values(value, f"{path}."))
        else:
            out.append(f"{path}={json.dumps(value)}")
    return out


@dataclass(frozen=True)
class Helm:
    """Our helm binary (never one on PATH), optionally bound to a kubeconfig."""

    binary: Path
    kubeconfig: Path | None = None

    def run(
        self, *args: str, check: bool = True, timeout_s: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        argv = [str(self.binary), *args]
        if self.kubeconfig is not None:
            argv.append(f"--kubeconfig={self.kubeconfig}")
        env = dict(os.environ)
        env.setdefault("HELM_CACHE_HOME", "/tmp/kvr-helm/cache")
        env.setdefault("HELM_CONFIG_HOME", "/tmp/kvr-helm/config")
        env.setdefault("HELM_DATA_HOME", "/tmp/kvr-helm/data")
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, check=False, env=env
        )
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr}")
        return done

    def template(
        self,
        values: Mapping[str, Any] | None = None,
        *,
        namespace: str = RELEASE_NAMESPACE,
        release: str = "kvretention",
        chart: Path = CHART,
    ) -> list[dict[str, Any]]:
        """Render the chart with ``values`` (nested dict) and return the documents."""
        sets = [f"--set-json={item}" for item in flatten_values(values or {})]
        done = self.run("template", release, str(chart), f"--namespace={namespace}", *sets)
        return parse_docs(done.stdout)

    def template_error(self, values: Mapping[str, Any]) -> str:
        """Render expecting failure; return helm's error output."""
        sets = [f"--set-json={item}" for item in flatten_values(values)]
        done = self.run(
            "template",
            "kvretention",
            str(CHART),
            f"--namespace={RELEASE_NAMESPACE}",
            *sets,
            check=False,
        )
        assert done.returncode != 0, f"helm template unexpectedly succeeded with {values}"
        return done.stderr


def parse_docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def select(
    docs: Iterable[Mapping[str, Any]], kind: str, name: str | None = None
) -> list[dict[str, Any]]:
    return [
        dict(d)
        for d in docs
        if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]


def metrics_toggle(helm: Helm, key: str, *, enabled: bool) -> list[dict[str, Any]]:
    """The chart rendered with ``metrics.<key>.enabled`` set and a ``release: prom`` label."""
    return helm.template({"metrics": {key: {"enabled": enabled, "labels": {"release": "prom"}}}})


def one(docs: Iterable[Mapping[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = select(docs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def operator_container(docs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    deploy = one(docs, "Deployment")
    containers = deploy["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["operator"]
    container: dict[str, Any] = containers[0]
    return container


def rules_as_set(rules: Iterable[Mapping[str, Any]]) -> set[tuple[str, str, str, str]]:
    """RBAC rules flattened to (apiGroup, resource, resourceName or '*', verb) for exact comparison."""
    out: set[tuple[str, str, str, str]] = set()
    for rule in rules:
        names = rule.get("resourceNames") or ["*"]
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for name in names:
                    for verb in rule["verbs"]:
                        out.add((group, resource, name, verb))
    return out


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())
