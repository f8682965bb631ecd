"""The worker pods' probe reports and the conditions they decide: ``KvHintsSupported`` (SGLang
takes ``kv_hints``) and ``RetentionApplied`` (SGLang loads the retention plugin and finds its hook
targets; no hook failed since the last reading).

Each worker pod runs the capability probe as its ``probe`` init container, whose termination message
is the report (:mod:`kvretention.api.probe_report`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvretention.api.names import PROBE_CONTAINER
from kvretention.api.probe_report import (
    PLUGIN_LOAD_FAILED,
    PLUGIN_LOADED,
    PLUGIN_NOT_INSTALLED,
    PLUGIN_NOT_SELECTED,
    PLUGIN_UNSUPPORTED,
    ProbeReport,
    ProbeReportError,
    parse_report,
)
from kvretention.controller.conditions import (
    HINTS_OFF,
    HOOK_FAILURES,
    HOOK_TARGETS_MISSING,
    KV_HINTS_NOT_ACCEPTED,
    PLUGIN_LOAD_FAILED_REASON,
    RETENTION_IS_APPLIED,
    TRANSPORT_ONLY,
    CondStatus,
    Verdict,
)
from kvretention.controller.diagnosis import clip
from kvretention.controller.resources.sglang_args import PLUGIN_NOT_SELECTED_REASON, RetentionWiring
from kvretention.controller.worker_metrics import HookIncrease, describe_increases
from kvretention.retention import EVICTION_POLICY


@dataclass(frozen=True)
class PodReport:
    """One worker pod's probe report (the pod is named in the conditions' messages)."""

    pod: str
    report: ProbeReport


@dataclass(frozen=True)
class ProbeFailure:
    """A probe termination message that is not a report we understand."""

    pod: str
    error: str


def _probe_message(pod: Mapping[str, Any]) -> str | None:
    statuses = (pod.get("status") or {}).get("initContainerStatuses") or []
    for container in statuses:
        if container.get("name") != PROBE_CONTAINER:
            continue
        for key in ("state", "lastState"):
            terminated = (container.get(key) or {}).get("terminated") or {}
            message = terminated.get("message")
            if message:
                return str(message)
    return None


def parse_probe_report(pod: Mapping[str, Any]) -> PodReport | ProbeFailure | None:
    """The probe report from a pod's ``probe`` init container termination message, if any."""
    name = str((pod.get("metadata") or {}).get("name", "?"))
    message = _probe_message(pod)
    if message is None:
        return None
    try:
        return PodReport(pod=name, report=parse_report(message))
    except ProbeReportError as err:
        return ProbeFailure(pod=name, error=str(err))


def worker_reports(pods: Sequence[Mapping[str, Any]]) -> list[PodReport | ProbeFailure]:
    """Probe reports of live worker pods, in pod-name order (deterministic)."""
    out = []
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name", ""))):
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        report = parse_probe_report(pod)
        if report is not None:
            out.append(report)
    return out


def _read_reports(
    reports: Sequence[PodReport | ProbeFailure], *, invalid: CondStatus
) -> Verdict | list[PodReport]:
    """Every report, when there are some and each reads; else the verdict: Unknown while no
    worker pod has reported, ``invalid`` for the first report that cannot be read."""
    if not reports:
        return Verdict("Unknown", "ProbePending", "no worker pod has reported its engine yet")
    good = []
    for r in reports:
        if isinstance(r, ProbeFailure):
            return Verdict(invalid, "ProbeReportInvalid", f"pod {r.pod}: {r.error}")
        good.append(r)
    return good


def check_kv_hints(reports: Sequence[PodReport | ProbeFailure]) -> Verdict:
    """Every worker pod's engine must take kv_hints; the first pod that cannot names the reason."""
    good = _read_reports(reports, invalid="False")
    if isinstance(good, Verdict):
        return good
    for r in good:
        if not r.report.kv_hints_parameter or r.report.dialect == "none":
            return Verdict(
                "False",
                "EngineLacksKvHints",
                f"pod {r.pod}: sglang {r.report.sglang_version or '(not installed)'} has no "
                "kv_hints parameter on Engine.async_generate",
            )
    for r in good:
        if not r.report.usable_for_hints:
            return Verdict(
                "False", "EngineUnusableForHints", f"pod {r.pod}: the probe reports it unusable"
            )
    first = good[0].report
    message = f"sglang {first.sglang_version} accepts kv_hints ({first.dialect} dialect)"
    # The probe reports Mooncake but does not require it (docs/probe.md): a worker whose HiCache
    # backend cannot load fails its own readiness. Say it here so the cause is one look away.
    no_mooncake = next((r for r in good if not r.report.mooncake_store_importable), None)
    if no_mooncake is not None:
        message += (
            f"; note: mooncake.store does not import in pod {no_mooncake.pod}: "
            f"{no_mooncake.report.mooncake_error or 'unknown error'}"
        )
    return Verdict("True", "EngineAcceptsKvHints", message)


def _plugin_verdict(r: PodReport) -> Verdict | None:
    """What keeps one pod's SGLang from applying ``kv.retain``; None when nothing does."""
    report = r.report
    sglang = f"sglang {report.sglang_version or '(not installed)'}"
    why = f": {report.retention_error}" if report.retention_error else ""
    state = report.retention_plugin
    if not report.usable_for_hints:
        return Verdict(
            "False",
            KV_HINTS_NOT_ACCEPTED,
            f"pod {r.pod}: {sglang} takes no kv_hints, so no kv.retain reaches its cache",
        )
    if state is None:
        return Verdict(
            "False",
            TRANSPORT_ONLY,
            f"pod {r.pod}: the image's probe predates the retention plugin; {sglang} receives "
            "kv.retain and ignores it (its own eviction, no soft pins)",
        )
    if state in (PLUGIN_NOT_INSTALLED, PLUGIN_UNSUPPORTED):
        return Verdict(
            "False",
            TRANSPORT_ONLY,
            f"pod {r.pod}: {sglang} receives kv.retain and ignores it, the retention plugin is "
            f"{'not installed' if state == PLUGIN_NOT_INSTALLED else 'unsupported'}{why}",
        )
    if state == PLUGIN_NOT_SELECTED:
        return Verdict(
            "False",
            PLUGIN_NOT_SELECTED_REASON,
            f"pod {r.pod}: {sglang} does not load the retention plugin{why}",
        )
    if state == PLUGIN_LOAD_FAILED:
        return Verdict(
            "False",
            PLUGIN_LOAD_FAILED_REASON,
            f"pod {r.pod}: {sglang} fails to load the retention plugin{why}",
        )
    if state != PLUGIN_LOADED:
        return Verdict(
            "Unknown", "UnknownPluginState", f"pod {r.pod}: retention plugin state {state!r}"
        )
    problems = report.retention_target_problems
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return Verdict(
            "False",
            HOOK_TARGETS_MISSING,
            clip(
                f"pod {r.pod}: the retention plugin loads in {sglang} but its hook targets do not "
                f"match, so kv.retain would not be applied: {problems[0]}{more}"
            ),
        )
    return None


def check_retention_applied(
    reports: Sequence[PodReport | ProbeFailure], wiring: RetentionWiring
) -> Verdict:
    """Whether SGLang applies ``kv.retain``: hints on, the plugin's policy rendered (no user setting
    keeps it out), then every worker pod's probe: SGLang loads the plugin and finds its targets."""
    if not wiring.hints:
        return Verdict(
            "False",
            HINTS_OFF,
            "no request carries kv.retain: hints.policy is Optional, every hints.providers "
            "switch is off and hints.defaultTtlSeconds is unset",
        )
    if wiring.blocked_reason is not None:
        return Verdict("False", wiring.blocked_reason, wiring.blocked_message)
    good = _read_reports(reports, invalid="Unknown")
    if isinstance(good, Verdict):
        return good
    for r in good:
        verdict = _plugin_verdict(r)
        if verdict is not None:
            return verdict
    return Verdict(
        "True",
        RETENTION_IS_APPLIED,
        f"sglang {good[0].report.sglang_version} loads the retention plugin and finds its hook "
        f"targets on every worker pod; the workers evict with --radix-eviction-policy "
        f"{EVICTION_POLICY}",
    )


def check_hook_failures(retention: Verdict, increases: Sequence[HookIncrease]) -> Verdict:
    """An applied plugin whose hooks failed since the last reading falls back (fail-open) for
    those requests: not applied for them. A counter that stays flat is applied again."""
    if retention.reason != RETENTION_IS_APPLIED or not increases:
        return retention
    return Verdict(
        "False",
        HOOK_FAILURES,
        clip(
            "retention hooks failed since the last reading, those requests were served without "
            "retention (kvretention_retention_hook_failures_total; the worker log has the "
            f"exception): {describe_increases(increases)}"
        ),
    )
