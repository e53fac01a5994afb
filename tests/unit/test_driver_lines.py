"""The kernel-log parser on real-format lines from several driver generations, and on garbage."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.driver_lines import GpuAnnounce, SxidLine, XidLine, parse_nvrm, parse_record
from agent.kernel_log import KernelLogCollector
from vigil_core.signals import GpuRef, SignalKind, normalize_pci_bus_id
from vigil_core.sxid import sxid_meaning

REAL_LINES = [
    # (line, bus, code, pid, process)
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.", "0000:3b:00", 79, 0, ""),
    (
        "NVRM: Xid (PCI:0000:b7:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error "
        "(DBE) has been detected on GPU in the framebuffer at partition 0, subpartition 0.",
        "0000:b7:00",
        48,
        None,
        "",
    ),
    ("NVRM: Xid (0000:03:00): 13, 0003 00000000 0000a1c0 00000180 00000000 00000000", "0000:03:00", 13, None, ""),
    (
        "NVRM: Xid (PCI:0000:07:00): 31, pid=20277, name=python3, Ch 00000008, intr 10000000. MMU Fault: "
        "ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f1a_3e000000.",
        "0000:07:00",
        31,
        20277,
        "python3",
    ),
    (
        "NVRM: Xid (PCI:0000:3b:00): 119, pid=1582, name=nvidia-smi, Timeout after 6s of waiting for RPC "
        "response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20802a02 0x8).",
        "0000:3b:00",
        119,
        1582,
        "nvidia-smi",
    ),
    (
        "NVRM: Xid (PCI:0001:00:00): 94, pid=3155, name=pt_main_thread, Contained: SM (0x1). RST: No, D-RST: No",
        "0001:00:00",
        94,
        3155,
        "pt_main_thread",
    ),
    (
        "NVRM: Xid (PCI:0000:ab:00): 13, pid=1234, name=python, Graphics SM Warp Exception on (GPC 0, TPC 0, "
        "SM 0): Out Of Range Address",
        "0000:ab:00",
        13,
        1234,
        "python",
    ),
    ("NVRM: Xid (PCI:0000:01:00): 62, 0cb8(2d50) 00000000 00000000", "0000:01:00", 62, None, ""),
    (
        "NVRM: Xid (PCI:0000:18:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error detected on "
        "link 3(0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)",
        "0000:18:00",
        74,
        None,
        "",
    ),
    ("NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.", "0000:3b:00", 79, None, ""),
    ("NVRM: GPU at PCI:0000:db:00: GPU has fallen off the bus.", "0000:db:00", 79, None, ""),
]

PREFIXES = [
    "",
    "3,1234,5678901234,-;",  # /dev/kmsg record
    "[ 1234.567890] ",  # dmesg
    "Nov 21 03:12:44 gpu-node-17 kernel: ",  # journald / syslog
    "kernel: [  842.165431] ",
]


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize(("line", "bus", "code", "pid", "process"), REAL_LINES)
def test_real_xid_lines(prefix: str, line: str, bus: str, code: int, pid: int | None, process: str) -> None:
    parsed = parse_nvrm(parse_record(prefix + line).message)
    assert isinstance(parsed, XidLine)
    assert (parsed.pci_bus_id, parsed.code, parsed.process) == (bus, code, process)
    if pid is not None:
        assert parsed.pid == pid


def test_kmsg_record_header() -> None:
    record = parse_record("6,771,18445021,-;NVRM: GPU at PCI:0000:18:00: GPU-5b8d3c7e-1f2a-4c3b-9d8e-0a1b2c3d4e5f\n")
    assert (record.seq, record.timestamp_us) == (771, 18445021)
    parsed = parse_nvrm(record.message)
    assert parsed == GpuAnnounce("0000:18:00", "GPU-5b8d3c7e-1f2a-4c3b-9d8e-0a1b2c3d4e5f")


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("00000000:3B:00.0", "0000:3b:00"),
        ("0000:3b:00", "0000:3b:00"),
        ("PCI:0001:DB:00", "0001:db:00"),
        ("3b:00", "0000:3b:00"),
    ],
)
def test_pci_bus_ids_are_normalised(raw: str, normal: str) -> None:
    assert normalize_pci_bus_id(raw) == normal


def collector_for(lines: list[str]) -> KernelLogCollector:
    gpus = [GpuRef(0, "GPU-aaaa", "0000:3b:00")]
    return KernelLogCollector("n1", lambda: lines, gpus, clock=lambda: 42.0)


def test_collector_maps_the_bus_id_to_the_gpu_and_learns_uuids_from_announces() -> None:
    lines = [
        "6,1,1,-;NVRM: GPU at PCI:0000:5d:00: GPU-5b8d3c7e-1f2a-4c3b-9d8e-0a1b2c3d4e5f",
        "3,2,2,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.",
        "3,3,3,-;NVRM: Xid (PCI:0000:5d:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit",
    ]
    signals = collector_for(lines).collect()
    assert [(s.kind, s.code, s.gpu.index, s.gpu.uuid) for s in signals] == [
        (SignalKind.XID, 79, 0, "GPU-aaaa"),
        (SignalKind.XID, 48, -1, "GPU-5b8d3c7e-1f2a-4c3b-9d8e-0a1b2c3d4e5f"),
    ]
    assert all(s.source == "kmsg" and s.observed_at == 42.0 for s in signals)


def test_garbage_is_counted_not_fatal() -> None:
    lines = [
        "NVRM: Xid (PCI:zzzz): seventy-nine",  # a driver fault line we cannot read
        "NVRM: Xid garbage",
        "GPU has fallen off the bus, somehow",
        "\x00\x01\x02 binary junk",
        "6,notanumber,;half a header",
        "usb 1-1: new high-speed USB device number 2",  # an unrelated kernel line: not counted
        "",
    ]
    collector = collector_for(lines)
    assert collector.collect() == []
    assert collector.unparsed_lines == 3


@given(st.text(max_size=300))
def test_parser_never_raises(text: str) -> None:
    collector = collector_for([text, "NVRM: Xid (" + text])
    collector.collect()
    assert collector.unparsed_lines <= 2


SXID_LINES = [
    # (line as it reaches the agent, switch, bus, code, fatal, detail)
    (
        "3,812,9913120,-;nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted "
        "PRIV error (First)",
        3,
        "0000:05:00",
        12028,
        False,
        "Link 32 egress non-posted PRIV error (First)",
    ),
    (
        "[ 4821.331] nvidia-nvswitch0: SXid (PCI:0000:c6:00.0): 24007, Fatal, Link 44 sourcetrack timeout "
        "error (First)",
        0,
        "0000:c6:00",
        24007,
        True,
        "Link 44 sourcetrack timeout error (First)",
    ),
    ("kernel: nvidia-nvswitch11: SXid (PCI:0000:9d:00.0): 20034, Fatal", 11, "0000:9d:00", 20034, True, ""),
]


@pytest.mark.parametrize(("line", "switch", "bus", "code", "fatal", "detail"), SXID_LINES)
def test_real_sxid_lines(line: str, switch: int, bus: str, code: int, fatal: bool, detail: str) -> None:
    parsed = parse_nvrm(parse_record(line).message)
    assert parsed == SxidLine(switch, bus, code, fatal, detail)


def test_sxid_lines_become_fatal_or_nonfatal_signals_and_their_follow_ups_add_nothing() -> None:
    lines = [
        SXID_LINES[0][0],
        "3,813,9913121,-;nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Severity 0 Engine instance 32 "
        "Sub-engine instance 00",
        "3,814,9913122,-;nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Data {0x00000000, 0x00000004}",
        SXID_LINES[1][0],
        "nvidia-nvswitch2: SXid (PCI:0000:06:00.0): twelve, Fatal",  # malformed: counted, like a bad Xid
        "nvidia-nvswitch2: SXid (PCI:0000:06:00.0): 99999999999, Fatal",  # no driver's number
    ]
    collector = collector_for(lines)
    signals = collector.collect()
    assert [(s.kind, s.code, s.gpu.pci_bus_id, s.gpu.index) for s in signals] == [
        (SignalKind.SXID_NONFATAL, 12028, "0000:05:00", -1),
        (SignalKind.SXID_FATAL, 24007, "0000:c6:00", -1),
    ]
    what = "fatal: an error in the NVSwitch SOE (the switch's management engine) unit"
    assert signals[1].describe() == f"SXid 24007 ({what}) on n1 NVSwitch at PCI 0000:c6:00"
    assert "(non-fatal: egress non-posted PRIV error)" in signals[0].describe()
    assert collector.unparsed == {"unrecognised": 2}


def test_the_sxid_catalog_names_codes_and_units() -> None:
    assert sxid_meaning(12022) == "egress input ECC double-bit error"
    assert "corrected by the switch" in sxid_meaning(19071)


# Lines drivers and log shippers really write that were missed before: each must reach a signal.
MISSED_BEFORE = [
    # (line, kind, code, the GPU's bus id or "" for the node's)
    ("NVRM: Xid (PCI:0000:3b:00 GPU-I:05): 94, pid=1234, name=python, Contained ECC error.", "XID", 94, "0000:3b:00"),
    (
        "NVRM: Xid (PCI:0000:3b:00 GPU-I:5 GPU-CI:0): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit "
        "error (DBE) has been detected",
        "XID",
        48,
        "0000:3b:00",
    ),  # fmt: skip
    ("NVRM: Xid (PCI:0000:3b:00 GPU-I:02): 79, pid=0, GPU has fallen off the bus.", "XID", 79, "0000:3b:00"),
    ("NVRM: Xid (PCI:...): 79, pid=0, GPU has fallen off the bus.", "XID", 79, ""),  # bus id redacted
    ("NVRM: Xid (PCI:<redacted>): 48, pid=0, An uncorrectable double bit error", "XID", 48, ""),
    (
        "NVRM: The NVIDIA GPU 0000:3b:00.0 (PCI ID: 10de:2330) installed in this system has fallen off the bus and "
        "is not responding to commands.",
        "XID",
        79,
        "0000:3b:00",
    ),  # fmt: skip
    ("NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.", "XID", 79, "0000:3b:00"),
    ("NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.", "XID", 79, "0000:3b:00"),
    ("NVRM: The NVIDIA GPU (PCI:...) has fallen off the bus.", "XID", 79, ""),
    ("nvidia-nvswitch2: SXid (PCI:0000:05:00.0): 24007, SOE watchdog error", "SXID_FATAL", 24007, "0000:05:00"),
    ("nvidia-nvswitch2: SXid (PCI:0000:05:00.0): 24010, SOE halted", "SXID_FATAL", 24010, "0000:05:00"),
    ("nvidia-nvswitch0: SXid (PCI:0000:07:00.0): 24011, SOE external error", "SXID_FATAL", 24011, "0000:07:00"),
    ("nvidia-nvswitch0: SXid (PCI:0000:07:00.0): 19084, link trained down", "SXID_NONFATAL", 19084, "0000:07:00"),
]


@pytest.mark.parametrize(("line", "kind", "code", "bus"), MISSED_BEFORE)
def test_mig_redacted_bus_drop_and_severity_less_lines_reach_a_signal(
    line: str, kind: str, code: int, bus: str
) -> None:
    collector = collector_for([f"3,9,9,-;{line}"])
    (signal,) = collector.collect()
    assert (signal.kind.value, signal.code, signal.gpu.pci_bus_id) == (kind, code, bus)
    if bus == "0000:3b:00":
        assert signal.gpu.index == 0  # the node's GPU at that bus, as for any other XID
    assert collector.unparsed_lines == 0


def test_a_mig_instance_is_named_in_the_detail() -> None:
    parsed = parse_nvrm("NVRM: Xid (PCI:0000:3b:00 GPU-I:05): 94, pid=1234, name=python, Contained ECC error.")
    assert isinstance(parsed, XidLine) and parsed.detail.startswith("[MIG GPU instance 5]")


def test_unparsed_driver_lines_are_kept_as_a_bounded_sample() -> None:
    collector = collector_for([f"NVRM: Xid garbage {i} " + "x" * 2000 for i in range(20)])
    collector.collect()
    samples = collector.take_samples()
    assert len(samples) == 5 and all(len(s) <= 600 for s in samples) and "garbage 19" in samples[-1]
    assert collector.take_samples() == [] and collector.unparsed_lines == 20
