"""Expected outcomes of the cache-control normalizers (the rows of docs/contract.md), shared by the
Anthropic and OpenAI hint tests: a refusal, no hint, a full-prompt TTL, or breakpoints."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from kvretention.hints import CacheControlError, ClientErrorCode, KvHintEnvelope


@dataclass(frozen=True)
class Err:
    code: ClientErrorCode
    param: str


def refusal(call: Callable[[], object], expected: Err) -> CacheControlError:
    """The CacheControlError ``call()`` raises, with ``expected``'s code and param."""
    with pytest.raises(CacheControlError) as info:
        call()
    assert (info.value.code, info.value.param) == (expected.code, expected.param)
    return info.value


@dataclass(frozen=True)
class Ok:
    """Full-prompt TTL (the automatic breakpoint), breakpoints as (the provider's path, TTL), and
    whether the client sent a control at all."""

    full: int | None = None
    breakpoints: tuple[tuple[str, int], ...] = ()
    controls: bool = True

    def wire(self) -> dict[str, Any]:
        """The envelope's wire form these hints make (``{}``: none)."""
        wire: dict[str, Any] = {}
        if self.full is not None:
            wire["retain_full_prompt"] = {"ttl_seconds": self.full}
        if self.breakpoints:
            wire["retain_prefixes"] = {"breakpoints": len(self.breakpoints)}
        return wire


def assert_full_prompt(envelope: KvHintEnvelope | None, ttl: int | None) -> None:
    """No hint (``ttl`` None), or full-prompt retention for ``ttl`` seconds and nothing else."""
    if ttl is None:
        assert envelope is None
    else:
        assert envelope is not None
        assert envelope.to_wire() == {"retain_full_prompt": {"ttl_seconds": ttl}}
