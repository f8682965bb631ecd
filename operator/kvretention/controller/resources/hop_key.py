"""The fleet's hop key: a Secret the frontend signs each request's tenant with and the router and
the workers check it by (:mod:`kvretention.common.hop_auth`), so no other pod that reaches their
ports can act as a tenant.

Only fleets with ``spec.frontend.auth`` have tenants to protect, and only they get one. The
Secret ``<fleet>-hop-key`` is made once with a random key and never rewritten (a new key at each
reconcile would split the fleet's pods between two keys); it is owned by the fleet, so it goes
with it, and when auth is turned off the operator deletes it (``named_objects.retire_hop_key``).
A Secret of that name that is already there is used as it is, whoever made it: that is
how a fleet gets a key of its own choosing. Its one key is mounted read-only in the frontend,
router and worker pods (as a volume, not subPath, so a rotated key reaches running pods).
"""

from __future__ import annotations

import base64
from typing import Final

from kvretention.api.models import KvRetentionDeployment
from kvretention.controller.resources.common import Manifest, child_name, object_meta

HOP_KEY_SUFFIX: Final = "hop-key"
HOP_KEY_FIELD: Final = "hop-key"
"""The Secret's data key: the file the pods read."""
HOP_KEY_BYTES: Final = 32
"""Random bytes in a key the operator makes (written as hex: 64 characters)."""
HOP_KEY_MOUNT: Final = "/etc/kvretention/hop"
HOP_KEY_VOLUME: Final = "hop-key"
HOP_KEY_COMPONENT: Final = "hop-key"


def hop_key_secret(cr: KvRetentionDeployment) -> str | None:
    """The name of the fleet's hop-key Secret; None for a fleet without auth (nothing signed)."""
    return child_name(cr, HOP_KEY_SUFFIX) if cr.spec.frontend.auth is not None else None


def build_hop_key_args(cr: KvRetentionDeployment) -> list[str]:
    """``--hop-key-file`` for the frontend, the router and the workers (nothing without auth)."""
    if hop_key_secret(cr) is None:
        return []
    return [f"--hop-key-file={HOP_KEY_MOUNT}/{HOP_KEY_FIELD}"]


def build_hop_key_volumes(cr: KvRetentionDeployment) -> tuple[list[Manifest], list[Manifest]]:
    """The hop-key Secret as a read-only volume, and its mount (nothing without auth)."""
    name = hop_key_secret(cr)
    if name is None:
        return [], []
    volume = {
        "name": HOP_KEY_VOLUME,
        "secret": {
            "secretName": name,
            "items": [{"key": HOP_KEY_FIELD, "path": HOP_KEY_FIELD}],
            "defaultMode": 0o444,
        },
    }
    mount = {"name": HOP_KEY_VOLUME, "mountPath": HOP_KEY_MOUNT, "readOnly": True}
    return [volume], [mount]


def build_hop_key_secret(cr: KvRetentionDeployment, *, key: str) -> Manifest:
    """The Secret as it is created, holding ``key`` (the caller draws it: builders stay pure)."""
    name = hop_key_secret(cr)
    if name is None:
        raise ValueError(f"{cr.name} has no frontend auth: it has no hop key")
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": object_meta(cr, name=name, component=HOP_KEY_COMPONENT),
        "type": "Opaque",
        "data": {HOP_KEY_FIELD: base64.b64encode(key.encode() + b"\n").decode()},
    }
