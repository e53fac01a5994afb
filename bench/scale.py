"""Vigil at fleet scale, measured the way NVSentinel measures its own: one controller, N nodes.

    python -m bench.scale --nodes 20000 [--workers 3] [--heartbeat-s 5] [--idle-heartbeat-s 60]
                          [--background-per-s 500] [--probes 60] [--probe-every-s 0.5]
                          [--bursts 100,400,1000] [--restart] [--hellos-per-s N] [--switch-interval-ms MS]
                          [--database sqlite|postgresql] [--relays K] [--relay-hello-wait-s S]
                          [--relay-linger-ms MS] [--failover [kill|stop]] [--faults-across N]
                          [--agents-give-up] [--keep]

What runs, all on this machine:

- a real ``vigil controller`` process with the Kubernetes actuator, talking to the Kubernetes API
  double (``tests/fakes/kube_api.py``, holding all N Node objects; it stamps each request's arrival);
  guards open (breaker, shared-cause and rate limit: every fault here is real), pager off;
- N simulated agents, one real gRPC stream each (``tests/fakes/fleet.py``), each on a connection of
  its own as real agents are (``--streams-per-connection``; 0: every stream of a worker on one
  HTTP/2 connection, which is how the figures before that option were taken), heartbeating as
  the agent does (``--heartbeat-s`` with something new to say, else ``--idle-heartbeat-s``),
  spread over ``--workers`` processes so that the simulator is not what is measured: each worker
  measures its own event loop's lag (a 10 ms ticker) and says it with the figures, with the
  streams gRPC's client broke by itself and why;
- continuous background: ``--background-per-s`` record-only signals a second (XID 63, a row remap
  event: stored, no action), spread over the fleet;
- probes: ``--probes`` single XID 79s, one every ``--probe-every-s`` on a fresh node: fault →
  cordon (the agent's stamp to the cordon PATCH arriving at the API server) and controller → cordon
  (the controller's receipt, read back from its incident, to the PATCH);
- bursts: each of ``--bursts`` nodes failing at the same moment, until all are cordoned
  (``all_cordoned_s``) and every quarantine's condition and Event are written (``all_recorded_s``);
- ``--relays K``: K ``vigil relay`` processes between the fleet and the controller (each worker's
  agents on one of them): the controller then holds K streams, and the agents' connections are the
  relays' (their RSS and CPU are given beside the controller's); ``--relay-hello-wait-s``: the
  wait at the controller each relay sizes its room for Hellos by (``controller.relay.hello_room``);
- ``--restart``: the controller stopped and started again; the time until every agent is back
  (``--hellos-per-s``: the controller's Hello pacing, 0 for none: every agent admitted at once);
- ``--switch-interval-ms``: the controller's ``limits.switch_interval_ms`` (0: CPython's 5 ms), to
  set it beside the default in interleaved runs;
- ``--failover`` (with ``--relays``): two controllers under a Lease on the API double (leader
  election, its default timings: a 15 s lease), the relays given both; the leader is killed
  (SIGKILL; ``--failover stop``: stopped with SIGTERM, as a rolling update does, and it hands the
  Lease back) and the times until the standby serves and until every agent is back through the
  relays are measured (``kill_to_new_leader_s`` from the signal either way). On PostgreSQL the
  two share the database; on SQLite the standby has a file of its own (it learns the fleet from
  the agents' Hellos). With either, ``--faults-across`` XID 79s on fresh nodes, half just before the
  signal and half a second after it: once every agent is back, each node must be cordoned, and the
  controller serving then must hold one XID 79 incident for it (``faults_across``: nothing lost,
  nothing twice);
- ``--agents-give-up``: the simulated agents give up on a Hello unanswered for 10 s of their
  process's own time (then 20, 40, ... s), counted once the server has taken the call
  (``vigil_core.call_taken``; how long that took: ``call_taken``), and reconnect, as the agent
  does; without it they wait on, which hides what an overloaded path costs real agents. With
  relays, how long the Hellos waited at them for the controller's answer is given either way
  (``relays_hello_answered``).

- ``--faults-connecting N``: XID 79s in the spools of N fresh nodes as the whole fleet starts
  connecting from nothing (a relay's agents moving to the others, the relays rolled); once the fleet
  is connected each must be cordoned, and ``faults_connecting`` says how long after it was made. The
  controller and the relays open their urgent ports and the simulated agents with faults waiting
  dial them (``vigil_core.urgent_port``; ``--no-urgent-port``: neither, every call on the main port).
  ``--faults-come-s S``: those agents start instead at a moment of their own in the first S seconds
  of the connect, each fault coming 0.5-5 s after its agent started (seeded; ``--fault-after-start-s
  LO,HI`` for other bounds: at 100,000 through 4 relays every agent still waited 20-40 s after it
  started), while it waits for its Hello's answer or once it is in; ``faults_connecting.waiting_when_made``
  says how many still waited. ``--agents-wait-their-turn``:
  the simulated agents as before a fault could end their wait (it waits with their Hello): the
  side-by-side baseline for ``agent.link.FaultCame``.

Figures: connect time (all N agents acknowledged), controller RSS (peak) and CPU (cores, per phase;
a burst's CPU of this process, the API double's, beside it), database size (and on PostgreSQL its
server's CPU while connecting, ``connect_database_cpu_s``; the controller's by thread,
``connect_controller_threads_cpu_s``: its event loop, the store's writer...), each phase's
latencies, the simulator's own lag. Printed and appended to
bench/results/scale.jsonl with the command that produced them. PostgreSQL runs with fsync on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import multiprocessing
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import psutil
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from agent.link import HELLO_ACK_TIMEOUT_S, HELLO_PATIENCE_DOUBLINGS, hello_patience_s
from bench import thread_clock
from bench.controller_process import controller_target, port_file, start_controller, wide_open
from bench.record import append_result, header, host_pace_ms, logged_at, percentile, revision
from bench.thread_clock import ThreadClock
from controller.edge import open_files
from controller.nodes.guards.shared import SharedCauseConfig
from protos.vigil.v1 import admin_pb2
from tests.fakes.fleet import Fleet
from tests.fakes.kube_api import KubeApiServer
from tests.helpers import free_port
from tests.postgres import postgres_cluster
from tests.postgres import unavailable as postgres_unavailable
from vigil.admin_client import AdminClient
from vigil_core import gc_young, loop_lag

BACKGROUND_CODE = 63  # a row remap event: recorded, no action (the default policy)


def summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50_ms": round(percentile(values, 0.5) * 1000, 1),
        "p90_ms": round(percentile(values, 0.9) * 1000, 1),
        "p99_ms": round(percentile(values, 0.99) * 1000, 1),
        "max_ms": round(max(values) * 1000, 1),
    }


def controller_times(log: Path, nodes: list[str]) -> dict[str, dict[str, float]]:
    """Each probe's moments in the controller, from its JSON log (wall-clock seconds): its incident
    ``opened``, its page carried out (``settled``: paging is off here, so that is the settling window's
    sleep over and nothing else) and its quarantine ``done`` (the cordon, the condition and the Event
    written)."""
    times: dict[str, dict[str, float]] = {}
    wanted = set(nodes)
    with log.open() as lines:
        for line in lines:
            if '"node"' not in line or not line.startswith("{"):
                continue
            entry = json.loads(line)
            node, event = entry.get("node"), entry.get("event")
            if node not in wanted:
                continue
            if event == "incident_opened" and entry.get("code") == 79:
                moment = "opened"
            elif event == "action_done" and str(entry.get("action", "")).startswith("PAGE"):
                moment = "settled"
            elif event == "action_done" and entry.get("action") == "QUARANTINE":
                moment = "done"
            else:
                continue
            times.setdefault(node, {}).setdefault(moment, logged_at(entry))
    return times


def controller_split(times: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Where each probe's time in the controller went (``controller_times``): from its incident opened
    to its settling window's sleep over (how late that ended is how long the event loop was held up),
    and to its quarantine done. Pure."""

    def since_opened(moment: str) -> list[float]:
        return [t[moment] - t["opened"] for t in times.values() if "opened" in t and moment in t]

    return {"to_settled": summary(since_opened("settled")), "to_quarantined": summary(since_opened("done"))}


def threads_in_settling(clock: ThreadClock, moments: dict[str, dict[str, float]], settle_ms: float) -> dict[str, Any]:
    """Where the controller's threads and the other processes were in each probe's settling window
    (``thread_clock``): the windows that ended 20 ms and more past the sleep, summed, beside all of
    them, and the clock's own CPU (``clock_cpu_s``); the clock stopped."""
    try:
        spent = clock.spent([(t["opened"], t["settled"]) for t in moments.values() if "opened" in t and "settled" in t])
    finally:
        clock.stop()
    return thread_clock.held_up(spent, settle_ms, over_ms=20) | {"clock_cpu_s": clock.own_cpu_s}


# The simulated fleet's processes ------------------------------------------------------------------


class LagMeter:
    """How late this process's event loop wakes a 10 ms ticker: its backlog, said with the figures."""

    def __init__(self) -> None:
        self.samples: list[float] = []

    async def run(self) -> None:
        await loop_lag.watch(lambda lag: self.samples.append(lag), interval_s=0.01)  # take() swaps the list

    def take(self) -> dict[str, float]:
        samples, self.samples = self.samples, []
        if not samples:
            return {"p99_ms": 0.0, "max_ms": 0.0, "late_s": 0.0}
        p99, worst = percentile(samples, 0.99), max(samples)
        return {"p99_ms": round(p99 * 1000, 1), "max_ms": round(worst * 1000, 1), "late_s": round(sum(samples), 1)}


def worker(conn: Connection, *args: Any) -> None:
    """A simulator process: ``_worker``'s loop (its arguments, after the pipe). Its garbage collector
    collects young as the controller's and the relays' do (``vigil_core.gc_young``): with CPython's
    own 700, the simulator spent about 30% of its time while connecting in collections (py-spy,
    12,500 agents a process), time taken from the processes it measures on the same cores."""
    gc_young.set_young(gc_young.YOUNG_OBJECTS, say=False)  # its stdout is the bench's: not said
    asyncio.run(_worker(conn, *args))


async def _worker(
    conn: Connection,
    target: str,
    names: list[str],
    beats: tuple[float, float],
    background_per_s: float,
    per_connection: int | None,
    hello_again: bool,
    give_up: bool,
    urgent_target: str | None = None,
    faulted: tuple[str, ...] = (),
    fault_come: tuple[float, float, float] | None = None,
    wait_their_turn: bool = False,
) -> None:
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
    loop.add_reader(conn.fileno(), lambda: inbox.put_nowait(conn.recv()))
    lag = LagMeter()
    lag_task = asyncio.create_task(lag.run())
    fleet = Fleet(
        target,
        names,
        beats[0],
        idle_heartbeat_s=beats[1],
        streams_per_connection=per_connection,
        resumable=hello_again,
        hello_patience_first_s=HELLO_ACK_TIMEOUT_S if give_up else None,
        urgent_target=urgent_target,
    )
    answer_waits: list[float] = []  # each Hello's wait for its first answer, since the last stats
    taken_waits: list[float] = []  # each stream's wait for the server to take it (vigil_core.call_taken)
    for node in fleet.nodes.values():
        node.answered = lambda waited: answer_waits.append(waited)  # the list is emptied, never swapped
        node.taken_in = lambda waited: taken_waits.append(waited)
        node.leave_for_urgent = not wait_their_turn
    started, cpu0 = time.time(), time.process_time()
    spooled: dict[str, float] = {}
    all_came = loop.create_future()

    def come(node: str) -> None:
        spooled[node] = fleet.nodes[node].fault()
        if len(spooled) == len(faulted) and not all_came.done():
            all_came.set_result(None)

    start_in: dict[str, float] = {}
    for n in faulted:  # in their spools as their agents start, or coming as each waits (``--faults-come-s``)
        if fault_come is not None:  # its agent starts within the first span, its fault comes (lo, hi) after
            span_s, after_lo_s, after_hi_s = fault_come
            moments = random.Random(n)
            start_in[n] = moments.uniform(0, span_s)
            loop.call_later(start_in[n] + moments.uniform(after_lo_s, after_hi_s), come, n)
        else:
            come(n)
    await fleet.start(timeout_s=1800, start_in=start_in)
    if faulted:
        await all_came
    # The streams' objects, made once, are never garbage: left to the collector, each full pass over
    # them stopped this process for seconds (the simulator's own lag), and its agents with it.
    gc.freeze()
    urgent_streams = sum(n.urgent_streams for n in fleet.nodes.values())
    conn.send(("connected", time.time() - started, time.process_time() - cpu0, spooled, urgent_streams))
    background = asyncio.create_task(_background(fleet, names, background_per_s))
    try:
        while True:
            command = await inbox.get()
            match command:
                case ("fault", faulty, watch):
                    conn.send(("sent", {n: fleet.nodes[n].fault(watch=watch) for n in faulty}))
                case ("watched", nodes):  # the streams' times for each node's last watched signal
                    conn.send(("watched", {n: fleet.nodes[n].last_watched for n in nodes}))
                case ("stats",):
                    reconnects = sum(n.reconnects for n in fleet.nodes.values())
                    paced = sum(n.paced for n in fleet.nodes.values())
                    why = Counter(n.last_error[:80] for n in fleet.nodes.values() if n.last_error)
                    unsent = sum(n.unsent for n in fleet.nodes.values())
                    stats = {"lag": lag.take(), "reconnects": reconnects, "paced": paced, "why": dict(why)}
                    stats["hello_again"] = sum(n.resumed for n in fleet.nodes.values())
                    stats["gave_up"] = fleet.gave_up
                    stats["unasked"] = sum(getattr(n, "unasked", 0) for n in fleet.nodes.values())  # an older fleet: 0
                    stats["left_for_urgent"] = sum(n.left_for_urgent for n in fleet.nodes.values())
                    stats["unsent"] = unsent
                    stats["answer_waits"], stats["taken_waits"] = list(answer_waits), list(taken_waits)
                    answer_waits.clear()
                    taken_waits.clear()
                    conn.send(("stats", stats))
                case ("connected_at", nodes):  # when each node's agent was last taken back (its Hello's Ack)
                    conn.send(("connected_at", {n: fleet.nodes[n].connected_at for n in nodes}))
                case ("connected_since", since):
                    back = [n.connected_at for n in fleet.nodes.values() if n.connected_at >= since]
                    conn.send(("connected_since", len(back), max(back, default=0.0)))
                case ("stop",):
                    break
    finally:
        background.cancel()
        lag_task.cancel()
        await fleet.close()
        conn.send(("stopped",))


async def _background(fleet: Fleet, names: list[str], per_s: float) -> None:
    """Record-only signals at ``per_s`` a second, each on a node picked at random, sent every 10 ms."""
    if per_s <= 0:
        return
    owed, last = 0.0, time.monotonic()
    while True:
        await asyncio.sleep(0.01)
        now = time.monotonic()
        owed += (now - last) * per_s
        last = now
        while owed >= 1:
            owed -= 1
            fleet.nodes[random.choice(names)].fault(BACKGROUND_CODE, message="row remap event")


def _answer_waits(waits: list[float]) -> dict[str, float]:
    """How long the Hellos waited for their first answer (an Ack or a Hello again), and how many waited
    longer than an agent's first wait (``HELLO_ACK_TIMEOUT_S``: a real agent gives up there and
    reconnects, then waits twice as long) and than its longest (``hello_patience_s``: a real agent
    would have given up on every one of its Hellos so far). The simulated agents wait on."""
    if not waits:
        return {"n": 0}
    first, longest = HELLO_ACK_TIMEOUT_S, hello_patience_s(HELLO_PATIENCE_DOUBLINGS)
    p50, p99 = percentile(waits, 0.5), percentile(waits, 0.99)
    return {"n": len(waits), "p50_s": round(p50, 2), "p99_s": round(p99, 2), "max_s": round(max(waits), 2),
            f"over_{first:g}s": sum(1 for w in waits if w > first),
            f"over_{longest:g}s": sum(1 for w in waits if w > longest)}  # fmt: skip


class Workers:
    """The fleet's processes, each with a share of the nodes, and a pipe to each."""

    def __init__(
        self,
        targets: list[str],
        names: list[str],
        count: int,
        beats: tuple[float, float],
        background_per_s: float,
        per_connection: int | None,
        hello_again: bool = True,
        give_up: bool = False,
        urgent_targets: list[str] | None = None,
        faulted: frozenset[str] = frozenset(),
        fault_come: tuple[float, float, float] | None = None,
        wait_their_turn: bool = False,
    ) -> None:
        """``urgent_targets``: the urgent port beside each of ``targets``; ``faulted``: nodes with a
        fault in their spool as they start connecting, or (``fault_come``: span, lo, hi) their agents
        starting within the span's first seconds and each fault coming lo-hi s after
        (``spooled``: when each was made, once connected), in processes of
        their own, one per target: each real agent is on a machine of its own, not slowed by the rest
        of the fleet, where a simulator process's loop runs tens of seconds late while 100,000 connect."""
        context = multiprocessing.get_context("spawn")
        rest, ordered_faulted = [n for n in names if n not in faulted], [n for n in names if n in faulted]
        self.shares = [rest[i::count] for i in range(count)]
        self.shares += [share for i in range(len(targets)) if (share := ordered_faulted[i :: len(targets)])]
        self.owner = {n: i for i, share in enumerate(self.shares) for n in share}
        self.pipes: list[Connection] = []
        self.processes = []
        self.connect_cpu_s = 0.0  # the workers' CPU while connecting, once connected
        self.spooled: dict[str, float] = {}  # the faults in spools at the start: when each was made
        self.urgent_streams = 0  # streams opened on an urgent port while connecting
        for i, share in enumerate(self.shares):
            ours, theirs = context.Pipe()
            process = context.Process(
                target=worker,
                args=(
                    theirs,
                    targets[i % len(targets)],
                    share,
                    beats,
                    background_per_s / count if i < count else 0.0,
                    per_connection,
                    hello_again,
                    give_up,
                    urgent_targets[i % len(urgent_targets)] if urgent_targets else None,
                    tuple(n for n in share if n in faulted),
                    fault_come,
                    wait_their_turn,
                ),
                daemon=True,
            )
            process.start()
            self.pipes.append(ours)
            self.processes.append(process)

    def _ask_all(self, command: tuple[Any, ...], answer: str, timeout_s: float = 60.0) -> list[tuple[Any, ...]]:
        for pipe in self.pipes:
            pipe.send(command)
        return [self._answer(pipe, answer, timeout_s) for pipe in self.pipes]

    @staticmethod
    def _answer(pipe: Connection, answer: str, timeout_s: float) -> tuple[Any, ...]:
        if not pipe.poll(timeout_s):
            raise TimeoutError(f"a fleet worker did not answer {answer!r} within {timeout_s} s")
        got: tuple[Any, ...] = pipe.recv()
        if got[0] != answer:
            raise RuntimeError(f"a fleet worker answered {got[0]!r}, not {answer!r}")
        return got

    def connected(self, timeout_s: float) -> float:
        """How long the slowest worker took to connect its agents (its own start left out); their
        CPU for it, all threads, in ``connect_cpu_s``."""
        answers = [self._answer(p, "connected", timeout_s) for p in self.pipes]
        self.connect_cpu_s = sum(float(a[2]) for a in answers)
        self.spooled = {n: at for a in answers for n, at in a[3].items()}
        self.urgent_streams = sum(int(a[4]) for a in answers)
        return max(float(a[1]) for a in answers)

    def _ask_owners(self, nodes: list[str], command: str, answer: str, *extra: Any) -> dict[str, Any]:
        """``(command, their nodes, *extra)`` to the workers owning ``nodes``; their answers, by node."""
        by_worker: dict[int, list[str]] = {}
        for n in nodes:
            by_worker.setdefault(self.owner[n], []).append(n)
        for i, share in by_worker.items():
            self.pipes[i].send((command, share, *extra))
        found: dict[str, Any] = {}
        for i in by_worker:
            found |= self._answer(self.pipes[i], answer, 60)[1]
        return found

    def fault(self, nodes: list[str], watch: bool = False) -> dict[str, float]:
        """A fault on each node now; their send times. ``watch``: their streams' times are kept (``watched``)."""
        return self._ask_owners(nodes, "fault", "sent", watch)

    def watched(self, nodes: list[str]) -> dict[str, list[float]]:
        """Each node's last watched fault: sent, then each time its stream took it and was done with it."""
        return self._ask_owners(nodes, "watched", "watched")

    def stats(self) -> dict[str, Any]:
        answers = [a[1] for a in self._ask_all(("stats",), "stats")]
        return {
            "lag_p99_ms": max(a["lag"]["p99_ms"] for a in answers),
            "lag_max_ms": max(a["lag"]["max_ms"] for a in answers),
            "late_s": [a["lag"]["late_s"] for a in answers],  # each process's loop, late in all
            "unsent_messages": sum(a["unsent"] for a in answers),  # held back by the streams' flow control
            "stream_reconnects": sum(a["reconnects"] for a in answers),
            "hellos_paced": sum(a["paced"] for a in answers),
            "hellos_again": sum(a["hello_again"] for a in answers),  # on streams a relay kept (no reconnection)
            "hellos_given_up": sum(a["gave_up"] for a in answers),  # with --agents-give-up: as real agents would
            "urgent_hellos_unasked": sum(a["unasked"] for a in answers),  # faults waiting while a relay waited
            "left_for_urgent": sum(a.get("left_for_urgent", 0) for a in answers),  # a fault came as its Hello waited
            "hello_answered": _answer_waits([w for a in answers for w in a["answer_waits"]]),
            # from a stream's Hello to the server taking its call, where its patience starts
            "call_taken": _answer_waits([w for a in answers for w in a["taken_waits"]]),
            "streams_broke_because": dict(sum((Counter(a["why"]) for a in answers), Counter())),
        }

    def renice(self, nice: int) -> None:
        """Every thread of the fleet's processes at niceness ``nice`` (Linux's is a thread's own; the
        threads they start later take it from theirs)."""
        for process in self.processes:
            for task in Path(f"/proc/{process.pid}/task").iterdir():
                with contextlib.suppress(ProcessLookupError):  # a thread gone since: only that is let pass
                    os.setpriority(os.PRIO_PROCESS, int(task.name), nice)

    def cpu_s(self) -> float:
        """The fleet's processes' CPU over their whole life so far (all threads)."""
        return processes_cpu_s(process.pid for process in self.processes if process.pid is not None)

    def connected_at(self, nodes: list[str]) -> dict[str, float]:
        """When each node's agent was last taken back (the Ack of its Hello)."""
        return self._ask_owners(nodes, "connected_at", "connected_at")

    def back_since(self, since: float) -> tuple[int, float]:
        answers = self._ask_all(("connected_since", since), "connected_since")
        return sum(a[1] for a in answers), max(a[2] for a in answers)

    def stop(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError):
                pipe.send(("stop",))
        for process in self.processes:
            process.join(30)
            if process.is_alive():
                process.kill()


# The controller's side -----------------------------------------------------------------------------


class Relays:
    """``vigil relay`` processes in front of the controller (none: agents connect to it directly)."""

    def __init__(
        self,
        controller: str,
        count: int,
        workdir: Path,
        gc_freeze: bool = False,
        hello_wait_s: float | None = None,
        urgent: bool = False,
        linger_ms: float | None = None,
    ) -> None:
        self.processes: list[subprocess.Popen[bytes]] = []
        self.targets: list[str] = []
        self.urgent_targets: list[str] = []  # each one's urgent port (``urgent``)
        self.metrics_ports: list[int] = []
        for i in range(count):
            port, port_file = free_port(), workdir / f"relay-{i}.port"
            self.metrics_ports.append(free_port())
            if urgent:
                self.urgent_targets.append(f"127.0.0.1:{free_port()}")
            command = [sys.executable, "-m", "vigil", "relay", "--controller", controller, "--plaintext",
                       "--listen", f"127.0.0.1:{port}", "--port-file", str(port_file),
                       "--metrics-port", str(self.metrics_ports[-1]), "--log-format", "json",
                       "--gc-freeze" if gc_freeze else "--no-gc-freeze",
                       *(["--hello-wait-s", str(hello_wait_s)] if hello_wait_s is not None else []),
                       *(["--linger-ms", str(linger_ms)] if linger_ms is not None else []),
                       *(["--urgent-listen", self.urgent_targets[-1]] if urgent else [])]  # fmt: skip
            out = open(workdir / f"relay-{i}.out", "wb")  # noqa: SIM115 (the process's until it ends)
            self.processes.append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT))
            deadline = time.monotonic() + 60
            while not port_file.exists():
                if self.processes[-1].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((workdir / f"relay-{i}.out").read_text()[-2000:])
                time.sleep(0.05)
            self.targets.append(f"127.0.0.1:{port}")
        self.samplers = [Sampler(p.pid) for p in self.processes]

    def cpu_s(self) -> float:
        return sum(s.cpu_s() for s in self.samplers)

    def rss(self) -> list[int]:
        return [s.process.memory_info().rss for s in self.samplers]

    def queued(self) -> dict[str, list[float]]:
        """Each relay's messages not yet sent to the controller (bytes) and carried up so far, from its /metrics."""
        out: dict[str, list[float]] = {"queued_bytes": [], "carried_up": [], "sent_first": [], "uplink_up": []}
        for port in self.metrics_ports:
            samples = scrape(port)
            out["sent_first"].append(_value(samples, "vigil_relay_sent_first_total"))
            out["queued_bytes"].append(_value(samples, "vigil_relay_queued_bytes"))
            out["carried_up"].append(_value(samples, "vigil_relay_messages_total", direction="up"))
            out["uplink_up"].append(_value(samples, "vigil_relay_uplink_messages_total", direction="up"))
        return out

    def carried_per_message(self, before: dict[str, list[float]]) -> float:
        """Agents' messages carried up since ``before`` (a ``queued()``) for each message the relays
        wrote to the controller."""
        now = self.queued()
        written = sum(now["uplink_up"]) - sum(before["uplink_up"])
        return round((sum(now["carried_up"]) - sum(before["carried_up"])) / written, 2) if written > 0 else 0.0

    def stop(self) -> None:
        for sampler, process in zip(self.samplers, self.processes, strict=True):
            sampler.stop()
            process.terminate()
        for process in self.processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


def longest_gc_pause(metrics_port: int) -> float:
    """A process's longest garbage collection so far (any generation), from its /metrics; -1: unread."""
    return _longest_pause(scrape(metrics_port))


def _longest_pause(samples: list[Sample]) -> float:
    pauses = [s.value for s in samples if s.name == "vigil_gc_pause_longest_seconds"]
    return round(max(pauses, default=-1.0), 3)


def gc_figures(metrics_port: int) -> dict[str, Any]:
    """A process's garbage collection so far, from its /metrics: the longest pause, the pauses' total,
    the full collections' total, the objects its collector leaves frozen (``vigil_core.gc_keeper``) and
    per generation [collections, seconds in all, the longest]."""
    samples = scrape(metrics_port)
    total = [s for s in samples if s.name == "vigil_gc_pause_seconds_total"]
    return {
        "longest_s": _longest_pause(samples),
        "total_s": round(sum(s.value for s in total), 2),
        "full_s": round(sum(s.value for s in total if s.labels.get("generation") == "2"), 2),
        "full_n": _value(samples, "vigil_gc_collections_total", generation="2"),
        "frozen_objects": _value(samples, "vigil_gc_frozen_objects"),
        "garbage_in_cycles": _value(samples, "vigil_gc_collected_objects_total"),
        "by_generation": {
            s.labels["generation"]: [
                _value(samples, "vigil_gc_collections_total", generation=s.labels["generation"]),
                round(s.value, 2),
                round(_value(samples, "vigil_gc_pause_longest_seconds", generation=s.labels["generation"]), 3),
            ]
            for s in total
        },
    }


def gc_since(before: dict[str, Any], metrics_port: int) -> dict[str, float]:
    """A process's garbage collection since ``before`` (``gc_figures`` then): the pauses' and the full
    collections' total, and how many full collections."""
    now = gc_figures(metrics_port)
    return {key: round(now[key] - before[key], 2) for key in ("total_s", "full_s", "full_n")}


def lateness(metrics_port: int, process: str) -> dict[str, Any]:
    """How late a process's event loop has run so far (``vigil_{process}_event_loop_lag_seconds``: the
    ticks' lateness added up, what its bounds on agents leave out; the ticks more than a second late),
    and, for a relay, the agents it ended so far by why; from its /metrics (-1: unread)."""
    samples = scrape(metrics_port)
    name = f"vigil_{process}_event_loop_lag_seconds"
    ticks = _value(samples, f"{name}_count")
    out: dict[str, Any] = {
        "late_s": round(_value(samples, f"{name}_sum"), 1),
        "ticks_over_1s": ticks - _value(samples, f"{name}_bucket", le="1.0") if ticks >= 0 else -1.0,
        "ticks_over_250ms": ticks - _value(samples, f"{name}_bucket", le="0.25") if ticks >= 0 else -1.0,
    }
    if process == "relay":
        refused = "vigil_relay_agents_refused_total"
        none_yet = 0.0 if samples else -1.0  # a reason's series appears with its first refusal
        out["refused"] = {why: max(none_yet, _value(samples, refused, why=why)) for why in REFUSALS}
    return out


REFUSALS = ("no_hello", "hello_again_late", "no_controller", "identity")


def hello_answers(metrics_ports: list[int]) -> dict[str, float]:
    """How long the agents' Hellos waited at their relays for the controller's answer, all relays
    together, so far (``vigil_relay_hello_answer_seconds``: the agents' wait without the simulated
    fleet's own lateness): how many, their total wait, and how many waited past 1 s and past an
    agent's first patience (``HELLO_ACK_TIMEOUT_S``: a real agent gives up there and reconnects);
    and the agents the relays queued for room at the controller (``controller.relay.hello_room``;
    records before the queue say ``turns``), with how many of them were called, their wait for room
    in all and how many waited past 1 s and 2.5 s (``vigil_relay_hello_queued_seconds``), and how
    many were gone before they were called (``left_queued``)."""
    name, first = "vigil_relay_hello_answer_seconds", f"over_{HELLO_ACK_TIMEOUT_S:g}s"
    queued = "vigil_relay_hello_queued_seconds"
    out = {"n": 0.0, "sum_s": 0.0, "over_1s": 0.0, first: 0.0, "queued": 0.0, "left_queued": 0.0}
    out |= {"called": 0.0, "called_wait_sum_s": 0.0, "called_over_1s": 0.0, "called_over_2.5s": 0.0}
    for port in metrics_ports:
        samples = scrape(port)
        if not _add_histogram(
            out, samples, name, ("n", "sum_s"), {"over_1s": "1.0", first: f"{HELLO_ACK_TIMEOUT_S:.1f}"}
        ):
            continue
        out["queued"] += max(0.0, _value(samples, "vigil_relay_hello_again_total", why="queued"))
        out["left_queued"] += max(0.0, _value(samples, "vigil_relay_hellos_left_queued_total"))
        called = {"called_over_1s": "1.0", "called_over_2.5s": "2.5"}  # relays before the metric say nothing
        _add_histogram(out, samples, queued, ("called", "called_wait_sum_s"), called)
    return out


def _add_histogram(
    out: dict[str, float], samples: list[Sample], name: str, keys: tuple[str, str], over: dict[str, str]
) -> bool:
    """Adds histogram ``name``'s count and sum (under ``keys``) to ``out``, and under each key of
    ``over`` how many were past its bucket bound; False, adding nothing, where it is not served."""
    if (count := _value(samples, f"{name}_count")) < 0:
        return False
    out[keys[0]] += count
    out[keys[1]] += _value(samples, f"{name}_sum")
    for key, le in over.items():
        out[key] += count - _value(samples, f"{name}_bucket", le=le)
    return True


def hello_rooms(metrics_ports: list[int]) -> list[float]:
    """Each relay's room for Hellos at the controller now (``vigil_relay_hello_room``; -1: none read)."""
    return [_value(scrape(port), "vigil_relay_hello_room") for port in metrics_ports]


def answered_since(then: dict[str, float], now: dict[str, float]) -> dict[str, float]:
    """``hello_answers`` between two readings, with the mean wait. Pure."""
    since = {k: round(now[k] - then.get(k, 0.0), 1) for k in now}
    since["mean_s"] = round(since["sum_s"] / since["n"], 2) if since["n"] else 0.0
    if since.get("called"):
        since["called_mean_s"] = round(since["called_wait_sum_s"] / since["called"], 2)
    return since


def controller_backlog(metrics_port: int) -> tuple[float, float]:
    """What the relays carried to the controller and it has not handled yet: bytes, streams waiting."""
    samples = scrape(metrics_port)
    return (
        _value(samples, "vigil_controller_relayed_waiting_bytes"),
        _value(samples, "vigil_controller_relayed_waiting_streams"),
    )


def lateness_since(before: dict[str, Any], metrics_port: int, process: str) -> dict[str, float]:
    """A process's event loop lateness since ``before`` (``lateness`` then): what a probe arriving
    meanwhile may have waited for before it was read."""
    now = lateness(metrics_port, process)
    return {key: round(now[key] - before[key], 1) for key in ("late_s", "ticks_over_250ms", "ticks_over_1s")}


def scrape(port: int) -> list[Sample]:
    """A process's /metrics on this machine, parsed; none where it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    except OSError:
        return []
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def _value(samples: list[Sample], name: str, **labels: str) -> float:
    """The first sample of that name with those labels; -1 where there is none (or nothing was read)."""
    return next((s.value for s in samples if s.name == name and labels.items() <= s.labels.items()), -1.0)


class Sampler:
    """The controller's peak RSS, sampled every 0.2 s in a thread; its CPU over a phase."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            with contextlib.suppress(psutil.Error):
                self.peak_rss = max(self.peak_rss, self.process.memory_info().rss)

    def cpu_s(self) -> float:
        times = self.process.cpu_times()
        return float(times.user + times.system)

    def stop(self) -> None:
        self._stop.set()


def run_queue_s(pid: int) -> tuple[float, float]:
    """How long the process's main thread (its event loop) and all its threads together have waited
    for a CPU while ready to run, in seconds (Linux's schedstat; threads gone since are not counted;
    (0, 0) where there is none). On a machine busier than its cores, each hop of a fault's path
    waits its turn: this says how much of that there was."""
    main = total = 0.0
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError, IndexError):
                waited = int((task / "schedstat").read_text().split()[1]) / 1e9
                total += waited
                main += waited if task.name == str(pid) else 0.0
    return main, total


Waits = dict[str, float]  # each process's run_queue_s: "controller_loop", "controller_all", "api_double", ...


def cpu_waits(controller: int, relays: list[int], simulator: list[int]) -> Waits:
    """Each part's ``run_queue_s`` now, in seconds: the controller's event loop and all its threads;
    this process (the Kubernetes API double: where a cordon is timed); the relays and the simulated
    fleet's processes, all threads, summed."""
    loop, all_ = run_queue_s(controller)
    return {
        "controller_loop": loop,
        "controller_all": all_,
        "api_double": run_queue_s(os.getpid())[1],
        "relays": sum(run_queue_s(pid)[1] for pid in relays),
        "simulator": sum(run_queue_s(pid)[1] for pid in simulator),
    }


def waited_per_s(then: Waits, now: Waits, over_s: float) -> dict[str, float]:
    """Each part's waits for a CPU between two ``cpu_waits``, in ms a second of ``over_s``. Pure."""
    return {part: round((now[part] - then[part]) * 1000 / over_s, 1) for part in then}


def own_cpu_s() -> float:
    """This process's CPU: the Kubernetes API double's, mostly (the fleet runs in processes of its own)."""
    times = psutil.Process().cpu_times()
    return float(times.user + times.system)


def database_cpu_s(database: str) -> float | None:
    """The benchmark's PostgreSQL server's CPU so far: its postmaster (the postgres process started
    with the DSN's port) and every process it runs now; a backend gone since is left out (the
    controller holds its own for its life). None for SQLite, whose work is the controller's own."""
    if not database.startswith("postgresql://"):
        return None
    port = database.rsplit(":", 1)[1].split("/", 1)[0]
    pids: list[int] = []
    for process in psutil.process_iter(["name", "cmdline"]):
        cmdline = process.info["cmdline"] or []
        if process.info["name"] == "postgres" and f"-p {port}" in " ".join(cmdline):
            with contextlib.suppress(psutil.Error):
                pids += [process.pid, *(child.pid for child in process.children(recursive=True))]
    return processes_cpu_s(pids)


def processes_cpu_s(pids: Iterable[int]) -> float:
    """The CPU (user and system, all threads) of each process over its life so far; one gone is left out."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    return total


def cordon_times(kube: KubeApiServer, seen: int, into: dict[str, float], events: dict[str, float]) -> int:
    """Read the API server's log from ``seen`` on: each node's first cordon PATCH (``into``) and first
    Event (``events``: the last of a quarantine's writes); returns the new position."""
    with kube.rules.lock:
        new = kube.rules.log[seen:]
    for r in new:
        if r.method == "PATCH" and r.path.count("/") == 4 and (r.body or {}).get("spec", {}).get("unschedulable"):
            into.setdefault(r.path.rsplit("/", 1)[1], r.at)
        elif r.method == "POST" and r.path.endswith("/events"):
            events.setdefault((r.body or {}).get("involvedObject", {}).get("name", ""), r.at)
    return seen + len(new)


class Cordons:
    def __init__(self, kube: KubeApiServer) -> None:
        self._kube, self._seen = kube, 0
        self.at: dict[str, float] = {}  # node -> its cordon
        self.recorded: dict[str, float] = {}  # node -> its Event, written after its condition

    def wait(self, nodes: list[str], timeout_s: float, record: bool = False) -> None:
        """Until every node is cordoned (``record``: and has its Event)."""
        deadline = time.monotonic() + timeout_s
        seen = self.recorded if record else self.at
        while time.monotonic() < deadline:
            self._seen = cordon_times(self._kube, self._seen, self.at, self.recorded)
            if all(n in seen for n in nodes):
                return
            time.sleep(0.005)
        missing = [n for n in nodes if n not in seen]
        what = "recorded" if record else "cordoned"
        raise TimeoutError(f"{len(missing)} of {len(nodes)} nodes not {what} within {timeout_s} s: {missing[:5]}")


def back_figures(
    workers: Workers,
    relays: Relays,
    hellos: dict[str, float],
    since: float,
    nodes: int,
    timeout_s: float,
    config: dict[str, Any],
) -> dict[str, Any]:
    """After a restart or a failover at ``since``: wait until every agent is back (or ``timeout_s``),
    then how long it took, the relays' Hellos and rooms meanwhile, the simulator's lag, and each
    event loop's lateness (the controller's, ``config``'s, since it started; the relays' since the
    bench began)."""
    deadline = time.monotonic() + timeout_s
    back, last = workers.back_since(since)
    while back < nodes and time.monotonic() < deadline:
        time.sleep(1)
        back, last = workers.back_since(since)
    return {
        "relays_hello_answered": answered_since(hellos, hello_answers(relays.metrics_ports)),
        "relays_hello_room": hello_rooms(relays.metrics_ports),
        "agents_back": back,
        "all_back_s": round(last - since, 1) if back == nodes else None,
        "simulator": workers.stats(),
        "lateness": {
            "controller": lateness(config["metrics_port"], "controller"),
            "relays": [lateness(port, "relay") for port in relays.metrics_ports],
        },
    }


ADOPTED = "adopted from"  # an adopted quarantine's incident's first message (``store.incidents.adopt``)


class FaultsAcross:
    """Faults across a restart or a failover, to show nothing is lost: half on fresh nodes just before
    the controller is signalled (in flight as it stops or dies), half a second after (its agents' relays
    between sessions: the faults wait in the agents and are sent again after their Hello). Once every
    agent is back, each must be cordoned, and the controller serving then must hold one incident for
    each: its XID 79, or, on a database of its own (SQLite, a file each), the quarantine it adopted from
    the cluster where the earlier leader had finished it (an agent's signal is acknowledged only once its
    actions are done, so an unfinished one is sent again and recorded here)."""

    def __init__(self, workers: Workers, nodes: list[str]) -> None:
        self._workers = workers
        half = len(nodes) // 2
        self.before, self.after = nodes[:half], nodes[half:]
        self.sent: dict[str, float] = {}

    def send_before(self) -> None:
        if self.before:
            self.sent |= self._workers.fault(self.before)

    def send_after(self, signalled: float) -> None:
        time.sleep(max(0.0, signalled + 1.0 - time.time()))
        if self.after:
            self.sent |= self._workers.fault(self.after)

    def figures(self, cordons: Cordons, target: str, timeout_s: float) -> dict[str, Any]:
        """Wait up to ``timeout_s`` for every cordon; then what was cordoned, how long after its fault, and
        how many XID 79 incidents the serving controller holds for each node."""
        nodes = [*self.before, *self.after]
        if not nodes:
            return {}
        with contextlib.suppress(TimeoutError):
            cordons.wait(nodes, timeout_s)
        missing = [n for n in nodes if n not in cordons.at]
        held: dict[str, int] = {}
        found = xid79_incidents(target, nodes)
        for incidents in found.values():
            kinds = "+".join(sorted("xid79" if i.code == 79 else "adopted" for i in incidents)) or "none"
            held[kinds] = held.get(kinds, 0) + 1
        return {
            "sent": len(self.sent),
            "cordoned": len(nodes) - len(missing),
            "not_cordoned": missing[:20],
            "fault_to_cordon_before": summary([cordons.at[n] - self.sent[n] for n in self.before if n in cordons.at]),
            "fault_to_cordon_after": summary([cordons.at[n] - self.sent[n] for n in self.after if n in cordons.at]),
            # the part after the signal, split
            "after_split": fault_split(self.after, self.sent, self._workers.connected_at(nodes), found, cordons.at),
            "incidents_held": dict(sorted(held.items())),  # each node's incidents on the serving controller: nodes
        }


def faults_connecting(
    cordons: Cordons, workers: Workers, nodes: list[str], target: str, timeout_s: float, urgent_port: bool
) -> dict[str, Any]:
    """The faults in their agents' spools as the fleet started connecting from nothing: once the
    fleet is connected, each must be cordoned; how long after it was made (the connect's start),
    split: until its agent's Hello was answered, then until the controller received the fault,
    then until the cordon."""
    with contextlib.suppress(TimeoutError):
        cordons.wait(nodes, timeout_s)
    made, back = workers.spooled, workers.connected_at(nodes)
    waiting = {n for n in nodes if n in made and back.get(n, 0.0) > made[n]}  # answered only after it
    return {
        "n": len(nodes),
        "urgent_port": urgent_port,
        "urgent_streams": workers.urgent_streams,
        "cordoned": sum(1 for n in nodes if n in cordons.at),
        "fault_to_cordon": summary([cordons.at[n] - made[n] for n in nodes if n in cordons.at and n in made]),
        "waiting_when_made": len(waiting),
        "waiting_fault_to_cordon": summary([cordons.at[n] - made[n] for n in waiting if n in cordons.at]),
        # the others: their agents already in, the rest of the fleet still connecting (``--faults-come-s``)
        "in_fault_to_cordon": summary(
            [cordons.at[n] - made[n] for n in nodes if n in made and n not in waiting and n in cordons.at]
        ),
        "split": fault_split(nodes, made, back, xid79_incidents(target, nodes), cordons.at),
    }


def xid79_incidents(target: str, nodes: list[str]) -> dict[str, list[admin_pb2.Incident]]:
    """Each node's XID 79 incidents on the controller serving at ``target``, and the quarantines it
    adopted from the cluster (``ADOPTED``)."""
    with AdminClient(target, timeout_s=60) as admin:
        return {
            n: [i for i in admin.incidents(node=n, limit=50) if i.code == 79 or i.first_message.startswith(ADOPTED)]
            for n in nodes
        }


def fault_split(
    nodes: list[str],
    sent: dict[str, float],
    back: dict[str, float],
    incidents: dict[str, list[admin_pb2.Incident]],
    cordoned: dict[str, float],
) -> dict[str, dict[str, float]]:
    """Each fault the serving controller received (its XID 79 incident), split: from ``sent`` until
    its node's agent was taken back (its Hello answered, ``back``), then until the controller
    received it, then until the cordon."""
    received = {n: i.received_at for n in nodes for i in incidents.get(n, []) if i.code == 79}
    return {
        "to_hello_answered": summary([back[n] - sent[n] for n in nodes if n in received]),
        "hello_to_received": summary([received[n] - back[n] for n in nodes if n in received]),
        "received_to_cordon": summary([cordoned[n] - received[n] for n in nodes if n in received and n in cordoned]),
    }


def settings(
    kube: KubeApiServer,
    workdir: Path,
    nodes: int,
    faulting: int,
    database: str,
    settle_s: float | None,
    hellos_per_s: float | None,
) -> dict[str, Any]:
    # A rate: the controller's own burst with it; 0: no pacing at all (every Hello within one burst).
    pacing = {} if hellos_per_s is None else {"hellos_per_s": hellos_per_s or 1e9}
    if hellos_per_s == 0:
        pacing["hello_burst"] = nodes
    return {
        "port": free_port(),  # the same after a restart: the agents come back to where they were
        "metrics_port": free_port(),  # its garbage collector's pauses, read after each phase
        "database": database,
        "actuator": "kubernetes",
        "kubernetes": {"kubeconfig": str(kube.kubeconfig(workdir / "kubeconfig"))},
        "pager": "none",
        "limits": {"max_nodes": nodes} | pacing,
        "guardrails": {
            "breaker_max_nodes": nodes,
            "breaker_max_fraction": 1.0,
            "quarantines_per_s": 1e6,
            "quarantine_burst": 1_000_000,
            "shared": wide_open(faulting, settle_s),
        },
    }


def database_bytes(database: str, workdir: Path) -> int:
    if database.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(database) as conn:
            row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
            return int(row[0]) if row else 0
    return sum(p.stat().st_size for p in workdir.glob("ctl.db*"))


def measure(args: argparse.Namespace, workdir: Path, database: str) -> dict[str, Any]:
    names = [f"gpu-{i:06d}" for i in range(args.nodes)]
    # Each probe and burst fault takes a node that never failed before: in the fleet's order (nodes are
    # dealt round robin to the workers and then to their connections, so the first hundreds all ride the
    # first few connections each worker opened), or spread over every connection (--spread-faults).
    fresh = iter(random.Random(7).sample(names, len(names)) if args.spread_faults else names)
    figures: dict[str, Any] = {}
    with KubeApiServer() as kube:
        kube.add_nodes(names)
        across_n = args.faults_across if args.restart or args.failover else 0
        faulting = args.probes + sum(args.bursts) + across_n + args.faults_connecting
        config = settings(kube, workdir, args.nodes, faulting, database, args.settle_s, args.hellos_per_s)
        config["limits"]["gc_freeze"] = args.gc_freeze
        if args.switch_interval_ms is not None:
            config["limits"]["switch_interval_ms"] = args.switch_interval_ms
        if args.urgent_port:
            config["urgent_port"] = free_port()
        # Faults in their agents' spools as the fleet starts connecting from nothing: fresh nodes.
        connecting_faults = [next(fresh) for _ in range(args.faults_connecting)]
        standby_config: dict[str, Any] | None = None
        if args.failover:
            config["leader_election"] = {"enabled": True, "identity": "ctl-a"}
            standby_config = config | {
                "port": free_port(),
                "metrics_port": free_port(),
                "leader_election": {"enabled": True, "identity": "ctl-b"},
                **({"urgent_port": free_port()} if args.urgent_port else {}),
                "database": database if database.startswith("postgresql://") else str(workdir / "standby.db"),
            }
        controller = start_controller(workdir, config)
        target = asyncio.run(controller_target(workdir, controller))
        standby = None
        if standby_config is not None:  # it waits for the Lease, its port closed, until the leader is gone
            standby = start_controller(workdir, standby_config, name="standby")
            target_for_relays = f"{target},127.0.0.1:{standby_config['port']}"
        else:
            target_for_relays = target
        sampler = Sampler(controller.pid)
        beats = (args.heartbeat_s, args.idle_heartbeat_s)
        per_connection = args.streams_per_connection or None
        relays = Relays(
            target_for_relays, args.relays, workdir, args.gc_freeze, args.relay_hello_wait_s, args.urgent_port,
            args.relay_linger_ms,
        )  # fmt: skip
        direct_urgent = [f"127.0.0.1:{config['urgent_port']}"] if args.urgent_port else []
        workers = Workers(
            relays.targets or [target],
            names,
            args.workers,
            beats,
            args.background_per_s,
            per_connection,
            args.hello_again,
            args.agents_give_up,
            (relays.urgent_targets if args.relays else direct_urgent) or None,
            frozenset(connecting_faults),
            (args.faults_come_s, *args.fault_after_start_s) if args.faults_come_s > 0 else None,
            args.agents_wait_their_turn,
        )
        try:
            started, cpu0, relays_cpu0 = time.time(), sampler.cpu_s(), relays.cpu_s()
            database_cpu0, threads0 = database_cpu_s(database), thread_clock.threads_cpu_ns(controller.pid)
            figures["connect_s"] = round(workers.connected(args.connect_timeout_s), 1)
            figures["simulator_while_connecting"] = workers.stats()  # beside the relays' lateness and refusals
            figures["connect_controller_cpu_s"] = round(sampler.cpu_s() - cpu0, 1)
            figures["connect_controller_threads_cpu_s"] = thread_clock.cpu_by_kind_s(
                threads0, thread_clock.threads_cpu_ns(controller.pid), sampler.cpu_s() - cpu0
            )
            if database_cpu0 is not None:
                figures["connect_database_cpu_s"] = round((database_cpu_s(database) or 0.0) - database_cpu0, 1)
            figures["connect_simulator_cpu_s"] = round(workers.connect_cpu_s, 1)
            figures["rss_after_connect_mb"] = round(sampler.process.memory_info().rss / 2**20)
            figures["gc_after_connect"] = {
                "controller": gc_figures(config["metrics_port"]),
                "relays": [gc_figures(port) for port in relays.metrics_ports],
            }
            hellos = hello_answers(relays.metrics_ports)
            figures["relays_hello_answered"] = answered_since({}, hellos)
            figures["relays_hello_room"] = hello_rooms(relays.metrics_ports)
            figures["lateness_after_connect"] = {
                "controller": lateness(config["metrics_port"], "controller"),
                "relays": [lateness(port, "relay") for port in relays.metrics_ports],
            }
            if args.relays:
                figures["relays"] = {
                    "count": args.relays,
                    "rss_after_connect_mb": [round(r / 2**20) for r in relays.rss()],
                    "connect_cpu_s": round(relays.cpu_s() - relays_cpu0, 1),
                }
            print(f"{args.nodes} agents connected in {figures['connect_s']} s", file=sys.stderr)
            if connecting_faults:
                figures["faults_connecting"] = faults_connecting(
                    Cordons(kube), workers, connecting_faults, target, args.burst_timeout_s, args.urgent_port
                ) | {
                    "come_s": args.faults_come_s,
                    "after_start_s": list(args.fault_after_start_s),
                    "agents_wait_their_turn": args.agents_wait_their_turn,
                }
                print(f"faults while connecting: {json.dumps(figures['faults_connecting'])}", file=sys.stderr)
            if args.fleet_nice:
                workers.renice(args.fleet_nice)
            # started here, where its own start (a process of its own) is long over before the first probe
            clock = None
            if args.thread_clock:
                others = {
                    "relays": [p.pid for p in relays.processes],
                    "simulator": [p.pid or 0 for p in workers.processes],
                }
                clock = ThreadClock(controller.pid, others | {"bench": [os.getpid()]}, by_name=("postgres",))
            time.sleep(max(args.heartbeat_s, 5.0))  # a full heartbeat period: the steady load is on
            workers.stats()  # the lag from here on
            cordons = Cordons(kube)

            cpu0, t0, relays_cpu0, fleet_cpu0 = sampler.cpu_s(), time.monotonic(), relays.cpu_s(), workers.cpu_s()
            late0 = lateness(config["metrics_port"], "controller"), [lateness(p, "relay") for p in relays.metrics_ports]
            pids = controller.pid, [p.pid for p in relays.processes], [p.pid or 0 for p in workers.processes]
            waits0 = cpu_waits(*pids)
            carried0 = relays.queued() if args.relays else None
            probes, queued = [next(fresh) for _ in range(args.probes)], []
            sent: dict[str, float] = {}
            backlog: dict[str, tuple[float, float]] = {}  # the controller's relayed messages waiting, at each probe
            for i, node in enumerate(probes):
                due = time.monotonic() + args.probe_every_s
                sent |= workers.fault([node], watch=True)
                backlog[node] = controller_backlog(config["metrics_port"])
                try:
                    cordons.wait([node], 30)
                except TimeoutError:  # where it waits, said, then the bench stops as before
                    probes = probes[: i + 1]
                    missed = {"probe": node, "simulator": workers.stats(), "relays": relays.queued()}
                    print(f"probe missed: {json.dumps(missed)}", file=sys.stderr)
                    figures["steady_missed"] = missed
                    raise
                if args.relays:  # what waits at the relays, after each probe
                    queued.append(max(relays.queued()["queued_bytes"]))
                time.sleep(max(0.0, due - time.monotonic()))
            streams = workers.watched(probes)
            moments = controller_times(workdir / "controller.out", probes)
            settle_ms = (args.settle_s if args.settle_s is not None else SharedCauseConfig().settle_s) * 1000
            loop_held = threads_in_settling(clock, moments, settle_ms) if clock else None
            with AdminClient(target, timeout_s=60) as admin:
                received = {
                    n: next(i.received_at for i in admin.incidents(node=n, limit=50) if i.code == 79) for n in probes
                }
            figures["steady"] = {
                "background_per_s": args.background_per_s,
                "fault_to_cordon": summary([cordons.at[n] - sent[n] for n in probes]),
                "controller_to_cordon": summary([cordons.at[n] - received[n] for n in probes]),
                # from each probe's incident opened: the settling window's sleep over, its quarantine done
                "controller_split": controller_split(moments),
                # --thread-clock: where the controller's threads were in each probe's settling window
                **({"loop_in_settling": loop_held} if loop_held else {}),
                # each probe over the 165 ms: (its send, s into the phase; before the controller; in it,
                # ms; the relayed bytes and streams waiting at the controller just after it was sent; ms after
                # its send that its stream took it and was done with it, each time it was sent)
                "late_probes": [
                    (
                        round(sent[n] - sent[probes[0]], 1),
                        round((received[n] - sent[n]) * 1000),
                        round((cordons.at[n] - received[n]) * 1000),
                        *backlog[n],
                        [round((t - sent[n]) * 1000) for t in streams[n][1:]],
                    )
                    for n in probes
                    if cordons.at[n] - sent[n] > 0.165
                ],
                "controller_cores": round((sampler.cpu_s() - cpu0) / (time.monotonic() - t0), 2),
                # ms a second that each part waited for a CPU while ready to run (cpu_waits)
                "waiting_for_cpu_ms_per_s": waited_per_s(waits0, cpu_waits(*pids), time.monotonic() - t0),
                "relays_cores": round((relays.cpu_s() - relays_cpu0) / (time.monotonic() - t0), 2),
                "simulator_cores": round((workers.cpu_s() - fleet_cpu0) / (time.monotonic() - t0), 2),
                "simulator": workers.stats(),
                "longest_gc_pause_s": {
                    "controller": longest_gc_pause(config["metrics_port"]),
                    "relays": [longest_gc_pause(port) for port in relays.metrics_ports],
                },
                "lateness_in_steady": {  # how late each event loop ran in this phase: a probe waits as long
                    "controller": lateness_since(late0[0], config["metrics_port"], "controller"),
                    "relays": [
                        lateness_since(then, port, "relay")
                        for then, port in zip(late0[1], relays.metrics_ports, strict=True)
                    ],
                },
                "gc_in_steady": {  # the collectors' time in this phase: full collections here stop a probe
                    "controller": gc_since(figures["gc_after_connect"]["controller"], config["metrics_port"]),
                    "relays": [
                        gc_since(then, port)
                        for then, port in zip(figures["gc_after_connect"]["relays"], relays.metrics_ports, strict=True)
                    ],
                },
            }
            if args.relays:
                figures["steady"]["relay_queued_bytes"] = {
                    "p50": percentile(queued, 0.5),
                    "max": max(queued),
                    "first_lane": relays.queued()["sent_first"],
                }
                if carried0 is not None:  # each message to the controller carried this many agents'
                    figures["steady"]["relay_carried_per_message"] = relays.carried_per_message(carried0)
            print(f"steady: {json.dumps(figures['steady'])}", file=sys.stderr)

            figures["bursts"] = []
            for size in args.bursts:
                burst = [next(fresh) for _ in range(size)]
                cpu0, own0, sys0 = sampler.cpu_s(), own_cpu_s(), sampler.process.cpu_times().system
                sent = workers.fault(burst)
                cordons.wait(burst, args.burst_timeout_s)
                first, last = min(sent.values()), max(cordons.at[n] for n in burst)
                cordons.wait(burst, args.burst_timeout_s, record=True)
                figures["bursts"].append(
                    {
                        "nodes": size,
                        "all_cordoned_s": round(last - first, 2),
                        "all_recorded_s": round(max(cordons.recorded[n] for n in burst) - first, 2),
                        "nodes_per_s": round(size / (last - first), 1),
                        "fault_to_cordon": summary([cordons.at[n] - sent[n] for n in burst]),
                        "controller_cpu_s": round(sampler.cpu_s() - cpu0, 1),
                        "controller_system_cpu_s": round(sampler.process.cpu_times().system - sys0, 1),
                        "api_server_cpu_s": round(own_cpu_s() - own0, 1),
                        "node_lists": len(kube.requests("GET", r"^/api/v1/nodes$")),
                        "simulator": workers.stats(),
                    }
                )
                print(f"burst: {json.dumps(figures['bursts'][-1])}", file=sys.stderr)
                time.sleep(2)

            across = FaultsAcross(workers, [next(fresh) for _ in range(across_n)])
            if args.restart:
                across.send_before()
                stopping = time.time()
                controller.send_signal(signal.SIGTERM)
                across.send_after(stopping)
                controller.wait(120)
                stopped_s = time.time() - stopping  # its agents' sessions ended, its writes flushed
                (workdir / "port").unlink()
                since = time.time()
                controller = start_controller(workdir, config)
                asyncio.run(controller_target(workdir, controller))
                sampler.stop()
                sampler = Sampler(controller.pid)
                figures["restart"] = {
                    "old_controller_stop_s": round(stopped_s, 1),
                    **back_figures(workers, relays, hellos, since, args.nodes, args.connect_timeout_s, config),
                    "controller_gc": gc_figures(config["metrics_port"]),
                    "rss_mb": round(sampler.process.memory_info().rss / 2**20),
                    "faults_across": across.figures(cordons, target, args.burst_timeout_s),
                }
                print(f"restart: {json.dumps(figures['restart'])}", file=sys.stderr)
            if standby is not None and standby_config is not None:
                hellos = hello_answers(relays.metrics_ports)
                across.send_before()
                relays_cpu0, fleet_cpu0 = relays.cpu_s(), workers.cpu_s()
                killed = time.time()
                if args.failover == "stop":  # a rolling update, a drain: it stops, then hands the Lease back
                    controller.send_signal(signal.SIGTERM)
                else:
                    controller.kill()  # the leader dies: no stop, no flush, its Lease left to expire
                across.send_after(killed)
                controller.wait(120)
                leader_target = asyncio.run(controller_target(workdir, standby, name="standby"))
                leading_s = port_file(workdir, "standby").stat().st_mtime - killed
                peak_rss = sampler.peak_rss
                sampler.stop()
                controller, config, sampler = standby, standby_config, Sampler(standby.pid)
                standby = None
                figures["failover"] = {
                    "leader": "stopped (SIGTERM)" if args.failover == "stop" else "killed (SIGKILL)",
                    "kill_to_new_leader_s": round(leading_s, 1),
                    **back_figures(workers, relays, hellos, killed, args.nodes, args.connect_timeout_s, config),
                    # from the signal until every agent was back (the new leader's own is not sampled)
                    "relays_cpu_s": round(relays.cpu_s() - relays_cpu0, 1),
                    "simulator_cpu_s": round(workers.cpu_s() - fleet_cpu0, 1),
                    "new_leader_rss_mb": round(sampler.process.memory_info().rss / 2**20),
                    "old_leader_peak_rss_mb": round(peak_rss / 2**20),
                    "faults_across": across.figures(cordons, leader_target, args.burst_timeout_s),
                }
                print(f"failover: {json.dumps(figures['failover'])}", file=sys.stderr)
            figures["controller_peak_rss_mb"] = round(sampler.peak_rss / 2**20)
            figures["database_mb"] = round(database_bytes(database, workdir) / 2**20, 1)
            figures["elapsed_s"] = round(time.time() - started)
            if args.relays:
                figures["relays"]["peak_rss_mb"] = [round(r.peak_rss / 2**20) for r in relays.samplers]
        finally:
            workers.stop()
            relays.stop()
            sampler.stop()
            for process in (controller, *([standby] if standby is not None else [])):
                process.terminate()
                try:
                    process.wait(60)
                except subprocess.TimeoutExpired:
                    process.kill()
    return figures


def _bounds(text: str) -> tuple[float, float]:
    """``LO,HI`` seconds, 0 <= LO <= HI (an argparse type: a clear error otherwise)."""
    try:
        lo, hi = (float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"LO,HI seconds, not {text!r}") from None
    if not 0 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"LO,HI with 0 <= LO <= HI, not {text!r}")
    return lo, hi


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=3, help="processes simulating the fleet")
    parser.add_argument("--heartbeat-s", type=float, default=5.0)
    parser.add_argument(
        "--idle-heartbeat-s",
        type=float,
        default=60.0,
        help="as the agent's setting (0: a heartbeat every --heartbeat-s)",
    )
    parser.add_argument("--background-per-s", type=float, default=0.0, help="record-only signals a second")
    parser.add_argument("--probes", type=int, default=60)
    parser.add_argument(
        "--spread-faults",
        action="store_true",
        help="probes and bursts on nodes spread over the simulated fleet's connections, not its first nodes "
        "(which ride the first few connections each simulator process opened)",
    )
    parser.add_argument("--probe-every-s", type=float, default=0.5)
    parser.add_argument("--bursts", default="100,400,1000", help="comma-separated burst sizes ('' for none)")
    parser.add_argument("--restart", action="store_true", help="stop and start the controller; time the return")
    parser.add_argument(
        "--failover",
        nargs="?",
        const="kill",
        choices=("kill", "stop"),
        help="a standby under a Lease beside the controller, the relays given both; kill the leader (SIGKILL, "
        "its Lease left to expire) or stop it (SIGTERM: it hands the Lease back), time the standby's leading "
        "and every agent's return (needs --relays)",
    )
    parser.add_argument("--database", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--settle-s", type=float, default=None, help="the guard's settling window (default: 0.03)")
    parser.add_argument(
        "--streams-per-connection",
        type=int,
        default=1,
        help="agents on one HTTP/2 connection (1: each its own, as real agents; 0: all of a worker's on one, "
        "gRPC's sharing, as the figures before this option were taken)",
    )
    parser.add_argument(
        "--hellos-per-s",
        type=float,
        default=None,
        help="the controller's limits.hellos_per_s (default: its own; 0: no pacing, every Hello admitted at once)",
    )
    parser.add_argument(
        "--switch-interval-ms",
        type=float,
        default=None,
        help="the controller's limits.switch_interval_ms (default: its own; 0: CPython's)",
    )
    parser.add_argument("--relays", type=int, default=0, help="vigil relay processes in front of the controller")
    parser.add_argument(
        "--relay-hello-wait-s",
        type=float,
        default=None,
        help="the relays' --hello-wait-s (default: theirs; 0: every Hello passed on at once, as before the option)",
    )
    parser.add_argument(
        "--relay-linger-ms",
        type=float,
        default=None,
        help="the relays' --linger-ms (default: theirs; 0: what waits goes to the controller at once)",
    )
    parser.add_argument(
        "--faults-across",
        type=int,
        default=100,
        help="with --restart or --failover: XID 79s on fresh nodes, half just before the controller is "
        "signalled and half a second after; each must be cordoned once every agent is back, and held once",
    )
    parser.add_argument(
        "--faults-connecting",
        type=int,
        default=0,
        help="XID 79s in the spools of fresh nodes as the fleet starts connecting from nothing: each must be "
        "cordoned; how long after it was made (faults_connecting)",
    )
    parser.add_argument(
        "--faults-come-s",
        type=float,
        default=0.0,
        help="with --faults-connecting: those agents start at a moment of their own in the first this many seconds "
        "of the connect, each fault coming 0.5-5 s later (seeded), not in its spool at the start (0)",
    )
    parser.add_argument(
        "--fault-after-start-s",
        type=_bounds,
        default=(0.5, 5.0),
        help="with --faults-come-s: each fault comes this long after its agent started, LO,HI seconds (seeded; "
        "default 0.5,5: most of them while their Hello waits)",
    )
    parser.add_argument(
        "--agents-wait-their-turn",
        action="store_true",
        help="the simulated agents as before a fault could end their wait: a fault that comes while a Hello waits "
        "waits with it (the side-by-side baseline)",
    )
    parser.add_argument(
        "--urgent-port",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the controller's and the relays' urgent ports, which the simulated agents with faults waiting dial "
        "(vigil_core.urgent_port; default: on, as the deploy manifests)",
    )
    parser.add_argument("--connect-timeout-s", type=float, default=1200)
    parser.add_argument("--burst-timeout-s", type=float, default=300)
    parser.add_argument(
        "--fleet-nice",
        type=int,
        default=0,
        help="once connected, run the simulated fleet's processes at this niceness (0-19): its agents stand for "
        "machines of their own, which here take most of a core at the controller's priority (10: a ninth of its share)",
    )
    parser.add_argument(
        "--thread-clock",
        action="store_true",
        help="sample the controller's threads and the other processes' CPU every 4 ms in the steady phase (a few "
        "percent of a core, said): where each probe's settling window went (steady.loop_in_settling)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the working directory (the controller's log)")
    parser.add_argument(
        "--gc-freeze",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="the controller's and the relays' garbage collector keeper (vigil_core.gc_keeper; default: off, "
        "as theirs)",
    )
    parser.add_argument(
        "--hello-again",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the simulated agents say Hello again on the stream a relay keeps when it loses the controller (as "
        "the agent does; --no-hello-again: as agents before it, whose streams the relay ends)",
    )
    parser.add_argument(
        "--agents-give-up",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="the simulated agents give up on a Hello unanswered for 10 s of their process's own time, then "
        "twice as long each time, and reconnect, as the agent does (default: they wait on, as in the records "
        "before this option)",
    )
    args = parser.parse_args()
    try:
        args.bursts = [int(b) for b in args.bursts.split(",") if b.strip()]
    except ValueError:
        parser.error(f"--bursts: whole numbers, comma-separated, not {args.bursts!r}")
    if args.nodes < 1 or args.workers < 1 or args.probes < 1 or any(b < 1 for b in args.bursts):
        parser.error("--nodes, --workers, --probes and each burst must be at least 1")
    if args.faults_across < 0 or args.faults_connecting < 0:
        parser.error("--faults-across and --faults-connecting must be at least 0")
    if args.faults_come_s < 0 or (args.faults_come_s > 0 and not args.faults_connecting):
        parser.error("--faults-come-s: at least 0, and only with --faults-connecting")
    across = args.faults_across if args.restart or args.failover else 0
    if args.probes + sum(args.bursts) + across + args.faults_connecting > args.nodes:
        parser.error(
            "--probes, the bursts, --faults-across and --faults-connecting must not exceed --nodes (each fault "
            "takes a fresh node)"
        )
    if args.database == "postgresql" and (why := postgres_unavailable()):
        parser.error(f"--database postgresql: {why}")
    if args.failover and not args.relays:
        parser.error("--failover needs --relays: the simulated agents dial one address, the relays both controllers")
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    connections = -(-args.nodes // args.streams_per_connection) if args.streams_per_connection else args.workers
    connections = -(-connections // args.relays) if args.relays else connections  # each relay's share
    if hard != resource.RLIM_INFINITY and connections + open_files.SPARE > hard:
        parser.error(
            f"{connections} connections need {connections + open_files.SPARE} open files in the controller (or each "
            f"relay), and this "
            f"machine's hard limit is {hard}: raise it (ulimit -Hn) or give each connection more agents "
            f"(--streams-per-connection {-(-args.nodes // (hard - open_files.SPARE))})"
        )
    pace_before = host_pace_ms()
    with contextlib.ExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix="vigil-scale-"))
        if args.keep:
            print(f"working directory (kept): {workdir}", file=sys.stderr)
        else:
            stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        if args.database == "postgresql":
            database = stack.enter_context(postgres_cluster(fsync=True)).dsn
        else:
            database = str(workdir / "ctl.db")
        try:
            figures = measure(args, workdir, database)
        except (TimeoutError, RuntimeError) as exc:
            print(f"bench failed: {exc}; the controller's last words:", file=sys.stderr)
            print((workdir / "controller.out").read_text()[-3000:], file=sys.stderr)
            return 1
    record = {
        **header(
            "scale",
            memory_gb=round(psutil.virtual_memory().total / 2**30),
            pace_ms=[pace_before, host_pace_ms()],  # before and after the run: the host's own speed
        ),
        "revision": revision(),
        "nodes": args.nodes,
        "database": args.database,
        "heartbeat_s": args.heartbeat_s,
        "settle_s": args.settle_s,
        "idle_heartbeat_s": args.idle_heartbeat_s,
        "workers": args.workers,
        "streams_per_connection": args.streams_per_connection or "all of a worker's on one",
        "relays": args.relays,
        "gc_freeze": args.gc_freeze,
        "spread_faults": args.spread_faults,
        "hello_again": args.hello_again,
        "agents_give_up": args.agents_give_up,
        "urgent_port": args.urgent_port,
        **({"fleet_nice": args.fleet_nice} if args.fleet_nice else {}),
        **({"switch_interval_ms": args.switch_interval_ms} if args.switch_interval_ms is not None else {}),
        **figures,
    }
    print(json.dumps(record, indent=2))
    append_result("scale", record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
