"""The CPU worker's ``sgl_kernel`` import shim (images/worker/cpu-shim/sgl_kernel) stays honest:
every attribute it hands out raises ``NotImplementedError`` when called, whatever the arguments,
and never returns a result; with ``KVR_SGL_KERNEL_SHIM_CALLS`` set it first records the name.

The shim is loaded by path under a name of its own and never put in ``sys.modules``, so it shadows
no ``sgl_kernel`` (real or shim) that another test imports.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SHIM_INIT = REPO / "images" / "worker" / "cpu-shim" / "sgl_kernel" / "__init__.py"
CALLS_ENV = "KVR_SGL_KERNEL_SHIM_CALLS"
"""tests/support/cpu_engine.py's ``SHIM_CALLS_ENV``: the file the shim records calls in."""

IMPORTED_BY_SGLANG_CPU = (
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "verify_tree_greedy_cpu",
)
"""What SGLang 0.5.23 with ``SGLANG_USE_CPU_ENGINE=1`` takes from ``sgl_kernel`` when its scheduler,
model runner, engine, tokenizer manager and Llama model are imported (recorded through the shim's
``__getattr__``): the speculative-decoding and KV-move helpers FACTS.md counts as 8."""
OTHER_NAMES = ("silu_and_mul", "rmsnorm", "convert_weight_packed", "anything_at_all")
"""Names SGLang calls only off the CPU-without-AMX path, and one it never asks for: the shim has no
list, so these must behave exactly like the 8."""
CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((), {}),
    ((1, 2.5, "x", None), {}),
    (([0, 1, 2], [[3]]), {"out": [0.0], "stream": None}),
]


def load_shim() -> ModuleType:
    """A fresh copy of the shim, under a private name and outside ``sys.modules``."""
    spec = importlib.util.spec_from_file_location("kvr_sgl_kernel_shim_under_test", SHIM_INIT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def shim(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.delenv(CALLS_ENV, raising=False)
    return load_shim()


def test_the_shim_declares_no_function_of_its_own(shim: ModuleType) -> None:
    """Every name SGLang asks for goes through ``__getattr__``: nothing defined here could compute."""
    public = {name for name in vars(shim) if not name.startswith("_")}
    assert public == {"os", "CALLS_ENV", "IS_KVRETENTION_SHIM"}
    assert shim.CALLS_ENV == CALLS_ENV
    assert shim.IS_KVRETENTION_SHIM is True
    assert not {name for name in IMPORTED_BY_SGLANG_CPU + OTHER_NAMES if name in vars(shim)}


@pytest.mark.parametrize("name", IMPORTED_BY_SGLANG_CPU + OTHER_NAMES)
@pytest.mark.parametrize(("args", "kwargs"), CALLS, ids=["no-args", "positional", "keywords"])
def test_every_attribute_raises_when_called_and_returns_nothing(
    shim: ModuleType, tmp_path: Path, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    function = getattr(shim, name)  # `from sgl_kernel import <name>` succeeds
    assert callable(function) and function.__name__ == name
    returned: list[object] = []
    with pytest.raises(NotImplementedError, match=rf"^sgl_kernel\.{name}: .*not installed"):
        returned.append(function(*args, **kwargs))
    assert returned == []
    assert list(tmp_path.iterdir()) == []  # with the variable unset nothing is recorded


@pytest.mark.parametrize("name", IMPORTED_BY_SGLANG_CPU)
def test_a_call_is_recorded_before_it_raises(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str
) -> None:
    record = tmp_path / "calls.txt"
    monkeypatch.setenv(CALLS_ENV, str(record))
    shim = load_shim()
    for _ in range(2):
        with pytest.raises(NotImplementedError):
            getattr(shim, name)(0)
    assert record.read_text().split() == [name, name]


def test_looking_a_name_up_records_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """SGLang imports all 8 at module load; only a call may land in the record."""
    record = tmp_path / "calls.txt"
    monkeypatch.setenv(CALLS_ENV, str(record))
    shim = load_shim()
    for name in IMPORTED_BY_SGLANG_CPU:
        getattr(shim, name)
    assert not record.exists()


@pytest.mark.parametrize("name", ["__wrapped__", "__version__", "__all__", "__torch_function__"])
def test_dunder_lookups_are_attribute_errors(shim: ModuleType, name: str) -> None:
    """``hasattr`` probes (the import system, ``inspect``, version checks) see nothing there."""
    assert not hasattr(shim, name)
