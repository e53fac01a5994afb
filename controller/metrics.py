"""The controller's Prometheus metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from vigil_core import loop_lag
from vigil_core.gc_pauses import GcPauses

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        r.register(GcPauses())  # the collector's pauses: the event loop's too
        self.signals = Counter("vigil_controller_signals_total", "Signals accepted", ["kind"], registry=r)
        self.duplicates = Counter(
            "vigil_controller_duplicate_signals_total", "Signals received again and ignored", registry=r
        )
        self.incidents = Counter("vigil_controller_incidents_total", "Incidents opened", ["severity"], registry=r)
        self.actions = Counter("vigil_controller_actions_total", "Actions carried out", ["kind", "status"], registry=r)
        self.fault_to_action = Histogram(
            "vigil_controller_fault_to_action_seconds",
            "From the agent observing a fault to the action done",
            ["kind"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.nodes = Gauge("vigil_controller_nodes", "Nodes by health", ["health"], registry=r)
        self.database_started_empty = Gauge(
            "vigil_controller_database_started_empty",
            "1 when the controller found its database file empty (0 bytes) at start: its history is gone",
            registry=r,
        )
        self.spool_signals_maybe_lost = Counter(
            "vigil_controller_agent_spool_signals_maybe_lost_total",
            "Signals waiting in an agent's spool (its last heartbeat) when the agent came back with another spool",
            ["node"],
            registry=r,
        )
        self.agent_dropped_faults = Gauge(
            "vigil_controller_agent_dropped_fault_signals",
            "Fault signals an agent's full spool had to drop, as the agent reports it",
            ["node"],
            registry=r,
        )
        self.connected_agents = Gauge("vigil_controller_connected_agents", "Agents with an open stream", registry=r)
        self.fleet_incidents = Counter(
            "vigil_controller_fleet_incidents_total",
            "Times one fault on much of the fleet at once became one fleet incident (its nodes held)",
            registry=r,
        )
        self.breaker_trips = Counter(
            "vigil_controller_circuit_breaker_trips_total", "Times the circuit breaker paused automation", registry=r
        )
        self.automation_paused = Gauge(
            "vigil_controller_automation_paused", "1 while the circuit breaker holds quarantines back", registry=r
        )
        self.certificate_expiry = Gauge(
            "vigil_controller_certificate_expiry_timestamp_seconds",
            "When the controller's certificate in use expires (unix time); 0 in plaintext",
            registry=r,
        )
        self.leader = Gauge("vigil_controller_leader", "1 while this replica holds the leader Lease", registry=r)
        self.job_mfu = Gauge(
            "vigil_controller_job_mfu", "The job's MFU in its last window (0: unknown peak)", ["job"], registry=r
        )
        self.job_tokens_per_s = Gauge(
            "vigil_controller_job_tokens_per_second", "The job's tokens/s in its last window", ["job"], registry=r
        )
        self.job_commands = Counter(
            "vigil_controller_job_commands_total", "CHECKPOINT_AND_RESTART commands sent", ["reason"], registry=r
        )
        self.rule_decisions = Counter(
            "vigil_controller_rule_decisions_total", "Quarantines and pages carried out, by rule", ["rule", "action"],
            registry=r,
        )  # fmt: skip
        self.rule_undone = Counter(
            "vigil_controller_rule_undone_total", "Quarantines a person undid soon after, by rule", ["rule"], registry=r
        )
        self.mfu_drops = Counter("vigil_controller_mfu_drops_total", "MFU drops detected", ["blamed"], registry=r)
        self.job_time = Gauge(
            "vigil_controller_job_time_seconds",
            "Where the job's time went: productive, checkpoint, restore, wasted, recovery",
            ["job", "kind"],
            registry=r,
        )
        self.job_hung = Gauge(
            "vigil_controller_job_hung_seconds",
            "How long a hung job's step has not moved (past its bound); 0: stepping",
            ["job"],
            registry=r,
        )
        self.job_goodput = Gauge(
            "vigil_controller_job_goodput_ratio", "Productive time over all the job's time seen", ["job"], registry=r
        )
        self.checkpoint_now = Counter(
            "vigil_controller_checkpoint_now",
            "Jobs asked to save now (CHECKPOINT_NOW): a node of theirs showed early signs of failing",
            ["job"],
            registry=r,
        )
        self.job_planned_ettr = Gauge(
            "vigil_controller_job_planned_ettr_ratio",
            "The ETTR the plan expects at the job's size and its measured save and restart times (vigil plan)",
            ["job"],
            registry=r,
        )
        self.job_recommended_checkpoint = Gauge(
            "vigil_controller_job_recommended_checkpoint_seconds",
            "How often the job should save, for its measured save time (Daly's interval)",
            ["job"],
            registry=r,
        )
        self.task_failures = Counter(
            "vigil_controller_task_failures_total",
            "Exceptions in the controller's background work, by task (each is logged, and the task resumes)",
            ["task"],
            registry=r,
        )
        self.loop_lag = Histogram(
            "vigil_controller_event_loop_lag_seconds",
            "How much later than due the controller's event loop ran a tick every 0.1 s (every stream, signal"
            " and action on it waited as long; an agent's first-message bound, a node's silence and a job's hang"
            " leave it out)",
            buckets=loop_lag.BUCKETS_S,
            registry=r,
        )
        self.tasks_down = Gauge(
            "vigil_controller_tasks_down", "Background tasks failing now (readiness fails meanwhile)", registry=r
        )
        self.store_up = Gauge(
            "vigil_controller_store_up", "1 while the database takes writes; 0 during an outage", registry=r
        )
        self.relayed_waiting_bytes = Gauge(
            "vigil_controller_relayed_waiting_bytes",
            "Agents' messages the relays carried here and the controller has not handled yet",
            registry=r,
        )
        self.relayed_waiting_streams = Gauge(
            "vigil_controller_relayed_waiting_streams",
            "Relayed agent streams with messages waiting their turn for a worker (an urgent one takes none)",
            registry=r,
        )
        self.node_watch_up = Gauge(
            "vigil_controller_node_watch_up",
            "1 while the Kubernetes node watch is current (labels, quarantine reads); 0 while it is lost",
            registry=r,
        )
        self.scheduler_drains_up = Gauge(
            "vigil_controller_scheduler_drains_up",
            "1 while the scheduler's drains are read (Slurm); 0 after a reading failed",
            registry=r,
        )
        self.scheduler_drains_waiting = Gauge(
            "vigil_controller_scheduler_drains_waiting",
            "Drains the scheduler made on nodes no agent has said hello from: not filed as signals yet",
            registry=r,
        )
        self.store_write_failures = Counter(
            "vigil_controller_store_write_failures_total", "Database transactions that failed", registry=r
        )
        self.store_writes_refused = Counter(
            "vigil_controller_store_writes_refused_total",
            "Recorded writes the database refused by their content (a bug; logged as store_write_refused)",
            registry=r,
        )
        self.database_bytes = Gauge("vigil_controller_database_bytes", "The database's size on disk", registry=r)
        self.plaintext_exposed = Gauge(
            "vigil_controller_plaintext_exposed",
            "1 when the controller serves plaintext gRPC on an address other than loopback",
            registry=r,
        )
        self.open_files_limit = Gauge(
            "vigil_controller_open_files_limit",
            "The controller's open-file limit (one descriptor per connected agent; raised at start toward "
            "limits.max_nodes + 1,024)",
            registry=r,
        )
        self.hellos_paced = Counter(
            "vigil_controller_hellos_paced_total",
            "Agent Hellos turned away with a turn to come back at (limits.hellos_per_s: a fleet reconnecting at once)",
            registry=r,
        )
        self.hellos_urgent = Counter(
            "vigil_controller_hellos_urgent_total",
            "Agent Hellos that said faults wait in their spool (Hello.urgent_waiting): admitted without a turn",
            registry=r,
        )
        self.urgent_port_calls = Counter(
            "vigil_controller_urgent_port_calls_total",
            "Agents' calls on the urgent port (urgent_port), by outcome: taken (faults wait in the agent's spool),"
            " or refused (none wait: the agent goes to the main port)",
            ["outcome"],
            registry=r,
        )
        self.check_results_refused = Counter(
            "vigil_controller_check_results_refused_total",
            "Check results not stored: the node sent more than limits.check_results_per_node_hour",
            ["node"],
            registry=r,
        )
        self.agent_unparsed_lines = Gauge(
            "vigil_controller_agent_unparsed_driver_lines",
            "Driver kernel-log lines a node's agent could not parse (its samples are logged as they come)",
            ["node"],
            registry=r,
        )
        self.blame_unconfirmed = Counter(
            "vigil_controller_job_blame_unconfirmed_total",
            "Nodes a job's MFU drop blamed that their own agents did not see run the job: paged, not acted on",
            registry=r,
        )
        self.repair_steps = Counter(
            "vigil_controller_repair_steps_total",
            "Repair steps carried out (controller.repairs), by rung and how each ended",
            ["step", "result"],
            registry=r,
        )
        self.repairs_ended = Counter(
            "vigil_controller_repairs_total",
            "Repairs ended: released (certified, back in service, nobody paged) or hands (a person paged)",
            ["outcome"],
            registry=r,
        )
        self.repairs_waiting = Gauge(
            "vigil_controller_repairs_under_way", "Repairs not ended, by phase", ["phase"], registry=r
        )
