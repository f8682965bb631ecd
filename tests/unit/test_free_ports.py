"""Ports for the plane's and the tests' processes: distinct, free, and outside the ephemeral range
that outgoing connections take their source ports from (else a client can take one first)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from kvretention import ports


def _ephemeral_low() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def test_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    picked = ports.free_ports(50)
    assert len(set(picked)) == 50
    low = _ephemeral_low()
    assert all(ports.LOWEST <= p < low for p in picked), (low, picked)
    for port in picked:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_someone_listens_on_is_never_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        taken = busy.getsockname()[1]
        busy.listen()
        monkeypatch.setattr(ports, "_listen_range", lambda: range(taken, taken + 1002))
        monkeypatch.setattr(ports.random, "choice", lambda r: taken)
        # Every random pick is the busy port: after its tries it falls back to the kernel's.
        (port,) = ports.free_ports(1)
    assert port != taken


@pytest.mark.parametrize(
    ("content", "expected"),
    [("32768\t60999\n", range(11000, 32768)), ("40000 60999", range(11000, 40000)), ("", None)],
    ids=["linux-default", "raised", "unreadable"],
)
def test_the_range_follows_the_machines_ephemeral_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str, expected: range | None
) -> None:
    path = tmp_path / "ip_local_port_range"
    path.write_text(content)
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", path)
    assert ports._listen_range() == (expected or range(11000, 32768))
