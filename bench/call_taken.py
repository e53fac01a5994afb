"""How long a call waits for a busy gRPC asyncio server to take it, and how long after that its
first message is answered: where an agent's Hello patience should start (``vigil_core.call_taken``).

    python -m bench.call_taken [--streams 2000] [--busy-ms 0,5] [--urgent 20]

A server in a process of its own answers each call's first message at once, having said the call
taken first (its initial metadata, as Vigil's servers do); its event loop is kept busy besides in
steps of ``--busy-ms`` (0: idle), as a relay's or a controller's is by the streams it already
carries while a fleet connects. A client process opens ``--streams`` streams at once (100 per
connection), each writing one message: for each, the wait from its write until the server took the
call, then until its answer; and how many of them an agent giving up on a Hello after
``HELLO_ACK_TIMEOUT_S`` would have given up on, counting from its write (as it did) or from the
call taken (as it does). One server per busy step, one after the other. Printed and appended to
``bench/results/call_taken.jsonl`` with the command.

``--urgent N``: the server process opens a second server beside the first, its urgent port
(``vigil_core.urgent_port``), and ``--urgent-after-s`` into the crowd N more streams are opened on
the main port and N on the urgent one, at the same moment: how long each waited to be taken
(``urgent``: ``main_taken_*`` against ``urgent_taken_*``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import time
from collections.abc import AsyncIterator
from multiprocessing.connection import Connection
from typing import Any

import grpc

from agent.link import HELLO_ACK_TIMEOUT_S
from bench.record import append_result, header, percentile, revision
from vigil_core.call_taken import say_taken
from vigil_core.tls import server_options

PER_CONNECTION = 100


async def _answer(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    await say_taken(context)
    await anext(aiter(requests), None)
    yield b"answer"
    async for _ in requests:
        pass


async def _busy(step_s: float) -> None:
    """The loop's other work: ``step_s`` of CPU at a time, the loop free between."""
    while True:
        started = time.perf_counter()
        while time.perf_counter() - started < step_s:
            pass
        await asyncio.sleep(0)


def _serve(conn: Connection, busy_s: float, streams: int, urgent: bool) -> None:
    async def main() -> None:
        handler = grpc.method_handlers_generic_handler(
            "bench.Taken", {"Connect": grpc.stream_stream_rpc_method_handler(_answer)}
        )
        servers, ports = [], []
        for _ in range(2 if urgent else 1):  # the main port, then the urgent one: a server each, as Vigil's
            server = grpc.aio.server(options=server_options(1 << 20, 1 << 20, streams))
            server.add_generic_rpc_handlers((handler,))
            ports.append(server.add_insecure_port("127.0.0.1:0"))
            await server.start()
            servers.append(server)
        if busy_s > 0:
            asyncio.get_running_loop().create_task(_busy(busy_s))
        conn.send(ports)
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)  # until told to stop
        for server in servers:
            await server.stop(None)

    asyncio.run(main())


def _channel(port: int) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)])


async def _open_all(ports: list[int], streams: int, urgent: int, urgent_after_s: float) -> dict[str, Any]:
    channels = [_channel(ports[0]) for _ in range(-(-streams // PER_CONNECTION))]
    taken: list[float] = []
    answered: list[float] = []
    late_taken: dict[str, list[float]] = {"main": [], "urgent": []}
    calls: list[grpc.aio.StreamStreamCall] = []

    async def one(channel: grpc.aio.Channel, late: str = "") -> None:
        call = channel.stream_stream("/bench.Taken/Connect")()
        calls.append(call)
        await call.write(b"hello")
        said = time.monotonic()
        await call.initial_metadata()
        (late_taken[late] if late else taken).append(time.monotonic() - said)
        await call.read()
        if not late:
            answered.append(time.monotonic() - said)

    async def late_ones() -> None:
        await asyncio.sleep(urgent_after_s)
        late = [_channel(ports[0]), _channel(ports[1])]
        channels.extend(late)
        await asyncio.gather(
            *(one(late[0], "main") for _ in range(urgent)), *(one(late[1], "urgent") for _ in range(urgent))
        )

    started = time.monotonic()
    await asyncio.gather(
        *(one(channels[i % len(channels)]) for i in range(streams)), *([late_ones()] if urgent else [])
    )
    elapsed = time.monotonic() - started
    for call in calls:
        call.cancel()
    for channel in channels:
        await channel.close()
    after = [a - t for a, t in zip(answered, taken, strict=True)]
    lates = {
        f"{door}_taken_{name}_s": round(figure, 2)
        for door, waits in late_taken.items()
        if waits
        for name, figure in (("p50", percentile(waits, 0.5)), ("max", max(waits)))
    }
    return {
        "all_answered_s": round(elapsed, 1),
        "taken_p50_s": round(percentile(taken, 0.5), 2),
        "taken_max_s": round(max(taken), 2),
        "then_answered_p50_s": round(percentile(after, 0.5), 3),
        "then_answered_max_s": round(max(after), 3),
        "given_up_from_write": sum(1 for a in answered if a > HELLO_ACK_TIMEOUT_S),
        "given_up_from_taken": sum(1 for a in after if a > HELLO_ACK_TIMEOUT_S),
        **({"urgent": {"n": urgent, "after_s": urgent_after_s, **lates}} if urgent else {}),
    }


def one_server(streams: int, busy_ms: float, urgent: int = 0, urgent_after_s: float = 2.0) -> dict[str, Any]:
    ours, theirs = multiprocessing.Pipe()
    server = multiprocessing.Process(target=_serve, args=(theirs, busy_ms / 1000, streams, urgent > 0), daemon=True)
    server.start()
    try:
        ports = ours.recv()
        figures = asyncio.run(_open_all(ports, streams, urgent, urgent_after_s))
    finally:
        ours.send("stop")
        server.join(30)
        if server.is_alive():
            server.kill()
    return {"busy_ms": busy_ms, **figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--busy-ms", default="0,5", help="the server loop's busy steps, comma-separated (0: idle)")
    parser.add_argument("--urgent", type=int, default=0, help="streams opened into the crowd on each port (0: none)")
    parser.add_argument("--urgent-after-s", type=float, default=2.0, help="when, after the crowd's")
    args = parser.parse_args()
    try:
        steps = [float(b) for b in args.busy_ms.split(",") if b.strip()]
    except ValueError:
        parser.error(f"--busy-ms must be numbers separated by commas, not {args.busy_ms!r}")
    if args.streams < 1 or not steps or any(b < 0 for b in steps):
        parser.error("--streams must be at least 1 and --busy-ms non-negative numbers")
    if args.urgent < 0 or args.urgent_after_s < 0:
        parser.error("--urgent and --urgent-after-s must not be negative")
    record = {
        **header("call_taken"),
        "revision": revision(),
        "streams": args.streams,
        "patience_s": HELLO_ACK_TIMEOUT_S,
        "servers": [one_server(args.streams, b, args.urgent, args.urgent_after_s) for b in steps],
    }
    print(json.dumps(record, indent=2))
    append_result("call_taken", record)


if __name__ == "__main__":
    main()
