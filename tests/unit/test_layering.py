"""The package's layers point down and its modules import no circle, read from the code's own imports.

Every ``import`` counts, also one inside a function or under ``TYPE_CHECKING``: a lazy import is still
an arrow a reader (and a refactor) has to follow. :data:`MAY_IMPORT` is the rule, one row per layer
(a top-level package or module of ``kvretention``); an arrow it does not list fails here, so a new
one is a decision written into this table, not an accident.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Final

import pytest

SOURCE_ROOT: Final = Path(__file__).parents[2] / "operator"
PACKAGE: Final = "kvretention"

_GROUND: Final = frozenset({"common", "ports"})
MAY_IMPORT: Final[Mapping[str, frozenset[str]]] = {
    # The ground floor: standard library and third-party code only.
    "common": frozenset(),
    "ports": frozenset(),
    # The KV-hint contract, and the retention plugin (it runs inside SGLang's scheduler, where the
    # operator and the data plane have no business).
    "hints": _GROUND,
    "retention": _GROUND,
    # The CRD's models: what a user declares, never how the data plane serves it.
    "api": _GROUND | {"hints"},
    "dataplane": _GROUND | {"hints", "api", "retention"},
    "controller": _GROUND | {"hints", "api", "retention", "dataplane"},
    "probe": _GROUND | {"hints", "api", "retention", "dataplane"},
    # A client of a fleet (``kvretention replay``): it speaks the providers' HTTP APIs only.
    "replay": _GROUND,
    # The command line loads every subcommand; nothing imports it but ``python -m``.
    "cli": _GROUND | {"hints", "api", "retention", "dataplane", "controller", "probe"},
    "__main__": frozenset({"cli"}),
}


def module_name(path: Path, root: Path = SOURCE_ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, *, module: str, is_package: bool = False) -> Iterator[str]:
    """The modules ``source`` imports anywhere in its body; ``from m import n`` names both ``m``
    and ``m.n`` (a caller keeps the one that is a module)."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names if alias.name != "*")


def read_graph(sources: Mapping[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """``{module: (source, is_package)}`` -> ``{module: the package's modules it imports}``."""
    graph: dict[str, set[str]] = {}
    for module, (source, is_package) in sources.items():
        targets = set(imported_modules(source, module=module, is_package=is_package))
        graph[module] = {t for t in targets if t in sources and t != module}
    return graph


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def upward_imports(graph: Mapping[str, set[str]]) -> list[str]:
    """Every import that :data:`MAY_IMPORT` does not allow, as ``a -> b``."""
    found = []
    for module, targets in sorted(graph.items()):
        if layer(module) == "":
            continue  # the package's own face (kvretention/__init__.py)
        allowed = MAY_IMPORT.get(layer(module))
        if allowed is None:
            found.append(f"{module}: layer {layer(module)!r} has no row in MAY_IMPORT")
            continue
        found += [
            f"{module} -> {target}"
            for target in sorted(targets)
            if layer(target) not in {layer(module), "", *allowed}
        ]
    return found


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of two or more modules (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def package_graph() -> dict[str, set[str]]:
    files = sorted((SOURCE_ROOT / PACKAGE).rglob("*.py"))
    return read_graph({module_name(f): (f.read_text(), f.name == "__init__.py") for f in files})


def test_every_layer_imports_only_the_layers_below_it() -> None:
    graph = package_graph()
    assert len(graph) > 100  # the package was read, not an empty folder
    assert upward_imports(graph) == []


def test_no_modules_import_each_other_in_a_circle() -> None:
    assert circles(package_graph()) == []


def test_every_layer_of_the_table_exists() -> None:
    assert set(MAY_IMPORT) - {layer(m) for m in package_graph()} == set()


@pytest.mark.parametrize(
    ("module", "source", "says"),
    [
        (
            "kvretention.api.fake",
            "from kvretention.dataplane.protocol import DEFAULT_SESSION_KEYS\n",
            "kvretention.api.fake -> kvretention.dataplane.protocol",
        ),
        (
            "kvretention.retention.fake",
            "def read():\n    from kvretention.controller import kvstore_metrics\n",
            "kvretention.retention.fake -> kvretention.controller.kvstore_metrics",
        ),
        (
            "kvretention.common.fake",
            "import kvretention.hints\n",
            "kvretention.common.fake -> kvretention.hints",
        ),
        (
            "kvretention.newlayer",
            "import json\n",
            "kvretention.newlayer: layer 'newlayer' has no row in MAY_IMPORT",
        ),
    ],
)
def test_the_checker_catches_an_arrow_up(module: str, source: str, says: str) -> None:
    sources = {
        module: (source, False),
        "kvretention.hints": ("", True),
        "kvretention.dataplane.protocol": ("", False),
        "kvretention.controller": ("", True),
        "kvretention.controller.kvstore_metrics": ("", False),
    }
    assert says in upward_imports(read_graph(sources))


def test_the_checker_catches_a_circle_hidden_in_a_function() -> None:
    sources = {
        "kvretention.retention.contract": (
            "def targets():\n    from kvretention.retention.l3 import L3_HOOK_TARGETS\n",
            False,
        ),
        "kvretention.retention.l3": ("from .contract import HookTarget\n", False),
        "kvretention.retention.plugin": ("from kvretention.retention import l3\n", False),
        "kvretention.retention": ("", True),
    }
    graph = read_graph(sources)
    assert upward_imports(graph) == []
    assert circles(graph) == [["kvretention.retention.contract", "kvretention.retention.l3"]]
