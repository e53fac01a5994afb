"""Vigil's client channels reconnect as soon as the other side is back: gRPC's process-wide pool of
connections would otherwise hand a new channel the backoff of earlier failed attempts to the same
address (a relay reached a failed-over controller 9.6 s after it served)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc

from protos.vigil.v1 import relay_pb2, relay_pb2_grpc
from tests.helpers import free_port
from vigil_core.tls import aio_channel


async def _nothing() -> AsyncIterator[relay_pb2.RelayUp]:
    await asyncio.sleep(3600)
    yield relay_pb2.RelayUp()  # pragma: no cover


async def _reached(port: int) -> bool:
    """One try as the relay's uplink makes it: a fresh channel, a stream, its connection, closed."""
    async with aio_channel(f"127.0.0.1:{port}", None) as ch:
        call = relay_pb2_grpc.AgentRelayStub(ch).Relay(_nothing())
        try:
            await call.wait_for_connection()
            return True
        except grpc.aio.AioRpcError:
            return False
        finally:
            call.cancel()


async def _serve(port: int) -> grpc.aio.Server:
    async def relay(_requests: AsyncIterator[bytes], _context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        await asyncio.sleep(3600)
        yield b""  # pragma: no cover

    server = grpc.aio.server()
    handler = grpc.stream_stream_rpc_method_handler(relay)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("vigil.v1.AgentRelay", {"Relay": handler}),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server


def test_a_new_channel_reaches_a_peer_back_after_an_outage_on_its_first_try() -> None:
    async def scenario() -> tuple[int, bool]:
        port, failed = free_port(), 0
        began = time.monotonic()
        while time.monotonic() - began < 8.0:  # the peer down 8 s, tried again and again
            failed += not await _reached(port)
            await asyncio.sleep(0.2)
        server = await _serve(port)
        try:
            return failed, await _reached(port)
        finally:
            await server.stop(None)

    failed, first_try = asyncio.run(scenario())
    assert failed > 10 and first_try
