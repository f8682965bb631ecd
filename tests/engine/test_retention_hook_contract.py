"""The SGLang targets the retention plugin hooks are where, and shaped as, the plugin expects.

Fails loudly when SGLang moves, renames or re-signs a hooked target (the plugin would otherwise
load and silently do nothing), and checks that SGLang's own plugin loader finds the plugin through
its entry point and wraps every target. Runs in fresh interpreters, so the targets are seen as
SGLang ships them, before any hook.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from typing import Any

import pytest

from kvretention.dataplane.worker.sglang_source import locate_sglang
from kvretention.retention import EVICTION_POLICY, PLUGIN_NAME
from kvretention.retention.contract import HookTarget, check_target, plugin_targets

pytestmark = pytest.mark.engine

needs_sglang = pytest.mark.skipif(
    locate_sglang() is None and not os.environ.get("CI"), reason="sglang 0.5.23 is not installed"
)


def _python(code: str, **env: str) -> str:
    """Run ``code`` in a fresh interpreter (SGLang's import-time warnings stay there)."""
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **env},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_the_plugin_is_an_sglang_entry_point_under_its_name() -> None:
    found = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert found.get(PLUGIN_NAME) == "kvretention.retention.plugin:register"


@pytest.fixture(scope="module")
def as_shipped_then_loaded() -> dict[str, Any]:
    """In one fresh interpreter: the targets as SGLang ships them, then after SGLang's plugin
    loader ran with ``SGLANG_PLUGINS=kvretention``."""
    code = (
        "import json, inspect, pkgutil\n"
        "from kvretention.retention.contract import check_targets, plugin_targets\n"
        "problems = check_targets()\n"
        "from sglang.srt.plugins import load_plugins\n"
        "load_plugins()\n"
        "from sglang.srt.arg_groups.choices import RADIX_EVICTION_POLICY_CHOICES as C\n"
        "w = [t.target for t in plugin_targets()"
        " if inspect.unwrap(pkgutil.resolve_name(t.target)) is not pkgutil.resolve_name(t.target)]\n"
        "print(json.dumps({'problems': problems, 'wrapped': w, 'choices': C}))\n"
    )
    seen: dict[str, Any] = json.loads(_python(code, SGLANG_PLUGINS=PLUGIN_NAME))
    return seen


@needs_sglang
def test_every_hook_target_exists_with_the_parameters_the_plugin_relies_on(
    as_shipped_then_loaded: dict[str, Any],
) -> None:
    assert as_shipped_then_loaded["problems"] == []


@needs_sglang
def test_sglangs_loader_wraps_every_target_and_adds_the_policy(
    as_shipped_then_loaded: dict[str, Any],
) -> None:
    assert as_shipped_then_loaded["wrapped"] == [t.target for t in plugin_targets()]
    assert EVICTION_POLICY in as_shipped_then_loaded["choices"]


BROKEN = [
    (
        "renamed method",
        HookTarget(
            "sglang.srt.mem_cache.radix_cache.RadixCache.checkpoint_v2", ("self",), "h", "AFTER", ""
        ),
        "not found",
    ),
    (
        "moved module",
        HookTarget("sglang.srt.mem_cache.hiradix_cache.HiRadixCache.insert", (), "h", "AFTER", ""),
        "not found",
    ),
    (
        "changed parameters",
        HookTarget(
            "sglang.srt.mem_cache.utils.get_eviction_strategy", ("policy",), "h", "AROUND", ""
        ),
        "parameters ('eviction_policy', 'config')",
    ),
]


@needs_sglang
@pytest.mark.parametrize(("target", "says"), [c[1:] for c in BROKEN], ids=[c[0] for c in BROKEN])
def test_a_moved_or_resigned_target_is_reported_by_name(target: HookTarget, says: str) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        problem = check_target(target)
    assert problem is not None and target.target in problem and says in problem


@needs_sglang
def test_without_the_plugin_selected_sglang_leaves_every_target_alone() -> None:
    code = (
        "import json, inspect, pkgutil\n"
        "from sglang.srt.plugins import load_plugins\n"
        "load_plugins()\n"
        "from kvretention.retention.contract import plugin_targets\n"
        "print(json.dumps([t.target for t in plugin_targets()"
        " if hasattr(pkgutil.resolve_name(t.target), '__wrapped__')]))\n"
    )
    assert json.loads(_python(code, SGLANG_PLUGINS="some-other-plugin")) == []
