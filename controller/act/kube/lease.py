"""Leader election on a ``coordination.k8s.io/v1`` Lease, with the kubernetes client's own elector.

Two (or more) controller replicas run; the one holding the Lease is the leader and the only one
that serves agents and acts. A standby waits for the Lease to expire (``lease_duration_s`` after
the leader's last renewal), then takes it. A leader that cannot renew within ``renew_deadline_s``
stops leading: the controller then exits at once (Kubernetes restarts it as a standby), so two
replicas never act together for longer than the clock skew allows.

A replica that stops on purpose (SIGTERM: a rolling update, its node drained) hands the Lease back
once it has stopped acting (``release``): the Lease is left without a holder, which a standby (this
library's, or client-go's) takes at its next try, ``retry_period_s`` later, instead of waiting out
``lease_duration_s`` as it must for a leader that died. The kubernetes client's elector cannot
release; the lock here makes no request after the release, so its renewing thread cannot take
the Lease back in the moment before the process exits.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, cast

import structlog
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.leaderelectionrecord import LeaderElectionRecord
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

log = structlog.get_logger(__name__)

RELEASE_TIMEOUT_S = 3.0  # the release's one request: a stopping replica does not wait longer on the API server


class _Bounded:
    """An API object whose every request is bounded (``_request_timeout``) unless the call sets its own."""

    def __init__(self, api: object, timeout_s: float) -> None:
        self._api, self._timeout_s = api, timeout_s

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._api, name)
        if not callable(method):
            return method

        def bounded(*args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("_request_timeout", self._timeout_s)
            return method(*args, **kwargs)

        return bounded


class ReleasableLeaseLock(LeaseLock):
    """The library's Lease lock, with three changes. Any error of a read or a write is a failed try, as
    the API server's refusal is: the library's lock lets every other error (urllib3's where the API
    server is out of reach, the client's where an answer is no Lease) out of its thread, which then
    ends without saying the leadership is lost, a leader acting on while a standby takes the Lease.
    Every request is bounded (``request_timeout_s``): the library's have no timeout, so one the API
    server never answers (a connection half gone, packets dropped) held its thread past its renew
    deadline, a leader acting on for as long. And its requests stop once ``released`` (its writes
    under one lock with the release)."""

    def __init__(self, name: str, namespace: str, identity: str, request_timeout_s: float) -> None:
        super().__init__(name, namespace, identity)
        self.api_instance = cast(client.CoordinationV1Api, _Bounded(self.api_instance, request_timeout_s))
        self.guard = threading.Lock()
        self.released = False

    def get(self, name: str, namespace: str) -> tuple[bool, object]:
        if self.released:  # no more requests: this replica no longer takes the Lease
            return False, ApiException(status=0, reason="released")
        try:
            return super().get(name, namespace)  # type: ignore[no-any-return]
        except Exception as exc:  # out of reach, or an answer that is no Lease: a failed try, never the thread's end
            log.warning("lease_read_failed", error=repr(exc)[:300])
            return False, ApiException(status=0, reason=f"the Lease could not be read: {exc!r}"[:300])

    def create(self, name: str, namespace: str, election_record: LeaderElectionRecord) -> bool:
        return self._write(lambda: LeaseLock.create(self, name, namespace, election_record))

    def update(self, name: str, namespace: str, updated_record: LeaderElectionRecord) -> bool:
        return self._write(lambda: LeaseLock.update(self, name, namespace, updated_record))

    def _write(self, write: Callable[[], object]) -> bool:
        with self.guard:
            if self.released:
                return False
            try:
                return bool(write())
            except Exception as exc:  # as for a read: a failed try
                log.warning("lease_write_failed", error=repr(exc)[:300])
                return False


class LeaderElector:
    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        name: str,
        identity: str,
        on_started: Callable[[], None],
        on_stopped: Callable[[], None],
        lease_duration_s: int = 15,
        renew_deadline_s: int = 10,
        retry_period_s: int = 2,
    ) -> None:
        # The library's lock builds its API object from the default configuration.
        client.Configuration.set_default(api.configuration)
        logging.getLogger("leaderelection").setLevel(logging.WARNING)  # it logs every renewal at INFO
        # A request past the retry period is a failed try: the last one begun before the renew deadline
        # ends before the Lease does (15 s: the deadline 10 s, the last try begun within it 2 s at most).
        lock = self._lock = ReleasableLeaseLock(name, namespace, identity, request_timeout_s=retry_period_s)
        self._on_started = on_started
        self._on_stopped = on_stopped
        self._config = electionconfig.Config(
            lock, lease_duration_s, renew_deadline_s, retry_period_s, self._started, self._stopped
        )
        self.identity = identity
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)

    def start(self) -> None:
        log.info("leader_election_started", identity=self.identity)
        self._thread.start()

    def release(self) -> bool:
        """Stop taking or renewing the Lease; where this replica holds it, leave it without a holder
        (the read's resourceVersion guards the write: a Lease another replica took is left alone).
        True when it was handed back. Call it only once this replica no longer acts."""
        lock = self._lock
        with lock.guard:
            lock.released = True
            try:
                lease = lock.api_instance.read_namespaced_lease(
                    lock.name, lock.namespace, _request_timeout=RELEASE_TIMEOUT_S
                )
                if lease.spec is None or lease.spec.holder_identity != self.identity:
                    return False
                lease.spec.holder_identity = None
                lease.spec.lease_duration_seconds = 1
                lease.spec.renew_time = datetime.now(UTC)
                lock.api_instance.replace_namespaced_lease(
                    lock.name, lock.namespace, lease, _request_timeout=RELEASE_TIMEOUT_S
                )
            except Exception as exc:  # the standby waits the Lease out instead
                log.warning("lease_release_failed", identity=self.identity, error=str(exc))
                return False
        log.info("lease_released", identity=self.identity, lease=f"{lock.namespace}/{lock.name}")
        return True

    def _run(self) -> None:
        leaderelection.LeaderElection(self._config).run()

    def _started(self) -> None:
        log.info("leader_elected", identity=self.identity)
        self._on_started()  # returns at once: the library keeps renewing until it cannot

    def _stopped(self) -> None:
        log.error("leadership_lost", identity=self.identity)
        self._on_stopped()
