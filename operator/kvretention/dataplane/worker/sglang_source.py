"""Read facts about the installed SGLang from its source files, without importing it.

``import sglang`` pulls in torch and a GPU stack, which the probe's image check and the CPU test
tiers do not have. Everything here locates files with ``importlib.util.find_spec("sglang")`` (which
does not run ``sglang/__init__.py``) and reads them with ``ast``. ``load_kv_hints_module`` executes
just ``kv_hints.py`` (and the msgspec helper it needs) from its file, so the real decoder can judge
what we build.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Final

ENGINE_FILE: Final = "srt/entrypoints/engine.py"
KV_HINTS_FILE: Final = "srt/managers/kv_hints.py"
MSGSPEC_UTILS_FILE: Final = "srt/utils/msgspec_utils.py"
MEMORY_ARGS_FILE: Final = "srt/arg_groups/fields/memory.py"
SERVER_ARGS_FILE: Final = "srt/server_args.py"
BACKEND_FACTORY_FILE: Final = "srt/mem_cache/storage/backend_factory.py"
STORAGE_BACKEND_FIELD: Final = "hicache_storage_backend"
STORAGE_BACKEND_FLAG: Final = "--hicache-storage-backend"
KV_HINTS_MODULE_ALIAS: Final = "kvretention._sglang_kv_hints"


@dataclass(frozen=True)
class Param:
    """One parameter of a function as written in source."""

    name: str
    kind: str
    """``inspect.Parameter`` kind name: POSITIONAL_OR_KEYWORD, KEYWORD_ONLY, ..."""
    default: str | None
    """The default's source text (``ast.unparse``), None when there is none."""


def locate_sglang() -> Path | None:
    """The directory of the ``sglang`` package that ``import sglang`` would load, or None."""
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None


def _nodes(path: Path) -> Iterator[ast.AST]:
    """Every node of a file's syntax tree; none when the file is missing or does not parse."""
    tree = _parse(path)
    return iter(()) if tree is None else ast.walk(tree)


def read_version(root: Path) -> str | None:
    """``__version__`` as a literal in ``_version.py`` or ``version.py``, else package metadata."""
    for name in ("_version.py", "version.py"):
        for node in _nodes(root / name):
            if (
                isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                return node.value.value
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("sglang")
    except PackageNotFoundError:
        return None


def async_generate_params(root: Path) -> list[Param] | None:
    """``Engine.async_generate``'s parameters (without ``self``), or None if not found."""
    tree = _parse(root / ENGINE_FILE)
    if tree is None:
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Engine":
            for item in node.body:
                if isinstance(item, ast.AsyncFunctionDef | ast.FunctionDef) and (
                    item.name == "async_generate"
                ):
                    return [p for p in params_of(item.args) if p.name != "self"]
    return None


def params_of(args: ast.arguments) -> list[Param]:
    """Parameters in signature order with their kinds and default source text."""
    positional = [*args.posonlyargs, *args.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults))
    defaults += list(args.defaults)
    out = [
        Param(
            name=a.arg,
            kind="POSITIONAL_ONLY" if i < len(args.posonlyargs) else "POSITIONAL_OR_KEYWORD",
            default=None if d is None else ast.unparse(d),
        )
        for i, (a, d) in enumerate(zip(positional, defaults, strict=True))
    ]
    if args.vararg is not None:
        out.append(Param(name=args.vararg.arg, kind="VAR_POSITIONAL", default=None))
    for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        out.append(
            Param(name=a.arg, kind="KEYWORD_ONLY", default=None if d is None else ast.unparse(d))
        )
    if args.kwarg is not None:
        out.append(Param(name=args.kwarg.arg, kind="VAR_KEYWORD", default=None))
    return out


def has_versioned_decoder_source(root: Path) -> bool:
    """Whether ``sglang/srt/managers/kv_hints.py`` defines ``decode_kv_hints_envelope``."""
    tree = _parse(root / KV_HINTS_FILE)
    return tree is not None and any(
        isinstance(n, ast.FunctionDef) and n.name == "decode_kv_hints_envelope" for n in tree.body
    )


def hicache_storage_backends(root: Path) -> list[str]:
    """The ``--hicache-storage-backend`` choices this SGLang offers, read from its argument specs.

    0.5.23 declares them as ``Arg(choices=[...])`` on a field in ``arg_groups/fields/memory.py``;
    older releases pass ``choices=`` to ``add_argument("--hicache-storage-backend")`` in
    ``server_args.py``; the storage factory's ``register_backend`` calls are the last resort.
    """
    for finder in (_choices_from_fields, _choices_from_argparse, _choices_from_factory):
        found = finder(root)
        if found:
            return found
    return []


def _literal_strings(node: ast.expr) -> list[str] | None:
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return None
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return list(value)
    return None


def _choices_kwarg(call: ast.Call) -> list[str] | None:
    for kw in call.keywords:
        if kw.arg == "choices":
            return _literal_strings(kw.value)
    return None


def _choices_from_fields(root: Path) -> list[str] | None:
    for node in _nodes(root / MEMORY_ARGS_FILE):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == STORAGE_BACKEND_FIELD
        ):
            for sub in ast.walk(node.annotation):
                if isinstance(sub, ast.Call) and (choices := _choices_kwarg(sub)):
                    return choices
    return None


def _choices_from_argparse(root: Path) -> list[str] | None:
    for node in _nodes(root / SERVER_ARGS_FILE):
        if (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value == STORAGE_BACKEND_FLAG
            and (choices := _choices_kwarg(node))
        ):
            return choices
    return None


def _choices_from_factory(root: Path) -> list[str] | None:
    names: list[str] = []
    for node in _nodes(root / BACKEND_FACTORY_FILE):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "register_backend"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.append(node.args[0].value)
    return names or None


def load_kv_hints_module(root: Path | None = None) -> ModuleType | None:
    """Execute SGLang's ``kv_hints.py`` from its file (needs msgspec and pydantic-core, not torch).

    Its one SGLang import, ``sglang.srt.utils.msgspec_utils``, is loaded from its file too and
    registered only while ``kv_hints.py`` runs, so the real package is never half-imported.
    """
    root = root or locate_sglang()
    if root is None or not (root / KV_HINTS_FILE).is_file():
        return None
    helper_name = "sglang.srt.utils.msgspec_utils"
    saved = sys.modules.get(helper_name)
    try:
        sys.modules[helper_name] = _exec_file(helper_name, root / MSGSPEC_UTILS_FILE)
        # Registered under a private name: msgspec resolves the structs' annotations through
        # sys.modules[__module__], and the real ``sglang`` package stays untouched.
        module = _exec_file(KV_HINTS_MODULE_ALIAS, root / KV_HINTS_FILE, register=True)
    except Exception:  # any failure means "no usable decoder here"
        sys.modules.pop(KV_HINTS_MODULE_ALIAS, None)
        return None
    finally:
        if saved is None:
            sys.modules.pop(helper_name, None)
        else:
            sys.modules[helper_name] = saved
    return module


def _exec_file(name: str, path: Path, *, register: bool = False) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
