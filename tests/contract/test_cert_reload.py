"""Renewed certificates taken up without a restart (``vigil_core.cert_reload``): a real controller and a
real agent on loopback, their certificate directories rewritten under them as the kubelet does
when cert-manager renews a secret, even to a new CA."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from structlog.testing import capture_logs

from controller.config import ControllerConfig
from controller.daemon import Controller
from protos.vigil.v1 import admin_pb2, admin_pb2_grpc
from tests.contract.test_mtls import certs, hello, relay_process
from tests.contract.test_relay_hello_room import metric
from tests.helpers import free_port, stop_controller
from vigil_core.cert_reload import not_after
from vigil_core.tls import CA_FILE, CERT_FILE, KEY_FILE, TlsError, TlsFiles

OK = grpc.StatusCode.OK


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three CAs' worth of certificates for the same parties: before renewal, after, and a stranger's."""
    root = tmp_path_factory.mktemp("renewal")
    for name, days in (("old", "30"), ("new", "90"), ("other", "90")):
        certs(root / name, "--nodes", "node-1", "--admin", "alice", "--relay", "127.0.0.1", "--days", days)
    return root


def creds(clusters: Path, cluster: str, party: str) -> grpc.ChannelCredentials:
    return TlsFiles.load(clusters / cluster / party).channel_credentials()


def install(source: Path, live: Path, names: tuple[str, ...] = (CA_FILE, CERT_FILE, KEY_FILE)) -> None:
    """Each file replaced whole (a rename), as the kubelet swaps a secret's files."""
    live.mkdir(exist_ok=True)
    for name in names:
        shutil.copy(source / name, live / f".{name}.tmp")
        os.replace(live / f".{name}.tmp", live / name)


def controller_config(tmp_path: Path, live: Path, port: int = 0, db: str = "c.db") -> ControllerConfig:
    return ControllerConfig(listen="127.0.0.1", port=port, database=tmp_path / db, pager="none", tls_dir=live)


def test_the_controller_takes_a_renewed_certificate_and_ca_at_the_next_handshake(
    clusters: Path, tmp_path: Path
) -> None:
    live = tmp_path / "controller"
    install(clusters / "old" / "controller", live)

    async def scenario() -> None:
        controller = Controller(controller_config(tmp_path, live))
        target = f"127.0.0.1:{await controller.start()}"

        def expiry() -> float | None:  # what Prometheus would scrape
            name = "vigil_controller_certificate_expiry_timestamp_seconds"
            return controller.engine.metrics.registry.get_sample_value(name)

        def expiry_of(cluster: str) -> float:
            return not_after((clusters / cluster / "controller" / CERT_FILE).read_bytes())

        try:
            assert await hello(target, creds(clusters, "old", "node-node-1"), "node-1") is grpc.StatusCode.OK
            assert expiry() == expiry_of("old")
            install(clusters / "new" / "controller", live)
            assert await hello(target, creds(clusters, "new", "node-node-1"), "node-1") is grpc.StatusCode.OK
            assert expiry() == expiry_of("new") > expiry_of("old") + 50 * 86400
            # The old CA's parties are now strangers: the controller no longer trusts them, nor they it.
            assert await hello(target, creds(clusters, "old", "node-node-1"), "node-1") is grpc.StatusCode.UNAVAILABLE

            # Half-written: another run's key beside the new certificate. The last good files serve on,
            # and the refusal is logged once, not on every handshake.
            with capture_logs() as logs:
                install(clusters / "other" / "controller", live, names=(KEY_FILE,))
                for _ in range(3):
                    assert await hello(target, creds(clusters, "new", "node-node-1"), "node-1") is grpc.StatusCode.OK
            refusals = [e for e in logs if e["event"] == "tls_certificates_not_reloaded"]
            assert len(refusals) == 1 and "is not the key of" in refusals[0]["reason"], logs
            install(clusters / "new" / "controller", live, names=(KEY_FILE,))
            assert await hello(target, creds(clusters, "new", "node-node-1"), "node-1") is grpc.StatusCode.OK
        finally:
            await stop_controller(controller)

    asyncio.run(scenario())


def test_the_urgent_port_takes_a_renewal_up_too_whichever_port_read_it_first(clusters: Path, tmp_path: Path) -> None:
    live = tmp_path / "controller"
    install(clusters / "old" / "controller", live)
    urgent = free_port()

    async def scenario() -> None:
        controller = Controller(controller_config(tmp_path, live).model_copy(update={"urgent_port": urgent}))
        main, door = f"127.0.0.1:{await controller.start()}", f"127.0.0.1:{urgent}"
        try:
            for target in (main, door):
                assert await hello(target, creds(clusters, "old", "node-node-1"), "node-1", urgent=1) is OK
            install(clusters / "new" / "controller", live)
            # The main port's handshake reads the renewal first; the urgent port's takes it up all the same.
            for target in (main, door):
                assert await hello(target, creds(clusters, "new", "node-node-1"), "node-1", urgent=1) is OK, target
                got = await hello(target, creds(clusters, "old", "node-node-1"), "node-1", urgent=1)
                assert got is grpc.StatusCode.UNAVAILABLE, target
        finally:
            await stop_controller(controller)

    asyncio.run(scenario())


def test_a_relay_takes_a_renewed_certificate_and_ca_at_the_next_handshake(clusters: Path, tmp_path: Path) -> None:
    """``vigil relay`` (the command): its agents' handshakes, on its main and urgent ports, take the
    renewed files; the connection it holds to the controller keeps the ones it was made with, and the
    next one, to a controller that trusts only the new CA, is made with the new."""
    live, relay_live = tmp_path / "controller", tmp_path / "relay"
    install(clusters / "old" / "controller", live)
    install(clusters / "old" / "relay-127.0.0.1", relay_live)
    port, urgent, metrics_port = free_port(), free_port(), free_port()

    def expiry() -> float:  # the relay's, as Prometheus would scrape it
        return metric(metrics_port, "vigil_relay_certificate_expiry_timestamp_seconds")

    def expiry_of(cluster: str) -> float:
        return not_after((clusters / cluster / "relay-127.0.0.1" / CERT_FILE).read_bytes())

    async def scenario() -> None:
        controllers = [Controller(controller_config(tmp_path, live, port=port))]
        target = f"127.0.0.1:{await controllers[0].start()}"
        try:
            more = ("--urgent-listen", f"127.0.0.1:{urgent}", "--metrics-port", str(metrics_port))
            async with relay_process(target, clusters, tmp_path, *more, tls_dir=relay_live) as through:
                ports = (through, f"127.0.0.1:{urgent}")
                for dial in ports:
                    assert await hello(dial, creds(clusters, "old", "node-node-1"), "node-1", urgent=1) is OK
                assert expiry() == expiry_of("old")
                install(clusters / "new" / "controller", live)
                install(clusters / "new" / "relay-127.0.0.1", relay_live)
                assert expiry() == expiry_of("new") > expiry_of("old") + 50 * 86400
                for dial in ports:
                    assert await hello(dial, creds(clusters, "new", "node-node-1"), "node-1", urgent=1) is OK, dial
                    got = await hello(dial, creds(clusters, "old", "node-node-1"), "node-1", urgent=1)
                    assert got is grpc.StatusCode.UNAVAILABLE, dial  # the old CA's agent: a stranger now
                # The controller restarted: the relay reaches it again with its renewed certificate.
                await stop_controller(controllers[0])
                controllers[0] = Controller(controller_config(tmp_path, live, port=port, db="c2.db"))
                await controllers[0].start()
                # As an agent does, it tries again while the relay finds its old stream gone (UNAVAILABLE).
                deadline, got = time.monotonic() + 30, None
                while got is not OK and time.monotonic() < deadline:
                    got = await hello(through, creds(clusters, "new", "node-node-1"), "node-1")
                    await asyncio.sleep(0 if got is OK else 0.5)
                assert got is OK
        finally:
            await stop_controller(controllers[0])

    asyncio.run(scenario())


def test_an_agent_reconnects_with_its_renewed_certificate_without_a_restart(clusters: Path, tmp_path: Path) -> None:
    controller_dir, agent_dir = tmp_path / "controller", tmp_path / "agent"
    install(clusters / "old" / "controller", controller_dir)
    install(clusters / "old" / "node-node-1", agent_dir)

    async def registered(target: str, cluster: str) -> None:
        async with grpc.aio.secure_channel(target, creds(clusters, cluster, "admin-alice")) as channel:
            admin = admin_pb2_grpc.AdminStub(channel)
            for _ in range(600):
                if [n.node for n in (await admin.GetStatus(admin_pb2.StatusRequest())).nodes] == ["node-1"]:
                    return
                await asyncio.sleep(0.05)
        raise AssertionError(f"the agent never registered with the {cluster} CA's controller")

    async def scenario() -> None:
        first = Controller(controller_config(tmp_path, controller_dir))
        port = await first.start()
        target = f"127.0.0.1:{port}"
        command = [
            sys.executable, "-m", "vigil", "agent", "--node", "node-1", "--controller", target,
            "--tls-dir", str(agent_dir), "--gpu-backend", "simulated", "--simulated-gpus", "1",
            "--kernel-log-source", "none", "--spool", str(tmp_path / "spool.db"), "--metrics-port", "0",
        ]  # fmt: skip
        agent = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            await registered(target, "old")
            # Everything renewed under a new CA; the controller restarts (a new pod, say), the agent
            # does not: it must reconnect with its new files, or the new controller refuses it.
            install(clusters / "new" / "node-node-1", agent_dir)
            install(clusters / "new" / "controller", controller_dir)
            await stop_controller(first)
            second = Controller(controller_config(tmp_path, controller_dir, port=port, db="c2.db"))
            await second.start()
            try:
                await registered(target, "new")
            finally:
                await stop_controller(second)
        finally:
            agent.terminate()
            _, stderr = agent.communicate(timeout=10)
        assert "tls_certificates_reloaded" in stderr.decode(), stderr.decode()[-2000:]

    asyncio.run(scenario())


def test_a_key_that_is_not_the_certificates_is_refused_at_start_naming_both_files(
    clusters: Path, tmp_path: Path
) -> None:
    mixed = tmp_path / "mixed"
    install(clusters / "old" / "node-node-1", mixed)
    install(clusters / "other" / "node-node-1", mixed, names=(KEY_FILE,))
    with pytest.raises(TlsError, match=r"mixed/tls\.key is not the key of .*mixed/tls\.crt"):
        TlsFiles.load(mixed)
    (mixed / KEY_FILE).write_text("-----BEGIN PRIVATE KEY-----\nnot base64\n-----END PRIVATE KEY-----\n")
    with pytest.raises(TlsError, match=r"tls\.key holds no readable unencrypted private key"):
        TlsFiles.load(mixed)
