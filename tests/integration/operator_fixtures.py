"""Helpers for the operator's integration tests: run the operator, read its metrics, fake kwok's gaps.

Import from test modules as ``from operator_fixtures import ...`` (pytest puts this folder on
sys.path). The control-plane fixtures themselves live in ``conftest.py``. The ``operator`` and
``fleets`` fixtures that several modules share come from factories, bound by name in each module:
``operator = operator_fixture(resync_s=RESYNC_S)`` and ``fleets = fleets_fixture()``.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from kvretention.api.models import GROUP, PLURAL, VERSION
from kvretention.ports import free_port
from support.controlplane import ApplyCrd, Cluster, RunningProcess, wait_until
from support.fleet_cleanup import delete_fleets
from support.probe_status import (
    INSTANCE,
    inject_probe_reports,
    list_worker_pods,
    report_message,
)
from support.sample_probe_reports import HINTS_REPORT, old_engine

REPO = Path(__file__).resolve().parents[2]
CRD_PATH = REPO / "crds" / f"{GROUP}_{PLURAL}.yaml"
EXAMPLES = REPO / "examples"
GPU = "nvidia.com/gpu"

GOOD_REPORT: dict[str, Any] = {
    **HINTS_REPORT,
    "retention_plugin": "loaded",
    "retention_error": None,
    "retention_target_problems": [],
}
"""What this repository's probe reports in its own worker image: SGLang takes kv_hints and loads
the retention plugin with every hook target found."""
TRANSPORT_ONLY_REPORT: dict[str, Any] = {
    k: v for k, v in GOOD_REPORT.items() if not k.startswith("retention_")
}
"""A stock image's report (a probe that predates the plugin): kv_hints transported, not applied."""
OLD_ENGINE_REPORT = old_engine(GOOD_REPORT, version="0.4.6")


class Operator:
    """``python -m kvretention operator`` as a real process, with its ports; with
    ``hold_after_applies=N``, :mod:`support.held_operator` instead (every child apply after the
    first N held forever)."""

    def __init__(
        self,
        cluster: Cluster,
        log_dir: Path,
        *args: str,
        name: str = "operator",
        env: Mapping[str, str] | None = None,
        hold_after_applies: int | None = None,
    ) -> None:
        self.health_port = free_port()
        self.metrics_port = free_port()
        if hold_after_applies is None:
            command = ["kvretention", "operator"]
        else:
            command = ["support.held_operator", str(hold_after_applies)]
            env = {**(env or {}), "PYTHONPATH": _with_tests(os.environ.get("PYTHONPATH"))}
        self.argv = [
            sys.executable,
            "-m",
            *command,
            f"--health-port={self.health_port}",
            f"--metrics-port={self.metrics_port}",
            *args,
        ]
        self.log_path = log_dir / f"{name}-{self.health_port}.log"
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **cluster.env, **(env or {})}
        with self.log_path.open("wb") as out:
            proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, env=full_env)
        self.process = RunningProcess(argv=self.argv, proc=proc, log_path=self.log_path)

    def get(self, port: int, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode()

    def readyz(self) -> dict[str, Any]:
        """``/readyz`` as JSON, or ``{}`` while the server is not up yet."""
        try:
            _, body = self.get(self.health_port, "/readyz")
        except OSError:
            return {}
        data: dict[str, Any] = json.loads(body)
        return data

    def wait_ready(self, *, role: str = "leader", timeout_s: float = 60) -> None:
        def ready() -> bool:
            if not self.process.alive():
                raise AssertionError(f"operator exited:\n{self.process.log()[-4000:]}")
            state = self.readyz()
            return bool(state.get("ok")) and state.get("role") == role

        wait_until(f"operator /readyz role={role}", ready, timeout_s=timeout_s)

    def metrics(self) -> dict[str, float]:
        """Prometheus samples as ``name{labels}`` -> value."""
        _, body = self.get(self.metrics_port, "/metrics")
        out: dict[str, float] = {}
        for line in body.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def metric_sum(self, prefix: str) -> float:
        return sum(v for key, v in self.metrics().items() if key.startswith(prefix))

    def writes(self) -> float:
        """Children applied or deleted plus status writes, as counted by the operator."""
        return sum(
            self.metric_sum(f"kvretention_operator_{m}_total")
            for m in ("apply_writes", "deletes", "status_writes")
        )

    def stop(self) -> int:
        return self.process.stop()

    def kill(self) -> None:
        self.process.proc.kill()
        self.process.proc.wait()


def _with_tests(pythonpath: str | None) -> str:
    """``PYTHONPATH`` with ``tests`` first, so ``python -m support...`` finds the test helpers."""
    return os.pathsep.join([str(REPO / "tests"), *([pythonpath] if pythonpath else [])])


def load_example(example: str, **overrides: Any) -> dict[str, Any]:
    """An ``examples/`` CR with metadata overrides (``name=...``)."""
    body: dict[str, Any] = yaml.safe_load((EXAMPLES / f"{example}.yaml").read_text())
    body["metadata"].update(overrides)
    return body


class Fleets:
    """CR and child access for one namespace, through the Python client."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.ns = namespace
        self.custom = client.CustomObjectsApi(api)
        self.apps = client.AppsV1Api(api)
        self.core = client.CoreV1Api(api)
        self.policy = client.PolicyV1Api(api)
        self.networking = client.NetworkingV1Api(api)

    # the custom resource

    def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.ns, PLURAL, copy.deepcopy(dict(body))
        )
        return obj

    def get(self, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.ns, PLURAL, name
        )
        return obj

    def patch_spec(self, name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            self.ns,
            PLURAL,
            name,
            {"spec": spec},
            _content_type="application/merge-patch+json",
        )
        return obj

    def create_secret(self, name: str, string_data: Mapping[str, str]) -> None:
        """A Secret in the test's namespace (an auth Secret a fleet references, say)."""
        secret = client.V1Secret(
            metadata=client.V1ObjectMeta(name=name), string_data=dict(string_data)
        )
        self.core.create_namespaced_secret(self.ns, secret)

    def delete(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)

    def conditions(self, name: str) -> dict[str, dict[str, Any]]:
        status = self.get(name).get("status") or {}
        return {c["type"]: c for c in status.get("conditions") or []}

    def wait_condition(
        self,
        name: str,
        type_: str,
        status: str,
        *,
        reason: str | None = None,
        generation: int | None = None,
        timeout_s: float = 90,
        while_waiting: Callable[[], None] | None = None,
        reporting: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Wait until condition ``type_`` of fleet ``name`` has ``status`` (and ``reason``, at
        ``generation``), calling ``while_waiting`` each poll; ``reporting``: a probe report to
        inject into the fleet's worker pods each poll (kwok runs no probe)."""

        def check() -> dict[str, Any] | None:
            if while_waiting is not None:
                while_waiting()
            if reporting is not None:
                self.inject_probe_reports(name, reporting)
            cond = self.conditions(name).get(type_)
            if cond is None or cond["status"] != status:
                return None
            if reason is not None and cond["reason"] != reason:
                return None
            if generation is not None and cond.get("observedGeneration") != generation:
                return None
            return cond

        want = f"{name} {type_}={status}" + (f" ({reason})" if reason else "")
        result: dict[str, Any] = wait_until(want, check, timeout_s=timeout_s)
        return result

    # children

    def _raw(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The API server's own JSON (camelCase), not the client's snake_case models."""
        response = call(*args, _preload_content=False, **kwargs)
        data: dict[str, Any] = json.loads(response.data)
        return data

    def children(self, name: str) -> dict[tuple[str, str], dict[str, Any]]:
        """Every child kind the operator owns (Deployment, Service, ConfigMap, PodDisruptionBudget,
        NetworkPolicy) labelled as this fleet's, by (kind, name)."""
        selector = f"{INSTANCE}={name}"
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for kind, lister in (
            ("Deployment", self.apps.list_namespaced_deployment),
            ("Service", self.core.list_namespaced_service),
            ("ConfigMap", self.core.list_namespaced_config_map),
            ("PodDisruptionBudget", self.policy.list_namespaced_pod_disruption_budget),
            ("NetworkPolicy", self.networking.list_namespaced_network_policy),
        ):
            for item in self._raw(lister, self.ns, label_selector=selector)["items"]:
                out[(kind, item["metadata"]["name"])] = item
        return out

    def deployment(self, name: str) -> dict[str, Any]:
        return self._raw(self.apps.read_namespaced_deployment, name, self.ns)

    def worker_pods(self, name: str) -> list[dict[str, Any]]:
        return list_worker_pods(self.core, self.ns, name)

    def inject_probe_reports(self, name: str, report: Mapping[str, Any]) -> None:
        """Write the probe report where the kubelet would: the init container's termination message.

        kwok fakes the kubelet but has no container to run, so the ``probe`` init container never
        writes a message; see :mod:`support.probe_status`. Callers poll and call again.
        """
        inject_probe_reports(self.core, self.ns, name, report_message(report))


def resource_versions(fleets: Fleets, name: str) -> dict[str, str]:
    """resourceVersion of the CR and each child: equal snapshots mean nothing was written."""
    out = {"cr": fleets.get(name)["metadata"]["resourceVersion"]}
    for (kind, child), obj in fleets.children(name).items():
        out[f"{kind}/{child}"] = obj["metadata"]["resourceVersion"]
    return out


start_operator = Operator
"""Start an operator process: constructing an :class:`Operator` starts it."""


def operators_fixture() -> Any:
    """An ``operators`` fixture: the list a test adds the operators it starts to; at teardown each is
    stopped, the last started first, and its last lines printed (pytest shows them on failure).

    Bind it in the module: ``operators = operators_fixture()``.
    """

    @pytest.fixture(name="operators")
    def operators() -> Iterator[list[Operator]]:
        started: list[Operator] = []
        yield started
        for op in reversed(started):
            code = op.stop()
            print(f"--- operator (exit {code}) {op.log_path}:\n{op.process.log()[-3000:]}")

    return operators


def start_leader_and_standby(
    cluster: Cluster, log_dir: Path, operators: list[Operator], namespace: str, *extra_args: str
) -> tuple[Operator, Operator]:
    """Operators ``a`` and ``b`` watching ``namespace``, electing a leader through a Lease there
    (resync every 3 s, plus ``extra_args``): ``a`` ready as the leader, then ``b`` as the standby;
    both added to ``operators``."""
    args = (
        f"--namespace={namespace}",
        "--leader-elect",
        f"--leader-election-namespace={namespace}",
        "--resync-seconds=3",
        *extra_args,
    )
    a = start_operator(cluster, log_dir, *args, name="a")
    operators.append(a)
    a.wait_ready(role="leader")
    b = start_operator(cluster, log_dir, *args, name="b")
    operators.append(b)
    b.wait_ready(role="standby")
    return a, b


def replica_sets_per_deployment(fleets: Fleets) -> Counter[str]:
    """How many ReplicaSets each Deployment in the namespace owns."""
    return Counter(
        ref.name
        for rs in fleets.apps.list_namespaced_replica_set(fleets.ns).items
        for ref in (rs.metadata.owner_references or [])
        if ref.kind == "Deployment"
    )


def operator_fixture(*, resync_s: float) -> Any:
    """A module-scoped ``operator`` fixture: the CRD applied, one operator for all namespaces without
    leader election, resyncing every ``resync_s``; at the end it must exit 0 on SIGTERM.

    Bind it in the module: ``operator = operator_fixture(resync_s=RESYNC_S)``.
    """

    @pytest.fixture(scope="module", name="operator")
    def operator(
        cluster: Cluster, apply_crd: ApplyCrd, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[Operator]:
        apply_crd(CRD_PATH)
        op = start_operator(
            cluster,
            tmp_path_factory.mktemp("operator"),
            "--all-namespaces",
            "--no-leader-elect",
            f"--resync-seconds={resync_s}",
        )
        try:
            op.wait_ready()
            yield op
        finally:
            code = op.stop()
            log = op.process.log()
            print(f"--- operator (exit {code}):\n{log[-4000:]}")
            assert code == 0, "the operator must exit 0 on SIGTERM"
            # The operator's own handler took SIGTERM (its tasks stop before kopf's), not kopf's.
            assert "Signal SIGTERM is received" not in log
            assert "Stop-flag is set" in log

    return operator


def fleets_fixture() -> Any:
    """A ``fleets`` fixture: :class:`Fleets` for the test's own namespace.

    Bind it in the module: ``fleets = fleets_fixture()``.
    """

    @pytest.fixture(name="fleets")
    def fleets(k8s: client.ApiClient, namespace: str) -> Fleets:
        return Fleets(k8s, namespace)

    return fleets


def own_fleets_fixture() -> Any:
    """A ``fleets`` fixture for tests that start their own operators: the CRD applied, and the
    test's CRs deleted at the end (after its operators stop), before the namespace.

    Bind it in the module: ``fleets = own_fleets_fixture()``.
    """

    @pytest.fixture(name="fleets")
    def fleets(k8s: client.ApiClient, namespace: str, apply_crd: ApplyCrd) -> Iterator[Fleets]:
        apply_crd(CRD_PATH)
        yield Fleets(k8s, namespace)
        delete_fleets(k8s, namespace)

    return fleets


def most_gpus_on_a_node(core: client.CoreV1Api) -> int:
    """The most ``nvidia.com/gpu`` any node advertises (kwok's fake node has a fixed number)."""
    allocatable = [
        int((node.status.allocatable or {}).get(GPU, "0")) for node in core.list_node().items
    ]
    assert allocatable and max(allocatable) > 0, f"no node advertises {GPU}: {allocatable}"
    return max(allocatable)
