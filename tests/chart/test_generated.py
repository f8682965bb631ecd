"""Generated files stay in step with their sources: the chart's CRD with crds/, the bundle with the chart."""

from __future__ import annotations

import subprocess
from pathlib import Path

from chartlib import (
    BUNDLE,
    CRD_NAME,
    CRDS,
    RELEASE_NAMESPACE,
    ROOT,
    Helm,
    load_yaml,
    one,
    parse_docs,
)


def _script(
    name: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ROOT / "scripts" / name), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )


def test_chart_crds_match_crds_folder() -> None:
    done = _script("sync-chart-crds.sh", "--check")
    assert done.returncode == 0, done.stderr


def test_chart_renders_exactly_the_crd_spec(helm: Helm) -> None:
    """Byte drift aside, what Helm applies is the same CRD spec as crds/ (the API's source of truth)."""
    rendered = one(helm.template(), "CustomResourceDefinition", CRD_NAME)
    source = load_yaml(CRDS / "kvretention.io_kvretentiondeployments.yaml")
    assert rendered["spec"] == source["spec"]
    assert source["metadata"]["labels"].items() <= rendered["metadata"]["labels"].items()


def test_sync_check_detects_drift(tmp_path: Path) -> None:
    """--check fails when crds/ changes and the chart copy does not (so the drift test can fail)."""
    src = CRDS / "kvretention.io_kvretentiondeployments.yaml"
    changed = tmp_path / src.name
    changed.write_text(src.read_text().replace("Whether the whole fleet serves.", "Changed."))
    done = _script(
        "sync-chart-crds.sh",
        "--check",
        env={"PATH": "/usr/bin:/bin", "KVR_CRDS_DIR": str(tmp_path)},
    )
    assert done.returncode == 1
    assert "drifted: charts/kvretention/templates/crds/" in done.stderr


def test_install_bundle_matches_chart(helm: Helm) -> None:
    done = _script(
        "gen-install-bundle.sh", "--check", env={"PATH": "/usr/bin:/bin", "HELM": str(helm.binary)}
    )
    assert done.returncode == 0, done.stderr


def test_install_bundle_content() -> None:
    docs = parse_docs(BUNDLE.read_text())
    kinds = [d["kind"] for d in docs]
    # Namespace first and the CRD before anything that could use it: kubectl applies in file order.
    assert kinds[0] == "Namespace"
    assert kinds.index("CustomResourceDefinition") < kinds.index("Deployment")
    assert one(docs, "Namespace")["metadata"]["name"] == RELEASE_NAMESPACE
    crd = one(docs, "CustomResourceDefinition")
    assert "helm.sh/resource-policy" not in (crd["metadata"].get("annotations") or {})
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--all-namespaces" in args
    assert {d["kind"] for d in docs} >= {"ClusterRole", "ClusterRoleBinding", "ServiceAccount"}
    namespaced = [
        d
        for d in docs
        if d["kind"]
        not in {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"}
    ]
    assert {d["metadata"]["namespace"] for d in namespaced} == {RELEASE_NAMESPACE}
