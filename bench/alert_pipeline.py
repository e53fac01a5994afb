"""Vigil's page beside a Prometheus + Alertmanager page on the same faults, in one run.

    python -m bench.alert_pipeline [--nodes 5] [--scrape-s 1]

Real processes on loopback: a Vigil controller paging a webhook; ``--nodes`` simulated-GPU agents,
each tailing a kernel log of its own (a kmsg-format file); a real Prometheus (Debian's
``prometheus``) scraping every agent's /metrics every ``--scrape-s`` and evaluating the XID alert as
often (``changes(vigil_gpu_last_xid_timestamp_seconds[1m]) > 0``, ``for: 0s``); a real
Alertmanager (Debian's ``prometheus-alertmanager``) sending it on at once (``group_wait: 0s``,
grouped by node). One HTTP receiver on loopback takes both webhooks. Each node gets one XID 79,
appended to its kernel log 1 to 1 + ``--scrape-s`` seconds after the last (each at its own phase of
the scrapes, seeded); from that write, the time to each pipeline's page is
measured. Prometheus' side is at its most aggressive settings: one-second scrapes and evaluations
(its default is a minute), no ``for``, no group wait; the same agent exports the metric, so both
see the fault at the same moment. Results are printed and appended to
``bench/results/alert_pipeline.jsonl`` with the command.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from bench.record import append_result, header, percentile
from gpus.simulated import simulated_gpus
from tests.e2e.processes import stop_all
from tests.helpers import free_port  # reserved below the ephemeral range, held while this runs
from vigil.demo import simulated_agent_args, xid_line

RULES = """
groups:
  - name: gpu
    interval: {every}
    rules:
      - alert: GpuXid
        expr: changes(vigil_gpu_last_xid_timestamp_seconds[1m]) > 0
        for: 0s
        labels: {{severity: page}}
        annotations: {{summary: "an XID on {{{{ $labels.node }}}}"}}
"""


@dataclass
class Receiver:
    """The one webhook both pipelines page: when each node's first page of each kind arrived."""

    vigil: dict[str, float] = field(default_factory=dict)
    alertmanager: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, path: str, body: dict[str, Any]) -> None:
        now = time.time()
        with self.lock:
            if path.startswith("/vigil") and body.get("type") == "page":
                self.vigil.setdefault(str(body.get("node")), now)
            elif path.startswith("/alertmanager"):
                for alert in body.get("alerts", []):
                    if alert.get("status") == "firing":
                        self.alertmanager.setdefault(str(alert["labels"].get("node")), now)


@contextmanager
def receiving(receiver: Receiver) -> Iterator[int]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            length = int(self.headers.get("Content-Length", 0))
            try:
                receiver.take(self.path, json.loads(self.rfile.read(length) or b"{}"))
            finally:
                self.send_response(200)
                self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()


def _spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(args, stdout=log.open("wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _ready(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer within {timeout_s:g} s")


def _targets_up(prometheus: int, count: int, timeout_s: float = 60.0) -> None:
    url = f"http://127.0.0.1:{prometheus}/api/v1/query?query=sum(up%7Bjob%3D%22agents%22%7D)"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            result = json.load(urllib.request.urlopen(url, timeout=1))["data"]["result"]
            if result and float(result[0]["value"][1]) == count:
                return
        except (OSError, KeyError, IndexError, ValueError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"Prometheus did not scrape all {count} agents within {timeout_s:g} s")


def run(nodes: int, scrape_s: float, workdir: Path) -> dict[str, Any]:
    every = f"{scrape_s:g}s"
    receiver = Receiver()
    procs: list[subprocess.Popen[bytes]] = []
    with receiving(receiver) as hook:
        try:
            ctl_port = free_port()
            config = {
                "listen": "127.0.0.1", "port": ctl_port, "database": str(workdir / "ctl.db"), "plaintext": True,
                "pager": "webhook", "webhook": {"url": f"http://127.0.0.1:{hook}/vigil"},
                "guardrails": {"breaker_max_fraction": 1.0, "shared": {"enabled": False}},
            }  # fmt: skip
            (workdir / "ctl.yaml").write_text(yaml.safe_dump(config))
            vigil = [sys.executable, "-m", "vigil"]
            procs.append(_spawn([*vigil, "controller", "--config", str(workdir / "ctl.yaml")], workdir / "ctl.log"))
            names = [f"node-{i + 1}" for i in range(nodes)]
            kmsg, metrics = {}, {}
            for name in names:
                kmsg[name], metrics[name] = workdir / f"{name}.kmsg", free_port()
                kmsg[name].write_text("")
                args = simulated_agent_args(name, f"127.0.0.1:{ctl_port}", kmsg[name], workdir / f"{name}.spool")
                args[args.index("--metrics-port") + 1] = str(metrics[name])
                procs.append(_spawn([*vigil, *args], workdir / f"{name}.log"))
            am_port, prom_port = free_port(), free_port()
            am_config = {
                "route": {"receiver": "hook", "group_by": ["alertname", "node"], "group_wait": "0s",
                          "group_interval": "1s", "repeat_interval": "1h"},
                "receivers": [{"name": "hook", "webhook_configs": [{"url": f"http://127.0.0.1:{hook}/alertmanager",
                                                                    "send_resolved": False}]}],
            }  # fmt: skip
            (workdir / "am.yml").write_text(yaml.safe_dump(am_config))
            procs.append(
                _spawn(
                    [
                        "prometheus-alertmanager", f"--config.file={workdir / 'am.yml'}",
                        f"--storage.path={workdir / 'am'}", f"--web.listen-address=127.0.0.1:{am_port}",
                        "--cluster.listen-address=",
                    ],
                    workdir / "alertmanager.log",
                )
            )  # fmt: skip
            (workdir / "rules.yml").write_text(RULES.format(every=every))
            targets = [f"127.0.0.1:{port}" for port in metrics.values()]
            prom_config = {
                "global": {"scrape_interval": every, "evaluation_interval": every},
                "rule_files": [str(workdir / "rules.yml")],
                "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
                "scrape_configs": [{"job_name": "agents", "static_configs": [{"targets": targets}]}],
            }
            (workdir / "prometheus.yml").write_text(yaml.safe_dump(prom_config))
            procs.append(
                _spawn(
                    [
                        "prometheus", f"--config.file={workdir / 'prometheus.yml'}",
                        f"--storage.tsdb.path={workdir / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}",
                    ],
                    workdir / "prometheus.log",
                )
            )  # fmt: skip
            _ready(f"http://127.0.0.1:{am_port}/-/ready")
            _ready(f"http://127.0.0.1:{prom_port}/-/ready")
            _targets_up(prom_port, nodes)
            time.sleep(2 * scrape_s + 1)  # every GPU's last-XID gauge has two samples before any fault
            written: dict[str, float] = {}
            chance = random.Random(0)
            for k, name in enumerate(names):
                gpu = simulated_gpus(name, 8)[2]
                with kmsg[name].open("a") as f:
                    f.write(xid_line(gpu.pci_bus_id, 79, "GPU has fallen off the bus.", 100 + k))
                written[name] = time.time()
                time.sleep(1.0 + chance.uniform(0, scrape_s))  # each fault at its own phase of the scrapes
            deadline = time.monotonic() + 30 + 4 * scrape_s
            while time.monotonic() < deadline and (len(receiver.vigil) < nodes or len(receiver.alertmanager) < nodes):
                time.sleep(0.1)
        finally:
            stop_all(procs)
    vigil_s = [receiver.vigil[n] - written[n] for n in names if n in receiver.vigil]
    am_s = [receiver.alertmanager[n] - written[n] for n in names if n in receiver.alertmanager]
    return {"vigil_s": vigil_s, "alertmanager_s": am_s, "missed": {
        "vigil": [n for n in names if n not in receiver.vigil],
        "alertmanager": [n for n in names if n not in receiver.alertmanager],
    }}  # fmt: skip


def _version(program: str) -> str:
    done = subprocess.run([program, "--version"], capture_output=True, text=True, timeout=10)
    return (done.stdout or done.stderr).splitlines()[0].strip() if (done.stdout or done.stderr) else "unknown"


def _summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {"p50": round(statistics.median(values), 3), "p99": round(percentile(values, 0.99), 3),
            "max": round(max(values), 3)}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5, help="nodes, one XID 79 each")
    parser.add_argument("--scrape-s", type=float, default=1.0, help="Prometheus' scrape and evaluation interval")
    parser.add_argument("--keep", action="store_true", help="keep the working directory (logs)")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    missing = [p for p in ("prometheus", "prometheus-alertmanager") if shutil.which(p) is None]
    if missing:
        print(f"needs Debian's {' and '.join(missing)} (apt-get install prometheus prometheus-alertmanager)")
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="vigil-alert-pipeline-"))
    try:
        found = run(args.nodes, args.scrape_s, workdir)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    vigil, am = _summary(found["vigil_s"]), _summary(found["alertmanager_s"])
    ratio = round(am["p50"] / vigil["p50"], 1) if vigil and am and vigil["p50"] > 0 else None
    print(f"{'fault -> page (s)':<26}{'p50':>8}{'p99':>8}{'max':>8}   ({args.nodes} nodes, one XID 79 each)")
    for name, s in (("Vigil (webhook)", vigil), (f"Prometheus {args.scrape_s:g}s + Alertmanager", am)):
        print(f"{name:<26}" + "".join(f"{s.get(k, float('nan')):>8.3f}" for k in ("p50", "p99", "max")))
    print(f"Alertmanager's page / Vigil's page at p50: x{ratio}" if ratio else "a pipeline missed pages")
    if any(found["missed"].values()):
        print(f"missed: {found['missed']}")
    if not args.no_record:
        record = {**header("alert_pipeline"), "nodes": args.nodes, "scrape_s": args.scrape_s,
                  "vigil_page_s": vigil, "alertmanager_page_s": am, "ratio_p50": ratio,
                  "samples": {k: [round(v, 3) for v in found[k]] for k in ("vigil_s", "alertmanager_s")},
                  "missed": found["missed"],
                  "versions": {p: _version(p) for p in ("prometheus", "prometheus-alertmanager")}}  # fmt: skip
        print(f"recorded in {append_result('alert_pipeline', record)}")
    return 0 if ratio else 1


if __name__ == "__main__":
    sys.exit(main())
