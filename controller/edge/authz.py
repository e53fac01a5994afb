"""Who may call what, under mutual TLS (``vigil_core.tls``): one interceptor for every service.

- AgentGateway: ``node:`` certificates (and ``Connect`` lets a node speak only for itself);
- TrainerGateway: ``trainer:`` or ``admin:`` certificates;
- Admin: ``admin:`` certificates only;
- AgentRelay: ``relay:`` certificates (a relay checks its agents' certificates itself).
A client without a certificate of the cluster's CA never gets this far: the handshake refuses it.
The DaemonSet's shared ``agents`` certificate names no node: its calls must bring the pod's
service-account token, and the node the API server names for it is the caller
(``controller.act.agent_tokens``; refused where the controller does not take tokens). Handlers learn
who called from ``caller()``. In plaintext (local use) the interceptor is not installed and nobody
is checked.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import grpc
import structlog

from controller.act.agent_tokens import ReviewUnavailable
from controller.edge.interceptors import WrappingInterceptor
from vigil_core.loop_lag import loop_time, within
from vigil_core.tls import Identity, peer_identity

if TYPE_CHECKING:  # the kubernetes client is imported only where agents may bring tokens
    from controller.act.kube.tokens import TokenReviewer

log = structlog.get_logger(__name__)
AGENT_SERVICE = "vigil.v1.AgentGateway"
_CALLER: contextvars.ContextVar[Identity | None] = contextvars.ContextVar("vigil_caller", default=None)


def caller() -> Identity | None:
    """Who is making the call being handled: its certificate's or its token's identity; None in
    plaintext."""
    return _CALLER.get()


ROLES_BY_SERVICE: dict[str, tuple[str, ...]] = {
    AGENT_SERVICE: ("node",),
    "vigil.v1.TrainerGateway": ("trainer", "admin"),
    "vigil.v1.Admin": ("admin",),
    "vigil.v1.AgentRelay": ("relay",),
}


def allowed(service: str, who: Identity | None) -> str:
    """Why ``who`` may not call ``service``; "" when it may. Pure."""
    if who is None:
        return "the client certificate names no Vigil identity (node:NAME, admin:WHO, trainer:NAME, relay:NAME)"
    roles = ROLES_BY_SERVICE.get(service, ())
    if who.role not in roles:
        return f"{who} may not call {service} (it takes {' or '.join(roles) or 'nobody'})"
    return ""


def bearer(metadata: object) -> str:
    """The token of an ``authorization: Bearer`` header in a call's metadata; "" when none. Pure."""
    for key, value in metadata if isinstance(metadata, tuple | list) else ():
        if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
            return value.removeprefix("Bearer ").strip()
    return ""


async def _refuse(context: grpc.aio.ServicerContext, service: str, code: grpc.StatusCode, why: str) -> None:
    log.warning("call_refused", service=service, peer=context.peer(), why=why)
    await context.abort(code, why)


class TokenRefused(Exception):
    """A token that proves no node now: the status to end the call with, and why."""

    def __init__(self, code: grpc.StatusCode, why: str) -> None:
        super().__init__(why)
        self.code, self.why = code, why


async def token_node(tokens: TokenReviewer | None, token: str) -> Identity:
    """The node a shared-certificate agent's token proves (reviewed by the API server; a relay's
    agents' tokens too). Raises ``TokenRefused``."""
    if tokens is None:
        why = "the shared agents certificate needs agent_tokens enabled on the controller"
        raise TokenRefused(grpc.StatusCode.PERMISSION_DENIED, why)
    if not token:
        why = "the shared agents certificate needs the pod's service-account token (authorization: Bearer)"
        raise TokenRefused(grpc.StatusCode.UNAUTHENTICATED, why)
    try:
        reviewed = await asyncio.to_thread(tokens.review, token)  # the kubernetes client blocks
    except ReviewUnavailable as exc:  # neither accepted nor refused: the agent tries again
        raise TokenRefused(grpc.StatusCode.UNAVAILABLE, str(exc)) from None
    if isinstance(reviewed, str):
        raise TokenRefused(grpc.StatusCode.UNAUTHENTICATED, reviewed)
    return reviewed


async def token_still_proves(tokens: TokenReviewer, token: str, who: Identity) -> str | None:
    """A stream's token reviewed again: why it no longer proves ``who``; "" while it does; None when
    the API server cannot be asked now (neither: ask again next time)."""
    try:
        again = await asyncio.to_thread(tokens.review, token)
    except ReviewUnavailable:
        return None
    if again == who:
        return ""
    why = again if isinstance(again, str) else f"the token now speaks for {again}, not {who}"
    return f"token no longer accepted: {why}"


async def _require(service: str, context: grpc.aio.ServicerContext, tokens: TokenReviewer | None) -> None:
    who = peer_identity(context.auth_context())
    if who is not None and who.role == "agents" and service == AGENT_SERVICE:  # whose node, the token says
        try:
            who = await token_node(tokens, bearer(context.invocation_metadata()))
        except TokenRefused as refused:
            await _refuse(context, service, refused.code, refused.why)
    if why := allowed(service, who):
        await _refuse(context, service, grpc.StatusCode.PERMISSION_DENIED, why)
    _CALLER.set(who)


class RoleInterceptor(WrappingInterceptor):
    def __init__(
        self,
        tokens: TokenReviewer | None = None,
        first_message_s: float = 30.0,
        own_time: Callable[[], float] = loop_time,
    ) -> None:
        self.tokens = tokens
        self.first_message_s = first_message_s  # a stream's first message, awaited before the caller is judged
        self.own_time = own_time  # the clock it is awaited on: the controller's loop less its lateness

    def wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        return _guarded(handler, method.split("/")[1], self.tokens, self.first_message_s, self.own_time)


def _guarded(
    handler: grpc.RpcMethodHandler,
    service: str,
    tokens: TokenReviewer | None,
    first_message_s: float,
    own_time: Callable[[], float],
) -> grpc.RpcMethodHandler:
    """The same handler, checking the caller first."""
    codec: dict[str, Any] = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary:
        unary = handler.unary_unary

        async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await _require(service, context, tokens)
            return await unary(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, **codec)
    if handler.unary_stream:
        streaming = _streaming(service, handler.unary_stream, tokens, first_message_s, own_time)
        return grpc.unary_stream_rpc_method_handler(streaming, **codec)
    if handler.stream_stream:
        streaming = _streaming(service, handler.stream_stream, tokens, first_message_s, own_time)
        return grpc.stream_stream_rpc_method_handler(streaming, **codec)
    raise TypeError(f"{service}: a client-streaming method is not guarded")  # Vigil has none


def _streaming(
    service: str,
    inner: Callable[[Any, Any], AsyncIterator[Any]],
    tokens: TokenReviewer | None,
    first_message_s: float,
    own_time: Callable[[], float],
) -> Callable[..., AsyncIterator[Any]]:
    """A server-streaming method (its argument a request or the requests' iterator), checked first."""

    async def guarded(argument: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        if hasattr(argument, "__aiter__"):
            # A stream's first message is read before the caller is judged: refused at once, the
            # caller's first write could fail against the closing stream, and its client would then
            # report that failure (INTERNAL) instead of the refusal and its reason.
            try:
                argument = await _first_read(argument, first_message_s, own_time)
            except TimeoutError:
                why = f"no first message within {first_message_s:g} s of opening the stream"
                await _refuse(context, service, grpc.StatusCode.DEADLINE_EXCEEDED, why)
        await _require(service, context, tokens)
        who, token = caller(), bearer(context.invocation_metadata())
        if tokens is not None and token and who is not None and hasattr(argument, "__aiter__"):
            argument = _rechecked(argument, context, service, tokens, token, who)
        async for reply in inner(argument, context):
            yield reply

    return guarded


async def _first_read(requests: AsyncIterator[Any], wait_s: float, clock: Callable[[], float]) -> AsyncIterator[Any]:
    """The same messages, the first of them read now (within ``wait_s`` on ``clock``, else TimeoutError)."""
    iterator = aiter(requests)
    first = await within(anext(iterator, _NOTHING), wait_s, clock)

    async def replay() -> AsyncIterator[Any]:
        if first is not _NOTHING:
            yield first
        async for message in iterator:
            yield message

    return replay()


_NOTHING = object()  # a stream that ended before its first message


async def _rechecked(
    requests: AsyncIterator[Any],
    context: grpc.aio.ServicerContext,
    service: str,
    tokens: TokenReviewer,
    token: str,
    who: Identity,
) -> AsyncIterator[Any]:
    """A token-proven stream's messages, the token reviewed again every ``recheck_s``: one revoked
    (or now naming another node) ends the stream, UNAUTHENTICATED, at its next message."""
    reviewed_at = time.monotonic()
    async for message in requests:
        if time.monotonic() - reviewed_at >= tokens.recheck_s:
            why = await token_still_proves(tokens, token, who)
            if why is not None:
                reviewed_at = time.monotonic()
            if why:
                await _refuse(context, service, grpc.StatusCode.UNAUTHENTICATED, why)
        yield message
