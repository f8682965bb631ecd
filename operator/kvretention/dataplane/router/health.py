"""Pure ejection decisions: when a worker leaves rotation, and when it comes back.

A busy worker is not a dead one. A coding agent's 200 KB prompt keeps a worker's CPU busy for
tens of milliseconds per request, and on a loaded node its ``/readyz`` can miss the poll's
timeout while it serves perfectly well. So the evidence is weighed by what it proves:

- **Decisive** (out at once): the worker says it is not ready (``/readyz`` 503, a ``draining``
  answer), nothing accepts the connection (refused: a process that is merely busy still has its
  kernel accept connections), or its connection dropped in the middle of an answer (broken: a
  busy process is slow, it does not hang up).
- **Ambiguous** (counted): a poll that timed out or failed otherwise.
  The worker leaves after ``eject_after`` of them in a row, and a real request it answered in
  between (passive evidence) wipes the count.
- **Fail open**: a worker whose only fault is slowness (timeouts) is never ejected while it is the
  last healthy worker of its pool: a slow answer beats a certain ``503 no_workers``.

One passing poll re-admits a worker and clears its count.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final, Literal

DEFAULT_EJECT_AFTER: Final = 3

Evidence = Literal["ok", "not_ready", "refused", "broken", "timeout", "error"]
"""What one poll or one real request showed about a worker."""
DECISIVE: Final[frozenset[Evidence]] = frozenset({"not_ready", "refused", "broken"})
SLOW: Final[frozenset[Evidence]] = frozenset({"timeout"})


@dataclass(frozen=True)
class HealthRecord:
    """A worker's standing: in rotation or not, and its failures in a row."""

    healthy: bool = False
    failures: int = 0
    slow_only: bool = True
    """Whether every failure in the current run was a timeout (slowness, not breakage)."""


@dataclass(frozen=True)
class HealthStep:
    """The record after one piece of evidence, and what changed."""

    record: HealthRecord
    ejected: str | None = None
    """The reason the worker left rotation now (``None``: it did not)."""
    admitted: bool = False
    held: str | None = None
    """Why a failing worker stays in rotation: ``serving`` or ``last_worker``."""


def plan_health(
    record: HealthRecord,
    evidence: Evidence,
    *,
    served_since: bool = False,
    last_healthy: bool = False,
    eject_after: int = DEFAULT_EJECT_AFTER,
) -> HealthStep:
    """Weigh one piece of evidence (see the module docstring).

    ``served_since``: a real request got an answer from the worker since the previous evidence.
    ``last_healthy``: no other worker of its pool is healthy now.
    """
    if evidence == "ok":
        return HealthStep(HealthRecord(healthy=True), admitted=not record.healthy)
    if evidence in DECISIVE:
        ejected = evidence if record.healthy else None
        return HealthStep(HealthRecord(failures=record.failures + 1, slow_only=False), ejected)
    if not record.healthy:
        return HealthStep(replace(record, failures=record.failures + 1))
    if served_since:
        # It answered a real request since the last look: busy, not gone.
        return HealthStep(HealthRecord(healthy=True), held="serving")
    failures = record.failures + 1
    slow_only = record.slow_only and evidence in SLOW
    kept = HealthRecord(healthy=True, failures=failures, slow_only=slow_only)
    if failures < eject_after:
        return HealthStep(kept)
    if slow_only and last_healthy:
        return HealthStep(kept, held="last_worker")
    return HealthStep(replace(kept, healthy=False), ejected=evidence)
