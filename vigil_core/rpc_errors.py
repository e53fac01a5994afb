"""A failed call to the controller in words a person can act on. Pure.

gRPC's own text names the transport's symptom ("Socket closed", "WRONG_VERSION_NUMBER"), not the
cause; these are the causes a client of Vigil meets: nobody listening, TLS on one side only, a
certificate the other side refuses, a call over the controller's rate, no answer in time.
"""

from __future__ import annotations

import grpc

TLS_HINT = "set VIGIL_TLS_DIR to this party's certificates (ca.crt, tls.crt, tls.key: vigil certs)"


def code_of(exc: grpc.RpcError) -> grpc.StatusCode | None:
    """The status of a failed call: a blocking call's error (a ``grpc.Call``) and an asyncio one
    (``grpc.aio.AioRpcError``, which is not a ``grpc.Call``) alike; None for neither."""
    code = getattr(exc, "code", None)
    return code() if callable(code) else None


def details_of(exc: grpc.RpcError) -> str:
    details = getattr(exc, "details", None)
    return (details() if callable(details) else None) or str(exc)


def is_refused(exc: grpc.RpcError) -> bool:
    """The controller answered and turned the call away (over its rate, too many jobs): not a lost
    connection, and worth trying again later."""
    return code_of(exc) is grpc.StatusCode.RESOURCE_EXHAUSTED


RETRY_AFTER_KEY = "vigil-retry-after-ms"  # trailing metadata of a call turned away: when to try again
MAX_RETRY_AFTER_S = 600.0  # a turn further away than this is not believed (a controller's bug, a foe)


def retry_after_s(exc: grpc.RpcError) -> float | None:
    """When the controller said to try again (a Hello turned away while a fleet reconnects:
    ``controller.edge.hello_pacing``), in seconds; None when it did not say, or said nonsense."""
    trailing = getattr(exc, "trailing_metadata", None)
    if code_of(exc) is not grpc.StatusCode.RESOURCE_EXHAUSTED or not callable(trailing):
        return None
    for key, value in trailing() or ():
        if key == RETRY_AFTER_KEY:
            try:
                seconds = int(value) / 1000
            except (TypeError, ValueError):
                return None
            return seconds if 0 <= seconds <= MAX_RETRY_AFTER_S else None
    return None


def explain(exc: grpc.RpcError, target: str) -> str:
    """``controller at HOST:PORT``: what happened, then what to do where that is known."""
    code, details = code_of(exc), details_of(exc)
    name = code.name if code is not None else "ERROR"
    text = f"the controller at {target}"
    if code is grpc.StatusCode.UNAVAILABLE:
        if "Socket closed" in details:
            why = "it may serve mutual TLS, and this client spoke plaintext"
            return f"{text} closed the connection at once: {why}; {TLS_HINT}"
        if "WRONG_VERSION_NUMBER" in details or "handshake" in details.lower():
            return (
                f"{text} did not complete a TLS handshake ({_last(details)}): it may serve plaintext "
                "(unset VIGIL_TLS_DIR), or refuse this certificate (not signed by its CA)"
            )
        if "Connection refused" in details or "connect" in details.lower():
            return f"{text} is not reachable ({_last(details)}): is it running, and is the address right?"
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        return f"{text} refused the call, over its limit: {details}"
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"{text} did not answer in time ({details})"
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return f"{text} refused this client ({name}): {details}"
    return f"{text} answered {name}: {details}"


def _last(details: str) -> str:
    """gRPC's last error, without its 'failed to connect to all addresses' preamble."""
    return details.split("last error: ", 1)[-1][:300]


_CODES = {code.value[0]: code for code in grpc.StatusCode}


def status_code(number: int) -> grpc.StatusCode:
    """A status code from its number on the wire (a relay's ``StreamEnd``); UNKNOWN for a number gRPC
    does not define."""
    return _CODES.get(number, grpc.StatusCode.UNKNOWN)
