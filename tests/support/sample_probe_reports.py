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


def old_engine(report: Mapping[str, Any], *, version: str = "0.4.9") -> dict[str, Any]:
    """``report`` from an SGLang too old for kv_hints (``version``)."""
    return {
        **report,
        "sglang_version": version,
        "kv_hints_parameter": False,
        "dialect": "none",
        "usable_for_hints": False,
    }
