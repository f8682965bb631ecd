"""The probe's report and exit status (pure; the real-SGLang runs live in tests/engine)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

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
    LOADER_LOGGER,
    RetentionFinding,
    build_report,
    check_mooncake,
    check_retention,
    exit_code_of,
    judge_retention_plugin,
    parse_retention_check,
    probe_cmd,
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
        "retention_plugin",
        "retention_error",
        "retention_target_problems",
        "engine_device",
        "radix_tree_core",
        "radix_tree_core_kvretain",
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


# -- the retention plugin, as SGLang's loader sees it --------------------------------------------

PLUGIN = "kvretention"
Loaded = Mapping[str, tuple[Callable[[], Any], str | None]]


def loads(func: Callable[[], Any] = lambda: None) -> Callable[[], Loaded]:
    return lambda: {"other": (lambda: None, "other-dist"), PLUGIN: (func, "kvretention")}


def fails_to_import(name: str = PLUGIN) -> Callable[[], Loaded]:
    """As ``load_plugins_by_group`` does when ``ep.load()`` raises: log with the traceback, go on."""

    def load() -> Loaded:
        try:
            raise ModuleNotFoundError("No module named 'kvretention.retention.plugin'")
        except ModuleNotFoundError:
            logging.getLogger(LOADER_LOGGER).exception(
                "Failed to load plugin %s from group %s", name, "sglang.srt.plugins"
            )
        return {}

    return load


def never(*_: Any) -> Any:
    raise AssertionError("must not be called")


def boom() -> None:
    raise RuntimeError("register() exploded")


def targets(*problems: str) -> Callable[[], Sequence[str]]:
    return lambda: list(problems)


@pytest.mark.parametrize(
    ("installed", "allowed", "load", "check", "expected"),
    [
        (False, "", never, never, ("not_installed", "no entry point 'kvretention'", ())),
        (True, "other", never, never, ("not_selected", "SGLANG_PLUGINS='other'", ())),
        (True, " other , kvretention ", loads(), targets(), ("loaded", None, ())),
        (True, ",", loads(), targets(), ("loaded", None, ())),  # SGLang: no names = all
        (True, "", fails_to_import(), never, ("load_failed", "ModuleNotFoundError: No mod", ())),
        (True, "", fails_to_import("other"), never, ("load_failed", "loader left it out", ())),
        (True, "", loads(boom), never, ("load_failed", "RuntimeError: register() exploded", ())),
        (True, "", loads(), boom, ("load_failed", "RuntimeError: register() exploded", ())),
        (True, "", loads(), targets("a.B.c: not found"), ("loaded", None, ("a.B.c: not found",))),
    ],
    ids=[
        "not-installed",
        "not-selected",
        "selected",
        "blank-whitelist",
        "import-fails",
        "another-plugin-fails",
        "register-raises",
        "target-check-raises",
        "targets-missing",
    ],
)
def test_judge_retention_plugin(
    installed: bool,
    allowed: str,
    load: Callable[[], Loaded],
    check: Callable[[], Sequence[str]],
    expected: tuple[str, str | None, tuple[str, ...]],
) -> None:
    found = judge_retention_plugin(
        plugin=PLUGIN, installed=installed, allowed=allowed, load=load, check_targets=check
    )
    state, error, problems = expected
    assert found.state == state
    assert (found.error is None) == (error is None)
    assert error is None or error in (found.error or "")
    assert found.target_problems == problems


def test_target_problems_are_capped_for_the_termination_message() -> None:
    many = [f"sglang.x{i}: " + "y" * 500 for i in range(20)]
    found = judge_retention_plugin(
        plugin=PLUGIN, installed=True, allowed="", load=loads(), check_targets=lambda: many
    )
    assert len(found.target_problems) == 8
    assert all(
        len(p) == 200 and p.startswith(f"sglang.x{i}: ")
        for i, p in enumerate(found.target_problems)
    )


def fake_python(tmp_path: Path, script: str) -> str:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\n" + script)
    fake.chmod(0o755)
    return str(fake)


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        (
            "echo 'INFO some sglang log line'\n"
            'echo \'{"state": "loaded", "error": null, "targets": ["a: not found"]}\'\n',
            RetentionFinding("loaded", None, ("a: not found",)),
        ),
        (
            "echo 'Traceback...' >&2\necho 'Segmentation fault' >&2\nexit 139\n",
            RetentionFinding("load_failed", "the check failed: Segmentation fault"),
        ),
        (
            'echo \'{"state": "lost"}\'\n',
            RetentionFinding(
                "load_failed", 'the check failed: no finding in its output \'{"state": "lost"}\''
            ),
        ),
        (
            "exec sleep 30\n",
            RetentionFinding("load_failed", "checking the retention plugin took over 1s"),
        ),
        (
            "kill -9 $$\n",
            RetentionFinding(
                "load_failed",
                "the check failed: killed by signal 9 (importing SGLang and torch needs about 1 GiB "
                "of memory: a container memory limit below that kills it)",
            ),
        ),
    ],
    ids=["finding", "crash", "unknown-state", "hang", "killed"],
)
def test_check_retention_runs_a_child(
    tmp_path: Path, script: str, expected: RetentionFinding
) -> None:
    timeout_s = 1 if "sleep" in script else 60  # only the hang waits for its timeout
    assert check_retention(python=fake_python(tmp_path, script), timeout_s=timeout_s) == expected


@pytest.mark.parametrize(
    "stdout",
    [
        "",
        "not json",
        "[1]",
        '{"state": "loaded", "targets": "a"}',
        '{"state": "loaded", "targets": [1]}',
    ],
)
def test_parse_retention_check_refuses_what_is_not_a_finding(stdout: str) -> None:
    assert parse_retention_check(stdout) is None


@pytest.mark.parametrize(
    ("finding", "plugin", "error", "problems"),
    [
        (None, None, None, ()),
        (RetentionFinding("loaded"), "loaded", None, ()),
        (
            RetentionFinding("not_installed", "no entry point"),
            "not_installed",
            "no entry point",
            (),
        ),
        (RetentionFinding("loaded", None, ("t: gone",)), "loaded", None, ("t: gone",)),
    ],
    ids=["not-checked", "loaded", "not-installed", "targets-missing"],
)
def test_build_report_carries_the_finding(
    finding: RetentionFinding | None,
    plugin: str | None,
    error: str | None,
    problems: tuple[str, ...],
) -> None:
    report = build_report(sglang_root=NOKVHINTS, mooncake_error=None, retention=finding)
    assert (report.retention_plugin, report.retention_error) == (plugin, error)
    assert report.retention_target_problems == problems
    assert parse_report(render_report(report)) == report
    assert exit_code_of(report) == EXIT_NO_HINTS  # retention is reported, never the exit status


def test_probe_without_sglang_reports_the_plugin_unsupported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("kvretention.probe.locate_sglang", lambda: None)
    done = CliRunner().invoke(probe_cmd, ["--skip-mooncake", "--report-only"])
    assert done.exit_code == 0, done.output
    report = parse_report(done.output.strip())
    assert (report.sglang_installed, report.retention_plugin) == (False, "unsupported")


def test_skip_retention_reads_as_a_probe_that_predates_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kvretention.probe.locate_sglang", lambda: NOKVHINTS)
    monkeypatch.setattr("kvretention.probe.check_retention", never)
    done = CliRunner().invoke(probe_cmd, ["--skip-mooncake", "--skip-retention"])
    assert done.exit_code == EXIT_NO_HINTS, done.output
    assert parse_report(done.output.strip()).retention_plugin is None


@pytest.mark.parametrize(
    ("device", "read"),
    [('"cpu"', "cpu"), ('"cuda"', "cuda"), ('"gpu"', None), ("null", None)],
)
def test_the_childs_engine_device_reaches_the_report(device: str, read: str | None) -> None:
    finding = parse_retention_check(f'{{"state": "loaded", "targets": [], "device": {device}}}')
    assert finding is not None and finding.device == read
    report = build_report(sglang_root=None, mooncake_error=None, retention=finding)
    assert report.engine_device == read
    assert parse_report(render_report(report)).engine_device == read


@pytest.mark.parametrize(
    ("child", "default", "kvretain"),
    [
        ('"state": "loaded", "tree_core": "rust"', "rust", "rust"),  # kvretain's holds as pins
        ('"state": "loaded", "tree_core": "python"', "python", "python"),
        ('"state": "not_selected", "tree_core": "rust"', "rust", None),
        ('"state": "loaded", "tree_core": 3', None, None),
        ('"state": "loaded"', None, None),  # a child that predates the field
    ],
    ids=["rust-default", "python-default", "plugin-not-loaded", "not-a-name", "absent"],
)
def test_the_childs_tree_core_reaches_the_report(
    child: str, default: str | None, kvretain: str | None
) -> None:
    finding = parse_retention_check(f'{{"targets": [], {child}}}')
    assert finding is not None
    report = build_report(sglang_root=None, mooncake_error=None, retention=finding)
    assert (report.radix_tree_core, report.radix_tree_core_kvretain) == (default, kvretain)
    assert parse_report(render_report(report)) == report


def test_a_report_without_tree_cores_still_parses() -> None:
    report = parse_report('{"schema": 1, "sglang_installed": true}')
    assert (report.radix_tree_core, report.radix_tree_core_kvretain) == (None, None)
