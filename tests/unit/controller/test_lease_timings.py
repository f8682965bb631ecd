"""``--lease-duration-seconds``: the renew deadline and retry period scale with the lease."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from kvretention.controller.leader import DEFAULT_LEASE_DURATION_S, election_timings
from kvretention.controller.operator import OperatorConfig, operator_cmd


@pytest.mark.parametrize(
    ("duration", "renew_deadline", "retry"),
    [(15, 10.0, 2.0), (4, 8 / 3, 8 / 15), (2, 4 / 3, 4 / 15), (60, 40.0, 8.0)],
)
def test_timings_keep_client_gos_ratio(duration: int, renew_deadline: float, retry: float) -> None:
    got = election_timings(duration)
    assert got == pytest.approx((renew_deadline, retry))
    # The leader gives up before a standby may take over, and retries several times first.
    assert got[1] * 3 < got[0] < duration


def test_the_default_is_client_gos() -> None:
    assert DEFAULT_LEASE_DURATION_S == 15
    assert OperatorConfig().lease_duration_seconds == 15


@pytest.mark.parametrize("value", ["1", "0", "-3", "abc", "3601"])
def test_out_of_range_lease_durations_are_usage_errors(value: str) -> None:
    result = CliRunner().invoke(operator_cmd, [f"--lease-duration-seconds={value}"])
    assert result.exit_code == 2
    assert "--lease-duration-seconds" in result.output


def test_the_flag_is_documented_in_help() -> None:
    result = CliRunner().invoke(operator_cmd, ["--help"])
    assert result.exit_code == 0
    assert "--lease-duration-seconds" in result.output
