"""Leader election's pure decisions: who may take the Lease, and what the record says after."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from kvretention.controller.leader import build_lease_spec, can_acquire, micro_time

NOW = dt.datetime(2025, 1, 1, 12, 0, 0, 123456, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("spec", "unchanged_for", "expected"),
    [
        ({}, 0.0, True),  # a brand-new Lease
        ({"holderIdentity": ""}, 0.0, True),  # released by a clean shutdown
        ({"holderIdentity": "me", "leaseDurationSeconds": 15}, 0.0, True),  # renewing our own
        ({"holderIdentity": "other", "leaseDurationSeconds": 15}, 14.9, False),  # held
        ({"holderIdentity": "other", "leaseDurationSeconds": 15}, 15.0, True),  # expired
        ({"holderIdentity": "other"}, 0.0, True),  # no duration: nothing to honour
    ],
)
def test_can_acquire(spec: dict[str, Any], unchanged_for: float, expected: bool) -> None:
    assert can_acquire(spec, identity="me", unchanged_for_s=unchanged_for) is expected


def test_first_acquire_records_holder_and_times() -> None:
    spec = build_lease_spec(None, identity="me", now=NOW, duration_s=15)
    assert spec == {
        "holderIdentity": "me",
        "leaseDurationSeconds": 15,
        "acquireTime": "2025-01-01T12:00:00.123456Z",
        "renewTime": "2025-01-01T12:00:00.123456Z",
        "leaseTransitions": 0,
    }


def test_renewal_keeps_acquire_time_and_takeover_counts_a_transition() -> None:
    held = build_lease_spec(None, identity="me", now=NOW, duration_s=15)
    later = NOW + dt.timedelta(seconds=2)
    renewed = build_lease_spec(held, identity="me", now=later, duration_s=15)
    assert renewed["acquireTime"] == held["acquireTime"]
    assert renewed["renewTime"] == micro_time(later)
    assert renewed["leaseTransitions"] == 0
    taken = build_lease_spec(renewed, identity="you", now=later, duration_s=15)
    assert taken["holderIdentity"] == "you"
    assert taken["acquireTime"] == micro_time(later)
    assert taken["leaseTransitions"] == 1
