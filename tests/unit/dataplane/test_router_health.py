"""The router's ejection rule as a table: which evidence ejects a worker, and when it is kept."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from kvretention.dataplane.router.health import Evidence, HealthRecord, plan_health

HEALTHY = HealthRecord(healthy=True)


def run(
    evidence: Sequence[Evidence],
    *,
    served: Sequence[bool] = (),
    last_healthy: bool = False,
    start: HealthRecord = HEALTHY,
) -> tuple[HealthRecord, list[str | None], list[str | None]]:
    """Feed evidence in order; the final record, the ejections and the holds step by step."""
    record, ejected, held = start, [], []
    for i, seen in enumerate(evidence):
        step = plan_health(
            record,
            seen,
            served_since=served[i] if i < len(served) else False,
            last_healthy=last_healthy,
            eject_after=3,
        )
        record = step.record
        ejected.append(step.ejected)
        held.append(step.held)
    return record, ejected, held


@pytest.mark.parametrize(
    ("evidence", "served", "last_healthy", "healthy", "ejected_at"),
    [
        # decisive evidence: out at once, even the last worker
        (["refused"], [], True, False, 0),
        (["not_ready"], [], True, False, 0),
        (["broken"], [True], True, False, 0),  # answers seen do not excuse a dropped stream
        # slowness needs three in a row ...
        (["timeout", "timeout"], [], False, True, None),
        (["timeout", "timeout", "timeout"], [], False, False, 2),
        # ... a passing poll in between starts the count again ...
        (["timeout", "timeout", "ok", "timeout", "timeout"], [], False, True, None),
        # ... and so does a real request answered in between (passive evidence)
        (["timeout", "timeout", "timeout"], [False, False, True], False, True, None),
        (["timeout"] * 6, [False, True, False, True, False, True], False, True, None),
        # fail open: the last healthy worker is never ejected for slowness
        (["timeout"] * 10, [], True, True, None),
        # other failures are not slowness: they eject the last worker too, after three
        (["error", "error", "error"], [], True, False, 2),
        (["timeout", "timeout", "error"], [], True, False, 2),
        (["error", "timeout", "timeout"], [], True, False, 2),
    ],
)
def test_plan_health(
    evidence: list[Evidence],
    served: list[bool],
    last_healthy: bool,
    healthy: bool,
    ejected_at: int | None,
) -> None:
    record, ejected, _ = run(evidence, served=served, last_healthy=last_healthy)
    assert record.healthy is healthy
    expected = [None] * len(evidence)
    if ejected_at is not None:
        expected[ejected_at] = evidence[ejected_at]
    assert ejected == expected


def test_why_a_failing_worker_is_kept() -> None:
    _, _, held = run(["timeout"] * 4, last_healthy=True)
    assert held == [None, None, "last_worker", "last_worker"]
    _, _, held = run(["timeout"], served=[True])
    assert held == ["serving"]


def test_one_passing_poll_readmits() -> None:
    out = HealthRecord(healthy=False, failures=7, slow_only=False)
    step = plan_health(out, "ok")
    assert step.admitted and step.record == HEALTHY
    assert not plan_health(HEALTHY, "ok").admitted


def test_an_ejected_worker_stays_out_until_a_poll_passes() -> None:
    record, ejected, _ = run(["refused", "timeout", "refused", "error"])
    assert not record.healthy
    assert ejected == ["refused", None, None, None]  # one ejection, counted once
