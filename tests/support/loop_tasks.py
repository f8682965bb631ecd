"""Record the tasks a block of code creates: kopf re-raises, when it stops, the exception of every
task in the loop that ended with one, so the operator's code must leave none."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def recording_tasks() -> Iterator[list[asyncio.Task[Any]]]:
    """Every task created in the running loop inside the block, in creation order."""
    loop = asyncio.get_running_loop()
    created: list[asyncio.Task[Any]] = []

    def record(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=loop, **kwargs)
        created.append(task)
        return task

    previous = loop.get_task_factory()
    loop.set_task_factory(record)
    try:
        yield created
    finally:
        loop.set_task_factory(previous)


def ended_with_exception(tasks: list[asyncio.Task[Any]]) -> list[asyncio.Task[Any]]:
    return [t for t in tasks if t.done() and not t.cancelled() and t.exception()]
