"""A kernel-log flood on one node beside a single real fault on another.

    python -m bench.flood [--lines 100000] [--baseline-rev REV] [--timeout 180] [--probe-at 1.0]
                          [--storm-fold-s S] [--spool-max-signals N]

A real ``vigil controller`` and two ``vigil agent`` processes (simulated GPUs, each tailing its own
kmsg-format file). 100,000 identical XID 45 lines are appended to node-flood's log in bursts of
1,000 (about 100,000 lines a second); right after the last of them (``--probe-at 1``: the
controller is then busiest with the flood), one XID 79 goes to node-probe's log. Measured:

- drain: from the flood's first line until the controller holds all of its observations (a storm
  folded at the agent counts as many as it stands for), and how many it holds at the end;
- the XID 79's fault → quarantine: from writing its line to the controller's QUARANTINE action
  done (the target is 0.1 s, the agent's kernel-log poll included);
- ``vigil status`` (the admin GetStatus call) every 0.1 s during the flood: p50, p99, max;
- signals lost: lines written minus observations held once the flood has drained (or at the timeout);
  and of those, how many the agent counted as dropped to keep its spool's bound (``dropped``) and how
  many nobody counted (``unaccounted``: must be 0).

``--storm-fold-s 0 --spool-max-signals 10`` runs the flood with the agent's storm folding off and a
tiny spool, so its bound merges and drops while the link is busy.

``--baseline-rev REV`` runs the same scenario first on a checkout of REV (a git worktree made for
the purpose), side by side, and prints the ratios. Results are printed and appended to
bench/results/flood.jsonl.
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.record import append_result, header, percentile
from gpus.simulated import simulated_gpus
from tests.e2e.processes import stop_all
from vigil.admin_client import AdminClient
from vigil.demo import simulated_agent_args, xid_line

ROOT = Path(__file__).resolve().parent.parent
BURST = 1_000


def _vigil(tree: Path, work: Path, name: str, *args: str) -> subprocess.Popen[bytes]:
    """``python -m vigil ARGS`` run from ``tree`` (its code, not this checkout's)."""
    return subprocess.Popen(
        [sys.executable, "-m", "vigil", *args],
        cwd=tree,
        stdout=open(work / f"{name}.out", "wb"),  # noqa: SIM115 (the child keeps it)
        stderr=open(work / f"{name}.log", "wb"),  # noqa: SIM115
        stdin=subprocess.DEVNULL,
    )


def _held(db: Path, node: str) -> int:
    """Observations of ``node`` the controller holds (a folded storm counts as many)."""
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
            columns = {row[1] for row in conn.execute("PRAGMA table_info(signals)")}
            what = "SUM(count)" if "count" in columns else "COUNT(*)"
            row = conn.execute(f"SELECT {what} FROM signals WHERE node = ? AND kind = 'XID'", (node,)).fetchone()
    except sqlite3.Error:
        return 0
    return int(row[0] or 0)


def _dropped(spool: Path) -> int:
    """Observations the agent's spool counted as dropped to keep its bound (0 where it keeps no count)."""
    try:
        with sqlite3.connect(f"file:{spool}?mode=ro", uri=True, timeout=5) as conn:
            row = conn.execute("SELECT value FROM meta WHERE key = 'dropped_total'").fetchone()
    except sqlite3.Error:
        return 0
    return int(row[0]) if row else 0


def _wait(condition: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def run(
    tree: Path, lines: int, timeout: float, probe_at: float, agent: dict[str, float] | None = None
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="vigil-flood-"))
    agent_config = work / "agent.yaml"
    agent_config.write_text("".join(f"{k}: {v}\n" for k, v in (agent or {}).items()) or "{}\n")
    db = work / "ctl.db"
    ctl = _vigil(tree, work, "ctl", "controller", "--plaintext", "--port", "0", "--port-file", str(work / "port"),
                 "--database", str(db), "--log-format", "json")  # fmt: skip
    procs = [ctl]
    try:
        if not _wait(lambda: (work / "port").exists(), 30):
            raise SystemExit(f"the controller did not start: {(work / 'ctl.log').read_text()[-2000:]}")
        target = f"127.0.0.1:{(work / 'port').read_text().strip()}"
        for node in ("node-flood", "node-probe"):
            (work / f"{node}.kmsg").write_text("")
            args = [*simulated_agent_args(node, target, work / f"{node}.kmsg", work / f"{node}.spool"),
                    "--config", str(agent_config)]  # fmt: skip
            procs.append(_vigil(tree, work, node, *args))
        admin = AdminClient(target, plaintext=True)
        if not _wait(lambda: len(admin.status().nodes) == 2, 30):
            raise SystemExit("the agents did not register")
        time.sleep(1.0)  # each agent's first look at its log (it starts at the end)

        status_s: list[float] = []
        flooding = threading.Event()
        flooding.set()

        asking = AdminClient(target, timeout_s=60.0, plaintext=True)

        def ask_status() -> None:
            while flooding.is_set():
                started = time.perf_counter()
                asking.status()  # a stalled controller answers late: the wait is the figure
                status_s.append(time.perf_counter() - started)
                time.sleep(0.1)

        asker = threading.Thread(target=ask_status, daemon=True)
        asker.start()
        flood_bus = simulated_gpus("node-flood", 8)[1].pci_bus_id
        probe_bus = simulated_gpus("node-probe", 8)[2].pci_bus_id
        line = xid_line(flood_bus, 45, "Preemptive cleanup, due to previous errors.", 1)
        started = time.time()
        probe_written = 0.0
        with open(work / "node-flood.kmsg", "a") as flood:
            for written in range(0, lines, BURST):
                flood.write(line * min(BURST, lines - written))
                flood.flush()
                if not probe_written and written + BURST >= lines * probe_at:
                    with open(work / "node-probe.kmsg", "a") as probe:
                        probe.write(xid_line(probe_bus, 79, "GPU has fallen off the bus.", 1))
                    probe_written = time.time()
                time.sleep(0.01)
        written_at = time.time()

        def quarantined_at() -> float:
            """When the controller's QUARANTINE action for the XID 79 was done (its own record)."""
            for incident in asking.incidents(node="node-probe"):
                for action in incident.actions:
                    if action.kind == "QUARANTINE" and action.status == "DONE":
                        return float(action.done_at)
            return 0.0

        spool = work / "node-flood.spool"
        drained = _wait(lambda: _held(db, "node-flood") + _dropped(spool) >= lines, timeout)
        drain_s = time.time() - started if drained else None
        flooding.clear()
        asker.join()
        _wait(lambda: quarantined_at() > 0, 60)
        done_at = quarantined_at()
        held, dropped = _held(db, "node-flood"), _dropped(spool)
        admin.close()
        asking.close()
        return {
            "lines": lines,
            "write_s": round(written_at - started, 3),
            "drain_s": round(drain_s, 3) if drain_s is not None else None,
            "held_at_end": held,
            "lost": lines - held,
            "dropped": dropped,
            "unaccounted": lines - held - dropped,
            "agent": agent or {},
            "probe_at": probe_at,
            "probe_fault_to_quarantine_s": round(done_at - probe_written, 4) if done_at else None,
            "status_s": {
                "p50": round(statistics.median(status_s), 4),
                "p99": round(percentile(status_s, 0.99), 4),
                "max": round(max(status_s), 4),
                "calls": len(status_s),
            },
        }
    finally:
        stop_all(procs)
        shutil.rmtree(work, ignore_errors=True)


def _describe(name: str, r: dict[str, Any], timeout: float) -> None:
    drain = f"{r['drain_s']:.2f} s" if r["drain_s"] is not None else f"not done in {timeout:g} s"
    q = r["probe_fault_to_quarantine_s"]
    print(
        f"{name:<10} drain {drain:<18} held {r['held_at_end']:>7}/{r['lines']}  lost {r['lost']:<6} "
        f"(counted dropped {r['dropped']}, unaccounted {r['unaccounted']})  XID 79 → quarantine "
        f"{f'{q:.3f} s' if q is not None else 'never':<10} status p50/p99/max "
        f"{r['status_s']['p50']:.3f}/{r['status_s']['p99']:.3f}/{r['status_s']['max']:.3f} s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--baseline-rev", default="", help="a git revision to run side by side first")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for the flood to drain")
    parser.add_argument("--probe-at", type=float, default=1.0, help="the XID 79 after this fraction of the flood")
    parser.add_argument("--storm-fold-s", type=float, default=None, help="the agents' storm folding (0: off)")
    parser.add_argument("--spool-max-signals", type=int, default=None, help="the agents' spool bound")
    args = parser.parse_args()
    agent = {k: v for k, v in (("storm_fold_s", args.storm_fold_s), ("spool_max_signals", args.spool_max_signals))
             if v is not None}  # fmt: skip
    results: dict[str, Any] = {}
    if args.baseline_rev:
        tree = Path(tempfile.mkdtemp(prefix="vigil-baseline-"))
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree), args.baseline_rev],
                       check=True)  # fmt: skip
        try:
            results["baseline"] = run(tree, args.lines, args.timeout, args.probe_at, agent)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
        _describe("baseline", results["baseline"], args.timeout)
    results["vigil"] = run(ROOT, args.lines, args.timeout, args.probe_at, agent)
    _describe("this tree", results["vigil"], args.timeout)
    record = {**header("flood"), "baseline_rev": args.baseline_rev, **results}
    append_result("flood", record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
