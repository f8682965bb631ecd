"""The core each tree runs, as the worker's ``/metrics`` says it: SGLang's own trees built with the
plugin's hook, recorded where the worker reads them, and the rule the probe reports with
(``plan_tree_core`` on SGLang's default) agreeing with what SGLang built."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest

from kvretention.dataplane.worker.app import WorkerMetrics
from kvretention.retention import EVICTION_POLICY
from kvretention.retention.failures import STATS_DIR_ENV
from kvretention.retention.tree_core import plan_tree_core, sglang_default_core
from support.sglang_radix import RadixTree, TreeSpec

pytestmark = pytest.mark.retention


def test_each_tree_reports_the_core_sglang_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(STATS_DIR_ENV, str(tmp_path))
    monkeypatch.setattr("kvretention.retention.tree_core._RECORDED", {})
    default = sglang_default_core()
    assert default == "rust"  # SGLang 0.5.23's own setting, unset here
    for policy in (EVICTION_POLICY, "lru"):
        tree = RadixTree(TreeSpec(kind="unified", policy=policy, page_size=4))
        assert tree.cache._tree_core_backend == plan_tree_core(policy, default=default)
    ranked = RadixTree(TreeSpec(kind="unified", page_size=4, tree_core="python"))
    assert ranked.cache._tree_core_backend == "python"
    text = generate_latest(WorkerMetrics(retention_stats_dir=str(tmp_path)).registry).decode()
    samples = sorted(line for line in text.splitlines() if line.startswith("kvretention_worker_"))
    cores = [s for s in samples if s.startswith("kvretention_worker_radix_core_info")]
    assert cores == [
        'kvretention_worker_radix_core_info{core="python",policy="kvretain"} 1.0',
        'kvretention_worker_radix_core_info{core="rust",policy="kvretain"} 1.0',
        'kvretention_worker_radix_core_info{core="rust",policy="lru"} 1.0',
    ]
