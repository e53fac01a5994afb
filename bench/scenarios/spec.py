"""A scenario file: the fleet, the timeline of injected events, and the expected outcome.

```yaml
description: one XID 79 quarantines its node and pages; the rest are left alone
family: catalog-reset            # the scorecard's row: the family of mistakes it guards against
covers: [xid-79]                 # the policy rules or known defects it exercises
fleet: {nodes: 4, gpus: 8}       # node-1 .. node-4
controller: {}                   # ControllerConfig fields (policy: inline, as a policy file's content)
events:
  - {at: 0.0, node: node-2, kernel_log: {xid: 79, gpu: 3}}
expect:
  quarantined: [node-2]          # every other node: not quarantined
  paged: [node-2]                # every other node: not paged
  health: {node-2: QUARANTINED}  # final health, where it matters
  among: [{of: [node-3, node-4], at_most: 1}]   # some of them, whichever
  page_says: {node-2: [reset the GPU]}          # words its page must say; `fleet`: a fleet page
```

Event kinds (one per event): ``kernel_log`` (an XID line in the node's kernel log), ``kernel_line``
(any line there, as the driver writes it: an NVSwitch SXid), ``nvml_xid``
(an XID event from NVML), ``gpu`` (what a GPU reports from now on: ``GpuFaults`` fields),
``restart_agent`` (the agent restarts, optionally with fewer GPUs), ``stop_agent`` (it goes
silent and stays silent), ``uncordon`` (a person returns
the node to service), ``resolve`` (a person resolves the node's open incidents), ``person`` (a
person cordons or taints the Node), ``job_windows`` (the training job's rank 0 reports windows;
needs ``job:``), ``sweep`` (a person runs ``vigil sweep``; what it must find is part of the event),
``ib_port`` (what a node's InfiniBand port reads: up, rate, counters; needs
``fleet.infiniband``), ``smi`` (how a node's nvidia-smi behaves: resets that fail, GPUs gone after
one; needs ``fleet.remedies``), ``job_process`` (a job's process on a node's GPU starts or goes),
``stop_controller`` / ``start_controller`` (the controller goes away, SIGTERM or SIGKILL, and comes
back on the same database and port), ``pause_controller`` (its process held that many seconds, its
agents sending on; with ``every_s``, again and again in the background), ``stop_relay`` /
``start_relay`` (one of ``fleet.relays``, the ``vigil relay`` its nodes' agents dial, goes away and
comes back on the same port). ``at`` is seconds
after every node reported healthy.

Every page goes to a Slack Web API on loopback (the real ``slack-sdk``); the judge checks that
each incident Vigil recorded as paged is one top-level Slack message, and that nothing else is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from vigil_core.config_file import load_yaml_model

CASES_DIR = Path(__file__).parent / "cases"
Health = Literal["HEALTHY", "SUSPECT", "UNHEALTHY", "QUARANTINED", "UNKNOWN"]


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FabricSpec(_Strict):
    """A two-tier fabric of network namespaces (``tests.e2e.netns``): the nodes hang, in order and as
    evenly as they divide, from ``leaves`` leaf bridges ``leaf-0`` ..; the controller knows each
    node's leaf from its ``vigil.dev/leaf-switch`` label."""

    leaves: int = Field(ge=2, le=8)


class Fleet(_Strict):
    nodes: int = Field(default=4, ge=1, le=64)
    gpus: int = Field(default=8, ge=1, le=64)
    kubernetes: bool = Field(
        default=False, description="Node objects in a Kubernetes API on loopback; the controller acts through it"
    )
    slurm: bool = Field(
        default=False,
        description="a private Slurm cluster (real slurmctld, a slurmd per node); the controller drains through it",
    )
    slurmrestd: bool = Field(
        default=False, description="the Slurm cluster is 24.11, and the controller reaches it through slurmrestd"
    )
    labels: dict[str, dict[str, str]] = Field(default_factory=dict, description="node -> its labels (kubernetes)")
    infiniband: bool = Field(
        default=False, description="each node has an InfiniBand HCA, mlx5_0 port 1 at 400 Gb/s (a sysfs tree)"
    )
    fabric: FabricSpec | None = Field(
        default=None,
        description="each node in a network namespace, under leaf bridges joined by a spine bridge (needs root)",
    )
    remedies: bool = Field(
        default=False,
        description="agents carry out GPU and bus resets through a fake nvidia-smi on their simulated GPUs; "
        "a reboot the controller asks restarts the node's agent with its GPUs reset (needs controller remediation)",
    )
    after_reboot: dict[str, int] = Field(default_factory=dict, description="node -> the GPUs it has after a reboot")
    xid_at_boot: dict[str, KernelXid] = Field(
        default_factory=dict,
        description="node -> an XID its kernel logs as it boots after a reboot, before its agent says Hello",
    )
    relays: int = Field(
        default=0,
        ge=0,
        le=4,
        description="agents reach the controller through this many vigil relays (node-i: i-1 mod)",
    )

    @property
    def names(self) -> list[str]:
        return [f"node-{i + 1}" for i in range(self.nodes)]


class KernelXid(_Strict):
    xid: int = Field(ge=1, lt=1 << 16)
    gpu: int = Field(0, ge=0)
    message: str = "injected by the scenario"
    repeat: int = Field(1, ge=1, le=100_000, description="this many lines at once")
    seq: int | None = Field(
        None, ge=1, description="the first line's kmsg sequence number (a replay repeats an earlier one's)"
    )


class KernelLine(_Strict):
    """Any line in the node's kernel log, as the driver writes it (an NVSwitch SXid, say)."""

    text: str = Field(min_length=1, max_length=4000)
    repeat: int = Field(1, ge=1, le=100_000)
    seq: int | None = Field(None, ge=1, description="the first line's kmsg sequence number")


class NvmlXid(_Strict):
    xid: int = Field(ge=1, lt=1 << 16)
    gpu: int = Field(0, ge=0)


class GpuState(_Strict):
    gpu: int = Field(0, ge=0)
    set: dict[str, bool | int] = Field(min_length=1)


class RestartAgent(_Strict):
    gpus: int | None = Field(None, ge=1, le=64, description="the node comes back with this many GPUs")


class StopAgent(_Strict):
    """The node's agent goes away and stays away (the node froze, the pod was evicted), or, with
    ``freeze``, stays with its connection up and answers nothing (SIGSTOP: a stuck agent)."""

    kill: bool = Field(default=True, description="SIGKILL, not SIGTERM")
    freeze: bool = Field(default=False, description="SIGSTOP: the process and its connection stay, silent")


class Uncordon(_Strict):
    by: str = "sre@example.com"
    reason: str = "scenario: a person returns the node"


EVENT_KINDS = (
    "kernel_log",
    "kernel_line",
    "nvml_xid",
    "gpu",
    "restart_agent",
    "stop_agent",
    "uncordon",
    "resolve",
    "person",
    "job_windows",
    "ib_port",
    "sweep",
    "stop_controller",
    "start_controller",
    "pause_controller",
    "stop_relay",
    "start_relay",
    "throttle",
    "smi",
    "job_process",
)
Verdict = Literal["OK", "FAIL", "UNKNOWN"]


class Person(_Strict):
    """What a person does to a node: through the Kubernetes API (``cordon``, ``taint``: needs
    ``fleet.kubernetes``) or through Slurm (``drain``: needs ``fleet.slurm``)."""

    cordon: bool = False  # kubectl cordon
    taint: str = ""  # kubectl taint KEY=VALUE:NoSchedule, e.g. "repair=rma"
    drain: str = ""  # scontrol update nodename=NODE state=drain reason=DRAIN (a person's, or NHC's)

    @model_validator(mode="after")
    def _something(self) -> Person:
        if not self.cordon and not self.taint and not self.drain:
            raise ValueError("a person event needs cordon: true, a taint or a drain")
        return self


class Resolve(_Strict):
    by: str = "sre@example.com"
    note: str = "scenario: a person explains the incident away"


class JobWindows(_Strict):
    """Training windows reported by the job's rank 0 (``job:`` names the job): ``count`` windows
    back to back, each ``window_s`` long, at this MFU, every rank ``step_time_s`` except where
    ``slow`` says (node -> its ranks' step time). ``start``: the first is the job's start event."""

    count: int = Field(default=1, ge=1, le=100)
    mfu: float = Field(default=0.5, ge=0, le=1.5)
    tokens_per_s: tuple[float, ...] = Field(
        default=(), description="each window's tokens/s, in turn (cycled); default 1,000 tokens a window"
    )
    step_time_s: float = Field(default=0.1, gt=0)
    slow: dict[str, float] = Field(default_factory=dict)
    start: bool = False


class Sweep(_Strict):
    """``vigil sweep --json`` as a person runs it, and what it must find."""

    checks: tuple[str, ...] = Field(min_length=1)
    nodes: tuple[str, ...] = ()  # default: every connected agent's
    params: tuple[str, ...] = ()  # CHECK.ARG=VALUE
    min_busbw_gbps: float = Field(default=0.0, ge=0)
    quarantine: bool = False
    verdict: Verdict | None = Field(default=None, description="the sweep's own verdict")
    rows: dict[str, dict[str, Verdict]] = Field(default_factory=dict, description="node -> check -> verdict")
    findings: tuple[str, ...] | None = Field(default=None, description="exactly these culprits ('a|b': a link)")
    held_ports: tuple[int, ...] = Field(
        default=(), description="ports another program holds while it runs, counted from sweep.pair_port_base"
    )


class IbPort(_Strict):
    """What the node's InfiniBand port reads from now on (needs ``fleet.infiniband``)."""

    hca: str = "mlx5_0"
    port: int = Field(1, ge=1, le=16)
    up: bool | None = None
    rate: str | None = Field(None, description='as sysfs says it: "200 Gb/sec (4X HDR)"')
    bump: dict[str, int] = Field(default_factory=dict, description="counter -> how much it grows")

    @model_validator(mode="after")
    def _something(self) -> IbPort:
        if self.up is None and self.rate is None and not self.bump:
            raise ValueError("an ib_port event needs up, rate or bump")
        return self


class Throttle(_Strict):
    """Slow one part of the fabric with ``tc ... tbf`` (needs ``fleet.fabric``), or lift every throttle."""

    uplink: int | None = Field(None, ge=0, description="the uplink of leaf-N, both directions")
    leaf: int | None = Field(None, ge=0, description="every port of leaf-N, as a failing switch")
    node: str = Field("", description="one node's own link")
    clear: bool = False
    rate: str = Field("100mbit", pattern=r"^[0-9]+[kmg]?bit$")

    @model_validator(mode="after")
    def _one(self) -> Throttle:
        if sum((self.uplink is not None, self.leaf is not None, bool(self.node), self.clear)) != 1:
            raise ValueError("a throttle event names one of uplink, leaf, node, or clear: true")
        return self


class Smi(_Strict):
    """How the node's (fake) nvidia-smi behaves from now on (needs ``fleet.remedies``): GPUs whose
    reset fails, GPUs gone after their reset, GPUs in persistence mode."""

    reset_fails: tuple[int, ...] = ()
    gone_after_reset: tuple[int, ...] = ()
    persistence: tuple[int, ...] = ()
    reset_s: float = Field(0.0, ge=0, le=60, description="how long each GPU reset takes")


class JobProcess(_Strict):
    """A training job's process on the node (``VIGIL_JOB_ID`` in its environment, the GPU in
    nvidia-smi's list), started or gone (needs ``fleet.remedies``)."""

    job: str = Field(default="train", pattern=r"^[a-z0-9][a-z0-9-]{0,40}$")
    gpu: int = Field(0, ge=0)
    running: bool = True


class StopController(_Strict):
    kill: bool = Field(default=False, description="SIGKILL, not SIGTERM")


class StartController(_Strict):
    pass


class PauseController(_Strict):
    """The controller's process held (SIGSTOP, then SIGCONT): as a long garbage collection or a paused
    VM holds it; its agents go on sending, into its sockets."""

    seconds: float = Field(gt=0, le=120)
    every_s: float | None = Field(
        default=None,
        description="hold it again at the start of every so many seconds, in the background until the scenario "
        "ends (sustained load: its event loop late tick after tick); the next event does not wait for it",
    )

    @model_validator(mode="after")
    def _lets_it_run(self) -> PauseController:
        if self.every_s is not None and self.every_s <= self.seconds:
            raise ValueError(f"every_s ({self.every_s:g}) must be longer than seconds ({self.seconds:g}): it must run")
        return self


class StopRelay(_Strict):
    relay: int = Field(default=0, ge=0, description="which relay (fleet.relays): node-i's is (i - 1) mod relays")
    kill: bool = Field(default=False, description="SIGKILL, not SIGTERM")


class StartRelay(_Strict):
    relay: int = Field(default=0, ge=0)


class Job(_Strict):
    """A training job on some of the fleet's nodes, reported to the controller as its hook would."""

    id: str = "train"
    nodes: tuple[str, ...] = Field(min_length=1)
    ranks_per_node: int = Field(default=8, ge=1, le=64)
    window_s: float = Field(default=0.2, gt=0, le=60, description="each window's length, as reported")


class Event(_Strict):
    at: float = Field(0.0, ge=0, le=600)
    node: str = Field(default="", description="the node it happens on (not for job_windows)")
    kernel_log: KernelXid | None = None
    kernel_line: KernelLine | None = None
    nvml_xid: NvmlXid | None = None
    gpu: GpuState | None = None
    restart_agent: RestartAgent | None = None
    stop_agent: StopAgent | None = None
    uncordon: Uncordon | None = None
    resolve: Resolve | None = None  # a person resolves the node's open incidents (vigil resolve)
    person: Person | None = None  # a person changes the Node through the Kubernetes API
    job_windows: JobWindows | None = None
    ib_port: IbPort | None = None
    sweep: Sweep | None = None
    stop_controller: StopController | None = None
    start_controller: StartController | None = None
    pause_controller: PauseController | None = None
    stop_relay: StopRelay | None = None
    start_relay: StartRelay | None = None
    throttle: Throttle | None = None
    smi: Smi | None = None
    job_process: JobProcess | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> Event:
        kinds = [k for k in EVENT_KINDS if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(f"an event has exactly one of {', '.join(EVENT_KINDS)}; got {kinds or 'none'}")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in EVENT_KINDS if getattr(self, k) is not None)

    @property
    def is_fault(self) -> bool:
        return self.kind in ("kernel_log", "kernel_line", "nvml_xid", "gpu", "ib_port")

    @property
    def fleet_wide(self) -> bool:
        """Happens to the fleet or the controller, not to one node."""
        return self.kind in (
            "job_windows", "sweep", "stop_controller", "start_controller", "pause_controller", "stop_relay",
            "start_relay", "throttle",
        )  # fmt: skip


class Among(_Strict):
    """Some of these nodes, it does not matter which: "at most N of these quarantined" (a burst
    whose first node may be taken before the rest is seen), "any N of these". Their pages are not
    judged one by one (``pages`` and ``fleet_pages`` can)."""

    of: frozenset[str] = Field(min_length=1)
    at_least: int = Field(0, ge=0)
    at_most: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _bounds(self) -> Among:
        if self.at_most is not None and not self.at_least <= self.at_most <= len(self.of):
            raise ValueError(f"among: at_least {self.at_least} <= at_most {self.at_most} <= {len(self.of)} nodes")
        return self

    @property
    def most(self) -> int:
        return len(self.of) if self.at_most is None else self.at_most


FLEET = "fleet"  # page_says: the pages about the fleet, a job or a domain (no one node)


class Expect(_Strict):
    quarantined: frozenset[str] = frozenset()
    among: tuple[Among, ...] = Field(default=(), description="bounds on how many of some nodes are quarantined")
    page_says: dict[str, tuple[str, ...]] = Field(
        default_factory=dict,
        description=f"node (or {FLEET!r}) -> words one of its pages or their replies must say, any case",
    )
    paged: frozenset[str] = frozenset()
    incident_says: dict[str, tuple[str, ...]] = Field(
        default_factory=dict,
        description="node -> words one of its incidents (reason, first message) must say, any case",
    )
    health: dict[str, Health] = Field(default_factory=dict)
    pages: dict[str, int] = Field(default_factory=dict, description="exactly this many pages for the node")
    fleet_pages: int | None = Field(default=None, ge=0, description="exactly this many pages about jobs or domains")
    cordoned: frozenset[str] | None = Field(default=None, description="exactly these Nodes cordoned at the end")
    drained: dict[str, str] | None = Field(
        default=None,
        description="exactly these nodes drained in Slurm at the end, each with a reason that starts with this",
    )
    undone: dict[str, int] = Field(
        default_factory=dict, description="rule -> quarantines a person undid soon after (vigil rules)"
    )
    job_restarted_without: frozenset[str] | None = Field(
        default=None,
        description="the job was told to checkpoint and restart without exactly these nodes (needs job: and"
        " job_windows after the fault, which is when the job hears its commands)",
    )
    remedied: frozenset[str] | None = Field(
        default=None, description="exactly these nodes had a repair carried out on them (a reset or a reboot)"
    )
    went_unknown: frozenset[str] | None = Field(
        default=None,
        description="exactly these nodes were found silent (UNKNOWN) at any time, however briefly (the controller's"
        " node_unknown log lines: each node's up to 20 a second, past that a few names a second)",
    )


class Scenario(_Strict):
    description: str
    family: str = Field(
        pattern=r"^[a-z0-9][a-z0-9-]*$", description="the family of mistakes it guards against (the scorecard's rows)"
    )
    covers: tuple[str, ...] = ()
    fleet: Fleet = Fleet()
    job: Job | None = None
    controller: dict[str, Any] = Field(default_factory=dict)
    agent: dict[str, Any] = Field(default_factory=dict, description="AgentConfig fields for every agent")
    events: tuple[Event, ...] = ()
    expect: Expect = Expect()
    settle_s: float = Field(1.0, ge=0, le=120, description="after the last event and the expected outcome")
    wait_s: float = Field(
        15.0, gt=0, le=80, description="how long the expected quarantines, pages and health may take to show"
    )
    known_defect: str = Field("", description="a defect not fixed yet: the scenario is expected to fail")
    timed: bool = Field(True, description="false: the policy waits on purpose (a throttle's duration); not timed")

    @model_validator(mode="after")
    def _names_known(self) -> Scenario:
        names = set(self.fleet.names)
        kube_people = any(e.person and (e.person.cordon or e.person.taint) for e in self.events)
        if (kube_people or self.expect.cordoned is not None) and not self.fleet.kubernetes:
            raise ValueError("cordon and taint events and expect.cordoned need fleet.kubernetes: true")
        slurm_people = any(e.person and e.person.drain for e in self.events)
        if (slurm_people or self.expect.drained is not None) and not self.fleet.slurm:
            raise ValueError("drain events and expect.drained need fleet.slurm: true")
        if self.fleet.slurmrestd and not self.fleet.slurm:
            raise ValueError("fleet.slurmrestd needs fleet.slurm: true")
        if self.fleet.slurm and self.fleet.kubernetes:
            raise ValueError("fleet.slurm and fleet.kubernetes: one actuator, choose one")
        if any(e.ib_port for e in self.events) and not self.fleet.infiniband:
            raise ValueError("ib_port events need fleet.infiniband: true")
        if any(e.throttle for e in self.events) and self.fleet.fabric is None:
            raise ValueError("throttle events need fleet.fabric")
        if self.fleet.fabric and any(
            e.throttle and (e.throttle.uplink or e.throttle.leaf or 0) >= self.fleet.fabric.leaves for e in self.events
        ):
            raise ValueError(f"a throttle names a leaf beyond the fabric's {self.fleet.fabric.leaves} (leaf-0 ..)")
        if any(e.smi or e.job_process for e in self.events) and not self.fleet.remedies:
            raise ValueError("smi and job_process events need fleet.remedies: true")
        if self.fleet.remedies and not (self.controller.get("remediation") or {}).get("enabled"):
            raise ValueError("fleet.remedies needs controller: {remediation: {enabled: true}}")
        for e in self.events:
            relay = e.stop_relay or e.start_relay
            if relay is not None and relay.relay >= self.fleet.relays:
                raise ValueError(f"{e.kind} at {e.at} s: relay {relay.relay}, and fleet.relays is {self.fleet.relays}")
        if any(e.job_windows for e in self.events) and self.job is None:
            raise ValueError("job_windows events need a job: section")
        if bad := [e for e in self.events if bool(e.node) == e.fleet_wide]:
            raise ValueError(f"the {bad[0].kind} event at {bad[0].at} s: only a node's own events name a node")
        running = True
        for e in sorted(self.events, key=lambda e: e.at):
            if e.kind in ("stop_controller", "start_controller"):
                if running != (e.kind == "stop_controller"):
                    raise ValueError(f"{e.kind} at {e.at} s: the controller is already {'up' if running else 'down'}")
                running = not running
            elif not running and e.kind in ("uncordon", "resolve", "sweep", "job_windows", "pause_controller"):
                raise ValueError(f"{e.kind} at {e.at} s needs the controller, which is down")
        if not running:
            raise ValueError("the controller is down at the end: add a start_controller event")
        named = {e.node for e in self.events if e.node} | set(self.job.nodes if self.job else ())
        named |= {n for e in self.events if e.job_windows for n in e.job_windows.slow}
        named |= {n for e in self.events if e.sweep for n in (*e.sweep.nodes, *e.sweep.rows)}
        named |= {e.throttle.node for e in self.events if e.throttle and e.throttle.node}
        named |= self.expect.quarantined | self.expect.paged | (self.expect.cordoned or frozenset())
        named |= set(self.fleet.labels)
        named |= set(self.expect.health) | set(self.expect.pages) | set(self.fleet.after_reboot)
        named |= self.expect.remedied or frozenset()
        named |= {n for a in self.expect.among for n in a.of} | (set(self.expect.page_says) - {FLEET})
        if overlap := sorted({n for a in self.expect.among for n in a.of} & self.expect.quarantined):
            raise ValueError(f"{overlap} both in expect.quarantined and in an among: name each node once")
        unknown = sorted(named - names)
        if unknown:
            raise ValueError(
                f"{unknown} not in the fleet ({self.fleet.nodes} nodes: node-1 .. node-{self.fleet.nodes})"
            )
        return self


def load_scenario(path: Path) -> Scenario:
    return load_yaml_model(Scenario, path)


def scenario_paths(names: list[str] | None = None) -> list[Path]:
    """The scenario files, by name (file stem) or all of them."""
    every = sorted(CASES_DIR.glob("*.yaml"))
    if not names:
        return every
    by_name = {p.stem: p for p in every}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise ValueError(f"no scenario named {missing}; known: {sorted(by_name)}")
    return [by_name[n] for n in names]
