"""How long a call waits for a busy gRPC asyncio server to take it, and how long after that its
first message is answered: where an agent's Hello patience should start (``vigil_core.call_taken``).

    python -m bench.call_taken [--streams 2000] [--busy-ms 0,5]

A server in a process of its own answers each call's first message at once, having said the call
taken first (its initial metadata, as Vigil's servers do); its event loop is kept busy besides in
steps of ``--busy-ms`` (0: idle), as a relay's or a controller's is by the streams it already
carries while a fleet connects. A client process opens ``--streams`` streams at once (100 per
connection), each writing one message: for each, the wait from its write until the server took the
call, then until its answer; and how many of them an agent giving up on a Hello after
``HELLO_ACK_TIMEOUT_S`` would have given up on, counting from its write (as it did) or from the
call taken (as it does). One server per busy step, one after the other. Printed and appended to
``bench/results/call_taken.jsonl`` with the command.
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


def _serve(conn: Connection, busy_s: float, streams: int) -> None:
    async def main() -> None:
        server = grpc.aio.server(options=server_options(1 << 20, 1 << 20, streams))
        handler = grpc.method_handlers_generic_handler(
            "bench.Taken", {"Connect": grpc.stream_stream_rpc_method_handler(_answer)}
        )
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        if busy_s > 0:
            asyncio.get_running_loop().create_task(_busy(busy_s))
        conn.send(port)
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)  # until told to stop
        await server.stop(None)

    asyncio.run(main())


async def _open_all(port: int, streams: int) -> dict[str, Any]:
    channels = [
        grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(-(-streams // PER_CONNECTION))
    ]
    taken: list[float] = []
    answered: list[float] = []
    calls: list[grpc.aio.StreamStreamCall] = []

    async def one(i: int) -> None:
        call = channels[i % len(channels)].stream_stream("/bench.Taken/Connect")()
        calls.append(call)
        await call.write(b"hello")
        said = time.monotonic()
        await call.initial_metadata()
        taken.append(time.monotonic() - said)
        await call.read()
        answered.append(time.monotonic() - said)

    started = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(streams)))
    elapsed = time.monotonic() - started
    for call in calls:
        call.cancel()
    for channel in channels:
        await channel.close()
    after = [a - t for a, t in zip(answered, taken, strict=True)]
    return {
        "all_answered_s": round(elapsed, 1),
        "taken_p50_s": round(percentile(taken, 0.5), 2),
        "taken_max_s": round(max(taken), 2),
        "then_answered_p50_s": round(percentile(after, 0.5), 3),
        "then_answered_max_s": round(max(after), 3),
        "given_up_from_write": sum(1 for a in answered if a > HELLO_ACK_TIMEOUT_S),
        "given_up_from_taken": sum(1 for a in after if a > HELLO_ACK_TIMEOUT_S),
    }


def one_server(streams: int, busy_ms: float) -> dict[str, Any]:
    ours, theirs = multiprocessing.Pipe()
    server = multiprocessing.Process(target=_serve, args=(theirs, busy_ms / 1000, streams), daemon=True)
    server.start()
    try:
        port = ours.recv()
        figures = asyncio.run(_open_all(port, streams))
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
    args = parser.parse_args()
    try:
        steps = [float(b) for b in args.busy_ms.split(",") if b.strip()]
    except ValueError:
        parser.error(f"--busy-ms must be numbers separated by commas, not {args.busy_ms!r}")
    if args.streams < 1 or not steps or any(b < 0 for b in steps):
        parser.error("--streams must be at least 1 and --busy-ms non-negative numbers")
    record = {
        **header("call_taken"),
        "revision": revision(),
        "streams": args.streams,
        "patience_s": HELLO_ACK_TIMEOUT_S,
        "servers": [one_server(args.streams, b) for b in steps],
    }
    print(json.dumps(record, indent=2))
    append_result("call_taken", record)


if __name__ == "__main__":
    main()
