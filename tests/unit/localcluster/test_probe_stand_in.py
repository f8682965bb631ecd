"""The kubelet stand-in for kwok pods (``tests/support/probe_status.py``, used by the demo).

What it writes must be exactly what the operator reads from a real node: the ``probe`` init
container's exit-0 termination message holding the report ``kvretention probe`` printed.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from kvretention.api.probe_report import ProbeReport, render_report
from kvretention.controller.probe_reports import PodReport, parse_probe_report
from support.probe_status import probe_message, probe_status_patch, report_message
from support.sample_probe_reports import FULL_REPORT

NOW = "2026-01-01T00:00:00Z"
REPORT: dict[str, Any] = {
    **FULL_REPORT,
    "mooncake_store_importable": False,
    "mooncake_error": "ImportError: libcuda.so.1",
    "engine_device": "cpu",
}
POD: dict[str, Any] = {
    "metadata": {"name": "qwen-worker-0"},
    "spec": {
        "initContainers": [{"name": "probe", "image": "kvr/worker:1"}],
        "containers": [{"name": "worker", "image": "kvr/worker:1"}],
    },
    "status": {"conditions": [{"type": "Ready", "status": "True"}]},
}


def pod(**changes: Any) -> dict[str, Any]:
    out = copy.deepcopy(POD)
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        node = out
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return out


def merged(p: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(p)
    out["status"] = {**out["status"], **patch["status"]}
    return out


def test_the_message_is_what_the_probe_prints() -> None:
    printed = render_report(ProbeReport.model_validate(REPORT))
    assert report_message(REPORT) == printed
    assert printed == json.dumps(REPORT, sort_keys=True, separators=(",", ":"))


def test_the_patched_pod_reads_back_as_the_report() -> None:
    message = report_message(REPORT)
    patch = probe_status_patch(POD, message, now=NOW)
    assert patch is not None
    [status] = patch["status"]["initContainerStatuses"]
    assert status["name"] == "probe"
    assert status["image"] == "kvr/worker:1"
    assert status["state"]["terminated"]["exitCode"] == 0
    parsed = parse_probe_report(merged(POD, patch))
    assert isinstance(parsed, PodReport)
    assert parsed.pod == "qwen-worker-0"
    report = parsed.report
    assert (report.sglang_version, report.dialect, report.usable_for_hints) == (
        "0.5.23",
        "versioned",
        True,
    )
    assert report.mooncake_store_importable is False
    assert report.mooncake_error == "ImportError: libcuda.so.1"


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"status__conditions": [{"type": "Ready", "status": "False"}]}, "not Ready yet"),
        ({"status__conditions": []}, "no conditions yet"),
        ({"metadata__deletionTimestamp": NOW}, "being deleted"),
        ({"spec__initContainers": []}, "no probe init container"),
    ],
)
def test_nothing_to_patch(changes: dict[str, Any], why: str) -> None:
    assert probe_status_patch(pod(**changes), report_message(REPORT), now=NOW) is None, why


def test_a_pod_already_carrying_the_report_is_left_alone_and_a_new_report_replaces_it() -> None:
    message = report_message(REPORT)
    patch = probe_status_patch(POD, message, now=NOW)
    assert patch is not None
    done = merged(POD, patch)
    assert probe_message(done) == message
    assert probe_status_patch(done, message, now=NOW) is None
    other = report_message({**REPORT, "sglang_version": "0.5.24"})
    assert probe_status_patch(done, other, now=NOW) is not None
