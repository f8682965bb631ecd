"""Pure: the workers' ``/metrics`` text in, the retention plugin's hook failures since the last
reading out.

Each worker exports ``kvretention_retention_hook_failures_total{hook, fallback}`` on its metrics
port (:mod:`kvretention.retention.failures`): fail-open fallbacks, the request served, its KV left
unretained or its pages written unpinned. The counter only grows, so what says something is its
*increase* between two readings of one pod, not its value: a counter that stays flat is healthy
again, whatever it reached.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from kvretention.controller.diagnosis import is_pod_ready
from kvretention.controller.kvstore_metrics import MetricsFormatError
from kvretention.ports import METRICS_PORT
from kvretention.retention.failures import FALLBACKS, METRIC

HOOK_FAILURES: Final = f"{METRIC}_total"
"""The sample name a worker serves (prometheus_client adds ``_total`` to a counter family)."""

SCRAPES_AT_ONCE: Final = 8
"""Worker pods read concurrently per fleet; the rest wait their turn (each read is time-bounded)."""

_LABEL: Final = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?')


def _labels(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(text):
        match = _LABEL.match(text, pos)
        if match is None:
            raise MetricsFormatError(f"unparsable labels {{{text}}}")
        out[match[1]] = match[2]
        pos = match.end()
    return out


def parse_hook_failures(text: str) -> dict[str, int]:
    """Each hook's failure count from a worker's ``/metrics`` text, summed over its ``fallback``
    label. A worker whose image predates the counter serves none of it: an empty dict."""
    counts: dict[str, int] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line.startswith(HOOK_FAILURES + "{"):
            continue
        head, brace, rest = line[len(HOOK_FAILURES) + 1 :].partition("}")
        parts = rest.split()
        if not brace or not parts:
            raise MetricsFormatError(f"sample {line[:80]!r} has no value")
        try:
            value = float(parts[0])
        except ValueError as err:
            raise MetricsFormatError(f"{HOOK_FAILURES} has no number: {parts[0]!r}") from err
        if not value >= 0 or value == float("inf"):
            raise MetricsFormatError(f"{HOOK_FAILURES} is {parts[0]}, not a count")
        hook = _labels(head).get("hook")
        if hook is None:
            raise MetricsFormatError(f"{HOOK_FAILURES} sample without a hook label: {line[:80]!r}")
        counts[hook] = counts.get(hook, 0) + int(value)
    return counts


@dataclass(frozen=True)
class PodFailures:
    """One read of one worker pod: its counts per hook, or why there are none."""

    pod: str
    counts: Mapping[str, int] | None = None
    error: str | None = None


@dataclass(frozen=True)
class HookIncrease:
    """Failures of one hook in one pod between two readings."""

    pod: str
    hook: str
    failures: int


@dataclass(frozen=True)
class FleetFailures:
    """A fleet's reading: each pod's last known counts (the next reading's baseline) and the
    increases this reading saw."""

    counts: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    increases: tuple[HookIncrease, ...] = ()
    unread: tuple[str, ...] = ()
    """Pods whose read failed this time (their last known counts stay the baseline)."""


def plan_failures(previous: FleetFailures | None, reads: Sequence[PodFailures]) -> FleetFailures:
    """The fleet's reading after ``reads``, given the one before.

    - A pod read before: each hook's increase since (a counter below its last value restarted
      with its worker: all of it is new).
    - A pod not read before (a new pod, or the operator's first reading): its counts are the
      baseline, no increase (as Prometheus' ``increase()`` skips a series' first sample).
    - A pod whose read failed keeps its last counts as its baseline and says nothing this time: a
      worker busy past the read's timeout is not a retention failure.
    - Pods no longer read (gone, not ready) are forgotten.
    """
    before = previous.counts if previous is not None else {}
    counts: dict[str, Mapping[str, int]] = {}
    increases: list[HookIncrease] = []
    unread: list[str] = []
    for read in sorted(reads, key=lambda r: r.pod):
        last = before.get(read.pod)
        if read.counts is None:
            unread.append(read.pod)
            if last is not None:
                counts[read.pod] = last
            continue
        counts[read.pod] = dict(read.counts)
        if last is None:
            continue
        for hook, now in sorted(read.counts.items()):
            was = last.get(hook, 0)
            grew = now - was if now >= was else now
            if grew > 0:
                increases.append(HookIncrease(read.pod, hook, grew))
    return FleetFailures(counts=counts, increases=tuple(increases), unread=tuple(unread))


def describe_increases(increases: Sequence[HookIncrease]) -> str:
    """``pod w-0: checkpoint 3 (KV left unretained); pod w-1: l3_put 1 (pages written unpinned)``."""
    what = {
        "unretained": "KV left unretained",
        "unpinned": "pages written unpinned",
        "last_agreed_time": "evicted by the last agreed time",
    }
    by_pod: dict[str, list[str]] = {}
    for inc in increases:
        fallback = what.get(FALLBACKS.get(inc.hook, ""), "fell back")
        by_pod.setdefault(inc.pod, []).append(f"{inc.hook} {inc.failures} ({fallback})")
    return "; ".join(f"pod {pod}: " + ", ".join(hooks) for pod, hooks in by_pod.items())


def metrics_url(pod_ip: str, *, port: int = METRICS_PORT) -> str:
    """A pod's metrics endpoint by IP (an IPv6 address in brackets)."""
    host = f"[{pod_ip}]" if ipaddress.ip_address(pod_ip).version == 6 else pod_ip
    return f"http://{host}:{port}/metrics"


def scrape_targets(pods: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(pod name, metrics URL) of each ready, live worker pod with an IP, in name order: a pod
    that is not ready may not serve yet, and its failures (if any) wait for it to be."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        ip = (pod.get("status") or {}).get("podIP")
        if meta.get("deletionTimestamp") or not ip or not is_pod_ready(pod):
            continue
        try:
            url = metrics_url(str(ip))
        except ValueError:
            continue
        out.append((str(meta.get("name", "?")), url))
    return sorted(out)
