"""Stand in for the kubelet's half of the ``probe`` init container on kwok nodes (no kubelet there).

The worker pod's ``probe`` init container prints its JSON report as its termination message; the
operator reads it from ``status.initContainerStatuses[probe].state.terminated.message``. kwok runs
no container, so tests and the demo write that status themselves. The builders here are pure; the
one I/O helper, :func:`inject_probe_reports`, is shared by the integration tests and
``scripts/inject_probe_report.py``.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kvretention.api.names import LABEL_COMPONENT as COMPONENT_LABEL
from kvretention.api.names import PROBE_CONTAINER
from kvretention.api.probe_report import ProbeReport, render_report
from kvretention.controller.status import WORKER_COMPONENTS

INSTANCE = "app.kubernetes.io/instance"


def worker_selector(name: str) -> str:
    """Label selector for every worker pod of fleet ``name`` (aggregated, prefill or decode)."""
    return f"{INSTANCE}={name},{COMPONENT_LABEL} in ({','.join(WORKER_COMPONENTS)})"


def report_message(report: ProbeReport | Mapping[str, Any]) -> str:
    """The termination message the probe writes: its report rendered as the probe renders it (a
    mapping is read as the report's JSON, so it must be a valid report)."""
    if not isinstance(report, ProbeReport):
        report = ProbeReport.model_validate(report)
    return render_report(report)


def pod_is_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def probe_message(pod: Mapping[str, Any]) -> str | None:
    """The ``probe`` init container's termination message, if it has one."""
    for s in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if s.get("name") == PROBE_CONTAINER:
            message = ((s.get("state") or {}).get("terminated") or {}).get("message")
            return str(message) if message is not None else None
    return None


def probe_status_patch(pod: Mapping[str, Any], message: str, *, now: str) -> dict[str, Any] | None:
    """The merge patch that records ``message`` as the probe's exit-0 termination, or None.

    None when there is nothing to do: the pod is not Ready yet (kwok's later stages would overwrite
    the patch), is being deleted, or already carries this message.
    """
    if (pod.get("metadata") or {}).get("deletionTimestamp") or not pod_is_ready(pod):
        return None
    if probe_message(pod) == message:
        return None
    inits = (pod.get("spec") or {}).get("initContainers") or []
    image = next((c["image"] for c in inits if c.get("name") == PROBE_CONTAINER), None)
    if image is None:
        return None
    terminated = {
        "exitCode": 0,
        "reason": "Completed",
        "message": message,
        "startedAt": now,
        "finishedAt": now,
    }
    status = {
        "name": PROBE_CONTAINER,
        "image": image,
        "imageID": "",
        "ready": True,
        "restartCount": 0,
        "state": {"terminated": terminated},
    }
    return {"status": {"initContainerStatuses": [status]}}


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def list_worker_pods(core: client.CoreV1Api, namespace: str, name: str) -> list[dict[str, Any]]:
    """Fleet ``name``'s worker pods as the API server's own JSON, without those being deleted."""
    response: Any = core.list_namespaced_pod(
        namespace, label_selector=worker_selector(name), _preload_content=False
    )
    items: Sequence[dict[str, Any]] = json.loads(response.data)["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def inject_probe_reports(core: client.CoreV1Api, namespace: str, name: str, message: str) -> int:
    """Write ``message`` into each Ready worker pod that lacks it; returns how many were patched.

    Once kwok has marked a pod Ready its stages stop touching the pod, so the patch sticks; callers
    poll and call again, which covers the race with kwok's last stage and pods created later.
    """
    now = _now()
    patched = 0
    for pod in list_worker_pods(core, namespace, name):
        body = probe_status_patch(pod, message, now=now)
        if body is None:
            continue
        try:
            core.patch_namespaced_pod_status(
                pod["metadata"]["name"],
                namespace,
                body,
                _content_type="application/merge-patch+json",
            )
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise
            continue
        patched += 1
    return patched
