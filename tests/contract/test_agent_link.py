"""The agent gateway over real gRPC on loopback: delivery, replay, deduplication, bad input."""

from __future__ import annotations

import asyncio
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

import agent.link as agent_link
from agent.link import ControllerLink
from agent.spool import Spool
from controller.config import ControllerConfig, LimitsConfig
from controller.daemon import Controller
from controller.edge.agent_sessions import seq_problem
from protos.codec import signal_to_proto
from protos.vigil.v1 import agent_pb2, agent_pb2_grpc, common_pb2, trainer_pb2, trainer_pb2_grpc
from tests.contract.test_group_commit import hold_flushes
from tests.helpers import free_port, start_controller, stop_controller, wait_until
from vigil_core.signals import GpuRef, Signal, SignalKind

NODE = "node-a"
GPU = GpuRef(0, "GPU-aaaa", "0000:18:00")


def xid(code: int) -> Signal:
    return Signal(NODE, SignalKind.XID, GPU, code, 0.0, f"xid {code}", "test", 1.0)


def signals_received(controller: Controller) -> float:
    return sum(
        s.value for m in controller.engine.metrics.signals.collect() for s in m.samples if s.name.endswith("_total")
    )


def duplicates(controller: Controller) -> float:
    return controller.engine.metrics.duplicates._value.get()


async def no_check(request: agent_pb2.RunCheck) -> common_pb2.CheckResult:
    return common_pb2.CheckResult(request_id=request.request_id, verdict=common_pb2.UNKNOWN)


def link_for(spool: Spool, port: int) -> ControllerLink:
    def hello() -> agent_pb2.Hello:
        return agent_pb2.Hello(node=NODE, spool_id=spool.spool_id, last_acked_seq=spool.acked_seq)

    return ControllerLink(f"127.0.0.1:{port}", spool, hello, no_check, heartbeat_s=0.2)


def test_reconnect_replays_exactly_the_unacknowledged(tmp_path: Path) -> None:
    async def scenario() -> None:
        spool = Spool(tmp_path / "spool.db")
        first = await start_controller(tmp_path / "ctl.db")
        port = first.port
        link, stop = link_for(spool, port), asyncio.Event()
        running = asyncio.create_task(link.run(stop))
        spool.append([xid(45) for _ in range(5)])
        link.notify()
        await wait_until(lambda: spool.acked_seq == 5, what="first five acknowledged")
        assert signals_received(first) == 5

        await stop_controller(first)  # the controller goes away; the agent keeps spooling
        await wait_until(lambda: not link.connected, what="link down")
        spool.append([xid(45) for _ in range(3)])
        link.notify()
        await asyncio.sleep(0.3)
        assert spool.acked_seq == 5 and spool.count() == 3

        second = await start_controller(tmp_path / "ctl.db", port)  # same store, same port
        await wait_until(lambda: spool.acked_seq == 8, timeout=20, what="replay acknowledged")
        assert signals_received(second) == 3  # exactly 6, 7 and 8 were sent again
        assert duplicates(second) == 0
        assert second.store.incidents.signals_from(NODE) == 8
        assert spool.count() == 0 and link.connections == 2
        stop.set()
        await running
        await stop_controller(second)

    asyncio.run(scenario())


def raw_batch(spool_id: str, seqs: list[int], code: int = 45) -> list[agent_pb2.AgentMessage]:
    hello = agent_pb2.AgentMessage(hello=agent_pb2.Hello(node=NODE, spool_id=spool_id))
    batch = agent_pb2.SignalBatch(signals=[signal_to_proto(xid(code).numbered(s)) for s in seqs])
    return [hello, agent_pb2.AgentMessage(signals=batch)]


async def send_raw(
    port: int, messages: list[agent_pb2.AgentMessage], replies: int = 0, until_ack: int | None = None
) -> list[agent_pb2.ControllerMessage]:
    """Send raw messages; read ``replies`` answers, or answers until an Ack reaches ``until_ack``."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = agent_pb2_grpc.AgentGatewayStub(channel).Connect()
        for m in messages:
            await call.write(m)
        out = [await call.read() for _ in range(replies)]
        while until_ack is not None and (not out or out[-1].ack.acked_seq < until_ack):
            out.append(await asyncio.wait_for(call.read(), 10))
        await call.done_writing()
        return out


def test_controller_ignores_duplicates(tmp_path: Path) -> None:
    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        replies = await send_raw(controller.port, raw_batch("spool1", [1, 2, 3], code=79), until_ack=3)
        acks = [r.ack.acked_seq for r in replies]
        # Hello's ack, then the batch's: held at 0 while the quarantine and page that signal 1 asked
        # for are under way; 3 once they are done.
        assert acks[:2] == [0, 0] and acks[-1] == 3 and set(acks) == {0, 3}
        # The ack was "lost": the same three again, plus one new, on a new stream.
        replies = await send_raw(controller.port, raw_batch("spool1", [1, 2, 3, 4], code=79), until_ack=4)
        acks = [r.ack.acked_seq for r in replies]
        # Hello's ack at 3; the batch's at 4, or at 3 while an action under way holds it back (under
        # CI load), then 4 once it is done.
        assert acks[0] == 3 and acks[-1] == 4 and set(acks) <= {3, 4} and len(acks) <= 3
        assert duplicates(controller) == 3
        assert controller.store.incidents.signals_from(NODE) == 4
        await controller.engine.wait_for_actions()
        (incident,) = controller.store.incidents.list(node=NODE)
        assert incident.signal_count == 4  # folded: one incident, one quarantine, one page
        assert sorted(a.kind for a in incident.actions) == ["NOTE:QUARANTINED", "PAGE:quarantine", "QUARANTINE"]
        await stop_controller(controller)

    asyncio.run(scenario())


def test_agent_with_a_lost_ack_resends_nothing_the_controller_holds(tmp_path: Path) -> None:
    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        spool = Spool(tmp_path / "spool.db")
        spool.append([xid(45) for _ in range(4)])
        # The controller already holds 1..3 from this spool, but the agent never saw the ack.
        await send_raw(controller.port, raw_batch(spool.spool_id, [1, 2, 3]), replies=2)
        link, stop = link_for(spool, controller.port), asyncio.Event()
        running = asyncio.create_task(link.run(stop))
        await wait_until(lambda: spool.acked_seq == 4, what="ack of seq 4")
        assert duplicates(controller) == 0
        assert controller.store.incidents.signals_from(NODE) == 4
        stop.set()
        await running
        await stop_controller(controller)

    asyncio.run(scenario())


def test_a_new_spool_is_not_mistaken_for_a_replay(tmp_path: Path) -> None:
    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        await send_raw(controller.port, raw_batch("old-spool", [1, 2]), replies=2)
        replies = await send_raw(controller.port, raw_batch("new-spool", [1]), replies=2)
        assert [r.ack.acked_seq for r in replies] == [0, 1]
        assert controller.store.incidents.signals_from(NODE) == 3 and duplicates(controller) == 0
        await stop_controller(controller)

    asyncio.run(scenario())


def test_an_oversized_message_and_a_flooding_agent_are_refused_and_the_server_keeps_serving(tmp_path: Path) -> None:
    async def scenario() -> None:
        limits = LimitsConfig(max_message_bytes=64 << 10, agent_messages_per_s=1.0, agent_burst=5)
        controller = await start_controller(tmp_path / "ctl.db", limits=limits)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.port}") as channel:
            huge = trainer_pb2.Progress(job_id="j", nodes=["n" * 60] * 2000)  # about 120 KiB
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await trainer_pb2_grpc.TrainerGatewayStub(channel).Report(huge, timeout=10)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in str(err.value.details())
        async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.port}") as channel:
            call = agent_pb2_grpc.AgentGatewayStub(channel).Connect()
            await call.write(agent_pb2.AgentMessage(hello=agent_pb2.Hello(node="flooder", spool_id="f")))
            assert (await call.read()).HasField("ack")
            # Batches as fast as it can, each answered before the next: written to a stream the controller
            # had already ended, a message fails on this side (INTERNAL) and hides the controller's reason.
            for seq in range(1, 21):
                flood = signal_to_proto(replace(xid(45), node="flooder").numbered(seq))
                await call.write(agent_pb2.AgentMessage(signals=agent_pb2.SignalBatch(signals=[flood])))
                try:
                    assert (await asyncio.wait_for(call.read(), 10)).ack.acked_seq == seq
                except grpc.aio.AioRpcError:
                    break  # refused
            code, details = await call.code(), await call.details()
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "flooder sends more than 1 messages/s" in details
        good = await send_raw(controller.port, raw_batch("s2", [1]), replies=2)  # another node is not held back
        assert good[-1].ack.acked_seq == 1
        await stop_controller(controller)

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("messages", "status", "text"),
    [
        ([agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat())], grpc.StatusCode.INVALID_ARGUMENT, "Hello"),
        (
            [agent_pb2.AgentMessage(hello=agent_pb2.Hello(node="Bad Node", spool_id="s"))],
            grpc.StatusCode.INVALID_ARGUMENT,
            "node",
        ),
        ([agent_pb2.AgentMessage(hello=agent_pb2.Hello(node=NODE))], grpc.StatusCode.INVALID_ARGUMENT, "spool_id"),
        (
            [
                agent_pb2.AgentMessage(hello=agent_pb2.Hello(node=NODE, spool_id="s")),
                agent_pb2.AgentMessage(signals=agent_pb2.SignalBatch(signals=[common_pb2.Signal(node=NODE, seq=1)])),
            ],
            grpc.StatusCode.INVALID_ARGUMENT,
            "kind",
        ),
        (
            [
                agent_pb2.AgentMessage(hello=agent_pb2.Hello(node=NODE, spool_id="s")),
                agent_pb2.AgentMessage(
                    signals=agent_pb2.SignalBatch(
                        signals=[signal_to_proto(Signal("other-node", SignalKind.XID, GPU, 79, seq=1))]
                    )
                ),
            ],
            grpc.StatusCode.PERMISSION_DENIED,
            "other-node",
        ),
        *(
            (
                [
                    agent_pb2.AgentMessage(hello=agent_pb2.Hello(node=NODE, spool_id="s")),
                    agent_pb2.AgentMessage(signals=agent_pb2.SignalBatch(signals=[bad])),
                ],
                grpc.StatusCode.INVALID_ARGUMENT,
                field,
            )
            for bad, field in [
                (common_pb2.Signal(node=NODE, kind=common_pb2.XID, seq=1, value=float("nan")), "'value'"),
                (common_pb2.Signal(node=NODE, kind=common_pb2.XID, seq=1, message="x" * 5000), "'message'"),
                (common_pb2.Signal(node=NODE, kind=common_pb2.XID, seq=1, gpu=common_pb2.GpuRef(index=5000)), "'gpu'"),
            ]
        ),
        (
            [agent_pb2.AgentMessage(hello=agent_pb2.Hello(node=NODE, spool_id="s", gpus=[common_pb2.GpuRef()] * 2000))],
            grpc.StatusCode.INVALID_ARGUMENT,
            "more than 1024",
        ),
        (
            [agent_pb2.AgentMessage(hello=agent_pb2.Hello(node=NODE, spool_id="s", address="10.0.0.1; rm -rf /"))],
            grpc.StatusCode.INVALID_ARGUMENT,
            "Hello.address",
        ),
        *(
            (
                [agent_pb2.AgentMessage(hello=agent_pb2.Hello(node=NODE, spool_id="s", idle_heartbeat_s=idle))],
                grpc.StatusCode.INVALID_ARGUMENT,
                "Hello.idle_heartbeat_s",
            )
            for idle in (-1.0, 86400.0, float("nan"))
        ),
        *(
            (
                [agent_pb2.AgentMessage(hello=agent_pb2.Hello(node=NODE, spool_id="s", booted_at=booted))],
                grpc.StatusCode.INVALID_ARGUMENT,
                "Hello.booted_at",
            )
            for booted in (-1.0, float("inf"), float("nan"))
        ),
    ],
)
def test_bad_messages_get_a_clear_status_and_the_server_keeps_serving(
    tmp_path: Path, messages: list[agent_pb2.AgentMessage], status: grpc.StatusCode, text: str
) -> None:
    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await send_raw(controller.port, messages, replies=3)
        assert err.value.code() == status and text in (err.value.details() or "")
        good = await send_raw(controller.port, raw_batch("s2", [1]), replies=2)
        assert good[-1].ack.acked_seq == 1
        await stop_controller(controller)

    asyncio.run(scenario())


def test_a_heartbeat_with_nothing_new_waits_for_the_idle_interval(tmp_path: Path) -> None:
    """At 100,000 nodes a heartbeat a node every 5 s is 20,000 messages a second: a quiet agent sends
    one only every ``idle_heartbeat_s`` (HTTP/2 keepalive says it is there meanwhile); anything new
    it has to say (its jobs here) goes at the next ``heartbeat_s``."""

    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        beats: list[list[str]] = []
        heartbeat = controller.engine.heartbeat
        controller.engine.heartbeat = lambda node, *a, **kw: (beats.append(list(a[2])), heartbeat(node, *a, **kw))  # type: ignore[method-assign]
        jobs: list[str] = []
        spool = Spool(tmp_path / "spool.db")

        def hello() -> agent_pb2.Hello:
            return agent_pb2.Hello(node=NODE, spool_id=spool.spool_id, idle_heartbeat_s=0.8)

        def fill(beat: agent_pb2.Heartbeat) -> None:
            beat.jobs.extend(jobs)

        link = ControllerLink(
            f"127.0.0.1:{controller.port}", spool, hello, no_check, heartbeat_s=0.05, idle_heartbeat_s=0.8,
            fill_heartbeat=fill,
        )  # fmt: skip
        stop = asyncio.Event()
        running = asyncio.create_task(link.run(stop))
        await wait_until(lambda: len(beats) >= 1, what="the first heartbeat")
        await asyncio.sleep(1.0)  # 20 heartbeat periods, nothing new: one more at most (the idle one)
        quiet = len(beats)
        assert 1 <= quiet <= 3
        for n in range(3):  # something new each time: each goes at the next heartbeat_s
            jobs.append(f"job-{n}")
            await wait_until(lambda n=n: bool(beats) and beats[-1][-1:] == [f"job-{n}"], timeout=2, what="news")
        assert len(beats) - quiet == 3
        assert controller.engine.fleet.nodes[NODE].idle_heartbeat_s == 0.8
        stop.set()
        await running
        await stop_controller(controller)

    asyncio.run(scenario())


def test_a_signal_spooled_while_a_heartbeat_is_written_goes_at_once_not_a_beat_later(tmp_path: Path) -> None:
    """The send loop looks at the spool, then writes a heartbeat: a fault spooled while that write
    waits (HTTP/2 flow control, a busy relay) is written as soon as it ends, not after the next
    beat (it waited up to ``heartbeat_s``: the wake-up was cleared after the write)."""

    class SlowBeat:  # a stream whose heartbeat's write takes a while; everything written, in order
        def __init__(self) -> None:
            self.written: list[str] = []
            self.beat_under_way, self.beat_done = asyncio.Event(), asyncio.Event()

        async def write(self, message: agent_pb2.AgentMessage) -> None:
            if message.HasField("heartbeat"):
                self.beat_under_way.set()
                await self.beat_done.wait()
            self.written.append(str(message.WhichOneof("body")))

    async def scenario() -> None:
        spool = Spool(tmp_path / "spool.db")
        link = ControllerLink("127.0.0.1:1", spool, agent_pb2.Hello, no_check, heartbeat_s=60.0)
        call, stop, over = SlowBeat(), asyncio.Event(), asyncio.Event()
        sending = asyncio.create_task(link._send_loop(call, stop, over))  # type: ignore[arg-type]
        await asyncio.wait_for(call.beat_under_way.wait(), 5)
        spool.append([xid(79)])
        link.notify()
        call.beat_done.set()
        await wait_until(lambda: "signals" in call.written, timeout=5, what="the XID 79 written after the beat")
        assert call.written == ["heartbeat", "signals"]
        over.set()
        link.notify()
        await asyncio.wait_for(sending, 5)

    asyncio.run(scenario())


def test_backoff_starts_afresh_once_the_controller_acknowledges_a_hello(tmp_path: Path) -> None:
    """After many failed tries, a controller that takes the Hello resets the backoff: the next outage
    is retried at once, not after the ~10 s the failures before had grown it to."""

    async def scenario() -> None:
        spool = Spool(tmp_path / "spool.db")
        port = free_port()
        link, stop = link_for(spool, port), asyncio.Event()
        real_backoff = agent_link.backoff_delay
        attempts: list[int] = []  # the attempt number each wait was computed from

        def recorded(attempt: int, **kw: Any) -> float:
            attempts.append(attempt)
            return 0.01 if not link.connections else real_backoff(attempt, **kw)

        agent_link.backoff_delay = recorded  # type: ignore[assignment]
        running = asyncio.create_task(link.run(stop))
        try:
            await wait_until(lambda: len(attempts) >= 8, what="failed tries piling up")
            controller = await start_controller(tmp_path / "ctl.db", port)
            await wait_until(lambda: link.connected, timeout=20, what="link up")
            attempts.clear()
            await stop_controller(controller)
            await wait_until(lambda: attempts, what="the first wait after the outage")
            assert attempts[0] == 0  # backoff_delay(0): at most 0.2 s, however many failures came before
        finally:
            agent_link.backoff_delay = real_backoff
            stop.set()
            await running

    asyncio.run(scenario())


def test_a_spool_behind_the_controller_is_renumbered_so_nothing_is_taken_for_a_replay(tmp_path: Path) -> None:
    """The controller holds seq 1..3 of this spool; the spool lost its last transactions (a lost WAL)
    and numbers its next signal 2 again: that signal must not be ignored as a replay."""

    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        spool = Spool(tmp_path / "spool.db")
        controller.engine.hello(NODE, spool.spool_id, 0)
        controller.engine.receive(NODE, [xid(45).numbered(seq) for seq in (1, 2, 3)])
        spool.append([xid(45)])
        spool.ack(1)
        spool.append([xid(79)])  # numbered 2: the controller already holds a 2
        link, stop = link_for(spool, controller.port), asyncio.Event()
        running = asyncio.create_task(link.run(stop))
        await wait_until(lambda: spool.acked_seq >= 4, timeout=20, what="renumbered signal acknowledged")
        incidents = controller.store.incidents.list(node=NODE)
        assert any(i.code == 79 for i in incidents)
        stop.set()
        await running
        await stop_controller(controller)

    asyncio.run(scenario())


def test_a_seq_far_past_the_spools_last_is_refused_and_does_not_silence_the_node(tmp_path: Path) -> None:
    """seq = 2^63-1 taken would make every later signal of that spool look replayed, for good."""

    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        first = await send_raw(controller.port, raw_batch("s9", [1, 2]), until_ack=2)
        assert first[-1].ack.acked_seq == 2
        async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.port}") as channel:
            call = agent_pb2_grpc.AgentGatewayStub(channel).Connect()
            hello, batch = raw_batch("s9", [2**63 - 1])
            await call.write(hello)
            assert (await call.read()).ack.acked_seq == 2
            await call.write(batch)
            code, details = await asyncio.wait_for(call.code(), 10), await call.details()
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "past this spool's last (2)" in str(details)
        later = await send_raw(controller.port, raw_batch("s9", [3]), until_ack=3)
        assert later[-1].ack.acked_seq == 3  # the node's next signal is still taken
        await stop_controller(controller)

    asyncio.run(scenario())


def test_seq_problem_allows_a_fresh_spool_any_number_and_a_known_one_a_bounded_gap() -> None:
    batch = [xid(45).numbered(5_000_000)]
    assert seq_problem(batch, 0, 1000) == ""  # nothing received from this spool yet: its own numbering
    assert seq_problem(batch, 4_999_500, 1000) == ""
    assert "past this spool's last" in seq_problem(batch, 100, 1000)


def test_a_hello_that_makes_up_a_node_beyond_max_nodes_is_refused(tmp_path: Path) -> None:
    """In plaintext any caller can name any node: the nodes table is bounded, known nodes still connect.
    Made-up names are refused before they take a turn of the Hello pacing (twenty of them would
    otherwise push the known node's next Hello two seconds out, at 10 Hellos a second)."""

    async def scenario() -> None:
        limits = LimitsConfig(max_nodes=1, hellos_per_s=10, hello_burst=1)
        controller = await start_controller(tmp_path / "ctl.db", limits=limits)
        first = await send_raw(controller.port, raw_batch("s1", [1]), until_ack=1)
        assert first[-1].ack.acked_seq == 1  # NODE, the first and only one allowed
        async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.port}") as channel:
            for i in range(20):
                call = agent_pb2_grpc.AgentGatewayStub(channel).Connect()
                await call.write(agent_pb2.AgentMessage(hello=agent_pb2.Hello(node=f"made-up-{i}", spool_id="x")))
                code, details = await asyncio.wait_for(call.code(), 10), await call.details()
                assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "limits.max_nodes" in str(details)
        await asyncio.sleep(0.2)  # past NODE's next turn, had no one else taken one
        again = await send_raw(controller.port, raw_batch("s1", [2]), until_ack=2)
        assert again[-1].ack.acked_seq == 2
        assert len(controller.engine.fleet) == 1
        await stop_controller(controller)

    asyncio.run(scenario())


def test_a_fleet_refused_at_max_nodes_is_a_line_each_up_to_20_a_second_and_the_rest_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """60 made-up nodes at once past limits.max_nodes (a fleet larger than the limit, every agent
    retrying): none of them goes unsaid, but past 20 a second they are counted on one line."""

    async def scenario() -> float:
        controller = await start_controller(tmp_path / "ctl.db", limits=LimitsConfig(max_nodes=1))
        await send_raw(controller.port, raw_batch("s1", [1]), until_ack=1)
        capsys.readouterr()  # the logs from here on

        async def refused(channel: grpc.aio.Channel, i: int) -> grpc.StatusCode:
            call = agent_pb2_grpc.AgentGatewayStub(channel).Connect()
            await call.write(agent_pb2.AgentMessage(hello=agent_pb2.Hello(node=f"made-up-{i}", spool_id="x")))
            return await asyncio.wait_for(call.code(), 10)

        began = asyncio.get_running_loop().time()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.port}") as channel:
            codes = await asyncio.gather(*(refused(channel, i) for i in range(60)))
        took = asyncio.get_running_loop().time() - began
        assert set(codes) == {grpc.StatusCode.RESOURCE_EXHAUSTED}
        await asyncio.sleep(1.2)  # the busy second's count is said once it is over
        await stop_controller(controller)
        return took

    took = asyncio.run(scenario())
    out = capsys.readouterr().out
    alone = re.findall(r"call_refused +node=made-up-", out)
    counted = [int(n) for n in re.findall(r"call_refused_more +count=(\d+)", out)]
    assert len(alone) + sum(counted) == 60, out  # each said alone or counted, none lost, none twice
    if took < 1.0:  # within one second, or two of the tally's: at most 40 alone
        assert len(alone) <= 40 and sum(counted) >= 20, out


def test_a_controller_that_stops_says_every_agent_it_leaves_even_in_its_last_second(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """40 agents connected when the controller stops: their disconnections fall in one second, 20
    said alone and the rest counted, and that count is said before the process ends, not lost with
    the second's timer."""

    async def scenario() -> None:
        cfg = ControllerConfig(listen="127.0.0.1", port=0, database=tmp_path / "ctl.db", pager="none", plaintext=True)
        controller, stop = Controller(cfg), asyncio.Event()
        running = asyncio.create_task(controller.run(stop))
        await wait_until(lambda: controller.port > 0 and controller.server is not None)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.port}") as channel:
            calls = []
            for i in range(40):
                call = agent_pb2_grpc.AgentGatewayStub(channel).Connect()
                await call.write(agent_pb2.AgentMessage(hello=agent_pb2.Hello(node=f"node-{i}", spool_id="x")))
                await asyncio.wait_for(call.read(), 10)  # answered: connected
                calls.append(call)
            await asyncio.sleep(1.1)  # the connections' second is over
            capsys.readouterr()
            stop.set()
            await asyncio.wait_for(running, 30)

    asyncio.run(scenario())
    out = capsys.readouterr().out
    alone = re.findall(r"agent_disconnected +node=node-", out)
    counted = [int(n) for n in re.findall(r"agent_disconnected_more +count=(\d+)", out)]
    assert len(alone) + sum(counted) == 40, out


def test_a_hello_the_store_cannot_record_leaves_the_node_disconnected(tmp_path: Path) -> None:
    """The database fails as an agent says Hello: the agent is told UNAVAILABLE (it keeps its
    spool and comes back), and the controller does not count it connected, so a node that then dies
    goes UNKNOWN after the policy's timeout, not after three of its idle heartbeats."""

    async def scenario() -> None:
        import sqlite3

        controller = await start_controller(tmp_path / "ctl.db")

        def broken() -> None:
            raise sqlite3.OperationalError("database or disk is full")

        controller.store.db.inner.inner.sync = broken  # type: ignore[attr-defined]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.port}") as channel:
            call = agent_pb2_grpc.AgentGatewayStub(channel).Connect()
            hello = agent_pb2.Hello(node=NODE, spool_id="s1", idle_heartbeat_s=60)
            await call.write(agent_pb2.AgentMessage(hello=hello))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call.read()
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "cannot record" in str(err.value.details())
        entry = controller.engine.fleet.nodes[NODE]
        assert not entry.connected and entry.disconnected_at > 0
        await stop_controller(controller)

    asyncio.run(scenario())


def test_a_hello_that_says_faults_wait_is_answered_without_waiting_for_the_fleet_s_writes(tmp_path: Path) -> None:
    """The store's flush held (a fleet's registrations on a slow disk): an agent whose Hello says
    faults wait, with nothing its answer would let it drop, is answered at once; an agent without
    one waits for the flush, which paces a fleet saying Hello at once (``Engine.hello_durable``)."""

    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        gate = hold_flushes(controller.store)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.port}") as channel:
                calm, urgent = (agent_pb2_grpc.AgentGatewayStub(channel).Connect() for _ in range(2))
                await calm.write(agent_pb2.AgentMessage(hello=agent_pb2.Hello(node="calm", spool_id="s1")))
                await urgent.write(
                    agent_pb2.AgentMessage(hello=agent_pb2.Hello(node="faulty", spool_id="s2", urgent_waiting=1))
                )
                assert (await asyncio.wait_for(urgent.read(), 5)).HasField("ack")
                reading = asyncio.ensure_future(calm.read())
                await asyncio.sleep(0.3)
                assert not reading.done()
                gate.set()
                assert (await asyncio.wait_for(reading, 5)).HasField("ack")
        finally:
            gate.set()
        await stop_controller(controller)

    asyncio.run(scenario())


def test_a_second_controller_on_a_port_in_use_is_refused_not_given_half_the_agents(tmp_path: Path) -> None:
    """gRPC shares a port by default (SO_REUSEPORT): a second controller, or an old one still
    stopping, would take part of the agents' connections without a word."""

    async def scenario() -> None:
        first = await start_controller(tmp_path / "one.db")
        with pytest.raises(OSError, match=rf"cannot listen on 127\.0\.0\.1:{first.port} \(in use"):
            await start_controller(tmp_path / "two.db", port=first.port)
        await stop_controller(first)

    asyncio.run(scenario())


def test_a_stream_that_never_says_hello_is_closed(tmp_path: Path) -> None:
    """A peer that opens agent streams and sends nothing holds none of them past limits.first_message_s."""

    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db", limits={"first_message_s": 0.5})
        async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.port}") as channel:
            call = agent_pb2_grpc.AgentGatewayStub(channel).Connect()
            code, details = await asyncio.wait_for(call.code(), 10), await call.details()
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED and "no Hello within 0.5 s" in str(details)
        replies = await send_raw(controller.port, raw_batch("s1", [1]), until_ack=1)  # an agent that speaks
        assert replies[-1].ack.acked_seq == 1
        await stop_controller(controller)

    asyncio.run(scenario())


def hold_hello_writes(controller: Controller) -> tuple[asyncio.Event, asyncio.Event]:
    """From now on the controller waits for ``release`` before a Hello's write is durable; ``written``
    is set once one waits there."""
    written, release = asyncio.Event(), asyncio.Event()
    durable = controller.engine.durable

    async def slow_durable() -> None:
        written.set()
        await release.wait()
        await durable()

    controller.engine.durable = slow_durable  # type: ignore[method-assign]
    return written, release


def test_a_stream_gone_while_its_hello_is_written_leaves_no_node_counted_connected(tmp_path: Path) -> None:
    """The agent dies (or gives up on a slow Hello) while the controller waits for the Hello's
    write: the call is cancelled there. The node must not stay counted as connected with no stream,
    which would keep a dead node HEALTHY for three of its idle heartbeats (seen under load: a killed
    agent's node never turned UNKNOWN within the scenario's 21 s)."""

    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        written, release = hold_hello_writes(controller)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.port}") as channel:
                call = agent_pb2_grpc.AgentGatewayStub(channel).Connect()
                hello = agent_pb2.Hello(node=NODE, spool_id="s1", idle_heartbeat_s=60)
                await call.write(agent_pb2.AgentMessage(hello=hello))
                await asyncio.wait_for(written.wait(), 10)
                entry = controller.engine.fleet.nodes[NODE]
                assert not entry.connected  # not before its stream is open: nothing could be sent to it yet
                call.cancel()
            await wait_until(lambda: entry.disconnected_at > 0, timeout=5, what="the stream's end recorded")
            assert not entry.connected
        finally:
            release.set()
            await stop_controller(controller)

    asyncio.run(scenario())


def test_an_older_stream_ending_while_a_newer_says_hello_leaves_the_node_connected(tmp_path: Path) -> None:
    """A reconnection overlaps the old stream: the new Hello is being written when the old stream
    ends. The node is connected (through the new stream) once its Hello is answered; counted as gone,
    an agent that beats only every idle interval would turn UNKNOWN while it talks."""

    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        hello = agent_pb2.AgentMessage(hello=agent_pb2.Hello(node=NODE, spool_id="s1", idle_heartbeat_s=60))
        release = asyncio.Event()
        agents = controller.engine.agents
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.port}") as channel:
                stub = agent_pb2_grpc.AgentGatewayStub(channel)
                old = stub.Connect()
                await old.write(hello)
                assert (await old.read()).HasField("ack")
                written, release = hold_hello_writes(controller)
                new = stub.Connect()
                await new.write(hello)
                await asyncio.wait_for(written.wait(), 10)
                old.cancel()
                entry = controller.engine.fleet.nodes[NODE]
                await wait_until(lambda: not agents.is_open(NODE), timeout=5, what="the old stream's end seen")
                release.set()
                assert (await new.read()).HasField("ack")
                assert entry.connected and agents.is_open(NODE)
                new.cancel()
                await wait_until(lambda: not entry.connected, timeout=5, what="the node counted as gone")
        finally:
            release.set()
            await stop_controller(controller)

    asyncio.run(scenario())


def paced_fleet(tmp_path: Path, port: int, count: int) -> tuple[list[ControllerLink], list[Spool]]:
    """``count`` agents of their own (node-0, node-1, ...) for the controller at ``port``, and their spools."""
    links, spools = [], []
    for i in range(count):
        spool = Spool(tmp_path / f"spool{i}.db")

        def hello(node: str = f"node-{i}", spool: Spool = spool) -> agent_pb2.Hello:
            return agent_pb2.Hello(node=node, spool_id=spool.spool_id, last_acked_seq=spool.acked_seq)

        spools.append(spool)
        links.append(ControllerLink(f"127.0.0.1:{port}", spool, hello, no_check, heartbeat_s=0.2))
    return links, spools


def test_a_fleet_connecting_at_once_is_given_turns_and_every_agent_takes_its_own(tmp_path: Path) -> None:
    """Twelve agents at once, the controller admitting 10 a second after a burst of 4: four are in at
    once, each of the others is turned away with its turn (RESOURCE_EXHAUSTED, vigil-retry-after-ms)
    and the real agent link comes back then, so all are in after about 0.8 s, each turned away at
    most once (the link does not spend its backoff's tries on a full controller)."""

    async def scenario() -> None:
        limits = LimitsConfig(hellos_per_s=10, hello_burst=4)
        controller = await start_controller(tmp_path / "ctl.db", limits=limits)
        stop = asyncio.Event()
        links, _ = paced_fleet(tmp_path, controller.port, 12)
        running = [asyncio.create_task(link.run(stop)) for link in links]
        try:
            await wait_until(lambda: all(link.connected for link in links), timeout=20, what="every agent in")
            paced = controller.engine.metrics.hellos_paced._value.get()
            assert paced == 8, paced  # twelve, less the burst of four; none turned away twice
            assert all(link.connections == 1 for link in links)
        finally:
            stop.set()
            await asyncio.gather(*running)
            await stop_controller(controller)

    asyncio.run(scenario())


def test_an_agent_with_a_fault_waiting_is_admitted_at_once_while_the_fleet_is_given_turns(tmp_path: Path) -> None:
    """A fleet reconnecting at once is paced; an agent whose spool holds a fault it has not delivered
    (its Hello's ``urgent_waiting``) is not turned away to wait its turn behind it."""

    async def scenario() -> None:
        limits = LimitsConfig(hellos_per_s=0.2, hello_burst=1)  # after the first, one Hello every 5 s
        controller = await start_controller(tmp_path / "ctl.db", limits=limits)
        stop = asyncio.Event()
        links, spools = paced_fleet(tmp_path, controller.port, 4)
        spools[3].append([replace(xid(79), node="node-3")])
        running = [asyncio.create_task(link.run(stop)) for link in links[:3]]
        try:
            await wait_until(lambda: controller.engine.metrics.hellos_paced._value.get() >= 2, what="two given turns")
            # The one admitted in: its answer waits for the store's flush, which a fault's does not
            # (``Engine.hello_durable``), so it is waited for here, not raced.
            await wait_until(lambda: sum(link.connected for link in links[:3]) == 1, what="the first one in")
            running.append(asyncio.create_task(links[3].run(stop)))
            await wait_until(lambda: links[3].connected, timeout=1.5, what="the agent with a fault in at once")
            assert sum(link.connected for link in links[:3]) == 1  # the two others still wait their turns
            assert controller.engine.metrics.hellos_urgent._value.get() == 1
            await wait_until(lambda: spools[3].urgent_waiting() == 0, what="its fault delivered")
        finally:
            stop.set()
            await asyncio.gather(*running)
            await stop_controller(controller)

    asyncio.run(scenario())


def test_an_agent_given_a_later_turn_that_comes_to_have_a_fault_says_its_hello_at_once(tmp_path: Path) -> None:
    """A fleet reconnecting at once is paced (one Hello every 20 s): an agent turned away with its
    turn that comes to have a fault while it waits says its Hello then, not at its turn, and is
    admitted at once (its Hello says the fault waits)."""

    async def scenario() -> None:
        limits = LimitsConfig(hellos_per_s=0.05, hello_burst=1)
        controller = await start_controller(tmp_path / "ctl.db", limits=limits)
        stop = asyncio.Event()
        links, spools = paced_fleet(tmp_path, controller.port, 3)
        running = [asyncio.create_task(link.run(stop)) for link in links]
        try:
            await wait_until(lambda: controller.engine.metrics.hellos_paced._value.get() >= 2, what="two given turns")
            await wait_until(lambda: sum(link.connected for link in links) == 1, what="the first one in")
            waiting = next(i for i, link in enumerate(links) if not link.connected)  # its turn 20 s or more away
            spools[waiting].append([replace(xid(79), node=f"node-{waiting}")])
            links[waiting].notify()  # as the agent's collector does once a signal is spooled
            await wait_until(
                lambda: links[waiting].connected, timeout=3, what="the agent with a fault in before its turn"
            )
            assert sum(link.connected for link in links) == 2  # the other still waits its turn
            assert controller.engine.metrics.hellos_urgent._value.get() == 1
            await wait_until(lambda: spools[waiting].urgent_waiting() == 0, what="its fault delivered")
        finally:
            stop.set()
            await asyncio.gather(*running)
            await stop_controller(controller)

    asyncio.run(scenario())


def test_faults_that_keep_coming_while_the_controller_is_down_cut_the_backoff_once(tmp_path: Path) -> None:
    """A fault cuts short the wait before the next Hello once per Hello that said none: with the
    controller down and a fault spooled every 50 ms, the link still backs off, not dialling again
    for each fault."""

    async def scenario() -> None:
        spool, stop = Spool(tmp_path / "spool.db"), asyncio.Event()
        link = link_for(spool, free_port())  # nothing listens there
        running = asyncio.create_task(link.run(stop))
        try:
            await wait_until(lambda: link.streams >= 3, what="a few tries")
            tries = link.streams
            for _ in range(40):  # 2 s of faults
                spool.append([xid(79)])
                link.notify()
                await asyncio.sleep(0.05)
            # One try at once for the first fault (its Hello said none), then the backoff's own: at
            # most a handful in 2 s (0.2 s doubling each try), not one for each of the 40 faults.
            assert link.streams - tries <= 8, link.streams - tries
            assert link.said_urgent > 0
        finally:
            stop.set()
            await running

    asyncio.run(scenario())


def test_a_turn_the_controller_says_is_read_only_from_a_refusal_and_only_when_sane() -> None:
    from vigil_core.rpc_errors import RETRY_AFTER_KEY, code_of, explain, retry_after_s

    def refusal(code: grpc.StatusCode, value: str | None) -> grpc.aio.AioRpcError:
        trailing = grpc.aio.Metadata(*([(RETRY_AFTER_KEY, value)] if value is not None else []))
        return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailing, details="paced")

    assert retry_after_s(refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, "1500")) == 1.5
    assert retry_after_s(refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, None)) is None  # a plain refusal: back off
    assert retry_after_s(refusal(grpc.StatusCode.UNAVAILABLE, "1500")) is None
    assert retry_after_s(refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, "soon")) is None
    assert retry_after_s(refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, "-5")) is None
    assert retry_after_s(refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, str(10**9))) is None  # not believed
    # An asyncio call's error is no grpc.Call: its status is read all the same.
    assert code_of(refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, None)) is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "refused the call, over its limit: paced" in explain(
        refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, None), "c:1"
    )


def test_a_check_the_controller_stops_ends_with_its_processes_and_answers_not_run(tmp_path: Path) -> None:
    """A pair's rank 1 waiting on a port where no rank 0 will ever listen (its partner could not run):
    the controller stops it, the agent ends the check program and answers UNKNOWN, not run."""
    import psutil

    from agent.local_checks import LocalChecks
    from gpus.simulated import SimulatedBackend

    master = f"127.0.0.1:{free_port()}"  # nobody listens: the member waits for its store (60 s)

    def members() -> list[psutil.Process]:
        return [p for p in psutil.process_iter(["cmdline"]) if master in " ".join(p.info["cmdline"] or [])]

    async def scenario() -> None:
        controller = await start_controller(tmp_path / "c.db")
        spool = Spool(tmp_path / "spool.db")
        link = ControllerLink(
            f"127.0.0.1:{controller.port}",
            spool,
            lambda: agent_pb2.Hello(node=NODE, spool_id=spool.spool_id, last_acked_seq=spool.acked_seq),
            LocalChecks(NODE, SimulatedBackend(NODE, 1)).run,
            heartbeat_s=0.2,
        )
        stop = asyncio.Event()
        task = asyncio.create_task(link.run(stop))
        try:
            await wait_until(lambda: controller.nodes.fleet.is_connected(NODE), timeout=10)
            params = {"master": master, "rank": "1", "world-size": "2", "sizes": "1024"}
            run = agent_pb2.RunCheck(request_id="s/1", check="allreduce", params=params, deadline_s=120)
            answer = controller.nodes.checks.ask(NODE, run)
            assert answer is not None
            await wait_until(lambda: bool(members()), timeout=30)
            asked_to_stop = asyncio.get_running_loop().time()
            controller.nodes.checks.stop(NODE, "s/1", "its pair's partner node-b ended first: port taken")
            result = await asyncio.wait_for(answer, 10)
            assert asyncio.get_running_loop().time() - asked_to_stop < 10
            assert result.verdict == common_pb2.UNKNOWN and result.not_run == "stopped"
            assert result.reason == "stopped by the controller: its pair's partner node-b ended first: port taken"
            await wait_until(lambda: not members(), timeout=5)  # the program and all it started are gone
        finally:
            stop.set()
            await task
            spool.close()
            await stop_controller(controller)

    asyncio.run(scenario())
