"""The probe report as the operator reads it: JSON types without coercion, one error per message,
absent or null fields as false or none (``kvretention.api.probe_report``)."""

from __future__ import annotations

import json
import typing
from typing import Any

import pytest

from kvretention.api.models import EngineStatus
from kvretention.api.probe_report import (
    RETENTION_PLUGIN_STATES,
    TERMINATION_LOG_LIMIT,
    ProbeReport,
    ProbeReportError,
    parse_report,
    render_report,
)
from support.sample_probe_reports import FULL_REPORT, RETENTION_FIELDS

GOOD: dict[str, Any] = FULL_REPORT
RETENTION_KEYS = tuple(RETENTION_FIELDS)
OLD = {k: v for k, v in GOOD.items() if k not in RETENTION_KEYS}
"""A report from a probe that predates the retention plugin."""
EMPTY = ProbeReport()


@pytest.mark.parametrize(
    ("message", "error"),
    [
        ("{not json", "not JSON: '{not json'"),
        ("[" * 100_000 + "]" * 100_000, "not JSON: "),
        ('{"schema": 1, "sglang_version": ' + "9" * 5000 + "}", "not JSON: "),
        ("[1, 2]", "unknown probe report schema in '[1, 2]'"),
        ('"text"', "unknown probe report schema in "),
        (json.dumps({**GOOD, "schema": 2}), "unknown probe report schema in "),
        (json.dumps({**GOOD, "schema": "1"}), "unknown probe report schema in "),
        (json.dumps({k: v for k, v in GOOD.items() if k != "schema"}), "unknown probe report"),
        (json.dumps({**GOOD, "sglang_installed": "yes"}), "field sglang_installed has"),
        (json.dumps({**GOOD, "sglang_version": 9}), "field sglang_version has"),
        (json.dumps({**GOOD, "kv_hints_parameter": "false"}), "field kv_hints_parameter has"),
        (json.dumps({**GOOD, "kv_hints_parameter": 1}), "field kv_hints_parameter has"),
        (json.dumps({**GOOD, "dialect": 0}), "field dialect has"),
        (json.dumps({**GOOD, "async_generate_parameters": "prompt"}), "async_generate_parameters"),
        (json.dumps({**GOOD, "hicache_storage_backends": 5}), "field hicache_storage_backends"),
        (json.dumps({**GOOD, "hicache_storage_backends": "mooncake"}), "hicache_storage_backends"),
        (json.dumps({**GOOD, "hicache_storage_backends": [1]}), "hicache_storage_backends has"),
        (json.dumps({**GOOD, "hicache_storage_backends": {}}), "hicache_storage_backends has"),
        (json.dumps({**GOOD, "mooncake_store_importable": 0}), "mooncake_store_importable has"),
        (json.dumps({**GOOD, "mooncake_error": ["x"]}), "field mooncake_error has"),
        (json.dumps({**GOOD, "usable_for_hints": "true"}), "field usable_for_hints has"),
        (json.dumps({**GOOD, "retention_plugin": True}), "field retention_plugin has"),
        (json.dumps({**GOOD, "retention_error": ["x"]}), "field retention_error has"),
        (json.dumps({**GOOD, "retention_target_problems": "a.b"}), "retention_target_problems"),
        (json.dumps({**GOOD, "retention_target_problems": [1]}), "retention_target_problems"),
        (  # the first wrong field in the schema's order is named
            json.dumps({**GOOD, "usable_for_hints": 1, "sglang_version": 1}),
            "probe report field sglang_version has the wrong type",
        ),
    ],
)
def test_what_is_not_a_report_says_why(message: str, error: str) -> None:
    with pytest.raises(ProbeReportError) as caught:
        parse_report(message)
    assert error in str(caught.value)


@pytest.mark.parametrize(
    ("wire", "expected"),
    [
        ({"schema": 1}, EMPTY),
        ({key: None for key in GOOD} | {"schema": 1}, EMPTY),
        ({"schema": 1, "dialect": ""}, EMPTY),
        ({**GOOD, "extra": [1, {"x": None}]}, ProbeReport.model_validate(GOOD)),
        (
            {"schema": 1, "hicache_storage_backends": ["file"], "mooncake_error": "no libcuda"},
            ProbeReport(hicache_storage_backends=("file",), mooncake_error="no libcuda"),
        ),
    ],
    ids=["absent", "null", "empty-dialect", "extra-keys", "some"],
)
def test_absent_or_null_fields_read_as_false_or_none(
    wire: dict[str, Any], expected: ProbeReport
) -> None:
    assert parse_report(json.dumps(wire)) == expected


def test_an_empty_report_reads_as_nothing_installed() -> None:
    assert (EMPTY.sglang_installed, EMPTY.sglang_version, EMPTY.dialect) == (False, None, "none")
    assert (EMPTY.hicache_storage_backends, EMPTY.async_generate_parameters) == ((), None)
    assert not (EMPTY.kv_hints_parameter or EMPTY.mooncake_store_importable)
    assert not EMPTY.usable_for_hints


def test_a_rendered_report_reads_back_as_itself() -> None:
    report = ProbeReport.model_validate(GOOD)
    text = render_report(report)
    assert text == json.dumps(GOOD, sort_keys=True, separators=(",", ":"))
    assert parse_report(text) == report


MISSING = ["sglang.srt.mem_cache.radix_cache.RadixCache.checkpoint: not found (AttributeError)"]


@pytest.mark.parametrize(
    ("wire", "plugin", "error", "problems"),
    [
        (OLD, None, None, ()),
        ({**OLD, "retention_plugin": None, "retention_target_problems": None}, None, None, ()),
        (GOOD, "loaded", None, ()),
        (
            {**GOOD, "retention_plugin": "not_installed", "retention_error": "no entry point"},
            "not_installed",
            "no entry point",
            (),
        ),
        (
            {**GOOD, "retention_plugin": "not_selected", "retention_error": "SGLANG_PLUGINS='x'"},
            "not_selected",
            "SGLANG_PLUGINS='x'",
            (),
        ),
        ({**GOOD, "retention_target_problems": MISSING}, "loaded", None, tuple(MISSING)),
        ({**GOOD, "retention_plugin": "from-the-future"}, "from-the-future", None, ()),
    ],
    ids=["old-probe", "nulls", "loaded", "missing", "not-selected", "targets-missing", "unknown"],
)
def test_the_retention_fields_round_trip(
    wire: dict[str, Any], plugin: str | None, error: str | None, problems: tuple[str, ...]
) -> None:
    """An older probe's report (no retention fields) still parses: it reads as not checked."""
    report = parse_report(json.dumps(wire))
    assert (report.retention_plugin, report.retention_error) == (plugin, error)
    assert report.retention_target_problems == problems
    assert report.usable_for_hints is True
    assert parse_report(render_report(report)) == report


def test_many_long_target_problems_still_fit_a_termination_message() -> None:
    report = ProbeReport.model_validate(
        {
            **GOOD,
            "async_generate_parameters": ["p" * 60] * 30,
            "mooncake_error": "m" * 400,
            "retention_error": "r" * 400,
            "retention_target_problems": [f"{i}" + "t" * 400 for i in range(12)],
        }
    )
    text = render_report(report)
    assert len(text.encode()) <= TERMINATION_LOG_LIMIT
    back = parse_report(text)
    assert back.async_generate_parameters is None
    assert back.retention_target_problems == report.retention_target_problems[:1]
    assert back.retention_plugin == "loaded"


def test_the_status_names_the_probes_plugin_states() -> None:
    """status.engine.retentionPlugin's enum is the probe's set of states (one rule, two homes)."""
    field = EngineStatus.model_fields["retention_plugin"]
    literal = next(a for a in typing.get_args(field.annotation) if a is not type(None))
    assert set(typing.get_args(literal)) == RETENTION_PLUGIN_STATES
