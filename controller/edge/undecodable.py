"""Bytes that are not the message they claim to be: INVALID_ARGUMENT, named, not UNKNOWN.

gRPC turns a request its deserializer cannot parse into UNKNOWN ("Unexpected DecodeError"), which
says "the server broke" where the client sent garbage. This interceptor gives every method a
deserializer that returns an ``Undecodable`` marker instead of raising, and aborts the call with
INVALID_ARGUMENT when one reaches the method (a unary request, or any message of a stream).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import structlog
from google.protobuf.message import DecodeError

from controller.edge.interceptors import WrappingInterceptor

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Undecodable:
    type_name: str
    error: str


def tolerant(deserializer: Callable[[bytes], Any] | None, method: str) -> Callable[[bytes], Any] | None:
    """The deserializer, returning ``Undecodable`` where it would raise."""
    if deserializer is None:
        return None
    parse = deserializer

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError as exc:
            return Undecodable(method, str(exc))

    return deserialize


async def refuse(context: grpc.aio.ServicerContext, bad: Undecodable) -> None:
    why = f"the request to {bad.type_name} is not a valid message: {bad.error}"
    log.warning("undecodable_request", peer=context.peer(), why=why)
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, why)


async def _checked(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
    async for request in requests:
        if isinstance(request, Undecodable):
            await refuse(context, request)
        yield request


class DecodeInterceptor(WrappingInterceptor):
    def wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        return _decoded(handler, method)


def _decoded(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    codec: dict[str, Any] = {
        "request_deserializer": tolerant(handler.request_deserializer, method),
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary:
        unary = handler.unary_unary

        async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, Undecodable):
                await refuse(context, request)
            return await unary(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, **codec)
    if handler.unary_stream:
        unary_stream = handler.unary_stream

        async def one_to_many(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if isinstance(request, Undecodable):
                await refuse(context, request)
            async for reply in unary_stream(request, context):
                yield reply

        return grpc.unary_stream_rpc_method_handler(one_to_many, **codec)
    if handler.stream_stream:
        stream_stream = handler.stream_stream

        async def many_to_many(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async for reply in stream_stream(_checked(requests, context), context):
                yield reply

        return grpc.stream_stream_rpc_method_handler(many_to_many, **codec)
    raise TypeError(f"{method}: a client-streaming method is not wrapped")  # Vigil has none
