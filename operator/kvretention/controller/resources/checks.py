"""Pure: problems in a spec that the CRD schema and CEL cannot see (``check_spec``).

Each check is a small function returning messages; an empty list means the spec can work. The
operator turns a non-empty list into ``Ready=False`` with reason ``InvalidSpec`` and creates nothing.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any, Final

from kvretention.api.models import (
    KvRetentionDeployment,
    PodOptions,
    ResourceRequirements,
    is_extended_resource,
)
from kvretention.api.names import Role
from kvretention.api.quantity import GIB, parse_quantity
from kvretention.controller.resources.common import (
    CONFIG_HASH_ANNOTATION,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    METRICS_PORT,
    WORKER_PORT,
)
from kvretention.controller.resources.lws import MAX_LABEL_LENGTH, longest_pod_hostname
from kvretention.controller.resources.mooncake import (
    CONFIG_MOUNT_DIR,
    CONFIG_PATH_ENV,
    LOCAL_HOSTNAME_ENV,
)
from kvretention.controller.resources.sglang_args import MANAGED_FLAGS, pool_for
from kvretention.controller.resources.sglang_cli import (
    SglangArgsError,
    dest_of,
    parse_sglang_args,
    sglang_version,
)
from kvretention.controller.resources.workers import (
    KV_EVENTS_CONFIG_FLAG,
    nodes_per_replica,
    serves_residency,
    worker_roles,
)
from kvretention.retention.pins import RATIO_ENV as PIN_RATIO_ENV

_DNS_SUBDOMAIN: Final = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_NAME_PART: Final = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def is_resource_name(name: str) -> bool:
    """A Kubernetes qualified name (``cpu``, ``nvidia.com/gpu``), as resource names must be."""
    prefix, _, part = name.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return False
    return len(part) <= 63 and _NAME_PART.match(part) is not None


def segment_bytes(size: str) -> Decimal:
    """Mooncake ``global_segment_size``: bytes, or ``<N>gb`` meaning N GiB (as SGLang parses it)."""
    return Decimal(int(size[:-2])) * GIB if size.endswith("gb") else Decimal(int(size))


def _pool_path(role: Role) -> str:
    return f"spec.workers.{role}"


def _resources(cr: KvRetentionDeployment) -> Iterator[tuple[str, ResourceRequirements | None]]:
    spec = cr.spec
    yield "spec.frontend.resources", spec.frontend.resources
    yield "spec.router.resources", spec.router.resources
    yield "spec.kvStore.mooncake.master.resources", spec.kv_store.mooncake.master.resources
    for role in worker_roles(cr):
        yield f"{_pool_path(role)}.resources", pool_for(spec, role).resources


def check_quantities(cr: KvRetentionDeployment) -> list[str]:
    """Every resource name is valid, and no request exceeds its limit."""
    problems = []
    for path, res in _resources(cr):
        if res is None:
            continue
        parsed: dict[str, dict[str, Decimal]] = {"requests": {}, "limits": {}}
        for kind in ("requests", "limits"):
            for key, value in sorted((getattr(res, kind) or {}).items()):
                if not is_resource_name(key):  # the API server would refuse the whole Deployment
                    problems.append(f"{path}.{kind}: {key!r} is not a valid resource name")
                    continue
                # The model checked each is a quantity within a node (api.quantity, also CEL).
                parsed[kind][key] = parse_quantity(value)
        for key, request in parsed["requests"].items():
            limit = parsed["limits"].get(key)
            if limit is not None and request > limit:
                problems.append(f"{path}: requests.{key} exceeds limits.{key}")
            elif limit is not None and request != limit and is_extended_resource(key):
                problems.append(
                    f"{path}: requests.{key} must equal limits.{key} "
                    "(Kubernetes does not overcommit extended resources)"
                )
    return problems


def check_extra_args(cr: KvRetentionDeployment) -> list[str]:
    """``extraArgs`` must parse as SGLang parses it and must not set what the operator renders.

    Read with SGLang's own parser (:mod:`.sglang_cli`), so an alias (``--model``), an abbreviation
    (``--tp-siz 4``) or ``--config FILE`` (a file that can set any flag) cannot slip past.
    """
    managed = {dest for flag in MANAGED_FLAGS if (dest := dest_of(flag)) is not None}
    kv_events = dest_of(KV_EVENTS_CONFIG_FLAG)
    problems = []
    for role in worker_roles(cr):
        path = f"{_pool_path(role)}.extraArgs"
        # worker --kv-events sets it and refuses one given after "--": the pod would crash-loop.
        owned = managed | {kv_events} if serves_residency(cr, role) and kv_events else managed
        try:
            options = parse_sglang_args(pool_for(cr.spec, role).extra_args)
        except SglangArgsError as exc:
            problems.append(f"{path}: SGLang {sglang_version()} would refuse these: {exc}")
            continue
        for opt in options:
            where = f"{path}[{opt.index}]: {opt.written}"
            if opt.dest == "config":
                problems.append(
                    f"{where} reads SGLang flags from a file the operator cannot check (it could "
                    "override the flags rendered from the spec); list the flags in extraArgs"
                )
            elif opt.dest in owned:
                named = "" if opt.written == opt.option else f" (SGLang reads it as {opt.option})"
                problems.append(
                    f"{where}{named} is set by the operator from the spec; "
                    "change the matching spec field instead"
                )
    return problems


def check_gpus(cr: KvRetentionDeployment) -> list[str]:
    """A GPU request or limit given by hand must match tensorParallelSize (one GPU per rank).

    A request without a limit is fine: the builder sets the limit to the request, as Kubernetes
    demands of extended resources (``resources_dict``).
    """
    gpu = cr.spec.workers.gpu_resource
    problems = []
    for role in worker_roles(cr):
        pool = pool_for(cr.spec, role)
        for kind in ("requests", "limits"):
            given = (getattr(pool.resources, kind) or {}) if pool.resources else {}
            if not gpu or gpu not in given:
                continue
            try:
                count = parse_quantity(given[gpu])
            except ValueError:
                continue  # reported by check_quantities
            nodes = cr.spec.workers.nodes_for(pool)
            if count * nodes != pool.tensor_parallel_size:
                across = f" across {nodes} nodes ({count * nodes} in all)" if nodes > 1 else ""
                problems.append(
                    f"{_pool_path(role)}.resources.{kind}.{gpu} is {given[gpu]}{across} but "
                    f"tensorParallelSize is {pool.tensor_parallel_size}: SGLang needs one GPU "
                    "per rank"
                )
    return problems


MIN_SEGMENT_BYTES: Final = Decimal(64 * 2**20)
"""Smallest Mooncake segment a worker may contribute: a few KV pages of a small model."""


def check_segment_size(cr: KvRetentionDeployment) -> list[str]:
    """A Mooncake segment too small to hold a KV page is a pool that stores nothing."""
    size = cr.spec.kv_store.mooncake.transfer.global_segment_size
    if segment_bytes(size) < MIN_SEGMENT_BYTES:
        return [
            f"spec.kvStore.mooncake.transfer.globalSegmentSize: {size} is below the minimum of "
            f"{int(MIN_SEGMENT_BYTES)} bytes (64 MiB)"
        ]
    return []


def check_host_memory(cr: KvRetentionDeployment) -> list[str]:
    """A worker's memory limit must hold its HiCache host pool plus its Mooncake segment."""
    spec = cr.spec
    hicache = spec.workers.hicache
    segment = (
        segment_bytes(spec.kv_store.mooncake.transfer.global_segment_size)
        if hicache.enabled and hicache.storage_backend == "mooncake"
        else Decimal(0)
    )
    problems = []
    for role in worker_roles(cr):
        if role == "decode":
            continue
        pool = pool_for(spec, role)
        limits = (pool.resources.limits or {}) if pool.resources else {}
        if "memory" not in limits:
            continue
        try:
            limit = parse_quantity(limits["memory"])
        except ValueError:
            continue
        nodes = spec.workers.nodes_for(pool)
        ranks_per_pod = pool.tensor_parallel_size // nodes
        ranks = "tensorParallelSize" + (" / nodesPerReplica" if nodes > 1 else "")
        host_pool = (
            Decimal(hicache.size_gib * ranks_per_pod) * GIB
            if hicache.enabled and hicache.size_gib is not None
            else Decimal(0)
        )
        if host_pool + segment > limit:
            problems.append(
                f"{_pool_path(role)}.resources.limits.memory {limits['memory']} is below the "
                f"{(host_pool + segment) / GIB:.0f}Gi the worker needs for its HiCache host pool "
                f"(hicache.sizeGiB x {ranks}) plus its Mooncake segment "
                "(kvStore.mooncake.transfer.globalSegmentSize)"
            )
    return problems


def check_master_ports(cr: KvRetentionDeployment) -> list[str]:
    master = cr.spec.kv_store.mooncake.master
    if cr.spec.kv_store.mooncake.mode != "managed":
        return []
    ports = [master.rpc_port, master.metrics_port, master.metadata_port]
    if len(set(ports)) != len(ports):
        return [
            "spec.kvStore.mooncake.master: rpcPort, metricsPort and metadataPort must differ, "
            f"got {ports[0]}, {ports[1]}, {ports[2]}"
        ]
    return []


_RESERVED_MOUNTS: Final = ("/dev/shm", CONFIG_MOUNT_DIR)


def check_worker_pod(cr: KvRetentionDeployment) -> list[str]:
    """Spec values the API server would refuse inside a worker pod or Service."""
    problems = []
    workers = cr.spec.workers
    taken = {WORKER_PORT: "HTTP", METRICS_PORT: "metrics"}
    if workers.mode == "disaggregated" and workers.bootstrap_port in taken:
        port = workers.bootstrap_port
        problems.append(
            f"spec.workers.bootstrapPort: {port} is the worker's {taken[port]} port; choose another"
        )
    volume = cr.spec.model.volume
    if volume is not None:
        if volume.claim_name is not None and not volume.claim_name:
            problems.append("spec.model.volume.claimName: must not be empty")
        if volume.host_path is not None and (
            not volume.host_path or ".." in volume.host_path.split("/")
        ):
            problems.append(
                "spec.model.volume.hostPath: must be a non-empty path without '..' segments"
            )
        if posixpath.normpath(volume.mount_path) in _RESERVED_MOUNTS:
            problems.append(
                f"spec.model.volume.mountPath: {volume.mount_path} is already mounted in workers"
            )
    return problems


RESERVED_LABELS: Final = frozenset({LABEL_NAME, LABEL_INSTANCE, LABEL_COMPONENT, LABEL_MANAGED_BY})
RESERVED_ANNOTATIONS: Final = frozenset({CONFIG_HASH_ANNOTATION})
RESERVED_ENV: Final = frozenset({"POD_IP", CONFIG_PATH_ENV, LOCAL_HOSTNAME_ENV})
RESERVED_VOLUMES: Final = frozenset({"dshm", "mooncake-config", "model"})
"""What the worker builder puts in pods; user options may not override any of it."""


def _pod_options(cr: KvRetentionDeployment) -> Iterator[tuple[str, PodOptions]]:
    spec = cr.spec
    for path, options in (
        ("spec.frontend.pod", spec.frontend.pod),
        ("spec.router.pod", spec.router.pod),
        ("spec.workers.pod", spec.workers.pod),
        ("spec.kvStore.mooncake.master.pod", spec.kv_store.mooncake.master.pod),
    ):
        if options is not None:
            yield path, options


def _named(
    items: list[dict[str, Any]], path: str, *, required: tuple[str, ...], unique: bool = True
) -> list[str]:
    """Each pass-through item has the string fields Kubernetes requires (and a unique name)."""
    problems = []
    names: set[str] = set()
    for index, item in enumerate(items):
        for key in required:
            if not isinstance(item.get(key), str) or not item[key]:
                problems.append(f"{path}[{index}].{key}: required (a non-empty string)")
        name = item.get("name")
        if unique and isinstance(name, str) and name in names:
            problems.append(f"{path}[{index}].name: {name!r} is repeated")
        if isinstance(name, str):
            names.add(name)
    return problems


def check_pod_options(cr: KvRetentionDeployment) -> list[str]:
    """Pod options pass through, but may not take over what the operator sets in the pod."""
    problems = []
    model_mount = cr.spec.model.volume.mount_path if cr.spec.model.volume else None
    reserved_mounts = {
        *_RESERVED_MOUNTS,
        *([posixpath.normpath(model_mount)] if model_mount else []),
    }
    pin_ratio = cr.spec.workers.radix_pin_ratio is not None
    for path, options in _pod_options(cr):
        for key in sorted(RESERVED_LABELS & options.labels.keys()):
            problems.append(f"{path}.labels: {key} is set by the operator (it selects pods on it)")
        for key in sorted(RESERVED_ANNOTATIONS & options.annotations.keys()):
            problems.append(f"{path}.annotations: {key} is set by the operator")
        problems += _named(options.env, f"{path}.env", required=("name",))
        problems += _named(options.volumes, f"{path}.volumes", required=("name",))
        problems += _named(
            options.volume_mounts,
            f"{path}.volumeMounts",
            required=("name", "mountPath"),
            unique=False,  # one volume may be mounted at several paths
        )
        for index, env in enumerate(options.env):
            if env.get("name") in RESERVED_ENV:
                problems.append(f"{path}.env[{index}]: {env['name']} is set by the operator")
            elif env.get("name") == PIN_RATIO_ENV and path == "spec.workers.pod" and pin_ratio:
                problems.append(
                    f"{path}.env[{index}]: {PIN_RATIO_ENV} is set by spec.workers.radixPinRatio; "
                    "set one of the two"
                )
        for index, volume in enumerate(options.volumes):
            if volume.get("name") in RESERVED_VOLUMES:
                problems.append(
                    f"{path}.volumes[{index}]: the name {volume['name']} is used by the operator"
                )
        for index, mount in enumerate(options.volume_mounts):
            mount_path = mount.get("mountPath")
            if isinstance(mount_path, str) and posixpath.normpath(mount_path) in reserved_mounts:
                problems.append(
                    f"{path}.volumeMounts[{index}]: {mount_path} is already mounted by the operator"
                )
    return problems


def check_frontend_auth(cr: KvRetentionDeployment) -> list[str]:
    """With auth on, the frontend's pod options may not take the Secrets' volume names or mount
    them over (the API server would refuse a repeated volume name; a mount over the keys would
    hide them)."""
    from kvretention.controller.resources.frontend import AUTH_MOUNT, AUTH_VOLUME_PREFIX

    options = cr.spec.frontend.pod
    if cr.spec.frontend.auth is None or options is None:
        return []
    problems = []
    path = "spec.frontend.pod"
    for index, volume in enumerate(options.volumes):
        name = volume.get("name")
        if isinstance(name, str) and name.startswith(AUTH_VOLUME_PREFIX):
            problems.append(f"{path}.volumes[{index}]: the name {name} is used by the operator")
    for index, mount in enumerate(options.volume_mounts):
        mount_path = mount.get("mountPath")
        if not isinstance(mount_path, str):
            continue
        normal = posixpath.normpath(mount_path)
        under = normal.startswith(AUTH_MOUNT + "/")
        if under or (AUTH_MOUNT + "/").startswith(normal.rstrip("/") + "/"):
            problems.append(
                f"{path}.volumeMounts[{index}]: {mount_path} would hide the auth Secrets "
                f"mounted under {AUTH_MOUNT}"
            )
    return problems


def check_frontend_codex(cr: KvRetentionDeployment) -> list[str]:
    """With codexInstructions set, the frontend's pod options may not take its volume name or
    mount over it (a repeated volume name is refused; a mount over the file would hide it)."""
    from kvretention.controller.resources.frontend import CODEX_MOUNT, CODEX_VOLUME

    options = cr.spec.frontend.pod
    if cr.spec.frontend.codex_instructions is None or options is None:
        return []
    path = "spec.frontend.pod"
    problems = [
        f"{path}.volumes[{index}]: the name {CODEX_VOLUME} is used by the operator"
        for index, volume in enumerate(options.volumes)
        if volume.get("name") == CODEX_VOLUME
    ]
    for index, mount in enumerate(options.volume_mounts):
        mount_path = mount.get("mountPath")
        if not isinstance(mount_path, str):
            continue
        normal = posixpath.normpath(mount_path).rstrip("/") + "/"
        if normal.startswith(CODEX_MOUNT + "/") or (CODEX_MOUNT + "/").startswith(normal):
            problems.append(
                f"{path}.volumeMounts[{index}]: {mount_path} would hide the codexInstructions "
                f"mounted at {CODEX_MOUNT}"
            )
    return problems


def check_multinode_names(cr: KvRetentionDeployment) -> list[str]:
    """A multinode pool's pod names are hostnames: the longest must stay a DNS label."""
    problems = []
    for role in worker_roles(cr):
        if nodes_per_replica(cr, role) < 2:
            continue
        hostname = longest_pod_hostname(cr, role)
        if len(hostname) > MAX_LABEL_LENGTH:
            problems.append(
                f"metadata.name: {cr.name!r} is too long for a multinode {role} pool: its "
                f"LeaderWorkerSet pod {hostname} ({len(hostname)} characters) would exceed the "
                f"{MAX_LABEL_LENGTH} characters of a hostname; shorten the name by "
                f"{len(hostname) - MAX_LABEL_LENGTH}"
            )
    return problems


CHECKS: Final[tuple[Callable[[KvRetentionDeployment], list[str]], ...]] = (
    check_quantities,
    check_extra_args,
    check_gpus,
    check_segment_size,
    check_host_memory,
    check_master_ports,
    check_worker_pod,
    check_pod_options,
    check_frontend_auth,
    check_frontend_codex,
    check_multinode_names,
)


def check_spec(cr: KvRetentionDeployment) -> list[str]:
    """Every problem the schema cannot catch, in a stable order (empty: the spec can work)."""
    return [problem for check in CHECKS for problem in check(cr)]
