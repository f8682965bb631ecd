"""An aiohttp app served on its own event loop in a daemon thread, so that synchronous tests (SDK
clients, subprocesses) in the test thread can drive processes that talk to it: the base of the
router stand-ins."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, Self, TypeVar

from aiohttp import web

T = TypeVar("T")


class ThreadedApp:
    """Subclasses build the app (:meth:`build_app`); ``start()``/``stop()`` or ``with``."""

    handler_cancellation = False
    """Cancel a handler when its client disconnects (as the real router's are)."""

    def __init__(self) -> None:
        self.base_url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    def build_app(self) -> web.Application:
        raise NotImplementedError

    def start(self) -> str:
        self._thread.start()
        self.base_url = self._run(self._start())
        return self.base_url

    async def _start(self) -> str:
        self._runner = web.AppRunner(
            self.build_app(), handler_cancellation=self.handler_cancellation, shutdown_timeout=0.5
        )
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        return f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    def stop(self) -> None:
        if self._runner is not None:
            self._run(self._runner.cleanup())
        self._run(_cancel_others())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)


async def _cancel_others() -> None:
    """Cancel handlers still waiting (a ``[[hang]]``, a held stream) so the loop closes cleanly."""
    current = asyncio.current_task()
    pending = [t for t in asyncio.all_tasks() if t is not current]
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
