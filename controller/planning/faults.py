"""What interrupts a large training run, how often each kind, and how fast it is found with Vigil
and without it. Pure data, for ``controller.planning.sim``.

The mix is the root-cause table of the 419 unexpected interruptions of Llama 3 405B's 54-day
pre-training snapshot on 16,384 H100s (Llama Team, "The Llama 3 Herd of Models", 2024, table 5).
Each kind is found by the signal Vigil detects it by, in the time measured for that signal:

- an XID on the kernel log or from NVML (a faulty GPU, HBM3, SRAM, the GSP, thermal): fault ->
  first action p99 0.51 s (``bench/results/scenarios.jsonl``, 65 scenarios, 2 cores);
- an InfiniBand port down past the 7 s transport timeout (switch, cable, NIC): 7.5 s;
- a host that dies (SSD, PSU, chassis, CPU, memory, IO board): the agent's heartbeat falls silent,
  ``heartbeat_timeout_s`` 30 s;
- a crashing job (software bug, dependency): the application-fault grace, 2 s;
- a hang of unknown cause (NCCL watchdog timeouts): Vigil has no hang detector of its own; the
  watchdog finds it in both cases, and Vigil's recovery sweep finds the node instead of a person;
- host maintenance: announced, no detection in either case; silent data corruption: it costs a
  rollback in both cases, and when it is noticed (the loss) is not modelled: no published figure.

Without Vigil, a dead rank is found by the NCCL watchdog (``Baseline.watchdog_s``), and a person
finds and takes out the node (``Baseline.person_s``) where the fault is a node's.
"""

from __future__ import annotations

from dataclasses import dataclass

XID_S = 0.51  # scenarios: fault -> first action, p99
IB_PORT_S = 7.5  # the transport timeout, and the agent's poll
HEARTBEAT_S = 30.0  # the controller's heartbeat_timeout_s
APP_FAULT_S = 2.0  # app_faults.grace_s
SWEEP_S = 60.0  # a recovery sweep of the job's nodes (gpu_health)


@dataclass(frozen=True, slots=True)
class FaultKind:
    name: str
    count: int  # interruptions of this kind in the published table
    signal: str  # what Vigil detects it by
    vigil_s: float  # fault -> the job told to stop, with Vigil
    watchdog: bool  # without Vigil, the NCCL watchdog is what notices it
    node_fault: bool  # without Vigil, a person must find the node before the restart
    unaided_s: float = 0.0  # found this fast without Vigil where the watchdog is not what notices it


def _xid(name: str, count: int) -> FaultKind:
    return FaultKind(name, count, "XID (kernel log, NVML)", XID_S, watchdog=True, node_fault=True)


def _host(name: str, count: int) -> FaultKind:
    return FaultKind(name, count, "agent heartbeat silent", HEARTBEAT_S, watchdog=True, node_fault=True)


LLAMA3_MIX: tuple[FaultKind, ...] = (
    _xid("faulty GPU", 148),
    _xid("GPU HBM3 memory", 72),
    FaultKind("software bug", 54, "the job crashed (application fault)", APP_FAULT_S, watchdog=True, node_fault=False),
    FaultKind("network switch/cable", 35, "InfiniBand port down", IB_PORT_S, watchdog=True, node_fault=True),
    FaultKind("host maintenance", 32, "announced", 0.0, watchdog=False, node_fault=False),
    _xid("GPU SRAM memory", 19),
    _xid("GPU system processor", 17),
    FaultKind("NIC", 7, "InfiniBand port down", IB_PORT_S, watchdog=True, node_fault=True),
    FaultKind("NCCL watchdog timeout", 7, "the watchdog, then a recovery sweep", 600.0 + SWEEP_S, True, True),
    FaultKind("silent data corruption", 6, "none (the loss)", 0.0, watchdog=False, node_fault=True),
    _xid("GPU thermal interface + sensor", 6),
    _host("SSD", 3),
    _host("power supply", 3),
    _host("server chassis", 2),
    _host("IO expansion board", 2),
    FaultKind("dependency", 2, "the job crashed (application fault)", APP_FAULT_S, watchdog=True, node_fault=False),
    _host("CPU", 2),
    _host("system memory", 2),
)


def detect_s(kind: FaultKind, vigil: bool, watchdog_s: float) -> float:
    """Fault -> the job is told, with or without Vigil."""
    if vigil:
        return kind.vigil_s
    return watchdog_s if kind.watchdog else kind.unaided_s


def mean_detect_s(mix: tuple[FaultKind, ...], vigil: bool, watchdog_s: float) -> float:
    total = sum(k.count for k in mix)
    return sum(k.count * detect_s(k, vigil, watchdog_s) for k in mix) / total


def node_fault_share(mix: tuple[FaultKind, ...]) -> float:
    """The share of interruptions where a person must find a node when nothing watches the cluster."""
    return sum(k.count for k in mix if k.node_fault) / sum(k.count for k in mix)
