"""Run SGLang's own ``MooncakeStore`` with (or without) the retention plugin, on CPU.

Run as a subprocess by ``test_l3_retention.py`` and ``benchmarks/retention_l3_bench.py``: it sets
SGLang's ``MooncakeStore`` up from the rendered config file (``SGLANG_HICACHE_MOONCAKE_CONFIG_PATH``,
with the plugin's ``kvretention`` section), loads the retention plugin through SGLang's own plugin
loader (its ``sglang.srt.plugins`` entry point, as ``sglang serve`` does) when asked, and writes
each request's pages the way HiCache backs a node up: ``batch_set_v1`` with the page keys HiCache
computes (``get_storage_hash_str`` over a ``RadixKey``, the chain its tree nodes carry). The
request's ``kv.retain`` envelope goes through SGLang's own decoder first, as ``Req.kv_hints`` holds
it. Then pressure: unhinted pages, several pools' worth. Every call the store client makes to
Mooncake's ``batch_put_from`` is recorded (keys and the soft pin of its ``ReplicateConfig``).
Prints one JSON report line.

Usage: python sglang_retention_check.py SCENARIO_JSON
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from hicache_store import load_cuda_standin, storage_config

OK = 0


class RecordingClient:
    """The real ``MooncakeDistributedStore``, recording what each ``batch_put_from`` asked for."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.puts: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def batch_put_from(
        self, keys: list[str], ptrs: list[int], sizes: list[int], *config: Any
    ) -> Any:
        pin, groups = None, None
        if config:
            action = str(config[0].soft_pin_action)
            if action.endswith("ENABLE"):
                pin = int(config[0].soft_pin_ttl_ms)
            groups = list(config[0].group_ids or []) or None
        results = self._client.batch_put_from(keys, ptrs, sizes, *config)
        self.puts.append(
            {"keys": list(keys), "pin_ttl_ms": pin, "group_ids": groups, "results": list(results)}
        )
        return results


class HostPool:
    """A page-first host KV pool as MooncakeStore reads it: each page one K and one V buffer."""

    def __init__(self, torch: Any, *, slots: int, page_size: int, object_bytes: int) -> None:
        self.page_size = page_size
        self.object_bytes = object_bytes
        self.torch = torch
        self.kv_buffer = torch.zeros(slots * 2 * object_bytes, dtype=torch.uint8)
        self.base = self.kv_buffer.data_ptr()

    def get_ksize_per_token(self) -> int:
        return self.object_bytes // self.page_size

    def get_page_buffer_meta(self, indices: Any) -> tuple[list[int], list[int]]:
        ptrs, sizes = [], []
        for token in indices.tolist()[:: self.page_size]:
            base = self.base + token // self.page_size * 2 * self.object_bytes
            ptrs += [base, base + self.object_bytes]
            sizes += [self.object_bytes, self.object_bytes]
        return ptrs, sizes

    def fill(self, slot: int, tag: int) -> bytes:
        """Write a recognisable page into ``slot``; its K+V bytes."""
        size = 2 * self.object_bytes
        view = self.kv_buffer[slot * size : (slot + 1) * size]
        pattern = (self.torch.arange(size, dtype=self.torch.int64) * 31 + tag * 7) % 251
        view.copy_(pattern.to(self.torch.uint8))
        return bytes(view.numpy().tobytes())


def main() -> None:
    scenario = json.loads(Path(sys.argv[1]).read_text())
    standin = Path(scenario["standin"])
    load_cuda_standin(standin)
    import torch
    from sglang.srt.managers.kv_hints import decode_kv_hints_envelope
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.utils import get_storage_hash_str

    from kvretention.retention import l3

    if scenario["plugin"]:
        # As `sglang serve` does: SGLang's own loader finds the plugin's entry point, runs its
        # register() (which registers the L3 hooks) and applies every registered hook.
        import os

        from sglang.srt.plugins import load_plugins

        os.environ["SGLANG_PLUGINS"] = "kvretention"
        load_plugins()
    from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore

    page_size, object_bytes = scenario["page_size"], scenario["object_bytes"]
    config = storage_config(
        # HiCache's Mooncake group semantics (objects tagged with their page's group id).
        extra_config={"enable_group_semantics": True} if scenario.get("groups") else None,
    )
    store = MooncakeStore(config, None)
    recorder = RecordingClient(store.store)
    store.store = recorder
    pool = HostPool(torch, slots=scenario["slots"], page_size=page_size, object_bytes=object_bytes)
    store.register_mem_pool_host(pool)
    l3.POOL_READ_S = scenario.get("pool_read_s", l3.POOL_READ_S)  # type: ignore[misc]
    l3.MASTER_READ_S = scenario.get("master_read_s", l3.MASTER_READ_S)  # type: ignore[misc]

    def start_ledger() -> None:
        """A new ledger, as a worker process starts with: wait until it has read the pool
        (production does not wait; its first pins wait for the reading instead)."""
        state = l3.client_state(store)
        if state.settings.metrics_url is not None:
            assert state.pool_read.wait(30), "the plugin never read the master's metrics"
        report.setdefault("ledgers", []).append(
            {
                "metrics_url": state.settings.metrics_url,
                "reserved_keys_at_start": state.ledger.reserved_keys,
            }
        )

    def object_keys(page_key: str) -> list[str]:
        tagged = store._tag_keys([page_key])[0]
        return [f"{tagged}_{store.mha_suffix}_k", f"{tagged}_{store.mha_suffix}_v"]

    def write(keys: list[str], slots: list[int], *, retry_s: float = 0.0) -> list[bool]:
        indices = torch.tensor(
            [s * page_size + t for s in slots for t in range(page_size)], dtype=torch.int64
        )
        deadline = time.monotonic() + retry_s
        while True:
            done = store.batch_set_v1(keys, indices)
            if all(done) or time.monotonic() >= deadline:
                return [bool(d) for d in done]
            time.sleep(0.02)

    report: dict[str, Any] = {"requests": {}}
    if scenario["plugin"]:
        start_ledger()
    expected: dict[str, bytes] = {}
    slot = 0
    for request in scenario["requests"]:
        if request["rid"] in scenario.get("restart_master_before", ()):
            report.setdefault("master_restarts", []).append(
                _restart_master(scenario, l3.client_state(store), l3.STATS)
            )
        if request["rid"] in scenario.get("restart_before", ()):
            # A worker restart, as the plugin sees it: a new process has a new ledger while the
            # pins the earlier one wrote stay in the pool (here: on the same segment).
            time.sleep(scenario.get("restart_after_s", 0.0))
            report.setdefault("pinned_keys_at_restart", []).append(
                _pinned_keys(scenario["metrics_url"])
            )
            l3._CLIENTS.clear()
            start_ledger()
        pages = request["pages"]
        tokens = [request["token_base"] + t for t in range(pages * page_size)]
        key = RadixKey(tokens, request.get("extra_key"), cache_salt=request.get("cache_salt"))
        keys = list(get_storage_hash_str(key, None, page_size))
        hints = request.get("kv_hints")
        req = SimpleNamespace(
            rid=request["rid"],
            kv_hints=None if hints is None else decode_kv_hints_envelope(hints),
            full_untruncated_fill_ids=tokens,
            origin_input_ids=tokens,
            extra_key=request.get("extra_key"),
            cache_salt=request.get("cache_salt"),
        )
        if scenario["plugin"]:
            # What the BEFORE hook on UnifiedRadixCache.checkpoint_into_tree does for this req.
            cache = SimpleNamespace(
                enable_storage=True, page_size=page_size, tree_core=SimpleNamespace(is_eagle=False)
            )
            l3._before_unified_checkpoint(cache, req, up_to=len(tokens))
        slots = list(range(slot, slot + pages))
        slot += pages
        for i, s in enumerate(slots):
            data = pool.fill(s, tag=s + 2)
            k, v = object_keys(keys[i])
            expected[k], expected[v] = data[:object_bytes], data[object_bytes:]
        report["requests"][request["rid"]] = {
            "keys": keys,
            "objects": [object_keys(k) for k in keys],
            "written": write(keys, slots),
        }
    report["metrics_after_writes"] = _metrics(scenario["metrics_url"])
    report["stats"] = dict(l3.STATS.pages)  # the requests' pages only, before the pressure
    report["wait_s"] = scenario.get("wait_s", 0.0)
    time.sleep(report["wait_s"])

    pressure_pages = scenario["pressure_pages"]
    pressure_slot = slot
    pressure_ok = 0
    for start in range(0, pressure_pages, 8):
        keys = [f"{start + i:064x}" for i in range(min(8, pressure_pages - start))]
        pool.fill(pressure_slot, tag=1)
        done = write(keys, [pressure_slot] * len(keys), retry_s=2.0)
        pressure_ok += sum(done)
    time.sleep(scenario.get("settle_s", 1.0))
    report["pressure_written"] = pressure_ok
    for info in report["requests"].values():
        exists = [all(recorder.is_exist(o) == 1 for o in pair) for pair in info["objects"]]
        info["exists"] = exists
        info["survived"] = [
            e and all(bytes(recorder.get(o)) == expected[o] for o in pair)
            for e, pair in zip(exists, info["objects"], strict=True)
        ]
    report["metrics_after_pressure"] = _metrics(scenario["metrics_url"])
    ours = {o for info in report["requests"].values() for pair in info["objects"] for o in pair}
    report["puts"] = [p for p in recorder.puts if set(p["keys"]) & ours]
    report["pressure_pins"] = sum(
        len(p["keys"])
        for p in recorder.puts
        if p["pin_ttl_ms"] is not None and not set(p["keys"]) & ours
    )
    report["pinned_bytes"] = {
        str(i): s.ledger.pinned_bytes for i, s in enumerate(l3._CLIENTS.values())
    }
    report["budget_bytes"] = [s.ledger.capacity_bytes for s in l3._CLIENTS.values()]
    report["hooked"] = hasattr(MooncakeStore._put_batch_zero_copy_impl, "__wrapped__")
    report["group_semantics"] = bool(store._can_use_group_semantics())
    from kvretention.retention.contract import check_target

    report["contract"] = [p for t in l3.L3_HOOK_TARGETS if (p := check_target(t)) is not None]
    recorder._client.close()
    print(json.dumps(report))


def _until(done: Callable[[], bool], timeout_s: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or done}")
        time.sleep(0.02)


def _sample(url: str, name: str) -> float | None:
    """One unlabelled sample of the master's /metrics; None while it cannot be read."""
    try:
        text = _metrics(url)
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def _restart_master(scenario: dict[str, Any], state: Any, stats: Any) -> dict[str, Any]:
    """Have the test restart the master while this worker process stays up; wait until the
    plugin's watch has seen the restart and the store client has mounted its segment again."""
    url, signal = scenario["metrics_url"], Path(scenario["signal_dir"])
    reads = state.master_reads
    # A reading of the old master after the writes: the counters the new one starts below.
    _until(lambda: state.master_reads >= reads + 2, what="two readings of the old master")
    before = {
        "ledger_pinned_bytes": state.ledger.pinned_bytes,
        "pool_pinned_keys": _pinned_keys(url),
        "restarts_seen": stats.master_restarts,
    }
    (signal / "restart-master").touch()
    _until(lambda: (signal / "master-restarted").exists(), 120, "the test's master restart")
    (signal / "master-restarted").unlink()
    _until(lambda: stats.master_restarts > before["restarts_seen"], what="the watch")
    _until(lambda: (_sample(url, "master_total_capacity_bytes") or 0) > 0, what="the remount")
    return {
        "before": before,
        "ledger_pinned_bytes": state.ledger.pinned_bytes,
        "pool_pinned_keys": _pinned_keys(url),
        "restarts_seen": stats.master_restarts,
        "pins_lost": stats.pins_lost,
    }


def _pinned_keys(url: str) -> int:
    for line in _metrics(url).splitlines():
        if line.startswith("master_soft_pin_key_count "):
            return int(float(line.split()[1]))
    raise AssertionError("the master reports no master_soft_pin_key_count")


def _metrics(url: str) -> str:
    return str(urllib.request.urlopen(url, timeout=5).read().decode())


if __name__ == "__main__":
    main()
