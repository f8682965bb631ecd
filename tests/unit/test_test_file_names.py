"""Test modules are imported by basename (the tiers have no ``__init__.py``), so two test files with
the same name in different folders stop the whole run at collection: keep every name unique."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_name_is_unique() -> None:
    seen: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        if "fixtures" not in path.relative_to(TESTS).parts:
            seen[path.name].append(str(path.relative_to(TESTS)))
    assert len(seen) > 100  # the walk found the tiers
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
