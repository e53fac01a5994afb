"""The HTTP port of a resident process: Prometheus's ``/metrics``, ``/readyz`` for the readiness
probe (200 ``ok``; 503 with what is wrong, one problem a line: a background task down, a database
that takes no writes, a replica that does not lead), and ``/livez`` for the liveness probe, the same
way (an event loop stuck in one step: ``vigil_core.loop_lag.stuck``). Served from a thread of its
own, so a stuck loop is seen from outside it."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        """Scrapes and probes are not worth a line each on stderr."""


def readiness_app(
    registry: CollectorRegistry, problems: Callable[[], list[str]], alive: Callable[[], list[str]]
) -> Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]:
    metrics = make_wsgi_app(registry)
    probes = {"/readyz": problems, "/livez": alive}

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        probe = probes.get(environ.get("PATH_INFO", ""))
        if probe is None:
            return metrics(environ, start_response)  # type: ignore[no-any-return]
        found = probe()
        body = ("\n".join(found) if found else "ok").encode() + b"\n"
        status = "503 Service Unavailable" if found else "200 OK"
        start_response(status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))])
        return [body]

    return app


def serve_http(
    address: str,
    port: int,
    registry: CollectorRegistry,
    problems: Callable[[], list[str]],
    alive: Callable[[], list[str]],
) -> WSGIServer:
    """Serve ``/metrics``, ``/readyz`` (``problems``) and ``/livez`` (``alive``'s problems) on
    ``address:port`` (port 0: any free one) in a daemon thread."""

    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in address else socket.AF_INET

    httpd = make_server(address, port, readiness_app(registry, problems, alive), Server, handler_class=_Quiet)
    threading.Thread(target=httpd.serve_forever, name="vigil-http", daemon=True).start()
    return httpd
