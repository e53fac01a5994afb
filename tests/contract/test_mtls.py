"""Mutual TLS on loopback: a real controller serving with certificates from ``vigil certs`` (run as a
command), and clients with the right certificate, none, another CA's, or another party's; and agents
that bring a service-account token instead, reviewed by a Kubernetes API server on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from controller.act.agent_tokens import AgentTokensConfig
from controller.config import ControllerConfig
from controller.daemon import Controller
from protos.vigil.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    agent_pb2,
    agent_pb2_grpc,
    relay_pb2,
    relay_pb2_grpc,
    trainer_pb2,
    trainer_pb2_grpc,
)
from tests.contract.test_own_time import BOUND_S, hold_the_loop
from tests.fakes.kube_api import KubeApiServer
from tests.helpers import free_port, stop_controller, wait_until
from vigil_core.tls import TlsFiles

Creds = grpc.ChannelCredentials | None


def certs(out: Path, *args: str) -> None:
    command = [sys.executable, "-m", "vigil", "certs", str(out), "--controller-name", "127.0.0.1", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert oct((out / "ca" / "ca.key").stat().st_mode & 0o777) == "0o600"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pki")
    certs(
        root / "ours", "--nodes", "node-1", "--admin", "alice", "--trainer", "jobs", "--agents", "--relay", "127.0.0.1"
    )
    certs(root / "ours", "--nodes", "node-2", "--trainer", "other")  # a second run adds to the same CA
    certs(root / "theirs", "--nodes", "node-1", "--admin", "alice")  # another cluster's CA
    return root


def mine(pki: Path, party: str, ca: str = "ours") -> grpc.ChannelCredentials:
    return TlsFiles.load(pki / ca / party).channel_credentials()


async def hello(target: str, creds: Creds, node: str, urgent: int = 0) -> grpc.StatusCode:
    """An agent's first message (``urgent``: faults waiting); OK once the controller acknowledges it."""
    async with _channel(target, creds) as channel:
        call = agent_pb2_grpc.AgentGatewayStub(channel).Connect()
        try:
            said = agent_pb2.Hello(node=node, spool_id="s1", urgent_waiting=urgent)
            await call.write(agent_pb2.AgentMessage(hello=said))
            reply = await asyncio.wait_for(call.read(), 10)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        call.cancel()
        assert reply.HasField("ack")
        return grpc.StatusCode.OK


async def outcome(call: Awaitable[object]) -> grpc.StatusCode:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def status(target: str, creds: Creds) -> grpc.StatusCode:
    async with _channel(target, creds) as channel:
        return await outcome(admin_pb2_grpc.AdminStub(channel).GetStatus(admin_pb2.StatusRequest(), timeout=10))


async def report(target: str, creds: Creds, job: str = "j", **fields: Any) -> grpc.StatusCode:
    async with _channel(target, creds) as channel:
        stub = trainer_pb2_grpc.TrainerGatewayStub(channel)
        return await outcome(stub.Report(trainer_pb2.Progress(job_id=job, **fields), timeout=10))


async def sweep(target: str, creds: Creds) -> grpc.StatusCode:
    async def drain() -> None:
        async for _ in admin_pb2_grpc.AdminStub(channel).Sweep(admin_pb2.SweepRequest(nodes=["nope"]), timeout=10):
            pass

    async with _channel(target, creds) as channel:
        return await outcome(drain())


def _channel(target: str, creds: Creds) -> grpc.aio.Channel:
    return grpc.aio.secure_channel(target, creds) if creds else grpc.aio.insecure_channel(target)


def serve(pki: Path, tmp_path: Path, test: Callable[[str], Awaitable[None]], **settings: Any) -> None:
    """A controller with this cluster's certificate (and ``settings``) on loopback, for ``test``."""

    async def scenario() -> None:
        cfg = ControllerConfig(listen="127.0.0.1", port=0, database=tmp_path / "c.db", pager="none",
                               tls_dir=pki / "ours" / "controller", **settings)  # fmt: skip
        controller = Controller(cfg)
        port = await controller.start()
        watching = asyncio.create_task(controller.nodes.lateness.watch())  # as Controller.run watches it
        try:
            await test(f"127.0.0.1:{port}")
        finally:
            watching.cancel()
            await stop_controller(controller)

    asyncio.run(scenario())


def test_agents_are_admitted_only_with_a_certificate_of_this_cluster_for_their_own_node(
    pki: Path, tmp_path: Path
) -> None:
    async def test(target: str) -> None:
        assert await hello(target, mine(pki, "node-node-1"), "node-1") is grpc.StatusCode.OK
        assert await hello(target, mine(pki, "node-node-2"), "node-2") is grpc.StatusCode.OK
        # Another node's identity: refused by name, after the handshake.
        assert await hello(target, mine(pki, "node-node-1"), "node-2") is grpc.StatusCode.PERMISSION_DENIED
        # No certificate, another CA's certificate, or no TLS at all: the handshake fails.
        only_ca = grpc.ssl_channel_credentials((pki / "ours" / "ca" / "ca.crt").read_bytes())
        assert await hello(target, only_ca, "node-1") is grpc.StatusCode.UNAVAILABLE
        assert await hello(target, mine(pki, "node-node-1", "theirs"), "node-1") is grpc.StatusCode.UNAVAILABLE
        assert await hello(target, None, "node-1") is grpc.StatusCode.UNAVAILABLE

    serve(pki, tmp_path, test)


async def relay_call(target: str, creds: Creds) -> grpc.StatusCode:
    """Open the controller's AgentRelay stream and say one agent's Hello on it."""
    hello = agent_pb2.AgentMessage(hello=agent_pb2.Hello(node="node-1", spool_id="s1")).SerializeToString()
    async with _channel(target, creds) as channel:
        call = relay_pb2_grpc.AgentRelayStub(channel).Relay()
        try:
            await call.write(relay_pb2.RelayUp(items=[relay_pb2.UpItem(stream=1, message=hello)]))
            lanes = await asyncio.wait_for(call.read(), 10)  # the controller's first word: the relay's lanes
            reply = await asyncio.wait_for(call.read(), 10)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        call.cancel()
        assert lanes.HasField("lanes") and reply.items[0].stream == 1
        return grpc.StatusCode.OK


@contextlib.asynccontextmanager
async def relay_process(
    target: str, pki: Path, tmp_path: Path, *more: str, tls_dir: Path | None = None
) -> AsyncIterator[str]:
    """``vigil relay`` (the command) with its relay certificate (``tls_dir``: from there) in front of
    the controller at ``target`` (``more``: its other arguments); yields where agents dial it."""
    port_file, port = tmp_path / "relay.port", free_port()
    tls_dir = tls_dir or pki / "ours" / "relay-127.0.0.1"
    command = [sys.executable, "-m", "vigil", "relay", "--controller", target, "--listen", f"127.0.0.1:{port}",
               "--tls-dir", str(tls_dir), "--port-file", str(port_file), *more]  # fmt: skip
    relay = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        await wait_until(port_file.exists, timeout=30, what="the relay up")
        yield f"127.0.0.1:{port}"
    finally:
        relay.terminate()
        await asyncio.to_thread(relay.wait, 30)
    assert relay.returncode == 0, relay.stderr.read() if relay.stderr else ""


def test_a_relay_carries_agents_only_for_the_nodes_their_certificates_name(pki: Path, tmp_path: Path) -> None:
    async def test(target: str) -> None:
        async with relay_process(target, pki, tmp_path) as through:
            assert await hello(through, mine(pki, "node-node-1"), "node-1") is grpc.StatusCode.OK
            assert await hello(through, mine(pki, "node-node-1"), "node-2") is grpc.StatusCode.PERMISSION_DENIED
            assert await hello(through, mine(pki, "admin-alice"), "node-1") is grpc.StatusCode.PERMISSION_DENIED
            assert await hello(through, mine(pki, "node-node-1", "theirs"), "node-1") is grpc.StatusCode.UNAVAILABLE
            # The shared agents certificate's token goes to the controller, which takes no tokens here.
            assert await hello(through, with_token(pki, tmp_path, "t"), "node-1") is grpc.StatusCode.PERMISSION_DENIED
            # The shared certificate without its token: refused as the controller refuses it.
            assert await hello(through, mine(pki, "agents"), "node-1") is grpc.StatusCode.UNAUTHENTICATED
            # The controller takes the relay's service only from a relay, and no agent from a relay.
            assert await relay_call(target, mine(pki, "relay-127.0.0.1")) is grpc.StatusCode.OK
            assert await relay_call(target, mine(pki, "node-node-1")) is grpc.StatusCode.PERMISSION_DENIED
            assert await relay_call(target, mine(pki, "admin-alice")) is grpc.StatusCode.PERMISSION_DENIED
            assert await hello(target, mine(pki, "relay-127.0.0.1"), "node-1") is grpc.StatusCode.PERMISSION_DENIED

    serve(pki, tmp_path, test)


def test_the_urgent_ports_take_only_agents_with_faults_waiting_and_check_who_they_are_as_the_main_ones(
    pki: Path, tmp_path: Path
) -> None:
    """The controller's (``urgent_port``) and ``vigil relay --urgent-listen``'s, under mutual TLS."""
    urgent, relay_urgent = free_port(), free_port()

    async def test(target: str) -> None:
        async with relay_process(target, pki, tmp_path, "--urgent-listen", f"127.0.0.1:{relay_urgent}"):
            for door in (f"127.0.0.1:{urgent}", f"127.0.0.1:{relay_urgent}"):
                assert await hello(door, mine(pki, "node-node-1"), "node-1", urgent=1) is grpc.StatusCode.OK
                got = await hello(door, mine(pki, "node-node-1"), "node-1")
                assert got is grpc.StatusCode.FAILED_PRECONDITION, door
                got = await hello(door, mine(pki, "node-node-1"), "node-2", urgent=1)
                assert got is grpc.StatusCode.PERMISSION_DENIED, door
                got = await hello(door, mine(pki, "node-node-1", "theirs"), "node-1", urgent=1)
                assert got is grpc.StatusCode.UNAVAILABLE, door  # another cluster's certificate: no handshake

    serve(pki, tmp_path, test, urgent_port=urgent)


def test_a_real_agent_connects_through_a_real_relay_with_its_node_certificate(pki: Path, tmp_path: Path) -> None:
    async def test(target: str) -> None:
        async with relay_process(target, pki, tmp_path) as through:
            await registers(target, pki, tmp_path, ["--tls-dir", str(pki / "ours" / "node-node-2")], dial=through)

    serve(pki, tmp_path, test)


def test_through_a_relay_an_agent_token_speaks_only_for_its_node_and_is_reviewed_again(
    pki: Path, tmp_path: Path
) -> None:
    with KubeApiServer() as kube:
        node_1, anyone = kube.issue_token("node-1"), kube.issue_token("node-1", "system:serviceaccount:ml:trainer")
        revoked = kube.issue_token("node-2")

        async def test(target: str) -> None:
            async with relay_process(target, pki, tmp_path) as through:
                assert await hello(through, with_token(pki, tmp_path, node_1), "node-1") is grpc.StatusCode.OK
                got = await hello(through, with_token(pki, tmp_path, node_1), "node-2")
                assert got is grpc.StatusCode.PERMISSION_DENIED
                for refused in ("forged", anyone):
                    got = await hello(through, with_token(pki, tmp_path, refused), "node-1")
                    assert got is grpc.StatusCode.UNAUTHENTICATED, refused
                await revoked_ends_its_stream(through, with_token(pki, tmp_path, revoked), kube, revoked, "node-2")

        kubeconfig = kube.kubeconfig(tmp_path / "kc")
        tokens = AgentTokensConfig(enabled=True, cache_s=0)
        serve(pki, tmp_path, test, agent_tokens=tokens, kubernetes={"kubeconfig": kubeconfig})


def test_a_certified_peer_that_never_says_hello_is_closed(pki: Path, tmp_path: Path) -> None:
    """Under TLS the stream's first message is read before the caller is judged; it is awaited
    limits.first_message_s at most."""

    async def test(target: str) -> None:
        async with _channel(target, mine(pki, "node-node-1")) as channel:
            call = agent_pb2_grpc.AgentGatewayStub(channel).Connect()
            code, details = await asyncio.wait_for(call.code(), 10), await call.details()
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED and "no first message within 0.5 s" in str(details)
        assert await hello(target, mine(pki, "node-node-1"), "node-1") is grpc.StatusCode.OK

    serve(pki, tmp_path, test, limits={"first_message_s": 0.5})


def test_a_controller_held_past_the_bound_still_takes_a_certified_agents_first_message(
    pki: Path, tmp_path: Path
) -> None:
    """The first message is awaited on the controller's own time: its event loop held past
    first_message_s (a long garbage collection) is not the agent's lateness."""

    async def test(target: str) -> None:
        async with _channel(target, mine(pki, "node-node-1")) as channel:
            call = agent_pb2_grpc.AgentGatewayStub(channel).Connect()
            await hold_the_loop()
            await call.write(agent_pb2.AgentMessage(hello=agent_pb2.Hello(node="node-1", spool_id="s1")))
            reply = await asyncio.wait_for(call.read(), 10)
            call.cancel()
        assert reply.HasField("ack")

    serve(pki, tmp_path, test, limits={"first_message_s": BOUND_S})


def test_the_admin_and_trainer_services_take_only_their_own_roles(pki: Path, tmp_path: Path) -> None:
    async def test(target: str) -> None:
        admin, node, trainer = mine(pki, "admin-alice"), mine(pki, "node-node-1"), mine(pki, "trainer-jobs")
        assert await status(target, admin) is grpc.StatusCode.OK
        assert await status(target, node) is grpc.StatusCode.PERMISSION_DENIED
        assert await status(target, trainer) is grpc.StatusCode.PERMISSION_DENIED
        assert await status(target, mine(pki, "admin-alice", "theirs")) is grpc.StatusCode.UNAVAILABLE
        assert await sweep(target, trainer) is grpc.StatusCode.PERMISSION_DENIED  # a streaming method too
        assert await report(target, trainer) is grpc.StatusCode.OK
        assert await report(target, admin) is grpc.StatusCode.OK
        assert await report(target, node) is grpc.StatusCode.PERMISSION_DENIED
        # The server is still serving after every refusal.
        assert await hello(target, node, "node-1") is grpc.StatusCode.OK

    serve(pki, tmp_path, test)


def test_the_cli_speaks_tls_with_the_certificates_vigil_tls_dir_names(pki: Path, tmp_path: Path) -> None:
    async def test(target: str) -> None:
        def vigil_status(tls_dir: str) -> subprocess.CompletedProcess[str]:
            env = {**os.environ, "VIGIL_TLS_DIR": tls_dir}
            command = [sys.executable, "-m", "vigil", "status", "--controller", target]
            return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)

        ok = await asyncio.to_thread(vigil_status, str(pki / "ours" / "admin-alice"))
        assert ok.returncode == 0 and "automation" in ok.stdout, ok.stderr
        refused = await asyncio.to_thread(vigil_status, str(pki / "ours" / "node-node-1"))
        assert refused.returncode == 2 and "PERMISSION_DENIED" in refused.stdout + refused.stderr
        missing = await asyncio.to_thread(vigil_status, str(tmp_path / "nowhere"))
        assert missing.returncode == 2 and "cannot read" in missing.stdout + missing.stderr
        assert "Traceback" not in missing.stdout + missing.stderr
        # No VIGIL_TLS_DIR against a TLS controller: gRPC says "Socket closed"; the CLI says why.
        plaintext = await asyncio.to_thread(vigil_status, "")
        said = " ".join((plaintext.stdout + plaintext.stderr).split())
        assert plaintext.returncode == 2 and "may serve mutual TLS" in said and "set VIGIL_TLS_DIR" in said, said

    serve(pki, tmp_path, test)


def test_a_tls_client_of_a_plaintext_controller_is_told_so(pki: Path, tmp_path: Path) -> None:
    async def scenario() -> None:
        cfg = ControllerConfig(listen="127.0.0.1", port=0, database=tmp_path / "c.db", pager="none", plaintext=True)
        controller = Controller(cfg)
        port = await controller.start()
        try:
            env = {**os.environ, "VIGIL_TLS_DIR": str(pki / "ours" / "admin-alice")}
            command = [sys.executable, "-m", "vigil", "status", "--controller", f"127.0.0.1:{port}"]
            done = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=60, env=env)
        finally:
            await stop_controller(controller)
        said = " ".join((done.stdout + done.stderr).split())
        assert done.returncode == 2 and "did not complete a TLS handshake" in said and "serve plaintext" in said, said

    asyncio.run(scenario())


async def registers(target: str, pki: Path, tmp_path: Path, transport: list[str], dial: str = "") -> None:
    """``vigil agent`` for node-2 with these transport flags (dialing ``dial``, else the controller)
    comes up in the controller's status."""
    command = [
        sys.executable, "-m", "vigil", "agent", "--node", "node-2", "--controller", dial or target, *transport,
        "--gpu-backend", "simulated", "--simulated-gpus", "2",
        "--kernel-log-source", "none", "--spool", str(tmp_path / "spool.db"), "--metrics-port", "0",
    ]  # fmt: skip
    agent = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        async with grpc.aio.secure_channel(target, mine(pki, "admin-alice")) as channel:
            admin = admin_pb2_grpc.AdminStub(channel)
            for _ in range(300):
                nodes = (await admin.GetStatus(admin_pb2.StatusRequest())).nodes
                if [(n.node, n.gpus) for n in nodes] == [("node-2", 2)]:
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the agent never registered")
    finally:
        agent.terminate()
        # Waited for in a thread: the controller the agent is leaving runs on this loop, and a
        # blocked loop made the agent's exit take over 10 s under CI load.
        try:
            await asyncio.to_thread(agent.wait, 30)
        except subprocess.TimeoutExpired:
            agent.kill()
            raise


def test_a_real_agent_connects_with_its_node_certificate(pki: Path, tmp_path: Path) -> None:
    async def test(target: str) -> None:
        await registers(target, pki, tmp_path, ["--tls-dir", str(pki / "ours" / "node-node-2")])

    serve(pki, tmp_path, test)


# Agents with service-account tokens (controller.agent_tokens): the real kubernetes client reviews
# them against an API server on loopback.


def serve_with_tokens(pki: Path, tmp_path: Path, kube: KubeApiServer, test: Callable[[str], Awaitable[None]]) -> None:
    """``serve``, with agents' tokens reviewed by ``kube``."""
    kubeconfig = kube.kubeconfig(tmp_path / "kc")
    serve(pki, tmp_path, test, agent_tokens=AgentTokensConfig(enabled=True), kubernetes={"kubeconfig": kubeconfig})


def with_token(pki: Path, tmp_path: Path, token: str) -> grpc.ChannelCredentials:
    """What an agent of the DaemonSet holds: the shared agents certificate, and its token in a file."""
    (tmp_path / "token").write_text(token + "\n")
    return TlsFiles.load(pki / "ours" / "agents", token_file=tmp_path / "token").channel_credentials()


def test_an_agent_token_speaks_only_for_the_node_the_api_server_names(pki: Path, tmp_path: Path) -> None:
    with KubeApiServer() as kube:
        node_1, anyone = kube.issue_token("node-1"), kube.issue_token("node-1", "system:serviceaccount:ml:trainer")
        other_audience = kube.issue_token("node-1", audiences=("https://kubernetes.default.svc",))
        no_node = kube.issue_token("")

        async def test(target: str) -> None:
            assert await hello(target, with_token(pki, tmp_path, node_1), "node-1") is grpc.StatusCode.OK
            assert await hello(target, with_token(pki, tmp_path, node_1), "node-2") is grpc.StatusCode.PERMISSION_DENIED
            for refused in ("forged", anyone, other_audience, no_node):
                got = await hello(target, with_token(pki, tmp_path, refused), "node-1")
                assert got is grpc.StatusCode.UNAUTHENTICATED, refused
            shared_alone = mine(pki, "agents")  # the shared certificate without a token
            assert await hello(target, shared_alone, "node-1") is grpc.StatusCode.UNAUTHENTICATED
            # Without the cluster's certificate a token gets nowhere: the handshake refuses.
            only_ca = grpc.ssl_channel_credentials((pki / "ours" / "ca" / "ca.crt").read_bytes())
            with_ca_only = grpc.composite_channel_credentials(
                only_ca,
                grpc.metadata_call_credentials(lambda _ctx, cb: cb((("authorization", f"Bearer {node_1}"),), None)),
            )
            assert await hello(target, with_ca_only, "node-1") is grpc.StatusCode.UNAVAILABLE
            # Node certificates still work; the shared certificate opens only the agents' service.
            assert await hello(target, mine(pki, "node-node-2"), "node-2") is grpc.StatusCode.OK
            assert await status(target, with_token(pki, tmp_path, node_1)) is grpc.StatusCode.PERMISSION_DENIED
            assert await report(target, with_token(pki, tmp_path, node_1)) is grpc.StatusCode.PERMISSION_DENIED
            assert await status(target, mine(pki, "admin-alice")) is grpc.StatusCode.OK

        serve_with_tokens(pki, tmp_path, kube, test)
        reviews = kube.requests("POST", "tokenreviews$")
        # node-1's accepted review is remembered (one API call for its two Hellos); refusals are not.
        assert [r.body["spec"]["token"] for r in reviews].count(node_1) == 1
        assert all(r.body["spec"]["audiences"] == ["vigil"] for r in reviews)


def test_a_token_that_cannot_be_reviewed_is_neither_taken_nor_refused(pki: Path, tmp_path: Path) -> None:
    """The API server refuses the review (a controller without the tokenreviews grant, say): the
    agent is told UNAVAILABLE, naming the cause, and is admitted once the review works again."""
    with KubeApiServer() as kube:
        token = kube.issue_token("node-1")
        kube.fail("POST", r"tokenreviews$", 403, times=1)

        async def test(target: str) -> None:
            assert await hello(target, with_token(pki, tmp_path, token), "node-1") is grpc.StatusCode.UNAVAILABLE
            assert await hello(target, with_token(pki, tmp_path, token), "node-1") is grpc.StatusCode.OK

        serve_with_tokens(pki, tmp_path, kube, test)
        assert len(kube.requests("POST", "tokenreviews$")) == 2


def test_the_shared_agents_certificate_is_refused_where_the_controller_takes_no_tokens(
    pki: Path, tmp_path: Path
) -> None:
    async def test(target: str) -> None:
        got = await hello(target, with_token(pki, tmp_path, "any"), "node-1")
        assert got is grpc.StatusCode.PERMISSION_DENIED

    serve(pki, tmp_path, test)


def test_a_real_agent_connects_with_its_token(pki: Path, tmp_path: Path) -> None:
    with KubeApiServer() as kube:
        token = tmp_path / "token"
        token.write_text(kube.issue_token("node-2"))
        shared = str(pki / "ours" / "agents")

        async def test(target: str) -> None:
            await registers(target, pki, tmp_path, ["--tls-dir", shared, "--token-file", str(token)])

        serve_with_tokens(pki, tmp_path, kube, test)


def test_a_trainer_speaks_only_for_its_own_jobs(pki: Path, tmp_path: Path) -> None:
    """trainer:jobs started job "moe"; trainer:other may neither report it (blame its nodes) nor end it."""

    async def test(target: str) -> None:
        owner, other, admin = mine(pki, "trainer-jobs"), mine(pki, "trainer-other"), mine(pki, "admin-alice")
        assert await report(target, owner, "moe", nodes=["node-1"], event="start") is grpc.StatusCode.OK
        assert await report(target, other, "moe", nodes=["node-2"]) is grpc.StatusCode.PERMISSION_DENIED
        assert await report(target, other, "moe", event="end") is grpc.StatusCode.PERMISSION_DENIED
        async with _channel(target, other) as channel:
            plan = trainer_pb2_grpc.TrainerGatewayStub(channel).Plan(trainer_pb2.PlanRequest(job_id="moe"), timeout=10)
            assert await outcome(plan) is grpc.StatusCode.PERMISSION_DENIED
        assert await report(target, other, "theirs", event="start") is grpc.StatusCode.OK  # its own job
        assert await report(target, admin, "moe") is grpc.StatusCode.OK  # an operator may speak for any
        assert await report(target, owner, "moe", event="end") is grpc.StatusCode.OK

    serve(pki, tmp_path, test)


def test_an_operators_action_is_recorded_under_its_certificate_not_its_word(pki: Path, tmp_path: Path) -> None:
    async def test(target: str) -> None:
        async with _channel(target, mine(pki, "node-node-1")) as channel:  # node-1 known, then quarantined by hand
            call = agent_pb2_grpc.AgentGatewayStub(channel).Connect()
            await call.write(agent_pb2.AgentMessage(hello=agent_pb2.Hello(node="node-1", spool_id="s1")))
            await asyncio.wait_for(call.read(), 10)
            call.cancel()
        async with _channel(target, mine(pki, "admin-alice")) as channel:
            stub = admin_pb2_grpc.AdminStub(channel)
            request = admin_pb2.UncordonRequest(node="node-1", requested_by="mallory", reason="looks fine")
            await stub.Uncordon(request, timeout=10)

    serve(pki, tmp_path, test)
    import sqlite3

    with sqlite3.connect(tmp_path / "c.db") as db:
        (who,) = db.execute("SELECT requested_by FROM operator_actions WHERE node = 'node-1'").fetchone()
    assert who == "admin:alice (says 'mallory')"


async def revoked_ends_its_stream(target: str, creds: Creds, kube: KubeApiServer, token: str, node: str) -> None:
    """An agent with ``token`` connected as ``node``; the token revoked: its stream ends UNAUTHENTICATED
    within the recheck, at one of its heartbeats."""
    async with _channel(target, creds) as channel:
        call = agent_pb2_grpc.AgentGatewayStub(channel).Connect()
        await call.write(agent_pb2.AgentMessage(hello=agent_pb2.Hello(node=node, spool_id="s1")))
        assert (await asyncio.wait_for(call.read(), 10)).HasField("ack")
        kube.revoke(token)
        for _ in range(40):  # heartbeats, 0.5 s apart: the stream ends within the recheck (5 s)
            if call.done():
                break
            with contextlib.suppress(asyncio.InvalidStateError, grpc.aio.AioRpcError):
                await call.write(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat()))
            await asyncio.sleep(0.5)
        assert await asyncio.wait_for(call.code(), 5) is grpc.StatusCode.UNAUTHENTICATED
        assert "no longer accepted" in (await call.details() or "")


def test_a_revoked_token_ends_a_stream_already_open(pki: Path, tmp_path: Path) -> None:
    with KubeApiServer() as kube:
        token = kube.issue_token("node-1")

        async def test(target: str) -> None:
            await revoked_ends_its_stream(target, with_token(pki, tmp_path, token), kube, token, "node-1")

        kubeconfig = kube.kubeconfig(tmp_path / "kc")
        serve(
            pki,
            tmp_path,
            test,
            agent_tokens=AgentTokensConfig(enabled=True, cache_s=0),
            kubernetes={"kubeconfig": kubeconfig},
        )
