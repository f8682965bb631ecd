"""Which of SGLang's radix-tree cores a worker runs: the rule, and its report on ``/metrics``.

SGLang 0.5.23's unified radix cache picks its ``TreeCore`` by name, default
``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND`` (``rust``). The retention plugin's ``kvretain`` policy
keeps the Rust core and carries its holds as pins (:data:`PINNED`, a backend the plugin registers:
SGLang's Rust core with LRU order plus :mod:`kvretention.retention.pins`); where SGLang resolves to
its Python core (its own fallbacks, or ``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python``),
``kvretain`` ranks nodes there with its eviction strategy (docs/retention.md, "Which tree core").
:func:`plan_tree_core` is that rule, used by the plugin's hook and by the probe.
The hook runs in SGLang's scheduler (one process per rank), so it writes the core it resolved into
the worker's stats directory (``<STATS_DIR>/tree_core/<pid>.json``, as the L3 numbers travel:
:mod:`kvretention.retention.l3_export`), and the worker's :class:`TreeCoreCollector` exports it as
``kvretention_worker_radix_core_info{core, policy} 1``. Import-light: no SGLang at import.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from kvretention.retention import EVICTION_POLICY
from kvretention.retention.failures import StatsDirCollector
from kvretention.retention.l3_export import read_process_files, write_process_file

RUST: Final = "rust"
PYTHON: Final = "python"
SUBDIR: Final = "tree_core"
METRIC: Final = "kvretention_worker_radix_core_info"
SGLANG_ENV_DEFAULT: Final = "sglang.srt.environ.envs.SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"
"""Where SGLang keeps its default core's name (an ``EnvStr``: the environment, else ``rust``)."""


PINNED: Final = "kvretain-rust"
"""The backend ``kvretain`` asks for where SGLang would build its Rust core: that core with LRU
order, holds as pins (registered by the plugin; :func:`core_label` reports it as ``rust``)."""


def plan_tree_core(policy: str | None, *, default: str) -> str:
    """The backend a tree with ``--radix-eviction-policy policy`` is built on, ``default`` being
    the one SGLang resolved to (its env default or the cache's override, after its own
    fallbacks): ``kvretain`` turns ``rust`` into :data:`PINNED`; anything else is left as SGLang
    has it (``kvretain`` on ``python`` ranks nodes with the plugin's eviction strategy)."""
    if default == RUST and str(policy or "").lower() == EVICTION_POLICY:
        return PINNED
    return default


def core_label(backend: str) -> str:
    """The core a backend name runs, as the metric and the probe report say it."""
    return RUST if backend == PINNED else backend


def sglang_default_core() -> str | None:
    """SGLang's default core name in this environment (imports SGLang); None when it has none."""
    import pkgutil

    try:
        env = pkgutil.resolve_name(SGLANG_ENV_DEFAULT)
        name = env.get()
    except Exception:  # an SGLang without the unified tree's registry, or one that cannot import
        return None
    return str(name) if name else None


_RECORDED: Final[dict[int, set[tuple[str, str]]]] = {}
"""Per process (a forked child starts its own): every tree's ``(core, policy)`` so far."""


def record_tree_core(*, core: str, policy: str) -> None:
    """One more tree of this scheduler process, with its core and policy, where the worker's
    ``/metrics`` reads them (the process's file lists every tree it built: a draft model's
    included)."""
    trees = _RECORDED.setdefault(os.getpid(), set())
    trees.add((core, policy))
    wire = {"trees": [{"core": c, "policy": p} for c, p in sorted(trees)]}
    write_process_file(SUBDIR, wire, what="the radix tree core")


def read_tree_cores(directory: str | Path) -> set[tuple[str, str]]:
    """Every ``(core, policy)`` the engine's processes recorded (one per distinct pair)."""
    found = set()
    for data in read_process_files(directory, SUBDIR):
        trees = data.get("trees")
        for tree in trees if isinstance(trees, list) else []:
            if not isinstance(tree, dict):
                continue
            core, policy = tree.get("core"), tree.get("policy")
            if isinstance(core, str) and isinstance(policy, str):
                found.add((core, policy))
    return found


class TreeCoreCollector(StatsDirCollector):
    """A prometheus_client collector: one ``1`` sample per core and policy the engine's schedulers
    resolved (none before the engine builds its unified tree, or on a classic ``RadixCache``)."""

    kind = "gauge"
    metric = METRIC
    documentation = (
        "The radix-tree core SGLang's unified cache runs on in this worker (rust: SGLang's "
        "default, kvretain's holds as pins there; python: SGLang's own fallback, kvretain's "
        "holds as node ranks there), with its --radix-eviction-policy; always 1."
    )
    labels = ("core", "policy")

    def samples(self) -> Iterable[tuple[list[str], float]]:
        return [([core, policy], 1) for core, policy in sorted(read_tree_cores(self.directory))]


__all__ = [
    "METRIC",
    "PINNED",
    "PYTHON",
    "RUST",
    "TreeCoreCollector",
    "core_label",
    "plan_tree_core",
    "read_tree_cores",
    "record_tree_core",
    "sglang_default_core",
]
