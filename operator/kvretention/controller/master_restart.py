"""Pure: a restart of the managed Mooncake master, seen in its pods, and what it did to the pins
(``RetentionBudget`` ``PinsLost``, a Warning Event when it first says so).

The master keeps every object and soft pin in memory: when its process restarts (a crash, an OOM
kill, a failed liveness probe; the kubelet counts it in the container's ``restartCount``) all of
them are gone, and nothing else says so. The workers' retention plugin sees the same restart in the
master's ``/metrics`` and stops counting the lost pins against its budget; it pins a retained page
again only when SGLang writes the page again, which SGLang does only for a prefix it computes anew
(``docs/kv-store.md``). So the loss is reported for as long as a lost pin could have lived
(``softPin.maxTtlSeconds`` from the restart). A master *pod* replaced whole (deleted, evicted, its
node gone) starts with ``restartCount`` 0 and is not seen here; a rollout of a new template is
``KvStoreReady`` ``MasterRestarting``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvretention.controller.conditions import PINS_LOST, Verdict
from kvretention.controller.diagnosis import Workload, pods_of
from kvretention.controller.kvstore_metrics import format_time
from kvretention.controller.resources.common import COMPONENT_MOONCAKE


@dataclass(frozen=True)
class MasterRestart:
    """The latest restart of the master's container: the pins written before ``lost_at`` are gone."""

    pod: str
    restarts: int
    """The container's ``restartCount``."""
    lost_at: dt.datetime
    """When the process that held them ended (``lastState.terminated.finishedAt``; the current
    process's start when the kubelet no longer says)."""
    last_exit: str | None
    """``exit code 137 (OOMKilled)``: how the process ended, when the kubelet says."""


def _time(value: object) -> dt.datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.UTC)


def _restart_of(pod: Mapping[str, Any]) -> MasterRestart | None:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for container in statuses:
        if container.get("name") != COMPONENT_MOONCAKE:
            continue
        restarts = int(container.get("restartCount") or 0)
        if restarts <= 0:
            return None
        ended = (container.get("lastState") or {}).get("terminated") or {}
        started = (container.get("state") or {}).get("running") or {}
        lost_at = _time(ended.get("finishedAt")) or _time(started.get("startedAt"))
        if lost_at is None:
            return None
        exit_text = None
        if ended:
            exit_text = f"exit code {ended.get('exitCode', '?')}"
            if ended.get("reason"):
                exit_text += f" ({ended['reason']})"
        name = str((pod.get("metadata") or {}).get("name", "?"))
        return MasterRestart(pod=name, restarts=restarts, lost_at=lost_at, last_exit=exit_text)
    return None


def find_master_restart(
    master: Sequence[Workload], pods: Sequence[Mapping[str, Any]]
) -> MasterRestart | None:
    """The latest restart among the managed master's pods (None: none restarted, or no managed
    master)."""
    found = [r for w in master for p in pods_of(w, pods) if (r := _restart_of(p)) is not None]
    return max(found, key=lambda r: r.lost_at, default=None)


def check_pins_lost(
    budget: Verdict,
    restart: MasterRestart | None,
    *,
    now: dt.datetime,
    longest_pin_s: float | None,
) -> Verdict:
    """``RetentionBudget`` ``False``/``PinsLost`` from a master restart until the longest pin
    written before it would have ended; the budget's own verdict otherwise (and after)."""
    if restart is None or longest_pin_s is None:
        return budget
    until = restart.lost_at + dt.timedelta(seconds=longest_pin_s)
    if now >= until:
        return budget
    how = f", {restart.last_exit}" if restart.last_exit else ""
    return Verdict(
        "False",
        PINS_LOST,
        f"the Mooncake master restarted (pod {restart.pod}, restart {restart.restarts}{how}): "
        f"the objects and soft pins written before {format_time(restart.lost_at)} are lost; the "
        "workers stop counting them against the budget and pin a retained page again only when "
        "SGLang writes it again (a prefix it still holds in GPU or host memory is not), so "
        f"retained prefixes may be recomputed; said until {format_time(until)}, when every lost "
        f"pin would have ended; budget: {budget.reason}: {budget.message}",
    )
