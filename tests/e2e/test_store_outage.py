"""The controller's database stops taking writes for a while: a full disk under SQLite, a PostgreSQL
server stopped for 10 s. Meanwhile the controller says so (``vigil status``, ``/readyz`` 503, a log
error, the store metrics) and faults wait in the agents' spools; afterwards its periodic work runs
again (a silent node turns UNKNOWN, a quiet SUSPECT clears) and the fault that waited is acted on.
Before supervision, one failed write ended the periodic loop for good, silently."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpus.simulated import simulated_gpus
from tests.e2e.processes import configured_controller, json_lines, port_of, start_agent, stop_all
from tests.helpers import poll_until
from tests.postgres import postgres_cluster, unavailable
from vigil.admin_client import AdminClient
from vigil.demo import xid_line

pytestmark = pytest.mark.e2e
NODES = ("node-a", "node-b", "node-c")


def readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def xid(kmsg: Path, node: str, code: int, seq: int, text: str = "injected") -> None:
    with open(kmsg, "a") as f:
        f.write(xid_line(simulated_gpus(node, 8)[2].pci_bus_id, code, text, seq))


def health(admin: AdminClient) -> dict[str, str]:
    return {n.node: n.health for n in admin.status().nodes}


def outage_and_back(tmp: Path, database: str, break_store: Callable[[], None], mend_store: Callable[[], None]) -> None:
    policy = tmp / "policy.yaml"
    policy.write_text("heartbeat_timeout_s: 8\nsuspect_clear_s: 12\nxid: {4001: {action: record}}\n")
    ctl = configured_controller(tmp, "ctl", database=database, metrics_port=0, policy=str(policy))
    procs: list[subprocess.Popen[bytes]] = [ctl]
    try:
        target = f"127.0.0.1:{port_of(tmp, 'ctl')}"
        started = poll_until(lambda: [e for e in json_lines(tmp / "ctl.log") if e["event"] == "controller_started"])
        metrics_port = int(started[0]["metrics_port"])  # type: ignore[index]
        agents = {node: start_agent(tmp, node, target) for node in NODES}
        procs += [proc for proc, _ in agents.values()]
        with AdminClient(target) as admin:
            poll_until(lambda: len(admin.status().nodes) == len(NODES), what="every agent registered")
            # An XID no catalog has: node-c SUSPECT, to clear once quiet for 12 s.
            xid(agents["node-c"][1], "node-c", 4000, 1, "an error no catalog has")
            poll_until(lambda: health(admin)["node-c"] == "SUSPECT", what="node-c SUSPECT")
            assert readyz(metrics_port)[0] == 200

            break_store()
            # A write makes the outage known (what was recorded before is written once the database
            # is back: controller.store.write_behind); this one, or one of the controller's own.
            xid(agents["node-b"][1], "node-b", 4001, 1, "a record-only error")
            poll_until(
                lambda: any("cannot record" in p for p in admin.status().problems),
                timeout=30,
                what="the controller saying it cannot record",
            )
            code, body = readyz(metrics_port)
            assert code == 503 and "cannot record" in body
            xid(agents["node-a"][1], "node-a", 79, 1, "GPU has fallen off the bus.")
            time.sleep(2)  # the agent has sent it (its link wakes at once); it is refused
            assert health(admin)["node-a"] != "QUARANTINED"  # the XID 79 waits in node-a's spool
            assert metric(metrics_port, "vigil_controller_store_up") == 0
            agents["node-b"][0].terminate()  # silent from now on
            time.sleep(14)  # past node-c's quiet time, while the database cannot record it
            mend_store()

            # The agent's next try (backoff up to 10 s), and on PostgreSQL the pool's reconnection (its tries
            # back off for up to 8 s, then the next write begins again): 1-7 s here, more on a loaded machine.
            poll_until(lambda: health(admin)["node-a"] == "QUARANTINED", timeout=90, what="the waiting XID 79 acted on")
            poll_until(lambda: health(admin)["node-b"] == "UNKNOWN", timeout=30, what="silent node-b UNKNOWN")
            poll_until(lambda: health(admin)["node-c"] == "HEALTHY", timeout=30, what="quiet node-c cleared")
            poll_until(lambda: not admin.status().problems, timeout=30, what="the controller saying all is well")
            assert readyz(metrics_port)[0] == 200
            assert metric(metrics_port, "vigil_controller_store_up") == 1
            # its event loop's lateness watched all along (what its bounds on agents, nodes and jobs leave out)
            assert metric(metrics_port, "vigil_controller_event_loop_lag_seconds_count") > 100
            assert metric(metrics_port, "vigil_controller_store_write_failures_total") >= 1
            assert ("node-a", 79) in {(i.node, i.code) for i in admin.incidents()}
        events = [e["event"] for e in json_lines(tmp / "ctl.log")]
        assert events.count("store_cannot_record") >= 1 and "store_recorded_again" in events
    finally:
        stop_all(procs)


def _mount_tmpfs(where: Path, size: str) -> str | None:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return "needs root to mount a small tmpfs (a disk that fills)"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    return None if done.returncode == 0 else f"cannot mount a tmpfs here: {done.stderr.decode()[:200]}"


def _fill(disk: Path) -> None:
    with open(disk / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


@pytest.mark.timeout(240)
def test_a_full_disk_under_sqlite_is_said_and_outlived(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    if why := _mount_tmpfs(disk, "4m"):
        pytest.skip(why)
    try:
        outage_and_back(tmp_path, str(disk / "ctl.db"), lambda: _fill(disk), lambda: (disk / "filler").unlink())
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.timeout(240)
@pytest.mark.skipif(bool(why := unavailable()), reason=why or "")
def test_a_postgresql_server_stopped_for_a_while_is_said_and_outlived(tmp_path: Path) -> None:
    with postgres_cluster() as server:
        stopped: dict[str, Any] = {}

        def stop() -> None:
            server.stop()
            stopped["at"] = time.monotonic()

        def start() -> None:
            time.sleep(max(0.0, 10.0 - (time.monotonic() - stopped["at"])))  # at least 10 s away
            server.start()

        outage_and_back(tmp_path, server.dsn, stop, start)
