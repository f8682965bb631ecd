"""Install paths against the real local control plane, with the real operator reconciling a fleet.

The chart's operator pod is a kwok pod (no container runtime here), so the operator runs as a local
process that authenticates as the chart's ServiceAccount: whatever it manages to do, the chart's
RBAC allowed. The same trick backs ``scripts/demo.sh``.
"""

from __future__ import annotations

import json
import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chartlib import BUNDLE, CHART, CRD_NAME, LEASE_NAME, ROOT, Helm, parse_docs

from support.controlplane import Cluster, RunningProcess, StartProcess, wait_until

pytestmark = pytest.mark.integration

EXAMPLE = ROOT / "examples" / "aggregated.yaml"
KVR = Path(sys.executable).parent / "kvretention"
SA = "kvretention-operator"
READY_S = 120.0


@pytest.fixture
def release_ns(cluster: Cluster) -> Iterator[str]:
    """A fresh release namespace (the chart's kvretention-system, made unique per test)."""
    name = f"kvr-chart-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    # PodSecurity admission then refuses an operator pod that is not "restricted".
    cluster.kubectl("label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted")
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def helm_cluster(cluster: Cluster, tmp_path: Path) -> Helm:
    return Helm(binary=cluster.bin_dir / "helm", kubeconfig=cluster.kubeconfig)


def adopt_crd_into(cluster: Cluster, *, release: str, namespace: str) -> None:
    """The documented adoption path, for a CRD that another install (or test) created first."""
    found = cluster.kubectl("get", "crd", CRD_NAME, "-o", "json", check=False)
    if found.returncode != 0:
        return
    cluster.kubectl(
        "annotate",
        "--overwrite",
        "crd",
        CRD_NAME,
        f"meta.helm.sh/release-name={release}",
        f"meta.helm.sh/release-namespace={namespace}",
    )
    cluster.kubectl("label", "--overwrite", "crd", CRD_NAME, "app.kubernetes.io/managed-by=Helm")


def older_chart(tmp_path: Path) -> Path:
    """The chart as an older release would ship it: its CRD lacks the ``Hints`` printer column."""
    copy = tmp_path / "kvretention-old"
    shutil.copytree(CHART, copy)
    crd_template = next((copy / "templates" / "crds").glob("*.yaml"))
    text = crd_template.read_text()
    start = text.index("    - name: Hints\n")
    end = text.index("    - name: Age\n")
    crd_template.write_text(text[:start] + text[end:])
    return copy


def printer_columns(cluster: Cluster) -> list[str]:
    crd = json.loads(cluster.kubectl("get", "crd", CRD_NAME, "-o", "json").stdout)
    version = crd["spec"]["versions"][0]
    return [c["name"] for c in version.get("additionalPrinterColumns", [])]


def sa_kubeconfig(cluster: Cluster, *, namespace: str, path: Path) -> Path:
    """A kubeconfig that authenticates as the chart's ServiceAccount (a bound token)."""
    token = cluster.kubectl("-n", namespace, "create", "token", SA, "--duration=1h").stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    ctx = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])
    server = next(c for c in admin["clusters"] if c["name"] == ctx["context"]["cluster"])
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [server],
                "users": [{"name": SA, "user": {"token": token}}],
                "contexts": [{"name": SA, "context": {"cluster": server["name"], "user": SA}}],
                "current-context": SA,
            }
        )
    )
    return path


def start_operator(
    start_process: StartProcess, *, kubeconfig: Path, release_ns: str, fleet_ns: str
) -> RunningProcess:
    """``kvretention operator`` exactly as the chart's Deployment runs it, but as a local process."""
    from kvretention.ports import free_port

    operator = start_process(
        [
            str(KVR),
            "operator",
            f"--namespace={fleet_ns}",
            "--leader-elect",
            f"--health-port={free_port()}",
            f"--metrics-port={free_port()}",
            "--resync-seconds=5",
        ],
        env={"KUBECONFIG": str(kubeconfig), "POD_NAMESPACE": release_ns},
        name="operator",
    )
    return operator


def kvrd(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    done = cluster.kubectl("-n", namespace, "get", "kvrd", name, "-o", "json", check=False)
    return json.loads(done.stdout) if done.returncode == 0 else {}


def condition(obj: dict[str, Any], ctype: str) -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == ctype:
            found: dict[str, Any] = c
            return found
    return {}


def ready_at_current_generation(cluster: Cluster, namespace: str, name: str) -> bool:
    obj = kvrd(cluster, namespace, name)
    ready = condition(obj, "Ready")
    generation = obj.get("metadata", {}).get("generation")
    return (
        ready.get("status") == "True"
        and obj["status"].get("observedGeneration") == generation
        and ready.get("observedGeneration") == generation
    )


def deployment(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    done = cluster.kubectl("-n", namespace, "get", "deploy", name, "-o", "json", check=False)
    return json.loads(done.stdout) if done.returncode == 0 else {}


def test_helm_install_upgrade_uninstall_with_operator(
    cluster: Cluster,
    helm_cluster: Helm,
    release_ns: str,
    namespace: str,
    start_process: StartProcess,
    tmp_path: Path,
) -> None:
    fleet_ns = namespace
    release = "kvretention"
    adopt_crd_into(cluster, release=release, namespace=release_ns)

    # 1. install an "older" chart: namespaced RBAC for the fleet namespace.
    installed = helm_cluster.run(
        "install",
        release,
        str(older_chart(tmp_path)),
        f"--namespace={release_ns}",
        f"--set=watch.namespaces={{{fleet_ns}}}",
        "--wait",
        "--timeout=2m",
    )
    notes = installed.stdout.split("NOTES:", 1)[1]
    assert f"watches KvRetentionDeployments in: {fleet_ns}" in notes
    assert f"rollout status deployment/{SA}" in notes
    assert "Hints" not in printer_columns(cluster)
    role = json.loads(cluster.kubectl("-n", fleet_ns, "get", "role", SA, "-o", "json").stdout)
    assert role["metadata"]["annotations"]["meta.helm.sh/release-namespace"] == release_ns
    # The operator Deployment rolled out: its pod passed PodSecurity "restricted" admission.
    assert deployment(cluster, release_ns, SA)["status"].get("availableReplicas") == 1

    # 2. the real operator, as the chart's ServiceAccount, reconciles a sample fleet.
    kubeconfig = sa_kubeconfig(cluster, namespace=release_ns, path=tmp_path / "sa.kubeconfig")
    whoami = cluster.kubectl(f"--kubeconfig={kubeconfig}", "auth", "whoami", "-o", "json")
    assert json.loads(whoami.stdout)["status"]["userInfo"]["username"] == (
        f"system:serviceaccount:{release_ns}:{SA}"
    )
    operator = start_operator(
        start_process, kubeconfig=kubeconfig, release_ns=release_ns, fleet_ns=fleet_ns
    )
    cluster.kubectl("-n", fleet_ns, "apply", "--server-side", "-f", str(EXAMPLE))
    name = yaml.safe_load(EXAMPLE.read_text())["metadata"]["name"]
    wait_until(
        f"{fleet_ns}/{name} Ready",
        lambda: ready_at_current_generation(cluster, fleet_ns, name),
        timeout_s=READY_S,
    )
    lease = json.loads(
        cluster.kubectl("-n", release_ns, "get", "lease", LEASE_NAME, "-o", "json").stdout
    )
    assert lease["spec"]["holderIdentity"]
    assert "Forbidden" not in operator.log() and "forbidden" not in operator.log()

    # 3. upgrade: the current chart (new CRD column) and a changed value.
    helm_cluster.run(
        "upgrade",
        release,
        str(CHART),
        f"--namespace={release_ns}",
        f"--set=watch.namespaces={{{fleet_ns}}}",
        "--set=operator.resyncSeconds=30",
        "--wait",
        "--timeout=2m",
    )
    assert "Hints" in printer_columns(cluster)
    args = deployment(cluster, release_ns, SA)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--resync-seconds=30" in args
    # The printer column the upgrade added works on the live object.
    table = cluster.kubectl("-n", fleet_ns, "get", "kvrd", name).stdout
    assert table.split("\n")[0].split()[:5] == ["NAME", "READY", "MODE", "WORKERS", "HINTS"]

    # A restarted operator (as after an upgrade) takes the Lease again and reconciles a change.
    operator.stop()
    operator = start_operator(
        start_process, kubeconfig=kubeconfig, release_ns=release_ns, fleet_ns=fleet_ns
    )
    cluster.kubectl(
        "-n",
        fleet_ns,
        "patch",
        "kvrd",
        name,
        "--type=merge",
        "--patch",
        json.dumps({"spec": {"workers": {"replicas": 3}}}),
    )
    wait_until(
        f"{fleet_ns}/{name} Ready at the new generation",
        lambda: ready_at_current_generation(cluster, fleet_ns, name),
        timeout_s=READY_S,
    )
    workers = [
        d
        for d in json.loads(
            cluster.kubectl(
                "-n",
                fleet_ns,
                "get",
                "deploy",
                "-l",
                f"app.kubernetes.io/instance={name},app.kubernetes.io/component=worker",
                "-o",
                "json",
            ).stdout
        )["items"]
    ]
    assert [w["spec"]["replicas"] for w in workers] == [3]

    # 4. uninstall: the operator's objects go; the CRD (keep) and the fleet stay.
    operator.stop()
    helm_cluster.run("uninstall", release, f"--namespace={release_ns}", "--wait")
    assert cluster.kubectl("-n", release_ns, "get", "deploy", SA, check=False).returncode != 0
    assert cluster.kubectl("-n", fleet_ns, "get", "role", SA, check=False).returncode != 0
    assert cluster.kubectl("get", "crd", CRD_NAME, check=False).returncode == 0
    assert kvrd(cluster, fleet_ns, name)["metadata"]["name"] == name
    # The ServiceAccount is gone, and with it the operator's credentials.
    denied = cluster.kubectl(
        f"--kubeconfig={kubeconfig}", "get", "kvrd", "-n", fleet_ns, check=False
    )
    assert denied.returncode != 0


@pytest.mark.parametrize(
    "values",
    [
        [],
        ["--set=watch.clusterWide=true"],
        ["--set=operator.replicas=2", "--set=crds.keep=false"],
        ["--set=metrics.dashboards.enabled=true"],
    ],
    ids=["namespaced", "cluster-wide", "ha", "dashboards"],
)
def test_rendered_chart_passes_server_side_validation(
    cluster: Cluster, helm_cluster: Helm, namespace: str, values: list[str]
) -> None:
    """The API server itself (schemas, RBAC, PodSecurity warnings) accepts everything rendered."""
    cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/warn=restricted")
    rendered = (
        Helm(binary=helm_cluster.binary)
        .run("template", "kvretention", str(CHART), f"--namespace={namespace}", *values)
        .stdout
    )
    done = cluster.kubectl(
        "apply",
        "--dry-run=server",
        "--server-side",
        "--force-conflicts",
        "--field-manager=kvr-chart-test",
        "-f",
        "-",
        stdin=rendered,
        check=False,
    )
    # Any stderr line is an error or a warning (a PodSecurity "would violate" warning included).
    assert (done.returncode, done.stderr) == (0, "")
    kinds = {doc["kind"] for doc in parse_docs(rendered)}
    assert kinds >= {"Deployment", "ServiceAccount", "CustomResourceDefinition"}


def test_install_bundle_applies(cluster: Cluster, start_process: StartProcess) -> None:
    """``kubectl apply -f deploy/install.yaml``: every object lands and the operator rolls out."""
    docs = parse_docs(BUNDLE.read_text())
    # --force-conflicts: an earlier test may have left the (shared) CRD owned by Helm.
    applied = cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", str(BUNDLE), timeout_s=120
    )
    for doc in docs:
        assert f"{doc['metadata']['name']} serverside-applied" in applied.stdout
    cluster.kubectl(
        "-n",
        "kvretention-system",
        "rollout",
        "status",
        f"deployment/{SA}",
        "--timeout=90s",
        timeout_s=100,
    )
    established = cluster.kubectl(
        "wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=30s"
    )
    assert "condition met" in established.stdout
    # Leave the CRD (other tests share it) and remove the rest.
    cluster.kubectl("delete", "clusterrole,clusterrolebinding", SA, check=False)
    cluster.kubectl("delete", "namespace", "kvretention-system", "--wait=false", check=False)
