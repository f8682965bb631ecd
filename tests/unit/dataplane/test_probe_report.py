"""The probe's report and exit status (pure; the real-SGLang runs live in tests/engine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvretention.probe import (
    EXIT_NO_HINTS,
    EXIT_NO_SGLANG,
    EXIT_USABLE,
    TERMINATION_LOG_LIMIT,
    build_report,
    check_mooncake,
    exit_code_of,
    render_report,
)

NOKVHINTS = Path(__file__).resolve().parents[2] / "fixtures" / "sglang_nokvhints" / "sglang"


def test_missing_sglang_reports_none_and_exits_4() -> None:
    report = build_report(sglang_root=None, mooncake_error="x")
    assert report["sglang_installed"] is False
    assert report["dialect"] == "none"
    assert report["usable_for_hints"] is False
    assert exit_code_of(report) == EXIT_NO_SGLANG == 4


def test_sglang_without_kv_hints_exits_3() -> None:
    report = build_report(sglang_root=NOKVHINTS, mooncake_error=None)
    assert (report["kv_hints_parameter"], report["dialect"]) == (False, "none")
    assert report["sglang_version"] == "0.4.9"
    assert report["hicache_storage_backends"] == ["file", "mooncake", "hf3fs", "nixl"]
    assert report["mooncake_store_importable"] is True
    assert exit_code_of(report) == EXIT_NO_HINTS == 3


@pytest.mark.parametrize(("usable", "code"), [(True, EXIT_USABLE), (False, EXIT_NO_HINTS)])
def test_exit_code_of_installed(usable: bool, code: int) -> None:
    assert exit_code_of({"sglang_installed": True, "usable_for_hints": usable}) == code


def test_render_report_fits_a_termination_message() -> None:
    report = build_report(sglang_root=NOKVHINTS, mooncake_error="e" * 400)
    report["async_generate_parameters"] = ["p" * 50] * 200
    text = render_report(report)
    assert len(text.encode()) <= TERMINATION_LOG_LIMIT
    assert json.loads(text)["async_generate_parameters"] is None


def test_check_mooncake_reports_the_import_error_line(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'ImportError: libcuda.so.1: cannot open' >&2\nexit 1\n")
    fake.chmod(0o755)
    assert (
        check_mooncake(python=str(fake), timeout_s=10) == "ImportError: libcuda.so.1: cannot open"
    )
