"""Bytes that are not the message a method takes get INVALID_ARGUMENT, named, over real gRPC; the
server keeps serving (gRPC alone answers UNKNOWN, as if the server had broken)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from protos.vigil.v1 import admin_pb2, admin_pb2_grpc
from tests.helpers import start_controller, stop_controller

GARBAGE = b"\xff\xff\xff\xff\x0f"  # a varint that never ends


@pytest.mark.parametrize(
    "method", ["/vigil.v1.TrainerGateway/Report", "/vigil.v1.Admin/GetStatus", "/vigil.v1.Admin/Sweep"]
)
def test_undecodable_unary_requests_are_invalid_argument(tmp_path: Path, method: str) -> None:
    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.port}") as channel:
            raw = {"request_serializer": lambda b: b, "response_deserializer": lambda b: b}
            call = (channel.unary_stream if method.endswith("Sweep") else channel.unary_unary)(method, **raw)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                answer = call(GARBAGE, timeout=10)
                if method.endswith("Sweep"):
                    [_ async for _ in answer]
                else:
                    await answer
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"the request to {method} is not a valid message" in str(err.value.details())
            status = await admin_pb2_grpc.AdminStub(channel).GetStatus(admin_pb2.StatusRequest(), timeout=10)
            assert status.automation  # still serving
        await stop_controller(controller)

    asyncio.run(scenario())


def test_an_undecodable_message_in_the_agents_stream_is_invalid_argument(tmp_path: Path) -> None:
    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.port}") as channel:
            call = channel.stream_stream(
                "/vigil.v1.AgentGateway/Connect", request_serializer=lambda b: b, response_deserializer=lambda b: b
            )()
            await call.write(GARBAGE)
            code, details = await asyncio.wait_for(call.code(), 10), await call.details()
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "AgentGateway/Connect is not a valid message" in details
        await stop_controller(controller)

    asyncio.run(scenario())
