"""An asyncio server on its own event loop in a daemon thread, so that synchronous code (the
kubernetes client, slack-sdk) and other processes can talk to it during a test."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, Self, TypeVar

T = TypeVar("T")


class ServerThread:
    what = "server"

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def serving(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Set up and listen on entry (recording the address), shut down on exit."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"the {self.what} did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the server's loop, from the test's thread."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        async with self.serving():
            self._ready.set()
            await self._stop.wait()
