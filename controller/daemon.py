"""``vigil controller``: the gRPC server around the engine, and the leader election around both.

With leader election on, a replica starts as a standby: it opens nothing but its metrics port
until it holds the Lease. Once leader, it adopts what an earlier leader left on the cluster
(quarantined nodes, Slack threads), resumes the actions its own store holds PENDING, then opens
the gRPC port; agents that tried the other replicas find it. A leader that loses the Lease exits
at once with status 1 (its actions stop with it; Kubernetes restarts it as a standby). A leader
told to stop (SIGTERM) stops serving and acting, closes its store, then hands the Lease back, so a
standby takes over within its retry period instead of the Lease's whole duration.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING

import grpc
import structlog

from controller.compose import Rooms, rooms
from controller.config import ControllerConfig
from controller.edge import open_files
from controller.edge.authz import RoleInterceptor
from controller.edge.undecodable import DecodeInterceptor
from controller.metrics import ControllerMetrics
from controller.nodes.engine import Engine
from controller.store import Opened, Store
from protos.vigil.v1 import admin_pb2_grpc, agent_pb2_grpc, relay_pb2_grpc, trainer_pb2_grpc
from vigil_core import gc_keeper, gc_young, switch_interval, thread_names
from vigil_core.cert_reload import CertificateSource, server_credentials
from vigil_core.http_status import serve_http
from vigil_core.loop_lag import stuck
from vigil_core.names import is_loopback
from vigil_core.supervise import supervise
from vigil_core.tls import bind, server_options
from vigil_core.waiting import wait_either, wait_event

if TYPE_CHECKING:
    from controller.act.actuators import Actuator
    from controller.act.kube.lease import LeaderElector
    from controller.act.kube.tokens import TokenReviewer
    from controller.nodes.adopt import Adoption

log = structlog.get_logger(__name__)

LOST_LEADERSHIP_EXIT = 1
RELEASE_WAIT_S = 5.0  # a stopping leader's wait to hand the Lease back; past it, the standby waits out the Lease


class Controller:
    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        self.store = Store(config.database, config.cluster_name)
        # Read now, so a standby replica refuses bad certificates at start and exports their expiry.
        self.tls = CertificateSource(config.tls_dir) if config.tls_dir is not None else None
        self._build(ControllerMetrics())
        if self.tls is not None:
            self.engine.metrics.certificate_expiry.set_function(self.tls.expires_at)
        if self.store.opened is Opened.EMPTY:  # its history is gone: loudly, once, and as a gauge
            log.error(
                "database_started_empty",
                database=self.store.db.where,
                why="the file was there with nothing in it: every incident, count and held action it had is gone",
            )
        self.engine.metrics.database_started_empty.set(1 if self.store.opened is Opened.EMPTY else 0)
        self.server: grpc.aio.Server | None = None
        self.urgent_server: grpc.aio.Server | None = None  # urgent_port's, when configured
        self.elector: LeaderElector | None = None
        self.adoption: Adoption | None = None  # a new leader's (leader election on)
        self.port = 0
        self.metrics_port: int | None = None

    def _build(self, metrics: ControllerMetrics, actuator: Actuator | None = None) -> None:
        """Every room, from what the store holds now (``controller.compose``)."""
        self.rooms: Rooms = rooms(self.config, self.store, metrics, actuator)
        self.nodes = self.rooms.nodes
        self.sweeper, self.jobs = self.rooms.sweeper, self.rooms.jobs

    @property
    def engine(self) -> Engine:
        return self.nodes.engine

    async def start(self) -> int:
        """Serve as the leader (or as the only replica)."""
        if self.config.leader_election.enabled and self.store.shared:
            # The database is shared with the replica that led before: what it wrote while this one
            # stood by (incidents, counts, the breaker's window, held actions) is read now. The actuator
            # is kept: its node watch, started with the standby, has the cluster's Nodes already (a
            # second would list them all again, and the first would watch on, unused).
            self._build(self.engine.metrics, self.nodes.runner.actuator)
        if self.config.leader_election.enabled:
            self.adoption = await self.nodes.adopter().at_leadership()
        tokens = self._token_reviewer()
        self.rooms.relay_gateway.tokens = tokens  # a relay's agents' tokens are reviewed here too
        size, limits = self.config.limits.max_message_bytes, self.config.limits
        roles = [RoleInterceptor(tokens, limits.first_message_s, self.nodes.lateness.own_time)] if self.tls else []

        def serving(port: int) -> tuple[grpc.aio.Server, int]:
            """A server listening on ``port``: undecodable bytes refused first (INVALID_ARGUMENT), then,
            under TLS, the caller's role; credentials of its own (each takes up renewed files itself)."""
            server = grpc.aio.server(
                interceptors=[DecodeInterceptor(), *roles],
                options=server_options(size, size, open_files.needed(limits.max_nodes)),
            )
            credentials = server_credentials(self.tls) if self.tls is not None else None
            return server, bind(server, f"{self.config.listen_address}:{port}", credentials)

        self.server, self.port = serving(self.config.port)
        agent_pb2_grpc.add_AgentGatewayServicer_to_server(self.rooms.agent_gateway, self.server)
        relay_pb2_grpc.add_AgentRelayServicer_to_server(self.rooms.relay_gateway, self.server)
        admin_pb2_grpc.add_AdminServicer_to_server(self.rooms.admin, self.server)
        trainer_pb2_grpc.add_TrainerGatewayServicer_to_server(self.rooms.trainer_gateway, self.server)
        if self.config.urgent_port is not None:
            # Agents with faults waiting only (vigil_core.urgent_port): a server of its own takes its
            # calls beside the main one's, not behind a fleet connecting at once.
            self.urgent_server, _ = serving(self.config.urgent_port)
            agent_pb2_grpc.add_AgentGatewayServicer_to_server(self.rooms.urgent_gateway, self.urgent_server)
        self._room_for_agents()
        self.engine.resume_pending()
        await self.server.start()
        if self.urgent_server is not None:
            await self.urgent_server.start()
        if self.config.port_file is not None:
            tmp = self.config.port_file.with_suffix(".tmp")
            tmp.write_text(str(self.port))
            tmp.replace(self.config.port_file)
        transport = "plaintext (local use only)"
        exposed = self.tls is None and not is_loopback(self.config.listen_address)
        self.engine.metrics.plaintext_exposed.set(1 if exposed else 0)
        if exposed:
            log.warning(
                "plaintext_on_a_network_address",
                listen=self.config.listen_address,
                detail="anyone who reaches this address can report faults and act as an operator: use tls_dir",
            )
        if self.tls is not None:
            transport = "mutual TLS" + (", agents' tokens" if tokens else "")
        log.info(
            "controller_started",
            port=self.port,
            urgent_port=self.config.urgent_port,
            metrics_port=self.metrics_port,
            nodes=len(self.engine.fleet),
            database=self.store.db.where,
            database_was=self.store.opened.value,
            automation=self.nodes.guard.automation,
            transport=transport,
        )
        return self.port

    def _room_for_agents(self) -> None:
        """One descriptor per connected agent: raise the open-file limit for ``limits.max_nodes`` of
        them, and say so where the system does not allow it (``controller.edge.open_files``)."""
        want = open_files.needed(self.config.limits.max_nodes)
        soft, hard = open_files.raise_open_files(want)
        self.engine.metrics.open_files_limit.set(soft)
        if soft < want:
            log.error(
                "open_files_limit_low",
                limit=soft,
                hard_limit=hard,
                needed=want,
                detail=f"about {max(0, soft - open_files.SPARE)} agents can connect, not limits.max_nodes "
                f"({self.config.limits.max_nodes}): raise the controller's open-file limit (LimitNOFILE, ulimit -n)",
            )

    def _token_reviewer(self) -> TokenReviewer | None:
        """Where agents may connect with a service-account token: the API server reviews them."""
        if not self.config.agent_tokens.enabled:
            return None
        from controller.act.kube.client import api_client
        from controller.act.kube.tokens import TokenReviewer

        k = self.config.kubernetes
        return TokenReviewer(api_client(k.kubeconfig, k.context), self.config.agent_tokens)

    def problems(self) -> list[str]:
        """Why this replica is not ready to serve (the readiness probe's 503); empty when it is."""
        if self.server is None:
            return ["not serving: a standby replica, or still starting"]
        return self.nodes.upkeep.problems()

    async def run(self, stop: asyncio.Event) -> None:
        if self.config.metrics_port is not None:
            # Read through self: a replica that becomes leader builds its engine (and metrics) again.
            self.http = serve_http(
                self.config.metrics_bind,
                self.config.metrics_port,
                self.engine.metrics.registry,
                self.problems,
                lambda: stuck(self.nodes.lateness),
            )
            self.metrics_port = self.http.server_port
        if self.config.leader_election.enabled and not await self._wait_for_leadership(stop):
            self.store.close()
            await self._release_lease()
            return
        await self.start()
        tasks = self.nodes.tasks
        watchers = [
            asyncio.create_task(supervise("engine", lambda: self.nodes.upkeep.watch(stop), stop, tasks)),
            asyncio.create_task(supervise("jobs", lambda: self.jobs.watch(stop), stop, tasks)),
            asyncio.create_task(supervise("repairs", lambda: self.rooms.repairs.watch(stop), stop, tasks)),
        ]
        lag, observe_lag = self.nodes.lateness, self.engine.metrics.loop_lag.observe  # never ends: cancelled below
        lateness = asyncio.create_task(supervise("loop-lag", lambda: lag.watch(observe_lag), stop, tasks))
        if self.adoption is not None and (watched := self.adoption.watched) is not None:
            watchers.append(asyncio.create_task(self._check_adoption(watched, stop)))
        if (drains := self.rooms.scheduler_drains) is not None:
            watchers.append(asyncio.create_task(supervise("scheduler-drains", lambda: drains.watch(stop), stop, tasks)))
        await stop.wait()
        assert self.server is not None
        if self.urgent_server is not None:
            await self.urgent_server.stop(grace=1.0)
        await self.server.stop(grace=1.0)
        await self.jobs.stop()
        await self.sweeper.stop()
        await asyncio.gather(*watchers)
        lateness.cancel()
        await self.engine.shutdown()
        self.rooms.relay_gateway.sessions.flush_lines()  # the agents' last tallied lines (direct or relayed)
        self.nodes.upkeep.flush_lines()
        self.store.close()
        await self._release_lease()  # last: nothing of this replica acts any more

    async def _check_adoption(self, watched: set[str], stop: asyncio.Event) -> None:
        """Read the cluster after an adoption from the node watch, until it has been read once
        (``controller.nodes.adopt``): an API server away is retried, the failure said and counted."""
        tasks = self.nodes.tasks
        while not stop.is_set():
            try:
                await self.nodes.adopter().check(watched)
            except Exception as exc:  # noqa: BLE001 (logged and counted, then tried again)
                await wait_event(stop, tasks.failed("adoption-check", exc))
            else:
                tasks.succeeded("adoption-check")
                return

    async def _release_lease(self) -> None:
        """Hand the Lease back, waiting at most ``RELEASE_WAIT_S`` (in a daemon thread: an API server
        that does not answer never holds the process, whose exit does not wait for the thread)."""
        if (elector := self.elector) is None:
            return
        released: concurrent.futures.Future[bool] = concurrent.futures.Future()

        def release() -> None:
            try:
                released.set_result(elector.release())
            except BaseException as exc:  # noqa: BLE001 (handed to the waiting loop)
                released.set_exception(exc)

        threading.Thread(target=release, name="lease-release", daemon=True).start()
        try:
            await asyncio.wait_for(asyncio.wrap_future(released), RELEASE_WAIT_S)
        except TimeoutError:
            log.warning("lease_release_failed", identity=elector.identity, error=f"no answer in {RELEASE_WAIT_S} s")

    async def _wait_for_leadership(self, stop: asyncio.Event) -> bool:
        from controller.act.kube.client import api_client
        from controller.act.kube.lease import LeaderElector

        loop = asyncio.get_running_loop()
        leading = asyncio.Event()
        le, k = self.config.leader_election, self.config.kubernetes

        def won() -> None:
            loop.call_soon_threadsafe(leading.set)

        def lost() -> None:
            # Stop acting now: another replica may already lead. No graceful drain of actions.
            log.error("exiting_after_losing_leadership", identity=le.identity)
            os._exit(LOST_LEADERSHIP_EXIT)

        elector = self.elector = LeaderElector(
            api_client(k.kubeconfig, k.context),
            le.namespace,
            le.lease_name,
            le.identity,
            on_started=won,
            on_stopped=lost,
            lease_duration_s=le.lease_duration_s,
            renew_deadline_s=le.renew_deadline_s,
            retry_period_s=le.retry_period_s,
        )
        elector.start()
        self.engine.metrics.leader.set(0)
        await wait_either(leading, stop)
        if leading.is_set():
            self.engine.metrics.leader.set(1)
        return leading.is_set()


def run_controller(config: ControllerConfig) -> None:
    gc_young.set_young(config.limits.gc_young_objects)  # process-wide: here, never in a test's process
    switch_interval.set_interval(config.limits.switch_interval_ms)  # likewise
    thread_names.mirror()  # likewise

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        controller = Controller(config)
        keeper = None
        if config.limits.gc_freeze:  # process-wide: here, never where a test runs a controller in its process
            sessions = lambda: controller.nodes.outboxes.sessions()  # noqa: E731 (read as the rooms are now)
            body = lambda: gc_keeper.keep(sessions, stop)  # noqa: E731
            keeper = asyncio.create_task(supervise("gc-keeper", body, stop, controller.nodes.tasks))
        await controller.run(stop)
        if keeper is not None:
            await keeper

    asyncio.run(main())
    # Everything is written and closed, the store last. Leave without the interpreter's teardown, which
    # frees every connected agent's objects one by one: 3.5 s of a 5.3 s stop with 20,000 agents through
    # relays (py-spy), while they wait for the next controller.
    log.info("controller_stopped")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
