"""The worker's planning pool: bounded, round-robin between tenants, in order within one.

Each job blocks on its own ``threading.Event`` until the test lets it go, so what runs at once
is observed, not timed.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from kvretention.dataplane.worker.planning import PlanningPool


class Jobs:
    """Blocking jobs that note when they start; ``release(name)`` lets one finish."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self._lock = threading.Lock()
        self._gates: dict[str, threading.Event] = {}
        self.running = 0
        self.most = 0

    def job(self, name: str) -> Callable[[], str]:
        gate = self._gates.setdefault(name, threading.Event())

        def work() -> str:
            with self._lock:
                self.started.append(name)
                self.running += 1
                self.most = max(self.most, self.running)
            assert gate.wait(10), f"{name} was never released"
            with self._lock:
                self.running -= 1
            return name

        return work

    def release(self, *names: str) -> None:
        for name in names:
            self._gates[name].set()

    async def until_started(self, count: int) -> None:
        for _ in range(1000):
            if len(self.started) >= count:
                return
            await asyncio.sleep(0.005)
        raise AssertionError(f"only {self.started} started")


async def settle() -> None:
    """Let finished jobs' callbacks start the next ones."""
    for _ in range(5):
        await asyncio.sleep(0.01)


async def test_no_more_jobs_run_at_once_than_threads() -> None:
    pool, jobs = PlanningPool(threads=2), Jobs()
    names = [f"j{i}" for i in range(5)]
    tasks = [asyncio.create_task(pool.run(jobs.job(n), tenant=n)) for n in names]
    await jobs.until_started(2)
    await settle()
    assert len(jobs.started) == 2 and pool.waiting == 3
    jobs.release(*names)
    assert await asyncio.gather(*tasks) == names
    assert jobs.most == 2
    pool.shutdown()


async def test_one_tenant_leaves_a_thread_for_the_others() -> None:
    """Tenant a's burst holds at most ``threads - 1`` threads; b's request starts at once."""
    pool, jobs = PlanningPool(threads=3), Jobs()
    burst = [asyncio.create_task(pool.run(jobs.job(f"a{i}"), tenant="a")) for i in range(4)]
    await jobs.until_started(2)
    small = asyncio.create_task(pool.run(jobs.job("b0"), tenant="b"))
    await jobs.until_started(3)
    assert jobs.started == ["a0", "a1", "b0"]
    jobs.release("b0")
    assert await small == "b0"
    assert not any(t.done() for t in burst)
    jobs.release("a0", "a1", "a2", "a3")
    await asyncio.gather(*burst)
    assert jobs.started == ["a0", "a1", "b0", "a2", "a3"]
    pool.shutdown()


@pytest.mark.parametrize(
    ("submitted", "started"),
    [
        (["a0", "a1", "a2", "b0", "b1", "c0"], ["a0", "a1", "b0", "c0", "a2", "b1"]),
        (["a0", "b0", "b1", "b2", "a1"], ["a0", "b0", "a1", "b1", "b2"]),
        (["a0", "a1", "a2"], ["a0", "a1", "a2"]),
    ],
)
async def test_tenants_take_turns_and_each_keeps_its_order(
    submitted: list[str], started: list[str]
) -> None:
    """One thread: while the first job runs the rest queue up; then tenants take turns."""
    pool, jobs = PlanningPool(threads=1), Jobs()
    first = asyncio.create_task(pool.run(jobs.job(submitted[0]), tenant=submitted[0][0]))
    await jobs.until_started(1)
    rest = [asyncio.create_task(pool.run(jobs.job(n), tenant=n[0])) for n in submitted[1:]]
    await settle()
    jobs.release(*submitted)
    await asyncio.gather(first, *rest)
    assert jobs.started == started
    pool.shutdown()


async def test_a_failure_reaches_its_caller_and_the_pool_goes_on() -> None:
    pool = PlanningPool(threads=1)

    def fails() -> str:
        raise ValueError("bad request")

    with pytest.raises(ValueError, match="bad request"):
        await pool.run(fails, tenant="a")
    assert await pool.run(lambda: "next", tenant="a") == "next"
    pool.shutdown()


async def test_a_job_cancelled_while_queued_never_runs() -> None:
    pool, jobs = PlanningPool(threads=1), Jobs()
    first = asyncio.create_task(pool.run(jobs.job("a0"), tenant="a"))
    await jobs.until_started(1)
    gone = asyncio.create_task(pool.run(jobs.job("b0"), tenant="b"))
    after = asyncio.create_task(pool.run(jobs.job("c0"), tenant="c"))
    await settle()
    gone.cancel()
    jobs.release("a0", "b0", "c0")
    assert await first == "a0" and await after == "c0"
    assert jobs.started == ["a0", "c0"]
    assert gone.cancelled()
    pool.shutdown()


def test_a_pool_needs_a_thread() -> None:
    with pytest.raises(ValueError, match="at least one thread"):
        PlanningPool(threads=0)


async def test_requests_without_a_tenant_share_every_thread() -> None:
    """Auth off: no tenant to be fair to, so nothing is held back."""
    pool, jobs = PlanningPool(threads=3), Jobs()
    tasks = [asyncio.create_task(pool.run(jobs.job(f"r{i}"))) for i in range(3)]
    await jobs.until_started(3)
    jobs.release("r0", "r1", "r2")
    await asyncio.gather(*tasks)
    assert jobs.most == 3
    pool.shutdown()


async def test_bodies_prepared_at_once_stay_within_the_byte_budget() -> None:
    """A body that does not fit beside those running waits (smaller ones may go first); one
    alone always runs, however large."""
    pool, jobs = PlanningPool(threads=4, max_bytes=100), Jobs()
    big = asyncio.create_task(pool.run(jobs.job("a0"), tenant="a", size=80))
    await jobs.until_started(1)
    waits = asyncio.create_task(pool.run(jobs.job("b0"), tenant="b", size=50))
    small = asyncio.create_task(pool.run(jobs.job("c0"), tenant="c", size=10))
    await jobs.until_started(2)
    await settle()
    assert jobs.started == ["a0", "c0"]
    jobs.release("a0", "c0")
    await asyncio.gather(big, small)
    jobs.release("b0")
    await waits
    huge = asyncio.create_task(pool.run(jobs.job("d0"), tenant="d", size=500))
    jobs.release("d0")
    await huge
    assert jobs.started == ["a0", "c0", "b0", "d0"]
    pool.shutdown()
