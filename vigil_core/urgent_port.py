"""The urgent port: a second port on a controller or a relay that takes only the calls of agents
with faults waiting in their spool.

A gRPC asyncio server takes the calls waiting for it one at a time, in the order they came
(``vigil_core.call_taken``): while a whole fleet connects at once (a relay or a controller
restarted, a relay gone and its agents moving to the others) an agent whose node has just failed
waits for its turn behind every agent that came before it, tens of seconds at 100,000 nodes, before
its Hello is even read; the relays' room calls it first only once it is taken. A second server in
the same process takes its own calls beside the first's: ``python -m bench.call_taken --door 20``
measures the two side by side. So each server can open an urgent port too (the controller's
``urgent_port``, a relay's ``--urgent-listen``), and an agent configured with it
(``urgent_controller``) dials it for a session whose Hello has faults to say
(``Hello.urgent_waiting``), and the main port otherwise.

The port is no second way in for the rest of the fleet: a call whose first Hello says no fault
waits is refused there (FAILED_PRECONDITION, ``refusal``), and its agent goes to the main port at
once. A session through it is then like any other: its stream is kept when the agent's spool is
empty again. An agent that cannot reach it (no such port, a refusal, a session that never got its
Ack) uses the main port for ``CLOSED_FOR_S`` before it tries it again.
"""

from __future__ import annotations

CLOSED_FOR_S = 60.0  # an urgent port not reached: the main port for this long

REFUSED = (
    "this is the urgent port: it takes only agents whose Hello says faults wait in their spool "
    "(urgent_waiting); connect to the main port"
)


def refusal(urgent_waiting: int) -> str:
    """Why the urgent port refuses a call whose first Hello says ``urgent_waiting`` faults wait; ""
    when it takes it. Pure."""
    return "" if urgent_waiting > 0 else REFUSED
