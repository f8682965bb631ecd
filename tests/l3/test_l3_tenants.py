"""L3: fleets sharing one Mooncake master as tenants (``kvStore.mooncake.external.tenant``).

A master started as a store admin would run a shared one: the operator's argv plus
``--enable_multi_tenants`` and a file quota policy naming each fleet's tenant. Each fleet's store
client is set up from the worker config the operator renders for an external-mode fleet with that
tenant. Pressure from one fleet evicts only its own unpinned objects; the other fleet's pages stay.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from mooncake_harness import (
    MIB,
    NO_AVAILABLE_HANDLE,
    OK,
    Master,
    Store,
    fleet_cr,
    running_master,
    value_for,
)

from kvretention.api.models import KvRetentionDeployment
from kvretention.controller.resources import build_mooncake_client_config

pytestmark = pytest.mark.l3

OBJECT = 256 * 1024
QUOTA = 6 * MIB
TENANT_QUOTA_EXCEEDED = -1700
TENANT_NOT_REGISTERED = -1701


def external_fleet(name: str, master: Master, tenant: str | None) -> KvRetentionDeployment:
    """An external-mode fleet pointed at the running master, writing as ``tenant``."""
    ports = master.cr.spec.kv_store.mooncake.master
    external: dict[str, Any] = {
        "masterAddress": f"127.0.0.1:{ports.rpc_port}",
        "metadataServer": f"http://127.0.0.1:{ports.metadata_port}/metadata",
    }
    if tenant is not None:
        external["tenant"] = tenant
    return KvRetentionDeployment.from_k8s(
        {
            "apiVersion": "kvretention.io/v1alpha1",
            "kind": "KvRetentionDeployment",
            "metadata": {"name": name, "namespace": "team"},
            "spec": {
                "model": {"name": "m", "path": "p"},
                "kvStore": {
                    "mooncake": {
                        "mode": "external",
                        "external": external,
                        "transfer": {"protocol": "tcp", "globalSegmentSize": str(16 * MIB)},
                    }
                },
            },
        }
    )


@pytest.fixture
def shared_master(tmp_path: Path) -> Any:
    policy = tmp_path / "quota.yaml"
    policy.write_text(
        "version: 1\n\ntenants:\n"
        f'  - name: "team.fleet-a"\n    quota: {QUOTA}\n'
        f'  - name: "team.fleet-b"\n    quota: {QUOTA}\n'
    )
    spec = {"leaseTtlMilliseconds": 50, "softPin": {"allowEviction": False, "budgetRatio": 0.5}}
    flags = (
        "--enable_multi_tenants=true",
        "--tenant_quota_connector_type=file",
        f"--tenant_quota_connector_uri={policy}",
    )
    with running_master(fleet_cr(master=spec), tmp_path / "master", extra_args=flags) as master:
        yield master


def put_retrying(store: Store, key: str, *, pin: bool = False) -> int:
    """A write retried while the pool or the tenant is full, as HiCache writes again."""
    for _ in range(100):
        rc = store.put(key, value_for(key, OBJECT), pin=pin)
        if rc not in (NO_AVAILABLE_HANDLE, TENANT_QUOTA_EXCEEDED):
            return rc
    return rc


def kept(store: Store, keys: list[str]) -> list[str]:
    return [k for k in keys if store.exists(k) and store.get(k) == value_for(k, OBJECT)]


def test_fleets_sharing_a_master_cannot_evict_each_other(
    shared_master: Master, store_module: ModuleType
) -> None:
    connect: Callable[[KvRetentionDeployment], Store] = lambda cr: Store(  # noqa: E731
        store_module, shared_master, build_mooncake_client_config(cr.spec, master_host="unused")
    )
    config_a = build_mooncake_client_config(
        external_fleet("fleet-a", shared_master, "team.fleet-a").spec, master_host="unused"
    )
    assert config_a["tenant_id"] == "team.fleet-a"
    a = connect(external_fleet("fleet-a", shared_master, "team.fleet-a"))
    b = connect(external_fleet("fleet-b", shared_master, "team.fleet-b"))
    mine = [f"b-{i}" for i in range(8)]
    for key in mine:
        assert b.put(key, value_for(key, OBJECT)) == OK
    pins = [f"a-pin-{i}" for i in range(4)]
    for key in pins:
        assert a.put(key, value_for(key, OBJECT), pin=True) == OK
    # Fleet A writes four times its quota: past it, its own unpinned objects are evicted.
    pressure = [f"a-{i}" for i in range(4 * QUOTA // OBJECT)]
    results = [put_retrying(a, key) for key in pressure]
    assert results == [OK] * len(pressure)
    assert kept(b, mine) == mine, "fleet A's pressure evicted fleet B's pages"
    assert kept(a, pins) == pins
    # A's own unpinned pages made room: what it still holds fits its quota (which pins count
    # against). Which pages went is the master's eviction order, not asserted.
    survivors = kept(a, pressure)
    assert len(survivors) < len(pressure)
    assert (len(survivors) + len(pins)) * OBJECT <= QUOTA
    # One namespace per tenant: the same key is two objects, and B cannot read A's.
    assert not b.exists("a-pin-0")
    samples = shared_master.metrics_text()
    assert 'mooncake_tenant_evict_bytes_total{tenant_id="team.fleet-a"}' in samples
    assert 'mooncake_tenant_evict_bytes_total{tenant_id="team.fleet-b"}' not in samples


def test_a_tenant_the_policy_does_not_name_cannot_write(
    shared_master: Master, store_module: ModuleType
) -> None:
    for tenant in ("team.fleet-c", None):  # None: the default tenant
        cr = external_fleet("fleet-c", shared_master, tenant)
        config = build_mooncake_client_config(cr.spec, master_host="unused")
        assert ("tenant_id" in config) is (tenant is not None)
        store = Store(store_module, shared_master, config)
        assert store.put("k", value_for("k", OBJECT)) == TENANT_NOT_REGISTERED
        store.close()
