"""Calls that wait for a Vigil server's event loop are taken, not refused by gRPC.

A controller or a relay whose event loop is busy (a fleet connecting at once) leaves the new calls
waiting in gRPC's core. Past 1,000 waiting gRPC refuses some at random, past 3,000 every one (the
client reads CANCELLED, or INTERNAL while it is still sending: the simulated fleet's "broken"
streams); ``vigil_core.tls.server_options`` makes room for as many as the server may hold agents,
and lets each wait ``UNREQUESTED_CALL_S``, not gRPC's 30 s, before gRPC cancels it.
Real server and client processes on loopback: the client sends its calls while the server's loop is
held.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable

import grpc
import pytest

from vigil_core.tls import server_options

CALLS = 4_000  # past gRPC's own bound of 3,000 waiting calls
HOLD_S = 3.0  # how long the server's loop is held while the calls arrive

CLIENT = """
import asyncio, json, sys
from collections import Counter
import grpc

async def main(target: str, n: int) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        echo = channel.unary_unary("/vigil.test.Waiting/Echo")
        await echo(b"ready", timeout=30)  # the connection is up before the calls are sent

        async def one() -> str:
            try:
                await echo(b"x", timeout=60)
                return "OK"
            except grpc.aio.AioRpcError as exc:
                return f"{exc.code().name}: {exc.details()}"

        calls = [asyncio.ensure_future(one()) for _ in range(n)]
        print("sending", flush=True)
        print(json.dumps(Counter(await asyncio.gather(*calls))), flush=True)

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def _echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return request


def _handler() -> grpc.GenericRpcHandler:
    echo = grpc.unary_unary_rpc_method_handler(_echo)
    return grpc.method_handlers_generic_handler("vigil.test.Waiting", {"Echo": echo})


def _vigils() -> list[tuple[str, int]]:
    return server_options(1 << 20, 1 << 20, 100_000)


def _grpcs_defaults() -> list[tuple[str, int]]:
    return [(k, v) for k, v in _vigils() if not k.startswith("grpc.server.max_pending_requests")]


async def _calls_answered(options: list[tuple[str, int]], calls: int = CALLS) -> dict[str, int]:
    """Send ``calls`` calls to a server whose loop is held while they arrive; their outcomes, counted."""
    server = grpc.aio.server(options=options)
    server.add_generic_rpc_handlers((_handler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CLIENT, f"127.0.0.1:{port}", str(calls), stdout=asyncio.subprocess.PIPE
    )
    try:
        assert client.stdout is not None
        assert (await asyncio.wait_for(client.stdout.readline(), 30)).strip() == b"sending"
        time.sleep(HOLD_S)  # the server's loop held (busy): the client's calls wait in gRPC's core
        line = await asyncio.wait_for(client.stdout.readline(), 120)
        assert await client.wait() == 0
        return json.loads(line)
    finally:
        if client.returncode is None:
            client.kill()
        await server.stop(None)


@pytest.mark.parametrize(
    ("options", "refused"),
    [(_vigils, False), (_grpcs_defaults, True)],
    ids=["vigil-options-take-every-call", "grpc-defaults-refuse-some"],
)
def test_calls_waiting_for_a_busy_server_are_taken(options: Callable[[], list[tuple[str, int]]], refused: bool) -> None:
    """With Vigil's options every call is answered; with gRPC's defaults (the test's own check that
    the calls did wait) some are refused."""
    outcomes = asyncio.run(_calls_answered(options()))
    if refused:
        assert outcomes.get("OK", 0) < CALLS, f"the calls did not wait, so this shows nothing: {outcomes}"
    else:
        assert outcomes == {"OK": CALLS}, outcomes


def test_a_call_waits_for_the_servers_loop_as_long_as_vigil_says_not_grpcs_30_s() -> None:
    """gRPC's core cancels a call its server has not taken within
    ``grpc.server_max_unrequested_time_in_server`` (30 s by default): a server's own lateness ending
    its callers' calls. Vigil's servers give a call ``UNREQUESTED_CALL_S``; shown here with a bound of
    1 s against the loop held 3 s (the calls cancelled), then Vigil's (every call answered)."""
    short = asyncio.run(_calls_answered(server_options(1 << 20, 1 << 20, 100_000, unrequested_s=1), calls=200))
    assert short.get("OK", 0) < 200 and any(o.startswith("CANCELLED") for o in short), short
    assert asyncio.run(_calls_answered(_vigils(), calls=200)) == {"OK": 200}
