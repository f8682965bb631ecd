"""What the worker hands SGLang is what the real sglang 0.5.23 source accepts.

Runs against the package installed with ``pip install --no-deps sglang==0.5.23``: its own
``decode_kv_hints_envelope`` judges the versioned envelope, its ``Engine.async_generate`` source
(parsed, since importing the engine needs torch) is the signature the stand-in must mirror, and
``kvretention probe`` is run as a real subprocess against it and against a fixture SGLang without
``kv_hints``.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvretention.dataplane.worker.dialect import Dialect, build_kv_hints
from kvretention.dataplane.worker.sglang_source import (
    ENGINE_FILE,
    load_kv_hints_module,
    locate_sglang,
)
from kvretention.dataplane.worker.standin import (
    StandinEngineFlat,
    StandinEngineNone,
    StandinEngineVersioned,
)
from kvretention.hints import envelope_or_none

pytestmark = pytest.mark.engine

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
WIRE = json.loads((FIXTURES / "kv_hints_wire.json").read_text())
NOKVHINTS_PATH = FIXTURES / "sglang_nokvhints"
SGLANG = locate_sglang()
# Skipped only on a dev box without bootstrap; under CI a missing sglang fails these tests.
needs_sglang = pytest.mark.skipif(
    SGLANG is None and not os.environ.get("CI"), reason="sglang 0.5.23 is not installed"
)


@pytest.fixture(scope="module")
def decoder() -> Any:
    module = load_kv_hints_module()
    assert module is not None, "sglang/srt/managers/kv_hints.py could not be loaded"
    return module.decode_kv_hints_envelope


@needs_sglang
@pytest.mark.parametrize("entry", WIRE["valid"], ids=lambda e: e["name"])
def test_versioned_envelope_passes_sglangs_own_decoder(entry: dict[str, Any], decoder: Any) -> None:
    env = envelope_or_none(entry["wire"])
    if entry["expected"] is None:
        assert env is None  # nothing would be passed at all
        return
    assert env is not None
    hints = build_kv_hints(
        env, Dialect.VERSIONED, request_id=f"req-{entry['name']}", prompt_tokens=42
    )
    decoded = decoder(hints)
    assert decoded.message_id == f"req-{entry['name']}"
    (action,) = decoded.actions
    assert (action.action_type, action.action_version) == ("kv.retain", "1.0")
    ttl = entry["expected"]["retain_full_prompt"]["ttl_seconds"]
    assert action.payload["directives"] == [
        {"start": 0, "end": 42, "priority": 50, "duration": ttl}
    ]


@needs_sglang
def test_sglang_rejects_the_flat_envelope(decoder: Any) -> None:
    """Why the dialect matters: 0.5.23 refuses the design's flat form outright."""
    with pytest.raises(ValueError, match="Malformed kv_hints envelope"):
        decoder({"retain_full_prompt": {"ttl_seconds": 300}})


def _source_signature() -> list[tuple[str, str, object]]:
    """(name, kind, default) of the real ``Engine.async_generate``, read straight from the file."""
    assert SGLANG is not None
    tree = ast.parse((SGLANG / ENGINE_FILE).read_text())
    engine = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Engine")
    fn = next(
        n for n in engine.body if isinstance(n, ast.AsyncFunctionDef) and n.name == "async_generate"
    )
    args = fn.args
    defaults = [None] * (len(args.args) - len(args.defaults)) + list(args.defaults)
    out: list[tuple[str, str, object]] = []
    for a, d in zip(args.args, defaults, strict=True):
        if a.arg != "self":
            out.append((a.arg, "POSITIONAL_OR_KEYWORD", _default(d)))
    for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        out.append((a.arg, "KEYWORD_ONLY", _default(d)))
    assert args.vararg is None and args.kwarg is None and not args.posonlyargs
    return out


def _default(node: ast.expr | None) -> object:
    return inspect.Parameter.empty if node is None else ast.literal_eval(node)


def _standin_signature(cls: type) -> list[tuple[str, str, object]]:
    params = inspect.signature(cls.async_generate).parameters.values()  # type: ignore[attr-defined]
    return [(p.name, p.kind.name, p.default) for p in params if p.name != "self"]


@needs_sglang
@pytest.mark.parametrize("cls", [StandinEngineFlat, StandinEngineVersioned])
def test_standin_signature_is_sglangs(cls: type) -> None:
    real = _source_signature()
    assert any(name == "kv_hints" for name, _, _ in real)
    assert _standin_signature(cls) == real


@needs_sglang
def test_none_standin_is_sglangs_signature_without_kv_hints() -> None:
    real = [p for p in _source_signature() if p[0] != "kv_hints"]
    assert _standin_signature(StandinEngineNone) == real


@needs_sglang
def test_standin_async_generate_is_a_coroutine_like_sglangs() -> None:
    assert inspect.iscoroutinefunction(StandinEngineFlat.async_generate)


def _probe(env_extra: dict[str, str], *args: str) -> tuple[int, dict[str, Any]]:
    env = {**os.environ, **env_extra}
    done = subprocess.run(
        [sys.executable, "-m", "kvretention", "probe", "--skip-mooncake", *args],
        capture_output=True,
        text=True,
        timeout=600,  # the retention check imports SGLang (and torch) in a child
        env=env,
        check=False,
    )
    return done.returncode, json.loads(done.stdout)


@needs_sglang
def test_probe_reports_the_real_install(tmp_path: Path) -> None:
    code, report = _probe({})
    assert code == 0
    assert report["schema"] == 1
    assert report["sglang_version"] == "0.5.23"
    assert report["kv_hints_parameter"] is True
    assert report["dialect"] == "versioned"
    assert report["usable_for_hints"] is True
    assert report["async_generate_parameters"] == [name for name, _, _ in _source_signature()]
    assert {"file", "mooncake", "nixl", "hf3fs"} <= set(report["hicache_storage_backends"])


@needs_sglang
def test_probe_writes_the_termination_log(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    done = subprocess.run(
        [sys.executable, "-m", "kvretention", "probe", "--termination-log", str(log)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0
    assert log.read_text() == done.stdout.strip()
    assert len(log.read_bytes()) <= 4096
    report = json.loads(log.read_text())
    # This machine has no libcuda, so the Mooncake store cannot load: reported, not fatal.
    assert isinstance(report["mooncake_store_importable"], bool)
    assert report["mooncake_store_importable"] == (report["mooncake_error"] is None)


def test_probe_reports_none_for_sglang_without_kv_hints() -> None:
    code, report = _probe({"PYTHONPATH": str(NOKVHINTS_PATH)})
    assert code == 3
    assert report["sglang_version"] == "0.4.9"
    assert report["kv_hints_parameter"] is False
    assert report["dialect"] == "none"
    assert report["usable_for_hints"] is False
    assert "kv_hints" not in report["async_generate_parameters"]


def test_probe_report_only_exits_zero_with_the_same_verdict() -> None:
    """The init-container form: an unusable image still starts; the report carries the verdict."""
    code, report = _probe({"PYTHONPATH": str(NOKVHINTS_PATH)}, "--report-only")
    assert code == 0
    assert report["dialect"] == "none"
    assert report["usable_for_hints"] is False
