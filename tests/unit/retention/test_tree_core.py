"""Which radix-tree core a worker runs: the policy rule, the plugin's hook that records it in
SGLang's scheduler process, and the worker's ``kvretention_worker_radix_core_info``."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kvretention.retention.failures import STATS_DIR_ENV
from kvretention.retention.plugin import _tree_core_backend
from kvretention.retention.tree_core import (
    PINNED,
    SUBDIR,
    core_label,
    plan_tree_core,
    read_tree_cores,
)
from support.metric_registries import worker_samples


@pytest.mark.parametrize(
    ("policy", "default", "backend", "label"),
    [
        ("kvretain", "rust", PINNED, "rust"),
        ("KVRETAIN", "rust", PINNED, "rust"),  # SGLang compares policies case-blind
        ("lru", "rust", "rust", "rust"),
        ("priority", "rust", "rust", "rust"),
        (None, "rust", "rust", "rust"),
        ("kvretain", "python", "python", "python"),  # SGLang's fallback: holds rank nodes there
        ("lru", "python", "python", "python"),
        ("kvretain", "custom", "custom", "custom"),  # a backend someone registered: left as asked
    ],
)
def test_only_kvretain_on_the_rust_core_gets_the_pinned_backend(
    policy: str | None, default: str, backend: str, label: str
) -> None:
    assert plan_tree_core(policy, default=default) == backend
    assert core_label(backend) == label


def scrape(directory: Path) -> dict[str, float]:
    return worker_samples(directory, "kvretention_worker_radix_core_info")


def write(directory: Path, name: str, text: str) -> None:
    (directory / SUBDIR).mkdir(exist_ok=True)
    (directory / SUBDIR / name).write_text(text, encoding="utf-8")


def test_the_collector_serves_each_core_and_policy_once(tmp_path: Path) -> None:
    assert scrape(tmp_path) == {}  # before the engine builds its tree: no sample
    for pid in (11, 12):  # two ranks, same tree
        tree = {"core": "python", "policy": "kvretain"}
        write(tmp_path, f"{pid}.json", json.dumps({"trees": [tree]}))
    draft = {"core": "rust", "policy": "lru"}  # a second tree in one process
    write(tmp_path, "13.json", json.dumps({"trees": [draft, {"core": 1, "policy": "lru"}, 2]}))
    write(tmp_path, "14.json", "{not json")
    write(tmp_path, "15.json", '["python", "kvretain"]')
    write(tmp_path, "16.json", '{"trees": {"core": "python", "policy": "fifo"}}')
    assert scrape(tmp_path) == {
        'kvretention_worker_radix_core_info{core="python",policy="kvretain"}': 1.0,
        'kvretention_worker_radix_core_info{core="rust",policy="lru"}': 1.0,
    }


@pytest.fixture
def no_registry(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The pinned backend's registration with SGLang's registry, counted instead of done."""
    calls: list[int] = []
    monkeypatch.setattr(
        "kvretention.retention.plugin._register_pinned_backend", lambda: calls.append(1)
    )
    return calls


@pytest.mark.parametrize(
    ("name", "policy", "backend", "core"),
    [
        ("rust", "kvretain", PINNED, "rust"),
        ("rust", "lru", "rust", "rust"),
        ("rust", "LRU", "python", "python"),  # SGLang's own fallback (here: the fake's) is kept
        ("python", "kvretain", "python", "python"),
    ],
)
def test_the_hook_records_the_core_the_tree_resolves_to(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    no_registry: list[int],
    name: str,
    policy: str,
    backend: str,
    core: str,
) -> None:
    monkeypatch.setenv(STATS_DIR_ENV, str(tmp_path))
    monkeypatch.setattr("kvretention.retention.tree_core._RECORDED", {})  # a fresh process
    asked: list[str] = []

    def original(name: str, params: Any) -> str:
        asked.append(name)
        return "python" if params.eviction_policy == "LRU" else name

    params = SimpleNamespace(eviction_policy=policy)
    assert _tree_core_backend(original, name, params) == backend
    assert asked == [name]  # SGLang's own fallbacks come first
    assert no_registry == ([1] if backend == PINNED else [])
    assert read_tree_cores(tmp_path) == {(core, policy.lower())}


def test_eagle_keeps_kvretain_on_the_python_core(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_registry: list[int]
) -> None:
    monkeypatch.setenv(STATS_DIR_ENV, str(tmp_path))
    params = SimpleNamespace(eviction_policy="kvretain", is_eagle=True)
    assert _tree_core_backend(lambda name, _: name, "rust", params) == "python"


def test_a_process_lists_every_tree_it_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_registry: list[int]
) -> None:
    monkeypatch.setenv(STATS_DIR_ENV, str(tmp_path))
    monkeypatch.setattr("kvretention.retention.tree_core._RECORDED", {})
    for policy in ("kvretain", "kvretain", "lru"):  # SGLang resolves each tree twice
        _tree_core_backend(lambda name, _: name, "rust", SimpleNamespace(eviction_policy=policy))
    assert read_tree_cores(tmp_path) == {("rust", "kvretain"), ("rust", "lru")}
    assert len(list((tmp_path / SUBDIR).glob("*.json"))) == 1


def test_without_a_worker_the_hook_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_registry: list[int]
) -> None:
    monkeypatch.delenv(STATS_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    params = SimpleNamespace(eviction_policy="kvretain")
    assert _tree_core_backend(lambda *_: "rust", "rust", params) == PINNED
    assert list(tmp_path.iterdir()) == []
