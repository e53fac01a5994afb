"""dcgm-exporter scraped over HTTP on loopback, and host signals from psutil."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent.dcgm import DcgmCollector, DcgmScrapeError
from agent.host import HostCollector
from vigil_core.signals import SignalKind

# As dcgm-exporter 3.3 prints it (labels and HELP lines trimmed to what the parser needs).
LABELS = (
    'gpu="{i}",UUID="GPU-{i}a",pci_bus_id="00000000:{bus}:00.0",device="nvidia{i}",modelName="NVIDIA H100 80GB HBM3"'
)


def exposition(xid: int = 0, dbe: int = 0, remap_pending: int = 0, xid_counts: dict[int, int] | None = None) -> str:
    lines = [
        "# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.",
        "# TYPE DCGM_FI_DEV_XID_ERRORS gauge",
    ]
    for i, bus in ((0, "18"), (1, "2A")):
        lines.append(f"DCGM_FI_DEV_XID_ERRORS{{{LABELS.format(i=i, bus=bus)}}} {xid if i == 1 else 0}")
    lines += ["# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter"]
    for i, bus in ((0, "18"), (1, "2A")):
        lines.append(f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{LABELS.format(i=i, bus=bus)}}} {dbe if i == 0 else 0}")
    lines += ["# TYPE DCGM_FI_DEV_ROW_REMAP_PENDING gauge"]
    lines.append(f"DCGM_FI_DEV_ROW_REMAP_PENDING{{{LABELS.format(i=1, bus='2A')}}} {remap_pending}")
    if xid_counts is not None:
        lines += ["# TYPE DCGM_EXP_XID_ERRORS_COUNT gauge"]
        for code, n in xid_counts.items():
            lines.append(f'DCGM_EXP_XID_ERRORS_COUNT{{{LABELS.format(i=0, bus="18")},xid="{code}"}} {n}')
    return "\n".join(lines) + "\n"


@pytest.fixture
def exporter() -> Iterator[tuple[str, list[str]]]:
    body = [exposition()]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            data = body[0].encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/metrics", body
    server.shutdown()


def test_dcgm_changes_become_signals_and_the_first_scrape_is_a_baseline(exporter: tuple[str, list[str]]) -> None:
    url, body = exporter
    body[0] = exposition(xid=31)  # an XID from before the agent started
    collector = DcgmCollector("n1", url, clock=lambda: 5.0)
    assert collector.collect() == []
    body[0] = exposition(xid=79, dbe=2, remap_pending=1)
    signals = collector.collect()
    got = sorted((s.kind, s.gpu.index, s.code, s.value) for s in signals)
    assert got == [
        (SignalKind.ECC_DBE, 0, 0, 2),
        (SignalKind.ROW_REMAP_PENDING, 1, 0, 1),
        (SignalKind.XID, 1, 79, 1),
    ]
    assert all(s.source == "dcgm" for s in signals)
    assert next(s for s in signals if s.kind is SignalKind.XID).gpu.pci_bus_id == "0000:2a:00"
    assert collector.collect() == []  # the last-XID gauge still says 79: nothing new to see


def test_dcgm_xid_counts_see_repeats(exporter: tuple[str, list[str]]) -> None:
    url, body = exporter
    body[0] = exposition(xid_counts={13: 1})
    collector = DcgmCollector("n1", url, clock=lambda: 5.0)
    collector.collect()
    body[0] = exposition(xid_counts={13: 3, 48: 1})
    assert sorted((s.code, s.value) for s in collector.collect()) == [(13, 2), (48, 1)]


def test_dcgm_unreachable_is_a_named_error() -> None:
    collector = DcgmCollector("n1", "http://127.0.0.1:1/metrics", clock=lambda: 5.0)
    with pytest.raises(DcgmScrapeError, match="cannot scrape dcgm-exporter at http://127.0.0.1:1/metrics"):
        collector.collect()


class FakePs:
    def __init__(self) -> None:
        self.available, self.used = 50, 50
        self.nic = SimpleNamespace(errin=0, errout=0, dropin=7, dropout=0)

    def virtual_memory(self) -> SimpleNamespace:
        return SimpleNamespace(available=self.available << 30, total=100 << 30)

    def disk_usage(self, path: str) -> SimpleNamespace:
        return SimpleNamespace(used=self.used, free=100 - self.used, total=100)

    def net_io_counters(self, pernic: bool) -> dict[str, SimpleNamespace]:
        return {"lo": SimpleNamespace(errin=9, errout=9, dropin=9, dropout=9), "ens1": self.nic}


def test_host_pressure_and_full_disk_are_reported_once_each_time_they_start() -> None:
    ps = FakePs()
    host = HostCollector("n1", lambda: 1.0, Path("/ckpt"), 0.05, 0.9, ps=ps)
    assert host.collect() == []
    ps.available, ps.used = 3, 95
    assert sorted(s.kind for s in host.collect()) == [SignalKind.DISK_FULL, SignalKind.HOST_MEMORY_PRESSURE]
    assert host.collect() == []  # still under pressure: not again
    ps.available, ps.used = 50, 50
    assert host.collect() == []
    ps.available = 1
    assert [s.kind for s in host.collect()] == [SignalKind.HOST_MEMORY_PRESSURE]


def test_nic_errors_but_not_drops_are_signals() -> None:
    ps = FakePs()
    host = HostCollector("n1", lambda: 1.0, ps=ps)
    host.collect()
    ps.nic = SimpleNamespace(errin=3, errout=1, dropin=900, dropout=0)
    signals = host.collect()
    assert [(s.kind, s.value) for s in signals] == [(SignalKind.NIC_ERRORS, 4)]
    assert "ens1" in signals[0].message
    assert host.reading is not None and host.reading.nic_errors["ens1"] == (3, 1, 900, 0)


def test_host_collector_reads_this_machine(tmp_path: Path) -> None:
    host = HostCollector("n1", lambda: 1.0, tmp_path)
    host.collect()
    r = host.reading
    assert r is not None and 0 < r.memory_available_bytes <= r.memory_total_bytes
    assert r.disk_total_bytes is not None and r.disk_free_bytes is not None and r.disk_free_bytes > 0
