"""The retention tier: SGLang's own radix caches on CPU with the plugin SGLang's loader found."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvretention.retention import radix
from support.sglang_radix import FakeClock, load_sglang


@pytest.fixture(scope="session", autouse=True)
def sglang_with_plugin() -> None:
    """SGLang's plugin loader, restricted to ours, run once for the session (as in a server)."""
    load_sglang("kvretention")


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeClock]:
    fake = FakeClock()
    monkeypatch.setattr(radix, "clock", fake)
    yield fake
