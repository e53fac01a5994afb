"""A node's agent streams as the controller keeps them (``controller.nodes.agent_outboxes``)."""

from __future__ import annotations

from controller.nodes.agent_outboxes import AgentOutboxes
from protos.vigil.v1 import agent_pb2


def ack(seq: int) -> agent_pb2.ControllerMessage:
    return agent_pb2.ControllerMessage(ack=agent_pb2.Ack(acked_seq=seq))


def test_the_node_is_connected_while_any_of_its_streams_is_open_and_the_newest_is_sent_to() -> None:
    boxes = AgentOutboxes()
    older, newer = boxes.open("n1"), boxes.open("n1")
    assert boxes.send("n1", ack(1)) and newer.get_nowait() == ack(1) and older.empty()
    # Answered in either order: the older stream ending is not the node going away.
    assert boxes.close("n1", older) is False and boxes.is_open("n1")
    assert boxes.send("n1", ack(2)) and newer.get_nowait() == ack(2)
    assert boxes.close("n1", newer) is True and not boxes.is_open("n1")
    assert not boxes.send("n1", ack(3))


def test_a_late_stream_opened_after_a_newer_one_takes_the_sends_until_it_ends() -> None:
    """A Hello answered late (its stream already left by the agent) is the newest for a moment; when
    it ends, the stream still open takes what is sent, and the node stays connected."""
    boxes = AgentOutboxes()
    live, late = boxes.open("n1"), boxes.open("n1")
    assert boxes.close("n1", late) is False
    assert boxes.send("n1", ack(7)) and live.get_nowait() == ack(7)
    assert boxes.close("n1", live) is True
    assert boxes.close("n1", live) is True  # closing twice, or a stream never opened, changes nothing


def test_an_outbox_hands_its_reader_each_message_in_order_waiting_when_empty() -> None:
    import asyncio

    from controller.nodes.agent_outboxes import Outbox

    async def scenario() -> None:
        outbox = Outbox()
        reader = asyncio.create_task(outbox.get())
        await asyncio.sleep(0)
        assert not reader.done()  # nothing yet: it waits
        outbox.put_nowait(ack(1))
        outbox.put_nowait(ack(2))
        assert await asyncio.wait_for(reader, 1) == ack(1)
        assert outbox.qsize() == 1 and await outbox.get() == ack(2) and outbox.empty()
        outbox.put_nowait(None)  # the stream's end, after what came before
        assert outbox.get_nowait() is None
        try:
            outbox.get_nowait()
        except asyncio.QueueEmpty:
            pass
        else:
            raise AssertionError("an empty outbox gave something")
        cancelled = asyncio.create_task(outbox.get())
        await asyncio.sleep(0)
        cancelled.cancel()  # the stream gone while its reader waited
        await asyncio.gather(cancelled, return_exceptions=True)
        outbox.put_nowait(ack(3))  # no waiter left to wake: kept for the next reader
        assert await outbox.get() == ack(3)

    asyncio.run(scenario())


def test_what_a_stream_ending_had_not_sent_goes_through_the_stream_still_open_in_order() -> None:
    """A stream that ends with messages it did not write (a check request, an ack) hands them to the
    node's stream still open, in the order they were sent; the gateway's own end mark stays behind."""
    check = agent_pb2.ControllerMessage(run_check=agent_pb2.RunCheck(request_id="r1"))
    # A late Hello's stream, the newest, took the sends and ended: the older stream sends them after its own.
    boxes = AgentOutboxes()
    live = boxes.open("n1")
    assert boxes.send("n1", ack(1))
    late = boxes.open("n1")
    assert boxes.send("n1", check) and boxes.send("n1", ack(3))
    late.put_nowait(None)  # its reader ended
    assert boxes.close("n1", late) is False
    assert [live.get_nowait() for _ in range(live.qsize())] == [ack(1), check, ack(3)]
    # The older stream ended with messages unsent: the newer one sends them before its own.
    boxes = AgentOutboxes()
    older = boxes.open("n1")
    assert boxes.send("n1", check)
    newer = boxes.open("n1")
    assert boxes.send("n1", ack(4))
    assert boxes.close("n1", older) is False
    assert [newer.get_nowait() for _ in range(newer.qsize())] == [check, ack(4)]
