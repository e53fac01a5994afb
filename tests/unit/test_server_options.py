"""A Vigil gRPC server's room for calls waiting to be taken, and for how long
(``vigil_core.tls.server_options``).
"""

from __future__ import annotations

import asyncio
import resource

import grpc
from hypothesis import given
from hypothesis import strategies as st

from agent.link import HELLO_PATIENCE_DOUBLINGS, hello_patience_s
from vigil_core.tls import MAX_CHANNEL_INT, UNREQUESTED_CALL_S, aio_channel_options, server_options

BOUNDS = ("grpc.server.max_pending_requests", "grpc.server.max_pending_requests_hard_limit")


@given(st.integers(min_value=-(2**63), max_value=2**63))
def test_both_of_grpcs_bounds_get_the_count_within_what_grpc_takes(waiting: int) -> None:
    options = dict(server_options(1 << 20, 1 << 20, waiting))
    expected = waiting if 0 <= waiting <= MAX_CHANNEL_INT else MAX_CHANNEL_INT
    assert [options[bound] for bound in BOUNDS] == [expected, expected]


def test_a_server_starts_with_an_unlimited_open_file_limit_as_its_count() -> None:
    """A relay passes its open-file limit, which reads -1 where it is unlimited."""

    async def serve() -> None:
        server = grpc.aio.server(options=server_options(1 << 20, 1 << 20, resource.RLIM_INFINITY))
        assert server.add_insecure_port("127.0.0.1:0") > 0
        await server.start()
        await server.stop(None)

    asyncio.run(serve())


def test_a_call_waits_for_the_server_longer_than_an_agent_waits_for_its_hello() -> None:
    """gRPC's 30 s for a call not yet taken is the server's own lateness; Vigil's is past an
    agent's longest wait for the answer to its Hello, so the agent's patience decides."""
    options = dict(server_options(1 << 20, 1 << 20, 10))
    assert options["grpc.server_max_unrequested_time_in_server"] == UNREQUESTED_CALL_S
    assert UNREQUESTED_CALL_S > hello_patience_s(HELLO_PATIENCE_DOUBLINGS) > 30


def test_only_a_server_of_agents_streams_alone_goes_without_grpcs_bdp_probe() -> None:
    """A relay's servers carry small messages only; the controller's takes the relays' batches too,
    whose windows grow with the probe (without it a late controller held the faults behind them)."""
    relay = dict(server_options(1 << 20, 1 << 20, 10, agents_only=True))
    controller = dict(server_options(1 << 20, 1 << 20, 10))
    assert relay["grpc.http2.bdp_probe"] == 0
    assert "grpc.http2.bdp_probe" not in controller  # gRPC's default: on


def test_an_agents_channel_goes_without_the_probe_and_a_relays_uplink_keeps_it() -> None:
    """The two ends of what the relays carry: the agent's small messages, the relay's batches."""
    agent, uplink = dict(aio_channel_options()), dict(aio_channel_options(1 << 20))
    assert agent["grpc.http2.bdp_probe"] == 0
    assert "grpc.http2.bdp_probe" not in uplink  # gRPC's default: on
    assert uplink["grpc.max_receive_message_length"] == uplink["grpc.max_send_message_length"] == 1 << 20
