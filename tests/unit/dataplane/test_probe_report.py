"""The probe's report and exit status (pure; the real-SGLang runs live in tests/engine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvretention.api.probe_report import (
    DIALECTS,
    TERMINATION_LOG_LIMIT,
    ProbeReport,
    parse_report,
    render_report,
)
from kvretention.dataplane.worker.dialect import Dialect
from kvretention.probe import (
    EXIT_NO_HINTS,
    EXIT_NO_SGLANG,
    EXIT_USABLE,
    build_report,
    check_mooncake,
    exit_code_of,
)

NOKVHINTS = Path(__file__).resolve().parents[2] / "fixtures" / "sglang_nokvhints" / "sglang"


def test_missing_sglang_reports_none_and_exits_4() -> None:
    report = build_report(sglang_root=None, mooncake_error="x")
    assert report.sglang_installed is False
    assert report.dialect == "none"
    assert report.usable_for_hints is False
    assert exit_code_of(report) == EXIT_NO_SGLANG == 4


def test_sglang_without_kv_hints_exits_3() -> None:
    report = build_report(sglang_root=NOKVHINTS, mooncake_error=None)
    assert (report.kv_hints_parameter, report.dialect) == (False, "none")
    assert report.sglang_version == "0.4.9"
    assert report.hicache_storage_backends == ("file", "mooncake", "hf3fs", "nixl")
    assert report.mooncake_store_importable is True
    assert exit_code_of(report) == EXIT_NO_HINTS == 3


@pytest.mark.parametrize(("usable", "code"), [(True, EXIT_USABLE), (False, EXIT_NO_HINTS)])
def test_exit_code_of_installed(usable: bool, code: int) -> None:
    assert exit_code_of(ProbeReport(sglang_installed=True, usable_for_hints=usable)) == code


def test_the_printed_report_is_schema_1_with_sorted_keys() -> None:
    """docs/probe.md: one compact line, keys sorted, every key present, and what the operator
    reads back is what the probe built."""
    report = build_report(sglang_root=NOKVHINTS, mooncake_error="ImportError: libcuda.so.1")
    text = render_report(report)
    wire = json.loads(text)
    assert list(wire) == sorted(wire)
    assert set(wire) == {
        "schema",
        "sglang_installed",
        "sglang_version",
        "kv_hints_parameter",
        "dialect",
        "async_generate_parameters",
        "hicache_storage_backends",
        "mooncake_store_importable",
        "mooncake_error",
        "usable_for_hints",
    }
    assert text == json.dumps(wire, separators=(",", ":"), sort_keys=True)
    assert wire["schema"] == 1
    assert wire["async_generate_parameters"][:2] == ["prompt", "sampling_params"]
    assert parse_report(text) == report


def test_render_report_fits_a_termination_message() -> None:
    report = build_report(sglang_root=NOKVHINTS, mooncake_error="e" * 400)
    report = report.model_copy(update={"async_generate_parameters": ("p" * 50,) * 200})
    text = render_report(report)
    assert len(text.encode()) <= TERMINATION_LOG_LIMIT
    assert json.loads(text)["async_generate_parameters"] is None
    assert json.loads(text)["hicache_storage_backends"] == ["file", "mooncake", "hf3fs", "nixl"]


def test_the_dialects_the_operator_knows_are_the_probes() -> None:
    assert {str(d) for d in Dialect} == DIALECTS


def test_check_mooncake_reports_the_import_error_line(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'ImportError: libcuda.so.1: cannot open' >&2\nexit 1\n")
    fake.chmod(0o755)
    assert (
        check_mooncake(python=str(fake), timeout_s=10) == "ImportError: libcuda.so.1: cannot open"
    )
