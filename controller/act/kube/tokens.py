"""The API server's review of an agent's token (``controller.act.agent_tokens`` says what is accepted)."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable

import structlog
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from controller.act.agent_tokens import AgentTokensConfig, ReviewUnavailable, node_of
from vigil_core.tls import Identity

log = structlog.get_logger(__name__)

MAX_CACHED = 10_000


class TokenReviewer:
    """Which node a token speaks for, by the API server's word. Blocking: call it from a thread."""

    def __init__(
        self, api: client.ApiClient, config: AgentTokensConfig, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._api = client.AuthenticationV1Api(api)
        self._config = config
        self._clock = clock
        self._cache: dict[str, tuple[float, str]] = {}
        self._lock = threading.Lock()

    @property
    def recheck_s(self) -> float:
        """How often a token is reviewed again on a stream already open (a revoked one is refused then)."""
        return max(5.0, self._config.cache_s)

    def review(self, token: str) -> Identity | str:
        """The token's node identity, or why it is refused. Raises ReviewUnavailable when the API
        server cannot be asked."""
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        with self._lock:
            cached = self._cache.get(key)
        if cached is not None and cached[0] > now:
            return Identity("node", cached[1])
        body = client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token, audiences=[self._config.audience]))
        try:
            reply = self._api.create_token_review(body, _request_timeout=10)
        except ApiException as exc:
            log.error("token_review_failed", status=exc.status, reason=exc.reason)
            why = f"the controller cannot review tokens: the API server answered {exc.status} {exc.reason}"
            raise ReviewUnavailable(why) from None
        except urllib3.exceptions.HTTPError as exc:
            log.error("token_review_failed", error=str(exc))
            why = f"the controller cannot review tokens: the API server is unreachable: {exc}"
            raise ReviewUnavailable(why) from None
        status = self._api.api_client.sanitize_for_serialization(reply.status) if reply.status else {}
        node, why = node_of(status, self._config)
        if why:
            return why
        with self._lock:
            if len(self._cache) >= MAX_CACHED:
                self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
            if len(self._cache) < MAX_CACHED:
                self._cache[key] = (now + self._config.cache_s, node)
        return Identity("node", node)
