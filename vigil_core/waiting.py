"""Waiting on an asyncio event with a time limit, the way every loop in Vigil sleeps."""

from __future__ import annotations

import asyncio
import contextlib


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait until ``event`` is set or ``timeout`` seconds pass; True when the event was set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout=max(0.0, timeout))
    return event.is_set()
