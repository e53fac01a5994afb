"""``vigil controller``: the gRPC server around the engine."""

from __future__ import annotations

import asyncio
import signal

import grpc
import structlog
from prometheus_client import start_http_server

from controller.actuators import ConsolePager, LocalActuator, NullPager, Pager
from controller.config import ControllerConfig
from controller.engine import Engine
from controller.policy import load_policy
from controller.server import Admin, AgentGateway
from controller.store import Store
from protos.vigil.v1 import admin_pb2_grpc, agent_pb2_grpc

log = structlog.get_logger(__name__)


class Controller:
    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        self.store = Store(config.database)
        pager: Pager = ConsolePager() if config.pager == "console" else NullPager()
        self.engine = Engine(self.store, load_policy(config.policy), LocalActuator(self.store), pager)
        self.gateway = AgentGateway(self.engine)
        self.server: grpc.aio.Server | None = None
        self.port = 0

    async def start(self) -> int:
        self.server = grpc.aio.server()
        agent_pb2_grpc.add_AgentGatewayServicer_to_server(self.gateway, self.server)
        admin_pb2_grpc.add_AdminServicer_to_server(Admin(self.engine), self.server)
        address = f"{self.config.listen}:{self.config.port}"
        try:
            self.port = self.server.add_insecure_port(address)
        except RuntimeError as exc:  # grpcio reports a failed bind this way
            raise OSError(f"cannot listen on {address}: {exc}") from None
        if self.port == 0:
            raise OSError(f"cannot listen on {address}")
        await self.server.start()
        if self.config.metrics_port is not None:
            start_http_server(self.config.metrics_port, registry=self.engine.metrics.registry)
        self.engine.resume_pending()
        if self.config.port_file is not None:
            tmp = self.config.port_file.with_suffix(".tmp")
            tmp.write_text(str(self.port))
            tmp.replace(self.config.port_file)
        log.info("controller_started", port=self.port, nodes=len(self.engine.nodes), database=str(self.config.database))
        return self.port

    async def run(self, stop: asyncio.Event) -> None:
        await self.start()
        watcher = asyncio.create_task(self.engine.watch(stop))
        await stop.wait()
        assert self.server is not None
        await self.server.stop(grace=1.0)
        await watcher
        await self.engine.shutdown()
        self.engine.persist_heartbeats()
        self.store.close()


def run_controller(config: ControllerConfig) -> None:
    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await Controller(config).run(stop)

    asyncio.run(main())
