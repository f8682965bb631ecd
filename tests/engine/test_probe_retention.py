"""``kvretention probe`` judges the retention plugin with the real sglang 0.5.23 and its own plugin
loader, and the SGLang arguments the operator renders for a hinted fleet parse with SGLang's own
parser once that loader has run.

Each case runs in a fresh interpreter (importing SGLang imports torch: tens of seconds here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvretention.api.models import KvRetentionDeployment
from kvretention.api.probe_report import parse_report
from kvretention.controller.resources import build_sglang_args
from kvretention.dataplane.worker.sglang_source import locate_sglang

pytestmark = pytest.mark.engine

NOKVHINTS_PATH = Path(__file__).resolve().parents[1] / "fixtures" / "sglang_nokvhints"
needs_sglang = pytest.mark.skipif(
    locate_sglang() is None and not os.environ.get("CI"), reason="sglang 0.5.23 is not installed"
)
TIMEOUT_S = 600


def _probe(**env: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "kvretention", "probe", "--skip-mooncake", "--report-only"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={**os.environ, **env},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report: dict[str, Any] = json.loads(done.stdout)
    parse_report(done.stdout)  # what the operator reads back
    return report


@needs_sglang
def test_the_probe_sees_sglang_load_the_plugin_and_find_its_targets() -> None:
    report = _probe()
    assert report["retention_plugin"] == "loaded", report["retention_error"]
    assert report["retention_error"] is None
    assert report["retention_target_problems"] == []
    assert report["usable_for_hints"] is True
    # torch in the same interpreter as SGLang: this machine has no GPU, so the CPU engine.
    import torch

    assert report["engine_device"] == ("cuda" if torch.cuda.is_available() else "cpu")


@needs_sglang
@pytest.mark.parametrize("allowed", ["other", "other, vendor"])
def test_a_whitelist_without_the_plugin_is_not_selected(allowed: str) -> None:
    report = _probe(SGLANG_PLUGINS=allowed)
    assert report["retention_plugin"] == "not_selected"
    assert report["retention_error"] == f"SGLANG_PLUGINS={allowed!r} does not list 'kvretention'"


def test_sglang_without_a_plugin_framework_is_unsupported() -> None:
    report = _probe(PYTHONPATH=str(NOKVHINTS_PATH))
    assert report["retention_plugin"] == "unsupported"
    assert "no plugin framework" in report["retention_error"]


def _rendered(role: str, **spec: Any) -> list[str]:
    body = {
        "apiVersion": "kvretention.io/v1alpha1",
        "kind": "KvRetentionDeployment",
        "metadata": {"name": "f", "namespace": "ns"},
        "spec": {"model": {"name": "m", "path": "org/m"}, **spec},
    }
    return build_sglang_args(KvRetentionDeployment.from_k8s(body).spec, role=role)  # type: ignore[arg-type]


PARSE = """
import argparse, json, sys
from sglang.srt.plugins import load_plugins
from sglang.srt.server_args import ServerArgs

def parse(argv):
    parser = argparse.ArgumentParser(exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    try:
        ns = parser.parse_args(argv)
    except argparse.ArgumentError as exc:
        return str(exc)
    return [ns.radix_eviction_policy, ns.enable_hierarchical_cache]

argvs = json.loads(sys.argv[1])
before = [parse(a) for a in argvs]
load_plugins()
print(json.dumps({"before": before, "after": [parse(a) for a in argvs]}))
"""


@needs_sglang
def test_the_rendered_policy_parses_once_sglangs_plugin_loader_ran() -> None:
    """The hinted workers' argv (aggregated, and PD prefill, both with HiCache) parses with
    SGLang's own parser after ``load_plugins()``; before it, SGLang refuses ``kvretain``: whoever
    embeds the engine must load plugins before parsing server args (``sglang.launch_server``
    does)."""
    argvs = [
        _rendered("aggregated"),
        _rendered("prefill", workers={"mode": "disaggregated", "prefill": {}, "decode": {}}),
    ]
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", PARSE, json.dumps(argvs)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["after"] == [["kvretain", True], ["kvretain", True]]
    assert all("invalid choice: 'kvretain'" in str(b) for b in seen["before"])


WORKER_PARSE = """
import json, sys
from kvretention.dataplane.worker.engine import parse_server_args
args = parse_server_args(json.loads(sys.argv[1]))
print(json.dumps([args.radix_eviction_policy, args.enable_hierarchical_cache]))
"""


def worker_parse(
    env: dict[str, str] | None = None,
) -> tuple[subprocess.CompletedProcess[str], list[Any]]:
    """Run :data:`WORKER_PARSE` on the aggregated pool's rendered argv in a fresh interpreter; it
    must exit 0. The finished process and its ``[radix_eviction_policy, hierarchical]``."""
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", WORKER_PARSE, json.dumps(_rendered("aggregated"))],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    parsed: list[Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return done, parsed


@needs_sglang
def test_the_worker_parses_the_rendered_argv_as_sglang_launch_server_does() -> None:
    """``kvretention worker`` embeds the engine: it loads SGLang's plugins before parsing, so the
    hinted workers' ``--radix-eviction-policy kvretain`` is a known choice (a fresh interpreter:
    nothing loaded the plugins before)."""
    _, parsed = worker_parse()
    assert parsed == ["kvretain", True]


@needs_sglang
def test_a_worker_whose_sglang_did_not_load_the_plugin_serves_instead_of_crash_looping() -> None:
    """``SGLANG_PLUGINS`` leaving the plugin out: SGLang would refuse ``kvretain`` and the pod
    would crash-loop; the worker drops the flag, says so, and SGLang parses the rest."""
    done, (policy, hierarchical) = worker_parse(
        {**os.environ, "SGLANG_PLUGINS": "some-other-plugin"}
    )
    assert policy != "kvretain"
    assert hierarchical is True
    assert "kv.retain is not applied in the radix tiers" in done.stderr
