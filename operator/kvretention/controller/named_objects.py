"""The objects a fleet names but does not reconcile as children: the auth Secrets and the
``codexInstructions`` ConfigMap it reads (checked only while the frontend is not ready, to say why
in status), and the hop-key Secret it needs once (created when absent, never rewritten, deleted
when auth is turned off if the fleet made it).

Secrets and ConfigMaps are not watched kinds, so each is a direct read or create, bounded to the
moments it can change the answer.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Mapping
from typing import Any

from prometheus_client import Counter

from kvretention.controller import kinds
from kvretention.controller import kube as k
from kvretention.controller.objects import ChildKey, component_of, is_controlled_by, uid_of
from kvretention.controller.planner import (
    FleetPlan,
    plan_codex_read,
    plan_hop_key,
    plan_hop_key_retired,
    plan_secret_reads,
    refused_message,
)
from kvretention.controller.resources.hop_key import (
    HOP_KEY_BYTES,
    HOP_KEY_COMPONENT,
    build_hop_key_secret,
)

log = logging.getLogger("kvretention.controller.executor")


async def _exists(kube: k.Kube, namespace: str, name: str) -> bool | Exception:
    try:
        return await kube.exists(kinds.SECRET, namespace, name)
    except Exception as exc:  # said nothing: the frontend's own reason stands
        return exc


async def missing_secrets(
    kube: k.Kube, plan: FleetPlan, previous: Mapping[str, Any] | None
) -> list[str]:
    """The auth Secrets that do not exist (metadata-only reads, only while the frontend is
    not ready). A read that fails otherwise (RBAC without ``get`` on Secrets, the API server
    busy) says nothing: the frontend's own reason stands."""
    names = plan_secret_reads(plan, previous)
    namespace = plan.cr.namespace
    found = await asyncio.gather(*(_exists(kube, namespace, name) for name in names))
    missing = []
    for name, exists in zip(names, found, strict=True):
        if isinstance(exists, Exception):
            log.debug("Secret %s/%s not checked: %s", namespace, name, exists)
        elif not exists:
            missing.append(name)
    return missing


async def missing_codex_instructions(
    kube: k.Kube, plan: FleetPlan, previous: Mapping[str, Any] | None
) -> str | None:
    """What of the codexInstructions ConfigMap key does not exist, in words (None: it does,
    or it was not read). Read only while the frontend is not ready; a read that fails
    otherwise says nothing, as for the auth Secrets."""
    wanted = plan_codex_read(plan, previous)
    if wanted is None:
        return None
    name, key = wanted
    namespace = plan.cr.namespace
    try:
        found = await kube.get_or_none(kinds.CONFIGMAP, namespace, name)
    except Exception as exc:
        log.debug("ConfigMap %s/%s not checked: %s", namespace, name, exc)
        return None
    if found is None:
        return f"ConfigMap {name} not found in namespace {namespace}"
    if key not in (found.get("data") or {}) and key not in (found.get("binaryData") or {}):
        return f"ConfigMap {name} in namespace {namespace} has no key {key}"
    return None


async def ensure_hop_key(
    kube: k.Kube,
    plan: FleetPlan,
    previous: Mapping[str, Any] | None,
    *,
    ensured: set[tuple[str, str]],
    writes: Counter,
) -> list[str]:
    """Create the fleet's hop-key Secret with a random key if it is absent; one that exists
    is never read or rewritten (a new key at each reconcile would split the fleet's pods
    between two keys). ``ensured`` remembers (fleet uid, Secret) made sure of since the
    operator started. A refused create, in words for status."""
    key = (plan.uid, plan.hop_key_secret or "")
    name = plan_hop_key(plan, previous, ensured=key in ensured)
    if name is None:
        return []
    manifest = build_hop_key_secret(plan.cr, key=secrets.token_hex(HOP_KEY_BYTES))
    try:
        created = await kube.create_if_absent(kinds.SECRET, plan.cr.namespace, manifest)
    except Exception as exc:  # RBAC, admission, the API server: said in status, retried
        said = exc.said if isinstance(exc, k.ApiError) else str(exc)
        return [refused_message(manifest, said)]
    if created:
        writes.labels(kinds.SECRET.kind).inc()
        log.info("created Secret %s/%s (the fleet's hop key)", plan.cr.namespace, name)
    ensured.add(key)
    return []


async def retire_hop_key(
    kube: k.Kube,
    plan: FleetPlan,
    live: Mapping[ChildKey, Mapping[str, Any]],
    *,
    ensured: set[tuple[str, str]],
    retries: set[tuple[str, str]],
    deletes: Counter,
) -> None:
    """Delete the hop-key Secret of a fleet whose auth was just turned off (its live frontend
    still mounts the key, ``live`` being read before this reconcile's applies), when the fleet
    made it: owned by the fleet, with the hop-key label. One a user made is left as it is. A
    failed delete is logged and tried again on the fleet's next reconciles (``retries``, kept by
    this process); the Secret goes with its fleet in any case."""
    name = plan_hop_key_retired(plan, live)
    if name is None and plan.hop_key_secret is None:
        name = next((n for uid, n in retries if uid == plan.uid), None)
    if name is None:
        return
    namespace = plan.cr.namespace
    ensured.discard((plan.uid, name))  # auth turned on again makes the key anew
    retries.discard((plan.uid, name))
    try:
        found = await kube.get_or_none(kinds.SECRET, namespace, name)
        if found is None:
            return
        if not is_controlled_by(found, plan.uid) or component_of(found) != HOP_KEY_COMPONENT:
            log.info("kept Secret %s/%s: the fleet did not make it", namespace, name)
            return
        await kube.delete(kinds.SECRET, namespace, name, uid=uid_of(found))
    except Exception as exc:
        retries.add((plan.uid, name))
        log.warning(
            "Secret %s/%s (a hop key no pod reads) not deleted, tried again on the next "
            "reconcile: %s",
            namespace,
            name,
            exc,
        )
        return
    deletes.labels(kinds.SECRET.kind).inc()
    log.info("deleted Secret %s/%s (auth is off: the fleet signs nothing)", namespace, name)
