"""Where requests are rendered and tokenized: a bounded set of threads, shared fairly by tenants.

Preparing a prompt is CPU work (a ~3 MB prompt: seconds), so it runs off the event loop. On one
thread, one tenant's huge prompt held up every other tenant's small request for as long as it
took; here ``threads`` requests are prepared at once. That helps because the expensive step, the
Hugging Face tokenizer's ``encode``, runs in Rust with the GIL released (measured on a 3 MB
prompt: ~75% of the planning time; decoding and rendering take tens of milliseconds). A process
pool would also spare the GIL-held remainder (turning 3M token offsets into Python objects), but
it would move every prompt and its tokens between processes and split the render cache, which
must see each conversation's previous prompt. The threads share the tokenizer (tokenizers 0.23
takes concurrent calls: four threads encoding at once, with truncation switched on and off
between calls, raised no "Already borrowed") and the render cache (locked).

Fair between tenants: waiting requests are queued per tenant and started round-robin, and one
tenant holds at most ``threads - 1`` threads at once, so a burst of huge prompts from one tenant
leaves a thread for everyone else. A tenant's own requests start in the order they arrived.
Requests that name no tenant (auth off: one client population) share all the threads.

Bounded in memory too: the bodies being prepared at once add up to at most ``max_bytes`` (a
request that does not fit waits for others to finish; one alone always runs), since each holds
its prompt's tokens and offsets (~100 bytes a token) while it is prepared.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, Generic, TypeVar

T = TypeVar("T")

DEFAULT_THREADS: Final = 4
"""Enough that a huge prompt never holds the only thread; few, because each thread may hold a
huge prompt's tokens and offsets while it works."""
MAX_BODY_BYTES: Final = 64 * 1024 * 1024
"""The largest request body the worker reads (aiohttp's ``client_max_size``: 413 past it)."""
DEFAULT_MAX_BYTES: Final = 2 * MAX_BODY_BYTES
"""Bodies in preparation at once: two of the largest, so one of them runs beside small ones."""
NO_TENANT: Final = ""
"""The queue of requests that name no tenant; not capped."""


@dataclass
class _Job(Generic[T]):
    tenant: str
    work: Callable[[], T]
    result: asyncio.Future[T]
    size: int


class PlanningPool:
    """Runs planning work on at most ``threads`` threads, round-robin between tenants.

    Used from one event loop: the queues are only touched on it, the work only on the threads."""

    def __init__(
        self, *, threads: int = DEFAULT_THREADS, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        if threads < 1:
            raise ValueError("a planning pool needs at least one thread")
        self.threads = threads
        self.per_tenant = max(1, threads - 1)
        """How many threads one named tenant may hold at once."""
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kvr-plan")
        self._waiting: OrderedDict[str, deque[_Job[Any]]] = OrderedDict()
        """Each tenant's queue, in the order tenants get their next turn."""
        self._running: dict[str, int] = {}
        self._busy = 0
        self.max_bytes = max_bytes
        self._bytes = 0
        """The sizes of the bodies being prepared, added up."""

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    @property
    def running(self) -> int:
        return self._busy

    async def run(self, work: Callable[[], T], *, tenant: str = NO_TENANT, size: int = 0) -> T:
        """``work()``'s result (or exception), computed on one of the pool's threads when the
        tenant's turn comes and ``size`` (its body's bytes) fits. Cancelled while queued, the work
        never runs."""
        result: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(tenant, deque()).append(_Job(tenant, work, result, size))
        self._start_next()
        return await result

    def shutdown(self) -> None:
        """Stop the threads once their current work is done; queued work never starts."""
        for queue in self._waiting.values():
            for job in queue:
                job.result.cancel()
        self._waiting.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _start_next(self) -> None:
        while self._busy < self.threads:
            job = self._next_job()
            if job is None:
                return
            self._busy += 1
            self._bytes += job.size
            self._running[job.tenant] = self._running.get(job.tenant, 0) + 1
            started = asyncio.get_running_loop().run_in_executor(self._executor, job.work)
            started.add_done_callback(partial(self._finished, job))

    def _next_job(self) -> _Job[Any] | None:
        """The first tenant in turn with work waiting that fits and a thread left to it; it
        goes last."""
        for tenant, queue in self._waiting.items():
            while queue and queue[0].result.cancelled():
                queue.popleft()
            if not queue:
                continue
            capped = tenant != NO_TENANT and self._running.get(tenant, 0) >= self.per_tenant
            fits = not self._busy or self._bytes + queue[0].size <= self.max_bytes
            if fits and not capped:
                job = queue.popleft()
                if queue:
                    self._waiting.move_to_end(tenant)
                else:
                    del self._waiting[tenant]
                return job
        for tenant in [t for t, q in self._waiting.items() if not q]:
            del self._waiting[tenant]
        return None

    def _finished(self, job: _Job[Any], done: asyncio.Future[Any]) -> None:
        self._busy -= 1
        self._bytes -= job.size
        self._running[job.tenant] -= 1
        if not self._running[job.tenant]:
            del self._running[job.tenant]
        error = None if done.cancelled() else done.exception()  # retrieved even when unwanted
        if not job.result.done():  # not cancelled meanwhile (the client went away)
            if done.cancelled():
                job.result.cancel()
            elif error is not None:
                job.result.set_exception(error)
            else:
                job.result.set_result(done.result())
        self._start_next()
