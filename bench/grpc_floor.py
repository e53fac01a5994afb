"""The floor under ``bench.scale``'s connect time: the same simulated fleet connecting to servers
that do nothing but gRPC, side by side with Vigil on the same machine.

    python -m bench.grpc_floor --nodes 100000 --workers 8 --servers 8 --streams-per-connection 100
                               [--vigil] [--relays-for-vigil K]

What runs: ``bench.scale``'s simulated fleet (``--workers`` processes, one real gRPC stream per
agent, ``--streams-per-connection`` agents on one HTTP/2 connection) against ``--servers`` bare
``grpc.aio`` servers, each a process of its own, serving ``AgentGateway/Connect`` with Vigil's own
server options (``vigil_core.tls.server_options``: message sizes, keepalive, every waiting call
admitted) and nothing else: each stream's first message is answered with an Ack, unread, and every
later one read and dropped. Each worker's agents go to one server, as ``bench.scale --relays K``
sends them to one relay. This is what any server written with Python's gRPC pays, with this
simulator, before doing anything a controller does: no decoding, no store, no bookkeeping.

Figures: connect time (every agent acknowledged), the servers' CPU and the simulator's (its
processes'), together and per agent, and what the connect time would be on this machine's cores if
that CPU were spread without a moment's wait (``cpu_bound_s``). With ``--vigil``, ``bench.scale``
runs right after with the same fleet (``--relays-for-vigil`` relays, default ``--servers``; one probe,
no bursts) and its connect figures are given beside, with the ratio. Printed and appended to
``bench/results/grpc_floor.jsonl`` with the command.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing
import os
import resource
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from multiprocessing.connection import Connection
from typing import Any

import grpc
import psutil

from bench.record import append_result, header, host_pace_ms, revision
from bench.scale import Workers, processes_cpu_s
from controller.edge import open_files
from protos.vigil.v1 import agent_pb2
from vigil_core.tls import server_options

SIMULATOR_FIGURES = ("lag_p99_ms", "lag_max_ms", "late_s", "stream_reconnects", "streams_broke_because")
ACK = agent_pb2.ControllerMessage(ack=agent_pb2.Ack(acked_seq=0)).SerializeToString()
MESSAGE_BYTES = 4 << 20


async def connect(requests: AsyncIterator[bytes], _context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    """A stream's first message answered with an Ack; the rest read and dropped until the agent ends it."""
    first = True
    async for _raw in requests:
        if first:
            first = False
            yield ACK


async def serve(pipe: Connection) -> None:
    soft, _ = open_files.raise_open_files(1 << 20)
    options = server_options(MESSAGE_BYTES, MESSAGE_BYTES, soft, agents_only=True)  # as a relay's
    server = grpc.aio.server(options=options)
    handler = grpc.stream_stream_rpc_method_handler(connect)
    service = grpc.method_handlers_generic_handler("vigil.v1.AgentGateway", {"Connect": handler})
    server.add_generic_rpc_handlers((service,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    pipe.send(port)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_reader(pipe.fileno(), stop.set)  # any word (or the pipe's end) stops it
    await stop.wait()
    await server.stop(grace=None)


def server_process(pipe: Connection) -> None:
    asyncio.run(serve(pipe))


def floor(args: argparse.Namespace) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    pipes, servers, targets = [], [], []
    for _ in range(args.servers):
        ours, theirs = context.Pipe()
        process = context.Process(target=server_process, args=(theirs,), daemon=True)
        process.start()
        if not ours.poll(60):
            raise RuntimeError("a bare server did not start within 60 s")
        targets.append(f"127.0.0.1:{ours.recv()}")
        pipes.append(ours)
        servers.append(process)
    names = [f"gpu-{i:06d}" for i in range(args.nodes)]
    server_pids = [p.pid for p in servers if p.pid is not None]
    server_cpu0 = processes_cpu_s(server_pids)
    workers = Workers(
        targets, names, args.workers, (5.0, 60.0), args.background_per_s, args.streams_per_connection or None
    )
    try:
        connect_s = workers.connected(args.connect_timeout_s)
        simulator = workers.stats()
        server_cpu = processes_cpu_s(server_pids) - server_cpu0
        simulator_cpu = workers.connect_cpu_s
        time.sleep(10)  # the fleet settled: its Hellos answered, its heartbeats on
        before = (processes_cpu_s(server_pids), workers.cpu_s(), time.monotonic())
        time.sleep(args.steady_s)
        after = (processes_cpu_s(server_pids), workers.cpu_s(), time.monotonic())
        elapsed = after[2] - before[2]
        steady = {
            "background_per_s": args.background_per_s,
            "seconds": round(elapsed, 1),
            "servers_cores": round((after[0] - before[0]) / elapsed, 2),
            "simulator_cores": round((after[1] - before[1]) / elapsed, 2),
        }
    finally:
        workers.stop()
        for pipe in pipes:
            with contextlib.suppress(OSError):
                pipe.send("stop")
        for process in servers:
            process.join(30)
            if process.is_alive():
                process.kill()
    cores = os.cpu_count() or 1
    return {
        "connect_s": round(connect_s, 1),
        "servers_cpu_s": round(server_cpu, 1),
        "simulator_cpu_s": round(simulator_cpu, 1),
        "cpu_ms_per_agent": {
            "servers": round(server_cpu / args.nodes * 1000, 3),
            "simulator": round(simulator_cpu / args.nodes * 1000, 3),
        },
        "cpu_bound_s": round((server_cpu + simulator_cpu) / cores, 1),
        "steady": steady,
        "simulator_while_connecting": {k: simulator[k] for k in SIMULATOR_FIGURES},
    }


def vigil_beside(args: argparse.Namespace) -> dict[str, Any]:
    """``bench.scale`` with the same fleet, one probe and no burst: its connect figures (it records its own line)."""
    relays = args.servers if args.relays_for_vigil is None else args.relays_for_vigil
    command = [sys.executable, "-m", "bench.scale", "--nodes", str(args.nodes), "--workers", str(args.workers),
               "--relays", str(relays), "--probes", "1", "--bursts", "",
               "--background-per-s", str(args.background_per_s),
               "--streams-per-connection", str(args.streams_per_connection)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.connect_timeout_s + 600)
    if done.returncode != 0:
        raise RuntimeError(f"bench.scale failed: {done.stderr[-2000:]}")
    record = json.loads(done.stdout)
    relays_cpu = (record.get("relays") or {}).get("connect_cpu_s", 0.0) if relays else 0.0
    vigil_cpu = record["connect_controller_cpu_s"] + relays_cpu
    return {
        "command": " ".join(command[1:]).replace("-m bench", "python -m bench"),
        "relays": relays,
        "connect_s": record["connect_s"],
        "controller_cpu_s": record["connect_controller_cpu_s"],
        "relays_cpu_s": relays_cpu,
        "cpu_ms_per_agent": round(vigil_cpu / args.nodes * 1000, 3),
        "simulator_cpu_s": record["connect_simulator_cpu_s"],
        "simulator_while_connecting": {k: record["simulator_while_connecting"][k] for k in SIMULATOR_FIGURES},
        "steady": {k: record["steady"][k] for k in ("controller_cores", "relays_cores", "simulator_cores")},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=20000)
    parser.add_argument("--workers", type=int, default=3, help="processes simulating the fleet")
    parser.add_argument("--servers", type=int, default=1, help="bare gRPC servers (each worker's agents on one)")
    parser.add_argument("--streams-per-connection", type=int, default=100, help="agents on one HTTP/2 connection")
    parser.add_argument("--connect-timeout-s", type=float, default=1200)
    parser.add_argument("--background-per-s", type=float, default=0.0, help="record-only signals a second")
    parser.add_argument("--steady-s", type=float, default=30.0, help="how long the steady load's CPU is measured")
    parser.add_argument("--vigil", action="store_true", help="bench.scale right after, its connect figures beside")
    parser.add_argument(
        "--relays-for-vigil", type=int, default=None, help="relays in bench.scale's run (default: --servers)"
    )
    args = parser.parse_args()
    if args.nodes < 1 or args.workers < 1 or args.servers < 1 or args.streams_per_connection < 1:
        parser.error("--nodes, --workers, --servers and --streams-per-connection must be at least 1")
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    connections = math.ceil(math.ceil(args.nodes / args.streams_per_connection) / args.servers)  # a server's share
    if hard != resource.RLIM_INFINITY and connections + open_files.SPARE > hard:
        parser.error(f"{connections} connections a server need {connections + open_files.SPARE} open files; the hard "
                     f"limit is {hard}: raise it (ulimit -Hn) or raise --streams-per-connection")  # fmt: skip
    pace_before = host_pace_ms()
    try:
        figures = floor(args)
        print(f"bare gRPC: {args.nodes} agents connected in {figures['connect_s']} s", file=sys.stderr)
    except (TimeoutError, RuntimeError) as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1
    if args.vigil:  # the floor is recorded whatever becomes of Vigil's run
        try:
            figures["vigil"] = vigil = vigil_beside(args)
            figures["vigil_over_floor"] = round(vigil["connect_s"] / max(figures["connect_s"], 0.1), 2)
        except (RuntimeError, subprocess.TimeoutExpired, KeyError, ValueError) as exc:
            figures["vigil"] = {"failed": f"{exc}"[-2000:]}
            print(f"bench.scale beside it failed: {exc}", file=sys.stderr)
    record = {
        **header(
            "grpc_floor",
            memory_gb=round(psutil.virtual_memory().total / 2**30),
            pace_ms=[pace_before, host_pace_ms()],  # before the floor and after it (and Vigil's, with --vigil)
        ),
        "revision": revision(),
        "nodes": args.nodes,
        "workers": args.workers,
        "servers": args.servers,
        "streams_per_connection": args.streams_per_connection,
        "grpcio": grpc.__version__,
        **figures,
    }
    print(json.dumps(record, indent=2))
    append_result("grpc_floor", record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
