"""Probe reports (what a worker pod's ``probe`` init container writes) shared by the status tests."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

HINTS_REPORT: dict[str, Any] = {
    "schema": 1,
    "sglang_version": "0.5.23",
    "kv_hints_parameter": True,
    "dialect": "versioned",
    "hicache_storage_backends": ["file", "mooncake"],
    "mooncake_store_importable": True,
    "mooncake_error": None,
    "usable_for_hints": True,
}
"""SGLang 0.5.23 taking kv_hints, with Mooncake's store importable; no retention plugin fields."""

RETENTION_FIELDS: dict[str, Any] = {
    "retention_error": None,
    "retention_plugin": "loaded",
    "retention_target_problems": [],
    "engine_device": "cuda",
    "radix_tree_core": "rust",
    "radix_tree_core_kvretain": "rust",
}
"""What a probe reports of the retention plugin (a probe that predates it reports none of these)."""

FULL_REPORT: dict[str, Any] = {
    **HINTS_REPORT,
    "sglang_installed": True,
    "async_generate_parameters": ["prompt", "kv_hints"],
    **RETENTION_FIELDS,
}
"""The same from a current probe: every field, the retention plugin loaded on a GPU engine."""


def old_engine(report: Mapping[str, Any], *, version: str = "0.4.9") -> dict[str, Any]:
    """``report`` from an SGLang too old for kv_hints (``version``)."""
    return {
        **report,
        "sglang_version": version,
        "kv_hints_parameter": False,
        "dialect": "none",
        "usable_for_hints": False,
    }
