"""Every worker pool of a fleet, each in the form its size asks for: a Deployment for one-node
workers (:mod:`.workers`), a LeaderWorkerSet for workers that span nodes (:mod:`.lws`); and the
pool the scale subresource sizes, in that form."""

from __future__ import annotations

from kvretention.api.models import KvRetentionDeployment
from kvretention.api.names import label_selector
from kvretention.controller.resources.common import Manifest, child_name, selector_labels
from kvretention.controller.resources.lws import (
    WORKER_INDEX_LABEL,
    build_multinode_pool,
    lws_name,
)
from kvretention.controller.resources.workers import (
    ROLE_COMPONENT,
    ROLE_SUFFIX,
    build_worker_pool,
    nodes_per_replica,
    scaled_role,
    worker_roles,
)


def build_workers(cr: KvRetentionDeployment) -> list[Manifest]:
    """Each pool: Deployments for one-node workers, LeaderWorkerSets for multinode ones."""
    return [
        m
        for role in worker_roles(cr)
        for m in (
            build_multinode_pool(cr, role)
            if nodes_per_replica(cr, role) > 1
            else build_worker_pool(cr, role)
        )
    ]


def scaled_workload(cr: KvRetentionDeployment) -> str:
    """The name of the scaled pool's workload: its Deployment, or its LeaderWorkerSet."""
    role = scaled_role(cr)
    if nodes_per_replica(cr, role) > 1:
        return lws_name(cr, role)
    return child_name(cr, ROLE_SUFFIX[role])


def scale_selector(cr: KvRetentionDeployment) -> str:
    """``status.selector`` for the scale subresource: the scaled pool's pod labels; of a
    LeaderWorkerSet only its leaders (rank 0), one pod per replica (a group)."""
    role = scaled_role(cr)
    match = selector_labels(cr, ROLE_COMPONENT[role])
    if nodes_per_replica(cr, role) > 1:
        match = {**match, WORKER_INDEX_LABEL: "0"}
    return label_selector(match)
