"""L3: the real ``mooncake_master`` from PyPI, started with exactly the argv the builders render.

Only the ports differ from a rendered manifest (free loopback ports, set through the spec's own
``rpcPort``/``metricsPort``/``metadataPort`` fields). The store client is Mooncake's real
``MooncakeDistributedStore``; on a CPU host it loads over the test-only libcuda stand-in that
``scripts/build-cuda-standin.sh`` builds (see docs/kv-store.md).
"""

from __future__ import annotations

import re
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from types import ModuleType

import pytest
from mooncake_harness import INVALID_PARAMS, OK, Master, Store, fleet_cr, running_master, value_for

from kvretention.controller.kvstore_metrics import parse_usage

pytestmark = pytest.mark.l3


def http(method: str, url: str, data: bytes | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=3) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


MASTER_SPEC = {
    "leaseTtlMilliseconds": 5000,
    "eviction": {"highWatermarkRatio": 0.8, "ratio": 0.1},
    "softPin": {
        "defaultTtlSeconds": 600,
        "maxTtlSeconds": 43200,
        "allowEviction": False,
        "budgetRatio": 0.5,
    },
}


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Master]:
    cr = fleet_cr(master=MASTER_SPEC, segment_bytes=64 * 1024 * 1024)
    with running_master(cr, tmp_path_factory.mktemp("mooncake")) as running:
        yield running


@pytest.fixture(scope="module")
def store(master: Master, store_module: ModuleType) -> Store:
    """One real store client for the module's master (it mounts the rendered segment)."""
    return Store(store_module, master)


def test_master_runs_with_the_rendered_args(master: Master) -> None:
    status, body = http("GET", master.metrics_url)
    assert status == 200
    assert b"master_allocated_bytes" in body
    assert master.process.poll() is None


@pytest.mark.parametrize(
    "echo",
    [
        "default_kv_lease_ttl=5000",
        "default_kv_soft_pin_ttl=600000",
        "max_kv_soft_pin_ttl=43200000",
        "allow_evict_soft_pinned_objects=0",
        "eviction_ratio=0.1",
        "eviction_high_watermark_ratio=0.8",
        "enable_http_metadata_server=1",
    ],
)
def test_master_applied_each_rendered_setting(master: Master, echo: str) -> None:
    """The master logs its effective settings at startup: each rendered value took effect."""
    assert re.search(rf"\b{re.escape(echo)}\b", master.log.read_text())


def test_rpc_port_accepts_connections(master: Master) -> None:
    rpc = master.cr.spec.kv_store.mooncake.master.rpc_port
    with socket.create_connection(("127.0.0.1", rpc), timeout=3):
        pass


def test_rendered_metadata_server_url_serves_metadata(master: Master) -> None:
    url = master.config()["metadata_server"]
    assert url.endswith("/metadata")
    assert http("PUT", f"{url}?key=kvr-l3", b'{"segment":"x"}')[0] == 200
    assert http("GET", f"{url}?key=kvr-l3") == (200, b'{"segment":"x"}')
    assert http("GET", f"{url}?key=absent")[0] == 404


@pytest.mark.parametrize(
    ("pin_ttl_ms", "expected_rc"),
    [
        pytest.param(None, OK, id="master-default-ttl"),
        pytest.param(3_600_000, OK, id="anthropic-1h"),
        pytest.param(43_200_000, OK, id="exactly-the-rendered-max"),
        pytest.param(43_200_001, INVALID_PARAMS, id="one-ms-above-the-rendered-max"),
        pytest.param(86_400_000, INVALID_PARAMS, id="mooncake-default-max-but-not-ours"),
    ],
)
def test_store_client_from_rendered_config_puts_and_gets_with_soft_pin(
    store: Store, pin_ttl_ms: int | None, expected_rc: int
) -> None:
    """The real store client, set up from the worker's rendered config, round-trips a pinned
    value; a pin longer than the rendered ``--max_kv_soft_pin_ttl`` is refused and not stored."""
    key = f"kvr-l3-pin-{pin_ttl_ms}"
    value = value_for(key, 1024 * 1024)
    assert store.put(key, value, pin=True, pin_ttl_ms=pin_ttl_ms) == expected_rc
    if expected_rc == OK:
        assert store.get(key) == value
    else:
        assert not store.exists(key)


def test_store_client_counts_pins_in_the_masters_metrics(master: Master, store: Store) -> None:
    """What the operator reads from /metrics moves with real writes."""
    before = parse_usage(master.metrics_text())
    assert store.put("kvr-l3-count-pinned", b"p" * 65536, pin=True) == OK
    assert store.put("kvr-l3-count-plain", b"u" * 65536) == OK
    after = parse_usage(master.metrics_text())
    assert after.capacity_bytes == int(master.config()["global_segment_size"])
    assert after.keys == before.keys + 2
    assert after.pinned_keys == before.pinned_keys + 1
    assert after.used_bytes >= before.used_bytes + 2 * 65536
    for key in ("kvr-l3-count-pinned", "kvr-l3-count-plain"):
        assert store.remove(key) == OK
