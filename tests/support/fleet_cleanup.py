"""Delete a test's KvRetentionDeployments before its namespace goes.

The ``namespace`` fixture deletes namespaces without waiting, and namespace deletion is slow; a CR
left in a terminating namespace is still seen by any operator watching all namespaces (the
reconcile module's), which would then count writes for it. Tests that run their own operator
delete their CRs, after stopping it, with :func:`delete_fleets`.
"""

from __future__ import annotations

from kubernetes import client

from kvretention.api.models import GROUP, PLURAL, VERSION
from support.controlplane import wait_until


def delete_fleets(api: client.ApiClient, namespace: str, *, timeout_s: float = 20) -> None:
    """Delete every KvRetentionDeployment in ``namespace`` and wait until none is left."""
    custom = client.CustomObjectsApi(api)

    def remaining() -> list[str]:
        items = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
        return [str(item["metadata"]["name"]) for item in items]

    for name in remaining():
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    wait_until(
        f"no KvRetentionDeployment left in {namespace}",
        lambda: not remaining(),
        timeout_s=timeout_s,
    )
