"""When a server has taken a call: what a Hello's patience counts from.

A gRPC asyncio server takes the calls waiting for it one at a time, each a few turns of its event
loop: one busy with the streams it already carries (a relay, a controller, while a whole fleet
connects) takes a few tens a second. ``python -m bench.call_taken``: 2,000 streams opened at once on
a server whose loop is busy in steps of 5 ms waited 27.6 s (P50; 55.4 s at most) to be taken, then
0.02 s for their answer (idle: 0.24 s at most). An agent that counted its Hello's patience (10 s)
from when it wrote it gave up on calls only waiting their turn (1,632 of those 2,000), and
reconnected behind the same queue: at 100,000 agents, tens of thousands of streams more, each
costing both ends again.

So a Vigil server says it has taken a call (its initial metadata: ``say_taken``), and an agent
counts its Hello's patience from then (``taken``). The controller says it at once, before it reads
the Hello; a relay once it holds the Hello: on its own when it passes the Hello on, and with its
word to wait when it queues it for room at the controller (the metadata goes with that first
answer: one batch, where two cost a fleet connecting at once 15% of the relays' CPU), or, to an
agent that waits for a Hello the relay keeps, with that first Hello's answer
(``controller.relay.server.taken_said_at_once``). Until then the
server bounds the wait itself: gRPC ends a call not taken within ``UNREQUESTED_CALL_S``; the agent
waits ``TAKEN_PATIENCE_S`` for it, a bound for a server that says nothing at all. An older server
sends its metadata with its first answer: against it a Hello's patience is that bound.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc

from vigil_core.loop_lag import within
from vigil_core.tls import UNREQUESTED_CALL_S

TAKEN_PATIENCE_S = float(UNREQUESTED_CALL_S) + 30.0  # past the server's own bound: its end comes first


async def say_taken(context: grpc.aio.ServicerContext) -> None:
    """The server's side: the call is taken (its initial metadata, empty, sent now)."""
    await context.send_initial_metadata(())


async def taken(call: grpc.aio.Call, clock: Callable[[], float], bound_s: float = TAKEN_PATIENCE_S) -> None:
    """The agent's side: once the server has taken ``call`` (or ended it: its status says why, on
    the next read); TimeoutError past ``bound_s`` on ``clock`` (the agent's own time)."""
    await within(call.initial_metadata(), bound_s, clock)
