"""InfiniBand/RoCE port health from fixture sysfs trees in the real mlx5 layout, through the real
reader and the port watch: healthy, flapping, down past the transport timeout, degraded, error storms."""

from __future__ import annotations

from pathlib import Path

from agent.infiniband import PortWatch, read_ports
from tests.fakes.ib_sysfs import IbSysfs
from vigil_core.signals import SignalKind


def fabric(tmp_path: Path) -> IbSysfs:
    ib = IbSysfs(tmp_path)
    ib.add_port("mlx5_0", 1, "0000:17:00.0")
    ib.add_port("mlx5_1", 1, "0000:3d:00.0", link_layer="Ethernet", rate="200 Gb/sec (4X HDR)")
    return ib


def kinds(signals: list) -> list[tuple[SignalKind, str]]:  # type: ignore[type-arg]
    return [(s.kind, s.message.partition(":")[0]) for s in signals]


def test_a_healthy_fabric_reads_right_and_says_nothing(tmp_path: Path) -> None:
    ib = fabric(tmp_path)
    ports = read_ports(ib.root)
    assert [(p.hca, p.port, p.pci_bus_id, p.up, p.rate_gbps, p.width, p.link_layer) for p in ports] == [
        ("mlx5_0", 1, "0000:17:00", True, 400.0, 4, "InfiniBand"),
        ("mlx5_1", 1, "0000:3d:00", True, 200.0, 4, "Ethernet"),
    ]
    assert "out_of_sequence" in ports[1].counters and "out_of_sequence" not in ports[0].counters
    watch = PortWatch("n1")
    for t in range(0, 300, 10):
        ib.bump("mlx5_0", 1, "port_rcv_data", 10**9)  # traffic is not an error
        ib.bump("mlx5_0", 1, "symbol_error", 1)  # one symbol error per 10 s is under the rate
        assert watch.observe(read_ports(ib.root), float(t)) == []
    assert read_ports(tmp_path / "no-such-dir") == []  # a node without InfiniBand


def test_a_short_flap_is_a_warning_and_a_long_outage_a_fault_once(tmp_path: Path) -> None:
    ib, watch = fabric(tmp_path), PortWatch("n1", transport_timeout_s=7.0)
    watch.observe(read_ports(ib.root), 0.0)
    ib.set_up("mlx5_0", 1, False)
    assert watch.observe(read_ports(ib.root), 1.0) == []
    ib.set_up("mlx5_0", 1, True)
    (flap,) = watch.observe(read_ports(ib.root), 4.0)
    assert (flap.kind, flap.code, flap.value, flap.gpu.pci_bus_id) == (SignalKind.IB_PORT_FLAP, 1, 3.0, "0000:17:00")
    assert flap.describe() == "IB_PORT_FLAP on n1 mlx5_0 port 1"

    ib.set_up("mlx5_1", 1, False)
    assert watch.observe(read_ports(ib.root), 10.0) == []
    assert watch.observe(read_ports(ib.root), 16.0) == []  # 6 s: not yet past the timeout
    (down,) = watch.observe(read_ports(ib.root), 17.5)
    assert (down.kind, down.value) == (
        SignalKind.IB_PORT_DOWN,
        7.5,
    ) and "past the 7 s transport timeout" in down.message
    assert watch.observe(read_ports(ib.root), 30.0) == []  # once per outage
    ib.set_up("mlx5_1", 1, True)
    assert watch.observe(read_ports(ib.root), 40.0) == []  # back: no flap for an outage already a fault
    assert watch.down_total_s("mlx5_0", 1, 40.0) == 3.0 and watch.down_total_s("mlx5_1", 1, 40.0) == 30.0


def test_a_link_below_its_rate_or_width_is_degraded_once(tmp_path: Path) -> None:
    ib, watch = fabric(tmp_path), PortWatch("n1")
    watch.observe(read_ports(ib.root), 0.0)
    ib.set_rate("mlx5_0", 1, "200 Gb/sec (4X HDR)")
    (slow,) = watch.observe(read_ports(ib.root), 1.0)
    assert slow.kind is SignalKind.IB_PORT_DEGRADED and "it ran at 400 Gb/s" in slow.message
    assert watch.observe(read_ports(ib.root), 2.0) == []
    ib.set_rate("mlx5_1", 1, "100 Gb/sec (2X HDR)")
    (narrow,) = watch.observe(read_ports(ib.root), 3.0)
    assert narrow.message.startswith("mlx5_1 port 1: link degraded: 100 Gb/s on 2X")


def test_an_error_storm_is_said_per_counter_at_most_once_a_minute_and_a_reset_is_a_baseline(tmp_path: Path) -> None:
    ib, watch = fabric(tmp_path), PortWatch("n1")
    watch.observe(read_ports(ib.root), 0.0)
    ib.bump("mlx5_0", 1, "symbol_error", 500)
    ib.bump("mlx5_1", 1, "out_of_sequence", 5000)  # RoCE retransmissions
    errors = watch.observe(read_ports(ib.root), 30.0)
    assert sorted((s.message.partition(":")[0], s.value) for s in errors) == [
        ("mlx5_0 port 1", 500.0),
        ("mlx5_1 port 1", 5000.0),
    ]
    assert "symbol_error grew by 500 in 30 s (more than 10 a minute)" in errors[0].message
    ib.bump("mlx5_0", 1, "symbol_error", 500)
    assert watch.observe(read_ports(ib.root), 60.0) == []  # the same counter: not again within the minute
    ib.reset("mlx5_0", 1, "symbol_error")
    assert watch.observe(read_ports(ib.root), 120.0) == []  # went back: a new window, not an error
    for t in (120.1, 120.2, 120.3):  # one error between polls a tenth of a second apart is one error
        ib.bump("mlx5_0", 1, "symbol_error", 1)
        assert watch.observe(read_ports(ib.root), t) == []
