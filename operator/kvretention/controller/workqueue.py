"""The reconcile work queue: client-go's workqueue semantics (a key is queued once however many
events arrive, and never handed out twice at once) and the backoff of a failed reconcile."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Final, Generic, TypeVar

MAX_BACKOFF_S: Final = 60.0

K = TypeVar("K")


def backoff_delay(failures: int) -> float:
    """0.5 s, 1 s, 2 s, ... capped at a minute."""
    return float(min(MAX_BACKOFF_S, 0.5 * 2 ** max(0, failures - 1)))


@dataclass
class WorkQueue(Generic[K]):
    """A key is queued once, and never processed twice at once."""

    queue: asyncio.Queue[K] = field(default_factory=asyncio.Queue)
    dirty: set[K] = field(default_factory=set)
    processing: set[K] = field(default_factory=set)

    def add(self, key: K) -> None:
        if key in self.dirty:
            return
        self.dirty.add(key)
        if key not in self.processing:
            self.queue.put_nowait(key)

    def add_after(self, key: K, delay: float) -> None:
        asyncio.get_running_loop().call_later(delay, self.add, key)

    async def get(self) -> K:
        key = await self.queue.get()
        self.dirty.discard(key)
        self.processing.add(key)
        return key

    def done(self, key: K) -> None:
        self.processing.discard(key)
        if key in self.dirty:
            self.queue.put_nowait(key)
