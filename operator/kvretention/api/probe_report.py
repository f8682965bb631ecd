"""The probe report (``docs/probe.md``, schema 1): what ``kvretention probe`` writes and the operator
reads back from the worker pods' ``probe`` init container termination message.

It lives in ``api/`` beside the CRD's models because it is a contract between two programs, not a
part of either: the probe (which reads SGLang's source through the data plane's worker code) and
the operator (which must not import that code) both import it from here, and it imports nothing
but pydantic.
"""

from __future__ import annotations

import json
from typing import Any, Final

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

SCHEMA: Final = 1
TERMINATION_LOG_LIMIT: Final = 4096
"""Kubernetes keeps at most 4 KiB of a termination message."""
DIALECTS: Final = frozenset({"none", "flat", "versioned"})
"""The dialects a probe names (``kvretention.dataplane.worker.dialect.Dialect``)."""
DEVICES: Final = frozenset({"cuda", "cpu"})
"""Where a probe says the engine runs (``kvretention.dataplane.worker.cpu.flags.Device``)."""
PLUGIN_LOADED: Final = "loaded"
PLUGIN_NOT_INSTALLED: Final = "not_installed"
PLUGIN_NOT_SELECTED: Final = "not_selected"
PLUGIN_LOAD_FAILED: Final = "load_failed"
PLUGIN_UNSUPPORTED: Final = "unsupported"
RETENTION_PLUGIN_STATES: Final = frozenset(
    {
        PLUGIN_LOADED,
        PLUGIN_NOT_INSTALLED,
        PLUGIN_NOT_SELECTED,
        PLUGIN_LOAD_FAILED,
        PLUGIN_UNSUPPORTED,
    }
)
"""What SGLang's own plugin loader did with the retention plugin (``docs/probe.md``)."""
TARGET_PROBLEMS_KEPT: Final = 8
"""At most this many hook-target problems are reported (the termination message is small)."""
_QUOTED_CHARS: Final = 120
"""How much of an unreadable message an error quotes."""


class ProbeReportError(ValueError):
    """A termination message that is not a schema-1 report (the text says why)."""


class ProbeReport(BaseModel):
    """One image's SGLang and Mooncake as the probe found them.

    Types are checked as JSON types, with no coercion (``"false"`` is no bool, ``1`` no string): a
    wrong type would otherwise reach the CR's status and make the API server refuse the write.
    A field that is absent or null reads as false, none or empty.
    """

    model_config = ConfigDict(frozen=True, strict=True, extra="ignore")

    schema_version: int = Field(default=SCHEMA, alias="schema", strict=False)
    """:func:`parse_report` checks it before the model sees the rest, so another schema is named as
    such and not as a field of the wrong type."""
    sglang_installed: bool = False
    sglang_version: str | None = None
    kv_hints_parameter: bool = False
    dialect: str = "none"
    """One of :data:`DIALECTS` from a probe; any other string reads as an unknown dialect."""
    async_generate_parameters: tuple[StrictStr, ...] | None = Field(default=None, strict=False)
    """None only when dropped to fit the termination message."""
    hicache_storage_backends: tuple[StrictStr, ...] = Field(default=(), strict=False)
    mooncake_store_importable: bool = False
    mooncake_error: str | None = None
    usable_for_hints: bool = False
    retention_plugin: str | None = None
    """One of :data:`RETENTION_PLUGIN_STATES`; None from a probe that predates the retention plugin
    (such an image only transports ``kv.retain``). Any other string reads as an unknown state."""
    retention_error: str | None = None
    """Why the plugin is not loaded, or why its hook targets could not be checked."""
    retention_target_problems: tuple[StrictStr, ...] = Field(default=(), strict=False)
    """Hook targets the plugin needs that this SGLang lacks or has changed, one line each naming the
    target (empty: every one found as the plugin expects it)."""
    engine_device: str | None = None
    """Where the worker's engine will run in this pod: ``cuda`` when torch sees a GPU, else ``cpu``
    (SGLang's CPU engine: one rank, no HiCache; ``docs/cpu-engine.md``). None: not measured."""
    radix_tree_core: str | None = None
    """SGLang's default radix-tree core in this image (``rust`` in 0.5.23, unless
    ``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND`` says otherwise): the core a worker runs under any
    ``--radix-eviction-policy`` but ``kvretain``. None: not measured."""
    radix_tree_core_kvretain: str | None = None
    """The core a worker runs under ``--radix-eviction-policy kvretain`` (the default core: on
    ``rust`` the plugin carries holds as pins); None without the loaded plugin."""

    @field_validator(
        "sglang_installed",
        "kv_hints_parameter",
        "dialect",
        "hicache_storage_backends",
        "mooncake_store_importable",
        "usable_for_hints",
        "retention_target_problems",
        mode="before",
    )
    @classmethod
    def _null_reads_as_default(cls, value: object, info: ValidationInfo) -> object:
        if value is None or (info.field_name == "dialect" and value == ""):
            return cls.model_fields[str(info.field_name)].default
        return value


def _compact(report: ProbeReport, **changes: Any) -> str:
    wire = {**report.model_dump(mode="json", by_alias=True), **changes}
    return json.dumps(wire, separators=(",", ":"), sort_keys=True)


def render_report(report: ProbeReport) -> str:
    """One line of compact JSON, keys sorted, that fits a termination message (the parameter list,
    the one long field, is dropped first; then the hook-target problems shrink to the first)."""
    attempts: tuple[dict[str, Any], ...] = (
        {},
        {"async_generate_parameters": None},
        {
            "async_generate_parameters": None,
            "retention_target_problems": list(report.retention_target_problems[:1]),
        },
    )
    text = ""
    for changes in attempts:
        text = _compact(report, **changes)
        if len(text.encode()) <= TERMINATION_LOG_LIMIT:
            break
    return text


def parse_report(message: str) -> ProbeReport:
    """The report in a termination message; :class:`ProbeReportError` says why there is none.

    Raises nothing else, whatever the text (the fuzz tier checks it).
    """
    try:
        data = json.loads(message)
    except (ValueError, RecursionError) as err:  # also numbers past Python's digit limit
        raise ProbeReportError(f"not JSON: {message[:_QUOTED_CHARS]!r}") from err
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ProbeReportError(f"unknown probe report schema in {message[:_QUOTED_CHARS]!r}")
    try:
        return ProbeReport.model_validate(data)
    except ValidationError as err:
        field = next((str(e["loc"][0]) for e in err.errors() if e["loc"]), "?")
        raise ProbeReportError(f"probe report field {field} has the wrong type") from err
