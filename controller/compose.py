"""The composition root: every room of the controller is built here, and wired to the others
through the narrow ports each one takes. Nothing below builds its collaborators.

``node_route`` builds the node route alone (the engine and what it works with), for the daemon and
for tests; ``rooms`` builds the whole controller from its configuration file.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from controller.act.actuators import Actuator, ConsolePager, NullPager, Pager
from controller.act.local_actuator import LocalActuator
from controller.config import ControllerConfig
from controller.edge.admin import Admin
from controller.edge.agent_gateway import AgentGateway
from controller.edge.agent_sessions import AgentSessions
from controller.edge.relay_gateway import RelayGateway
from controller.edge.trainer_gateway import TrainerGateway
from controller.jobs.monitor import JobMonitor
from controller.metrics import ControllerMetrics
from controller.nodes.actions.after import AfterAction
from controller.nodes.actions.apply import Applier
from controller.nodes.actions.fold_reports import FoldReports
from controller.nodes.actions.runner import ActionRunner
from controller.nodes.adopt import Adopter
from controller.nodes.agent_outboxes import AgentOutboxes
from controller.nodes.app_faults import CRASH_PAGE, AppFaults, JobMembership
from controller.nodes.by_hand import ByHand
from controller.nodes.check_requests import CheckRequests
from controller.nodes.engine import Engine
from controller.nodes.fleet import Fleet
from controller.nodes.found import Report
from controller.nodes.guards.guard import Guard
from controller.nodes.guards.rules import GuardrailConfig, TokenBucket
from controller.nodes.node_events import NodeEvents
from controller.nodes.recovery.release_checks import ReleaseChecks
from controller.nodes.recovery.rules import RecoveryConfig
from controller.nodes.scheduler_drains import DrainSource, SchedulerDrains
from controller.nodes.upkeep import Labels, Upkeep
from controller.repairs.config import RemediationConfig
from controller.repairs.ladder import rule_ladder
from controller.repairs.pages import defer_pages
from controller.repairs.reboot import HandOffReboot, Reboot, build_reboot
from controller.repairs.repairs import Repairs
from controller.repairs.steps import NodeOwners, ResetJobs
from controller.store import Store
from controller.sweeps.sweeper import Sweeper
from controller.vocab.policy import Policy, load_policy
from vigil_core.loop_lag import Lateness
from vigil_core.supervise import Tasks


@dataclass
class NodeRoute:
    """The node route's parts, each built once, each handed only to the parts that use it."""

    engine: Engine
    upkeep: Upkeep
    fleet: Fleet
    runner: ActionRunner
    guard: Guard
    by_hand: ByHand
    releases: ReleaseChecks
    checks: CheckRequests
    folds: FoldReports
    events: NodeEvents  # quarantines and early warnings, told to whoever must act on them (the jobs)
    outboxes: AgentOutboxes  # commands to connected agents; the agent gateway opens their queues
    app_faults: AppFaults
    store: Store
    metrics: ControllerMetrics
    tasks: Tasks
    clock: Callable[[], float]
    lateness: Lateness  # the event loop's, watched while serving (Controller.run): a bound leaves it out

    def adopter(self) -> Adopter:
        """A new leader's: it takes over the quarantines and pages that an earlier leader made."""
        r = self.runner
        return Adopter(r.actuator, r.pager, self.store, self.fleet, self.guard, r, self.clock)

    async def wait_for_actions(self) -> None:
        """Wait for the releases and actions under way to finish (tests and benchmarks)."""
        await self.releases.drain()
        await self.engine.wait_for_actions()

    async def shutdown(self) -> None:
        await self.engine.shutdown()


def node_route(
    store: Store,
    policy: Policy,
    actuator: Actuator,
    pager: Pager,
    metrics: ControllerMetrics | None = None,
    clock: Callable[[], float] = time.time,
    guardrails: GuardrailConfig | None = None,
    recovery: RecoveryConfig | None = None,
    fold_report_s: float = 300.0,
    drain: bool = False,
    app_faults: AppFaults | None = None,
    retention_s: float | None = None,
    check_results_per_node_hour: int = 120,
    remediation: RemediationConfig | None = None,
) -> NodeRoute:
    metrics = metrics or ControllerMetrics()
    lateness = Lateness(clock)  # the controller's own event loop's lateness: no node's nor job's doing
    guardrails, recovery = guardrails or GuardrailConfig(), recovery or RecoveryConfig()
    # The background work's health: failures logged, counted, and retried with backoff.
    tasks = Tasks(lambda task: metrics.task_failures.labels(task).inc())
    store.health.on_failure = metrics.store_write_failures.inc
    store.writer.on_refused = metrics.store_writes_refused.inc
    metrics.store_up.set_function(lambda: 0 if store.health.failing_since is not None else 1)
    if (cache := getattr(actuator, "cache", None)) is not None:  # the Kubernetes actuator's node watch
        metrics.node_watch_up.set_function(lambda: 1 if cache.synced else 0)
    metrics.tasks_down.set_function(lambda: len(tasks.down()))
    outboxes, events = AgentOutboxes(), NodeEvents()
    app_faults = app_faults or AppFaults(JobMembership())
    app_faults.restore(store.incidents.still_held())  # held by the controller before this one
    app_faults.restore_paged(store.actions.pages_since(CRASH_PAGE, clock() - app_faults.config.page_every_s))
    refused = metrics.check_results_refused
    checks = CheckRequests(
        store.records, outboxes.send, check_results_per_node_hour, lambda node: refused.labels(node).inc(), clock
    )
    fleet = Fleet(store.nodes.load(), store.incidents.latest_open(), clock())
    app_faults.restore_hardware(entry.state for entry in fleet.nodes.values())
    bucket = TokenBucket(guardrails.quarantines_per_s, guardrails.quarantine_burst)
    after = AfterAction(fleet, recovery, drain, clock, paged=lambda incident_id: runner.paged(incident_id))
    runner = ActionRunner(
        store.actions,
        actuator,
        pager,
        metrics,
        bucket,
        clock,
        on_done=after,
        on_ack=lambda node: engine.send_ack(node),  # the engine is built below; acks come later
        tasks=tasks,
    )
    folds = FoldReports(fold_report_s, store.incidents.signal_counts, runner.schedule, clock)
    applier = Applier(store, runner.schedule, fleet, folds, events, metrics)
    labels: Labels = {}  # refreshed by the upkeep from the actuator; the guard reads the failure domains
    guard = Guard(
        guardrails,
        store.records,
        runner,
        metrics,
        lambda: len(fleet),
        clock,
        lambda n: labels.get(n, {}),
        fleet.names,
        flush_soon=store.group.soon,
        quarantine_means=actuator.quarantine_means,
        paged=store.actions.paged,
    )
    runner.settle = guard.settle  # a burst's quarantines and pages wait to be decided as a whole
    by_hand = ByHand(fleet, store, runner, folds, guard, clock, metrics, recovery.undo_window_s)
    releases = ReleaseChecks(fleet, checks, recovery, by_hand.uncordon, clock, tasks)
    engine = Engine(store, policy, fleet, runner, guard, applier, app_faults, checks, outboxes, metrics, clock)
    if remediation is not None and remediation.enabled:  # a repairable quarantine pages only if hands are needed
        own = rule_ladder(policy)
        engine.defer_pages = lambda signal, actions, held: defer_pages(signal, actions, held, remediation, own)
    upkeep = Upkeep(
        engine,
        store,
        policy,
        fleet,
        guard,
        by_hand,
        releases,
        folds,
        actuator,
        labels,
        metrics,
        tasks,
        retention_s,
        clock,
        lateness.late_since,
    )
    return NodeRoute(
        engine, upkeep, fleet, runner, guard, by_hand, releases, checks, folds, events, outboxes, app_faults, store,
        metrics, tasks, clock, lateness,
    )  # fmt: skip


def build_actuator(config: ControllerConfig, store: Store) -> Actuator:
    if config.actuator == "local":
        return LocalActuator(store.db, config.node_labels)
    if config.actuator == "slurm":
        from controller.act.slurm.actuator import SlurmActuator
        from controller.act.slurm.client import Slurm, SlurmCommands
        from controller.act.slurm.rest import SlurmRest

        s, r = config.slurm, config.slurm.rest
        slurm: Slurm = (
            SlurmCommands(s.conf, s.bin_dir, s.timeout_s)
            if r is None
            else SlurmRest(str(r.url), r.token_file, r.user, r.api_version, s.timeout_s)
        )
        return SlurmActuator(slurm, s.node_names, config.node_labels)
    from controller.act.kube.actuator import watching
    from controller.act.kube.client import api_client

    k = config.kubernetes
    return watching(api_client(k.kubeconfig, k.context), events_namespace=k.events_namespace)


def build_pager(config: ControllerConfig, store: Store) -> Pager:
    if config.pager == "slack":
        from controller.act.pagers.slack import SlackPager

        assert config.slack is not None
        return SlackPager(config.slack.token(), config.slack.channel, store.records, base_url=config.slack.base_url)
    if config.pager == "webhook":
        from controller.act.pagers.webhook import WebhookPager

        assert config.webhook is not None
        return WebhookPager(config.webhook.url, config.webhook.headers)
    return ConsolePager() if config.pager == "console" else NullPager()


def repair_ports(config: ControllerConfig, actuator: Actuator) -> tuple[NodeOwners, Reboot, ResetJobs | None]:
    """Who else holds a node and its labels (the cluster's), how a node is rebooted, and who runs
    the reset Jobs (Kubernetes only)."""
    remediation = config.remediation
    if config.actuator != "kubernetes":  # the actuator itself knows who else holds its nodes
        assert isinstance(actuator, NodeOwners)
        return actuator, build_reboot(remediation.reboot, None) if remediation.enabled else HandOffReboot(), None
    from controller.act.kube.client import api_client
    from controller.act.kube.repair_ops import KubeRepairOps

    cache = getattr(actuator, "cache", None)  # the Kubernetes actuator's node watch
    ops = KubeRepairOps(api_client(config.kubernetes.kubeconfig, config.kubernetes.context), cache=cache)
    return ops, build_reboot(remediation.reboot, ops.run_reboot_job), ops


@dataclass
class Rooms:
    """The whole controller, wired: what the daemon serves and runs."""

    nodes: NodeRoute
    sweeper: Sweeper
    jobs: JobMonitor
    repairs: Repairs
    agent_gateway: AgentGateway
    urgent_gateway: AgentGateway  # the urgent port's (``urgent_port``): the same sessions, urgent agents only
    relay_gateway: RelayGateway  # agents that come through a `vigil relay`, the same sessions
    admin: Admin
    trainer_gateway: TrainerGateway
    scheduler_drains: SchedulerDrains | None = None  # others' drains read from Slurm (actuator: slurm)


def rooms(
    config: ControllerConfig, store: Store, metrics: ControllerMetrics, actuator: Actuator | None = None
) -> Rooms:
    """Every room, from the configuration file and what the store holds now; ``actuator``: the one
    built before, kept (a standby that now leads: its node watch has listed the cluster already)."""
    membership = JobMembership()  # the job monitor's record of the jobs' nodes, read by the engine
    actuator = actuator if actuator is not None else build_actuator(config, store)
    nodes = node_route(
        store,
        load_policy(config.policy),
        actuator,
        build_pager(config, store),
        metrics=metrics,
        guardrails=config.guardrails,
        recovery=config.recovery,
        fold_report_s=config.fold_report_s,
        drain=config.actuator == "kubernetes" and config.kubernetes.drain,
        app_faults=AppFaults(membership, config.app_faults),
        retention_s=config.retention_days * 86400 if config.retention_days is not None else None,
        check_results_per_node_hour=config.limits.check_results_per_node_hour,
        remediation=config.remediation,
    )
    report = nodes.engine.found
    sweeper = Sweeper(
        nodes.fleet, nodes.checks, actuator, report, store.records, config.sweep, labels=actuator.node_labels
    )
    jobs_config = config.jobs
    if jobs_config.blame_needs_agents is None:  # callers have identities only under TLS
        jobs_config = jobs_config.model_copy(update={"blame_needs_agents": config.tls_dir is not None})
    jobs = JobMonitor(
        nodes.fleet,
        report,
        nodes.runner.request,
        metrics,
        sweeper,
        jobs_config,
        nodes.events,
        membership=membership,
        held_since=nodes.lateness.late_since,
    )
    owners, reboot, reset_jobs = repair_ports(config, actuator)
    repairs = Repairs(
        config.remediation,
        nodes.fleet,
        store.incidents,
        nodes.checks,
        sweeper,
        owners,
        reboot,
        nodes.runner.request,
        nodes.by_hand.uncordon,
        store.records,
        nodes.guard,
        lambda node: nodes.upkeep.labels.get(node, {}),
        nodes.tasks,
        nodes.metrics,
        rule_ladder(nodes.engine.policy),
        nodes.clock,
        reset_jobs,
    )
    nodes.releases.skip = repairs.under_repair  # a node under repair goes back when it is certified
    admin = Admin(
        nodes.fleet,
        nodes.by_hand,
        nodes.guard,
        store.incidents,
        nodes.upkeep.problems,
        sweeper,
        jobs,
        replica=config.leader_election.identity,
        clock=nodes.clock,
        repairs=repairs,
    )
    sessions = AgentSessions(nodes.engine, nodes.fleet, nodes.checks, nodes.outboxes, config.limits)
    relay_gateway = RelayGateway(sessions)
    metrics.relayed_waiting_bytes.set_function(lambda: relay_gateway.waiting()[0])
    metrics.relayed_waiting_streams.set_function(lambda: relay_gateway.waiting()[1])
    return Rooms(
        nodes,
        sweeper,
        jobs,
        repairs,
        AgentGateway(sessions, nodes.lateness.own_time),
        AgentGateway(sessions, nodes.lateness.own_time, urgent_only=True),
        relay_gateway,
        admin,
        TrainerGateway(jobs, config.limits),
        scheduler_drains(config, actuator, report, store, metrics),
    )


def scheduler_drains(
    config: ControllerConfig, actuator: Actuator, report: Report, store: Store, metrics: ControllerMetrics
) -> SchedulerDrains | None:
    """Where the scheduler records drains of its own (Slurm), they are read as signals."""
    if not isinstance(actuator, DrainSource) or config.actuator != "slurm" or config.slurm.read_drains_s <= 0:
        return None
    drains = SchedulerDrains(actuator, report, store.records, config.slurm.read_drains_s)
    metrics.scheduler_drains_up.set_function(lambda: 1 if drains.up else 0)
    metrics.scheduler_drains_waiting.set_function(lambda: len(drains.waiting))
    return drains
