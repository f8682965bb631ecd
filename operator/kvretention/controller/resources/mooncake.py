"""Mooncake: the managed master (Deployment + Service) and the client config every worker mounts.

The client config is the JSON SGLang's Mooncake backend reads from the file named by
``SGLANG_HICACHE_MOONCAKE_CONFIG_PATH`` (``MooncakeStoreConfig.from_file`` in
``sglang/srt/mem_cache/storage/mooncake_store/mooncake_store.py``); ``local_hostname`` is left out
because each pod sets ``MOONCAKE_LOCAL_HOSTNAME`` to its own IP, which SGLang prefers. Its
``kvretention`` section (ignored by SGLang) tells the retention plugin's L3 hook the pin budget and
the master's longest pin (``kvretention.retention.l3``).
"""

from __future__ import annotations

import json
from typing import Any, Final

from kvretention.api.models import KvRetentionDeployment, KvRetentionDeploymentSpec, MooncakeSpec
from kvretention.controller.resources.common import (
    COMPONENT_MOONCAKE,
    Manifest,
    build_deployment,
    build_service,
    child_name,
    container_security,
    content_hash,
    object_meta,
    service_host,
    service_resources,
)
from kvretention.retention.l3_settings import SETTINGS_KEY as L3_SETTINGS_KEY
from kvretention.retention.l3_settings import L3Settings

MASTER_SUFFIX: Final = "mooncake"
CONFIG_SUFFIX: Final = "mooncake-config"
CONFIG_KEY: Final = "mooncake.json"
CONFIG_MOUNT_DIR: Final = "/etc/kvretention/mooncake"
CONFIG_PATH: Final = f"{CONFIG_MOUNT_DIR}/{CONFIG_KEY}"
CONFIG_PATH_ENV: Final = "SGLANG_HICACHE_MOONCAKE_CONFIG_PATH"
LOCAL_HOSTNAME_ENV: Final = "MOONCAKE_LOCAL_HOSTNAME"
MASTER_BINARY: Final = "mooncake_master"


def _bool(value: bool) -> str:
    return "true" if value else "false"


def build_mooncake_master_args(spec: KvRetentionDeploymentSpec) -> list[str]:
    """The exact ``mooncake_master`` argv of the managed master (gflags ``--flag=value`` form)."""
    master = spec.kv_store.mooncake.master
    pin = master.soft_pin
    return [
        MASTER_BINARY,
        f"--rpc_port={master.rpc_port}",
        "--rpc_address=0.0.0.0",
        "--enable_http_metadata_server=true",
        "--http_metadata_server_host=0.0.0.0",
        f"--http_metadata_server_port={master.metadata_port}",
        "--metrics_host=0.0.0.0",
        f"--metrics_port={master.metrics_port}",
        f"--eviction_high_watermark_ratio={master.eviction.high_watermark_ratio!r}",
        f"--eviction_ratio={master.eviction.ratio!r}",
        f"--default_kv_lease_ttl={master.lease_ttl_milliseconds}",
        f"--default_kv_soft_pin_ttl={pin.default_ttl_seconds * 1000}",
        f"--max_kv_soft_pin_ttl={pin.max_ttl_seconds * 1000}",
        f"--allow_evict_soft_pinned_objects={_bool(pin.allow_eviction)}",
    ]


def build_mooncake_client_config(
    spec: KvRetentionDeploymentSpec, *, master_host: str
) -> dict[str, Any]:
    """SGLang's Mooncake client config; ``master_host`` is the managed master's address.

    In external mode ``master_host`` is ignored: the addresses come from ``external``.
    """
    mooncake = spec.kv_store.mooncake
    if mooncake.external is not None:
        master_address = mooncake.external.master_address
        metadata_server = mooncake.external.metadata_server
    else:
        master = mooncake.master
        master_address = f"{master_host}:{master.rpc_port}"
        metadata_server = f"http://{master_host}:{master.metadata_port}/metadata"
    config: dict[str, Any] = {
        "master_server_address": master_address,
        "metadata_server": metadata_server,
        "protocol": mooncake.transfer.protocol,
        "device_name": mooncake.transfer.device,
        "global_segment_size": mooncake.transfer.global_segment_size,
    }
    if mooncake.external is None:
        config["master_metrics_port"] = mooncake.master.metrics_port
    else:
        if mooncake.external.metrics_port is not None:
            config["master_metrics_port"] = mooncake.external.metrics_port
        if mooncake.external.tenant is not None:
            config["tenant_id"] = mooncake.external.tenant
    pin = mooncake.master.soft_pin
    auth = spec.frontend.auth
    config[L3_SETTINGS_KEY] = L3Settings(
        budget_ratio=pin.budget_ratio,
        max_pin_ttl_ms=pin.max_ttl_seconds * 1000,
        tenant_share=None if auth is None else auth.pin_share,
    ).to_config()
    return config


def uses_mooncake(spec: KvRetentionDeploymentSpec) -> bool:
    """Whether workers use the Mooncake L3 tier at all."""
    hicache = spec.workers.hicache
    return hicache.enabled and hicache.storage_backend == "mooncake"


def _config(cr: KvRetentionDeployment) -> dict[str, Any]:
    return build_mooncake_client_config(cr.spec, master_host=service_host(cr, MASTER_SUFFIX))


def config_data(cr: KvRetentionDeployment) -> dict[str, str]:
    """The ConfigMap ``data`` the workers mount."""
    return {CONFIG_KEY: json.dumps(_config(cr), indent=2, sort_keys=True) + "\n"}


def config_hash(cr: KvRetentionDeployment) -> str:
    """The hash that rolls the workers: SGLang reads its part of the file once, at start. The
    plugin's ``kvretention`` section is left out: the plugin re-reads it from the mounted
    ConfigMap (updated in place by the kubelet), so a new pin budget needs no restart."""
    config = {k: v for k, v in _config(cr).items() if k != L3_SETTINGS_KEY}
    return content_hash({CONFIG_KEY: json.dumps(config, indent=2, sort_keys=True) + "\n"})


def build_mooncake_configmap(cr: KvRetentionDeployment) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(
            cr, name=child_name(cr, CONFIG_SUFFIX), component=COMPONENT_MOONCAKE
        ),
        "data": config_data(cr),
    }


def build_mooncake_master(cr: KvRetentionDeployment) -> list[Manifest]:
    """Service + Deployment of the managed master; nothing in external mode."""
    mooncake: MooncakeSpec = cr.spec.kv_store.mooncake
    if mooncake.mode != "managed":
        return []
    master = mooncake.master
    name = child_name(cr, MASTER_SUFFIX)
    container: dict[str, Any] = {
        "name": "mooncake-master",
        "image": master.image,
        "command": build_mooncake_master_args(cr.spec),
        "ports": [
            {"name": "rpc", "containerPort": master.rpc_port, "protocol": "TCP"},
            {"name": "metadata", "containerPort": master.metadata_port, "protocol": "TCP"},
            {"name": "metrics", "containerPort": master.metrics_port, "protocol": "TCP"},
        ],
        "readinessProbe": {
            "httpGet": {"path": "/metrics", "port": master.metrics_port},
            "periodSeconds": 5,
            "timeoutSeconds": 3,
        },
        "livenessProbe": {
            "tcpSocket": {"port": master.rpc_port},
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "securityContext": container_security(),
    }
    container["resources"] = service_resources(master.resources)
    service = build_service(
        cr,
        name=name,
        component=COMPONENT_MOONCAKE,
        ports=[
            ("rpc", master.rpc_port, master.rpc_port),
            ("metadata", master.metadata_port, master.metadata_port),
            ("metrics", master.metrics_port, master.metrics_port),
        ],
    )
    # One master holds the object index in memory: never run two side by side.
    deployment = build_deployment(
        cr,
        name=name,
        component=COMPONENT_MOONCAKE,
        replicas=1,
        pod_spec={"containers": [container]},
        strategy={"type": "Recreate"},
    )
    return [service, deployment]
