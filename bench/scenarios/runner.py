"""Runs one scenario through real processes: a ``vigil controller`` (configured as the scenario
says, paging a Slack Web API on loopback through the real ``slack-sdk``), one ``vigil agent`` per
node on simulated GPUs with a kmsg-format kernel log and a fault file, the events injected on their
timeline (a sweep is ``vigil sweep --json``, as a person runs it), then what Vigil did read back
from its admin API, its database and the Slack channel."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import yaml

from bench.scenarios.machines import Machines as _Machines
from bench.scenarios.score import Observed, SweepSeen
from bench.scenarios.spec import FLEET, Event, Job, JobWindows, Person, Scenario, Sweep, Throttle
from controller.repairs.pages import is_digest
from gpus.simulated import simulated_gpus
from protos.vigil.v1 import trainer_pb2, trainer_pb2_grpc
from tests.fakes.ib_sysfs import IbSysfs
from vigil.admin_client import AdminClient
from vigil.demo import Cluster, DemoFailed, wait_for, xid_line
from vigil_core.ports import port_block

if TYPE_CHECKING:
    from tests.e2e.netns import Nodes
    from tests.fakes.kube_api import KubeApiServer
    from tests.fakes.slack_api import FakeSlack
    from tests.slurm import SlurmCluster

START_TIMEOUT_S = 30.0
PAIR_PORTS = 64  # a run's block of ports for its sweeps' pairs: 21 pairs at once, each with its tries
SWEEP_TIMEOUT_S = 180.0


def run_scenario(name: str, scenario: Scenario, keep: bool = False) -> Observed:
    workdir = Path(tempfile.mkdtemp(prefix=f"vigil-scenario-{name}-"))
    with contextlib.ExitStack() as stack:
        from tests.fakes.slack_api import FakeSlack  # the Slack Web API the contract tests use

        slack = stack.enter_context(FakeSlack())
        kube = None
        if scenario.fleet.kubernetes:  # a test double of the API server, as the contract tests use
            from tests.fakes.kube_api import KubeApiServer

            kube = stack.enter_context(KubeApiServer())
            # A person's kubectl is quick: the client is loaded now, not at their first command
            # (a second or two on a cold start, enough to lose a race the scenario did not mean).
            import kubernetes.client  # noqa: F401

            for node in scenario.fleet.names:
                kube.add_node(node, labels=scenario.fleet.labels.get(node, {}))
        fabric = None
        if scenario.fleet.fabric is not None:  # each node in a network namespace under its leaf
            from tests.e2e.netns import namespaced_nodes

            nodes, leaves = len(scenario.fleet.names), scenario.fleet.fabric.leaves
            fabric = stack.enter_context(namespaced_nodes(nodes, prefix=f"vs{os.getpid() % 1000}", leaves=leaves))
        slurm = None
        if scenario.fleet.slurm:  # a real slurmctld, and a slurmd for each node, on loopback
            from tests.slurm import NEW, OLD, slurm_cluster

            version = NEW if scenario.fleet.slurmrestd else OLD
            slurm = stack.enter_context(slurm_cluster(scenario.fleet.names, version=version))
        pair_ports = stack.enter_context(port_block(PAIR_PORTS))
        return _run(workdir, scenario, slack, kube, fabric, keep, slurm, pair_ports)


def unavailable(scenario: Scenario) -> str | None:
    """Why the scenario cannot run on this machine, or None."""
    if scenario.fleet.slurm:
        from tests.slurm import NEW, OLD
        from tests.slurm import unavailable as slurm_unavailable

        if why := slurm_unavailable(NEW if scenario.fleet.slurmrestd else OLD):
            return why
    if scenario.fleet.fabric is None:
        return None
    from tests.e2e.netns import unavailable as netns_unavailable

    return netns_unavailable()


def _run(
    workdir: Path,
    scenario: Scenario,
    slack: FakeSlack,
    kube: KubeApiServer | None,
    fabric: Nodes | None,
    keep: bool,
    slurm: SlurmCluster | None,
    pair_ports: int,
) -> Observed:
    from tests.fakes.slack_api import CHANNEL, TOKEN

    cluster = Cluster(
        workdir,
        scenario.fleet.names,
        scenario.fleet.gpus,
        env={"VIGIL_SLACK_TOKEN": TOKEN},
        relays=scenario.fleet.relays,
    )
    labels = scenario.fleet.labels
    if fabric is not None:
        from tests.e2e.netns import HOST

        cluster.host = HOST
        cluster.prefixes = {node: fabric.exec_prefix(i) for i, node in enumerate(cluster.nodes)}
        leaves = fabric.labels(cluster.nodes)
        labels = {n: {**leaves.get(n, {}), **labels.get(n, {})} for n in {*leaves, *labels}}
    if scenario.agent:
        cluster.agent_config = workdir / "agent.yaml"
        cluster.agent_config.write_text(yaml.safe_dump(dict(scenario.agent)))
    machines = _Machines(cluster, scenario, kube)
    for node in scenario.fleet.names:
        machines.write_agent_config(node, scenario.fleet.gpus)
    settings = {"pager": "slack", "slack": {"channel": CHANNEL, "base_url": slack.base_url}} | scenario.controller
    if scenario.fleet.remedies:  # a reboot the controller asks for: the node's name in `reboots`
        reboot = {"executor": "command", "command": machines.reboot_command}
        settings["remediation"] = {"reboot": reboot} | dict(settings["remediation"])
    if fabric is not None:
        settings |= {"listen": cluster.host, "node_labels": labels}
    if kube is not None:
        kubeconfig = str(kube.kubeconfig(workdir / "kubeconfig"))
        settings |= {"actuator": "kubernetes", "kubernetes": {"kubeconfig": kubeconfig}}
    if slurm is not None:
        reach: dict[str, object] = (
            {"rest": {"url": slurm.rest_url, "token_file": str(slurm.token_file)}}
            if scenario.fleet.slurmrestd
            else {"conf": str(slurm.conf)}
        )
        settings |= {"actuator": "slurm", "slurm": reach | dict(settings.get("slurm", {}))}
    # Each run's pairwise checks on ports of its own: every scenario's agents share this machine, and
    # runs side by side (CI, --jobs) would meet on the default (EADDRINUSE: those pairs run again
    # elsewhere); a block held for this run, below the ports anyone's outgoing connection may take.
    settings["sweep"] = {"pair_port_base": pair_ports, "pair_port_span": PAIR_PORTS, **settings.get("sweep", {})}
    config = _controller_config(workdir, settings)
    try:
        cluster.start_controller(START_TIMEOUT_S, config)
        cluster.start_relays(START_TIMEOUT_S)
        cluster.start_agents()
        # Agents in network namespaces start through `ip netns exec`, a few a core on a loaded
        # machine: their registration gets twice as long.
        registered_s = START_TIMEOUT_S * (2 if fabric is not None else 1)
        with AdminClient(cluster.target, plaintext=True) as admin:
            healthy = lambda: _all_healthy(admin, cluster.nodes)  # noqa: E731
            try:
                wait_for(healthy, registered_s, "every node HEALTHY", cluster.check_alive)
            except DemoFailed as exc:
                raise DemoFailed(f"{exc}; {_not_healthy(admin, cluster)}") from None
            faults, sweeps, restarted_without = _play(cluster, config, admin, scenario, kube, fabric, machines, slurm)
            want = scenario.expect
            with contextlib.suppress(DemoFailed):  # judged below: what was missed is named there
                database, fleet_pages = workdir / "controller.db", want.fleet_pages or 0
                wait_for(
                    lambda: (
                        _observe(admin, faults).covers(want.quarantined, want.paged, want.health)
                        and sum(1 for _, node, _ in _recorded_pages(database) if not node) >= fleet_pages
                    ),
                    scenario.wait_s,
                    "the expected quarantines and pages",
                    machines.check,
                    every=0.05,
                )
            machines.sleep(scenario.settle_s)  # let a wrong action show itself
            cluster.check_alive()
            seen = _observe(admin, faults).observed
            cordoned = frozenset(n for n in cluster.nodes if kube and kube.node(n)["spec"].get("unschedulable"))
            undone = {r.rule: r.undone for r in admin.rules().rules}
            recorded = _recorded_pages(workdir / "controller.db")
            texts: dict[str, list[str]] = {}
            for _, node, text in [*recorded, *_recorded_notes(workdir / "controller.db")]:
                texts.setdefault(node or FLEET, []).append(text)
            return replace(
                seen,
                fleet_pages=sum(1 for incident, node, _ in recorded if not node and not is_digest(incident)),
                remedied=machines.remedied(),
                back_in_service_s=_back_in_service(workdir / "controller.db", faults),
                page_texts={n: tuple(t) for n, t in texts.items()},
                cordoned=cordoned,
                drained=_drained(slurm) if slurm is not None else {},
                incident_texts={
                    n: tuple(f"{i.reason} | {i.first_message}" for i in admin.incidents(node=n))
                    for n in scenario.expect.incident_says
                },
                undone=undone,
                job_restarted_without=restarted_without,
                paged_incidents=frozenset(incident for incident, _, _ in recorded),
                slack_posts=_slack_posts(slack),
                sweeps=tuple(sweeps),
                went_unknown=_went_unknown(workdir),
            )
    except DemoFailed as exc:
        return Observed(frozenset(), frozenset(), {}, error=f"{exc} (logs in {workdir})")
    finally:
        machines.stop()
        cluster.stop()
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


def _controller_config(workdir: Path, settings: dict[str, Any]) -> Path:
    config = dict(settings)
    if isinstance(config.get("policy"), dict):
        policy = workdir / "policy.yaml"
        policy.write_text(yaml.safe_dump(config["policy"]))
        config["policy"] = str(policy)
    path = workdir / "controller.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _play(
    cluster: Cluster,
    config: Path,
    admin: AdminClient,
    scenario: Scenario,
    kube: KubeApiServer | None,
    fabric: Nodes | None,
    machines: _Machines,
    slurm: SlurmCluster | None,
) -> tuple[dict[str, list[float]], list[SweepSeen], frozenset[str] | None]:
    """Inject the events on their timeline; returns when each node's faults were injected (wall
    clock), what each sweep found, and the nodes the job was told to restart without (None: never)."""
    people = kube is not None and any(e.person for e in scenario.events)
    person_api = _person_api(kube, cluster.workdir) if kube is not None and people else None
    started, seq = time.monotonic(), 10_000
    job = _JobReporter(cluster.target, scenario.job) if scenario.job else None
    faults: dict[str, list[float]] = {}
    sweeps: list[SweepSeen] = []
    for event in sorted(scenario.events, key=lambda e: e.at):
        machines.sleep(max(0.0, started + event.at - time.monotonic()))
        if event.is_fault and scenario.timed:
            faults.setdefault(event.node, []).append(time.time())
        if event.job_windows is not None:
            assert scenario.job is not None and job is not None
            job.windows(event.job_windows)
            continue
        if event.person is not None and event.person.drain:
            assert slurm is not None
            slurm.drain(event.node, event.person.drain)
            continue
        if event.person is not None:
            assert kube is not None
            _person(kube, person_api, event.node, event.person)
            continue
        if event.sweep is not None:
            base = yaml.safe_load(config.read_text())["sweep"]["pair_port_base"]
            sweeps.append(_sweep(cluster.target, event.sweep, base))
            continue
        if event.stop_controller is not None:
            cluster.stop_controller(kill=event.stop_controller.kill)
            continue
        if event.throttle is not None:
            assert fabric is not None
            _throttle(fabric, cluster.nodes, event.throttle)
            continue
        if event.start_controller is not None:
            cluster.start_controller(START_TIMEOUT_S, config)
            continue
        if (pause := event.pause_controller) is not None and pause.every_s is not None:
            cluster.hold_again_and_again("controller", pause.seconds, pause.every_s)
            continue
        if pause is not None:
            cluster.pause("controller", pause.seconds)
            continue
        if event.stop_relay is not None:
            cluster.stop_relay(event.stop_relay.relay, kill=event.stop_relay.kill)
            continue
        if event.start_relay is not None:
            cluster.start_relay(event.start_relay.relay, START_TIMEOUT_S)
            continue
        if event.smi is not None:
            machines.smi(event.node, event.smi)
            continue
        if event.job_process is not None:
            machines.job_process(event.node, event.job_process)
            continue
        seq = _inject(cluster, admin, event, seq)
    return faults, sweeps, job.restarted_without if job is not None else None


def _throttle(fabric: Nodes, nodes: list[str], throttle: Throttle) -> None:
    if throttle.clear:
        fabric.unthrottle_fabric()
        for i in range(len(nodes)):
            fabric.unthrottle(i)
    elif throttle.uplink is not None:
        fabric.throttle_uplink(throttle.uplink, throttle.rate)
    elif throttle.leaf is not None:
        fabric.throttle_leaf(throttle.leaf, throttle.rate)
    else:
        fabric.throttle(nodes.index(throttle.node), throttle.rate)


def _sweep(target: str, sweep: Sweep, pair_port_base: int) -> SweepSeen:
    """``vigil sweep --json``, the command a person runs; ``sweep.held_ports`` held meanwhile."""
    command = [sys.executable, "-m", "vigil", "sweep", "--controller", target, "--json"]
    command += ["--checks", ",".join(sweep.checks), "--min-busbw-gbps", str(sweep.min_busbw_gbps)]
    command += [a for p in sweep.params for a in ("-p", p)]
    command += [*(["--quarantine"] if sweep.quarantine else []), *sweep.nodes]
    try:
        with contextlib.ExitStack() as held:
            for offset in sweep.held_ports:  # another program listening there, on every address
                held.enter_context(socket.create_server(("", pair_port_base + offset)))
            done = subprocess.run(command, capture_output=True, text=True, timeout=SWEEP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return SweepSeen(exit_code=-1, error=f"vigil sweep did not finish in {SWEEP_TIMEOUT_S:.0f} s")
    try:
        summary = json.loads(done.stdout)
    except ValueError:
        return SweepSeen(exit_code=done.returncode, error=f"no JSON summary: {done.stderr.strip()[-500:]}")
    rows = {(r["node"], r["check"]): r.get("verdict", "VERDICT_UNSPECIFIED") for r in summary.get("rows", [])}
    return SweepSeen(
        exit_code=done.returncode,
        verdict=summary.get("verdict", ""),
        rows=rows,
        findings=tuple(sorted(f["node"] for f in summary.get("findings", []))),
        why={(r["node"], r["check"]): f"{r.get('figure', '')}: {r.get('reason', '')}" for r in summary.get("rows", [])},
        why_found={f["node"]: f.get("reason", "") for f in summary.get("findings", [])},
    )


def _inject(cluster: Cluster, admin: AdminClient, event: Event, seq: int) -> int:
    node = event.node
    if event.kernel_log is not None:
        k = event.kernel_log
        bus = simulated_gpus(node, cluster.gpus)[k.gpu].pci_bus_id
        first = seq if k.seq is None else k.seq  # a replay repeats an earlier line's number
        lines = [xid_line(bus, k.xid, k.message, first + i) for i in range(k.repeat)]
        with open(cluster.kernel_log(node), "a") as f:
            f.write("".join(lines))
        return seq + k.repeat if k.seq is None else seq
    if event.ib_port is not None:
        ib, e = IbSysfs(cluster.workdir / "ib" / node), event.ib_port
        if e.up is not None:
            ib.set_up(e.hca, e.port, e.up)
        if e.rate is not None:
            ib.set_rate(e.hca, e.port, e.rate)
        for counter, by in e.bump.items():
            ib.bump(e.hca, e.port, counter, by)
        return seq
    if event.kernel_line is not None:
        line = event.kernel_line
        uptime_us, text = int(time.monotonic() * 1e6), line.text.replace("\n", " ")
        first = seq if line.seq is None else line.seq
        lines = [f"3,{first + i},{uptime_us},-;{text}\n" for i in range(line.repeat)]
        with open(cluster.kernel_log(node), "a") as f:
            f.write("".join(lines))
        return seq + line.repeat if line.seq is None else seq
    if event.nvml_xid is not None:
        _fault_line(cluster, node, {"gpu": event.nvml_xid.gpu, "xid": event.nvml_xid.xid})
    elif event.gpu is not None:
        _fault_line(cluster, node, {"gpu": event.gpu.gpu, "set": event.gpu.set})
    elif event.stop_agent is not None and event.stop_agent.freeze:
        cluster.freeze_agent(node)
    elif event.stop_agent is not None:
        cluster.stop_agent(node, kill=event.stop_agent.kill)
    elif event.restart_agent is not None:
        cluster.stop_agent(node)
        cluster.start_agent(node, event.restart_agent.gpus, restart=True)
    elif event.uncordon is not None:
        admin.uncordon(node, event.uncordon.by, event.uncordon.reason)
    elif event.resolve is not None:
        for incident in admin.incidents(open_only=True, node=node):
            admin.resolve(incident.id, event.resolve.by, event.resolve.note)
    return seq


class _JobReporter:
    """The job's rank 0, as the training hook reports (real gRPC to the trainer gateway)."""

    def __init__(self, target: str, job: Job) -> None:
        self._stub = trainer_pb2_grpc.TrainerGatewayStub(grpc.insecure_channel(target))
        self._job = job
        self._step = 0
        self.restarted_without: frozenset[str] | None = None  # what a CheckpointAndRestart told it to leave

    def windows(self, w: JobWindows) -> None:
        job = self._job
        for i in range(w.count):
            now = time.time()
            times = [
                trainer_pb2.RankStepTime(rank=r, node=node, step_time_s=w.slow.get(node, w.step_time_s))
                for k, node in enumerate(job.nodes)
                for r in range(k * job.ranks_per_node, (k + 1) * job.ranks_per_node)
            ]
            self._step += 10
            p = trainer_pb2.Progress(
                job_id=job.id,
                step=self._step,
                window_start=now - job.window_s,
                window_end=now,
                mfu=w.mfu,
                tokens=1000,
                tokens_per_s=w.tokens_per_s[i % len(w.tokens_per_s)] if w.tokens_per_s else 1000 / job.window_s,
                step_times=times,
                nodes=list(job.nodes),
                world_size=len(times),
                event="start" if w.start and i == 0 else "",
            )
            reply = self._stub.Report(p, timeout=5)
            for command in reply.commands:
                if command.HasField("checkpoint_and_restart"):
                    left = frozenset(command.checkpoint_and_restart.exclude_nodes)
                    self.restarted_without = (self.restarted_without or frozenset()) | left
            time.sleep(job.window_s)


def _drained(slurm: SlurmCluster) -> dict[str, str]:
    """Each drained node's reason, as ``sinfo`` shows it."""
    return {n: slurm.reason(n) for n in slurm.nodes if "DRAIN" in slurm.state(n).split("+")}


def _person_api(kube: KubeApiServer, workdir: Path) -> Any:
    """The person's own Kubernetes client, made before the timeline starts (made on a loaded machine
    at the event's moment, it took seconds: the person acted after what the scenario meant)."""
    from kubernetes import client as k8s

    from controller.act.kube.client import api_client

    return k8s.CoreV1Api(api_client(kube.kubeconfig(workdir / "person-kubeconfig")))


def _person(kube: KubeApiServer, api: Any, node: str, person: Person) -> None:
    """What ``kubectl cordon`` or ``kubectl taint`` does, through the person's own client."""
    if person.cordon:
        api.patch_node(node, {"spec": {"unschedulable": True}}, field_manager="kubectl-cordon")
    if person.taint:
        key, _, value = person.taint.partition("=")
        taints = [*(kube.node(node)["spec"].get("taints") or []), {"key": key, "value": value, "effect": "NoSchedule"}]
        api.patch_node(node, {"spec": {"taints": taints}}, field_manager="kubectl-taint")


def _fault_line(cluster: Cluster, node: str, line: dict[str, Any]) -> None:
    with open(cluster.fault_file(node), "a") as f:
        f.write(json.dumps(line) + "\n")


def _recorded_pages(database: Path) -> list[tuple[str, str, str]]:
    """(incident, node, what it said) of every page the controller recorded as sent, from its own
    record of its actions: pages about a job or a domain are in no node's incidents ('' for the node)."""
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
        rows = db.execute("SELECT payload FROM actions WHERE kind LIKE 'PAGE%' AND status = 'DONE'").fetchall()
    pages = [json.loads(payload) for (payload,) in rows]
    said = ("summary", "remedy", "did", "gpu")
    return [
        (str(p.get("incident_id", "")), str(p.get("node") or ""), " | ".join(str(p.get(k) or "") for k in said))
        for p in pages
    ]


def _back_in_service(database: Path, faults: dict[str, list[float]]) -> dict[str, float]:
    """node -> seconds from its first injected fault to its release by a repair (the repairs' record)."""
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
        row = db.execute("SELECT value FROM meta WHERE key = 'repairs'").fetchone()
    repaired = json.loads(row[0]).get("repaired_at", {}) if row else {}
    return {
        node: round(times[0] - faults[node][0], 3) for node, times in repaired.items() if times and faults.get(node)
    }


def _recorded_notes(database: Path) -> list[tuple[str, str, str]]:
    """(incident, node, what it said) of every later word on a page (a reply in its thread) sent."""
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
        rows = db.execute("SELECT payload FROM actions WHERE kind LIKE 'NOTE%' AND status = 'DONE'").fetchall()
    notes = [json.loads(payload) for (payload,) in rows]
    return [(str(n.get("incident_id", "")), str(n.get("node") or ""), str(n.get("text") or "")) for n in notes]


def _slack_posts(slack: FakeSlack) -> tuple[str, ...]:
    """The incident of each top-level message in the channel (its metadata names it)."""
    with slack.state.lock:
        top = slack.state.top_level()
    return tuple(str(m.get("metadata", {}).get("event_payload", {}).get("incident_id", "")) for m in top)


def _all_healthy(admin: AdminClient, nodes: list[str]) -> bool:
    health = {n.node: n.health for n in admin.status().nodes}
    return all(health.get(n) == "HEALTHY" for n in nodes)


def _not_healthy(admin: AdminClient, cluster: Cluster) -> str:
    """Each node not HEALTHY yet: its state, and the last line its agent logged (why it is not in)."""
    try:
        health = {n.node: n.health for n in admin.status().nodes}
    except grpc.RpcError as exc:
        return f"the controller does not answer: {exc.code().name}"
    said = []
    for node in cluster.nodes:
        if health.get(node) != "HEALTHY":
            log = cluster.workdir / f"{node}.log"
            lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
            last = lines[-1][-300:] if lines else "nothing"
            said.append(f"{node} {health.get(node, 'unknown')}, its agent last said: {last}")
    return "; ".join(said)


def _went_unknown(workdir: Path) -> frozenset[str]:
    """The nodes the controller found silent at any time: its ``node_unknown`` log lines (JSON), up to
    20 a second with their names, past that a few names a second (``node_unknown_more``)."""
    found: set[str] = set()
    for name in ("controller.out", "controller.log"):
        path = workdir / name
        for line in path.read_text(errors="replace").splitlines() if path.exists() else ():
            if '"node_unknown"' in line or '"node_unknown_more"' in line:
                with contextlib.suppress(json.JSONDecodeError, TypeError):
                    said = json.loads(line)
                    found |= {said.get("node", ""), *said.get("nodes", [])}
    return frozenset(found - {""})


class _Seen:
    def __init__(self, observed: Observed) -> None:
        self.observed = observed

    def covers(self, quarantined: frozenset[str], paged: frozenset[str], health: dict[str, str]) -> bool:
        seen = self.observed
        healths = all(seen.health.get(node) == want for node, want in health.items())
        return quarantined <= seen.quarantined and paged <= seen.paged and healths


def _observe(admin: AdminClient, faults: dict[str, list[float]]) -> _Seen:
    """What Vigil did; fault -> action is timed, per node, from the last fault injected before its
    first quarantine or page (the one that crossed the rule's threshold) to that action."""
    incidents = admin.incidents(limit=10_000)
    quarantined: set[str] = set()
    paged: set[str] = set()
    acted_at: dict[str, float] = {}
    pages: dict[str, int] = {}
    for incident in incidents:
        for a in incident.actions:
            family = a.kind.split(":")[0]
            if a.status != "DONE" or family not in ("QUARANTINE", "PAGE") or not incident.node:
                continue
            if family == "QUARANTINE" and a.detail.startswith("dry run"):
                continue
            (quarantined if family == "QUARANTINE" else paged).add(incident.node)
            if family == "PAGE":
                pages[incident.node] = pages.get(incident.node, 0) + 1
            acted_at[incident.node] = min(a.done_at, acted_at.get(incident.node, a.done_at))
    health = {n.node: n.health for n in admin.status().nodes}
    times = tuple(
        round(acted_at[n] - max(t for t in injected if t <= acted_at[n]), 4)
        for n, injected in sorted(faults.items())
        if n in acted_at and injected[0] <= acted_at[n]
    )
    return _Seen(Observed(frozenset(quarantined), frozenset(paged), health, times, pages))
