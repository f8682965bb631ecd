"""The retention tier: SGLang's own radix caches on CPU with the plugin SGLang's loader found."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from kvretention.retention import radix
from support.sglang_radix import load_sglang


@pytest.fixture(scope="session", autouse=True)
def sglang_with_plugin() -> None:
    """SGLang's plugin loader, restricted to ours, run once for the session (as in a server)."""
    load_sglang("kvretention")


@dataclass
class FakeClock:
    """The wall clock holds are set and expire by, moved by hand: no sleeps, no timing."""

    now: float = 1_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeClock]:
    fake = FakeClock()
    monkeypatch.setattr(radix, "clock", fake)
    yield fake
