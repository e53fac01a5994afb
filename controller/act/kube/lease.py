"""Leader election on a ``coordination.k8s.io/v1`` Lease, with the kubernetes client's own elector.

Two (or more) controller replicas run; the one holding the Lease is the leader and the only one
that serves agents and acts. A standby waits for the Lease to expire (``lease_duration_s`` after
the leader's last renewal), then takes it. A leader that cannot renew within ``renew_deadline_s``
stops leading: the controller then exits at once (Kubernetes restarts it as a standby), so two
replicas never act together for longer than the clock skew allows.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import structlog
from kubernetes import client
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

log = structlog.get_logger(__name__)


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
        lock = LeaseLock(name, namespace, identity)
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

    def _run(self) -> None:
        leaderelection.LeaderElection(self._config).run()

    def _started(self) -> None:
        log.info("leader_elected", identity=self.identity)
        self._on_started()  # returns at once: the library keeps renewing until it cannot

    def _stopped(self) -> None:
        log.error("leadership_lost", identity=self.identity)
        self._on_stopped()
