"""Who may call what, under mutual TLS (``vigil.tls``): one interceptor for every service.

- AgentGateway: ``node:`` certificates (and ``Connect`` lets a node speak only for itself);
- TrainerGateway: ``trainer:`` or ``admin:`` certificates;
- Admin: ``admin:`` certificates only.
A client without a certificate of the cluster's CA never gets this far: the handshake refuses it.
In plaintext (local use) the interceptor is not installed and nobody is checked.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import structlog

from vigil.tls import Identity, peer_identity

log = structlog.get_logger(__name__)

ROLES_BY_SERVICE: dict[str, tuple[str, ...]] = {
    "vigil.v1.AgentGateway": ("node",),
    "vigil.v1.TrainerGateway": ("trainer", "admin"),
    "vigil.v1.Admin": ("admin",),
}


def allowed(service: str, who: Identity | None) -> str:
    """Why ``who`` may not call ``service``; "" when it may. Pure."""
    if who is None:
        return "the client certificate names no Vigil identity (node:NAME, admin:WHO, trainer:NAME)"
    roles = ROLES_BY_SERVICE.get(service, ())
    if who.role not in roles:
        return f"{who} may not call {service} (it takes {' or '.join(roles) or 'nobody'})"
    return ""


async def _require(service: str, context: grpc.aio.ServicerContext) -> None:
    why = allowed(service, peer_identity(context.auth_context()))
    if why:
        log.warning("call_refused", service=service, peer=context.peer(), why=why)
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, why)


class RoleInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None:
            return None
        return _guarded(handler, details.method.split("/")[1])


def _guarded(handler: grpc.RpcMethodHandler, service: str) -> grpc.RpcMethodHandler:
    """The same handler, checking the caller first."""
    codec: dict[str, Any] = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary:
        unary = handler.unary_unary

        async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await _require(service, context)
            return await unary(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, **codec)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(_streaming(service, handler.unary_stream), **codec)
    if handler.stream_stream:
        return grpc.stream_stream_rpc_method_handler(_streaming(service, handler.stream_stream), **codec)
    raise TypeError(f"{service}: a client-streaming method is not guarded")  # Vigil has none


def _streaming(service: str, inner: Callable[[Any, Any], AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    """A server-streaming method (its argument a request or the requests' iterator), checked first."""

    async def guarded(argument: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await _require(service, context)
        async for reply in inner(argument, context):
            yield reply

    return guarded
