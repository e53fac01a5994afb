"""The controller's configuration: YAML, validated into a frozen object, overridable from the CLI."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from controller.agent_tokens import AgentTokensConfig
from controller.app_faults import AppFaultConfig
from controller.guard_rules import GuardrailConfig
from controller.recovery import RecoveryConfig
from controller.sweep_spec import SweepConfig
from vigil_core.config_file import ConfigModel, DatabaseTarget, HttpUrl, load_yaml_model
from vigil_core.tls import transport_problem


class JobsConfig(ConfigModel):
    warmup_windows: int = Field(default=1, ge=0, description="windows after each (re)start that never count")
    baseline_windows: int = Field(default=3, ge=1, description="the baseline is the median of these windows")
    drop_fraction: float = Field(default=0.2, gt=0, lt=1, description="δ: below (1-δ)·baseline is low")
    drop_windows: int = Field(default=2, ge=1, description="N: this many low windows in a row are a drop")
    straggler_ratio: float = Field(default=1.3, gt=1, description="a rank this many times the median step time")
    deadline_s: float = Field(default=300.0, gt=0, description="to checkpoint and exit; past it the job is killed")
    act_on_drop: bool = Field(default=True, description="stop, sweep and restart the job after a blamed drop")
    sweep_checks: tuple[str, ...] = Field(default=("gpu_health",), description="the sweep of a stopped job's nodes")
    forget_after_s: float = Field(default=3600.0, gt=0, description="a job silent this long is forgotten")
    max_jobs: int = Field(default=1000, ge=1, description="jobs followed at once; a new job id beyond is refused")
    failures_per_1000_gpu_days: float = Field(
        default=1.0, gt=0, description="the GPUs' failure rate, for each job's planned ETTR (vigil plan)"
    )
    checkpoint_now: bool = Field(default=True, description="ask a job to save when a node of it shows early signs")
    checkpoint_now_every_s: float = Field(default=600.0, gt=0, description="at most one such ask per job this often")
    blame_needs_agents: bool | None = Field(
        default=None,
        description="act on a job's blame of a node only where that node's own agent sees the job's processes "
        "(else page only); default: on under TLS, where callers have identities, off in plaintext",
    )


class KubernetesConfig(ConfigModel):
    kubeconfig: Path | None = Field(default=None, description="default: in-cluster, else ~/.kube/config")
    context: str | None = None
    events_namespace: str = "default"
    drain: bool = Field(
        default=False, description="after a quarantine, evict the node's pods (honouring PodDisruptionBudgets)"
    )


class SlackConfig(ConfigModel):
    channel: str
    token_env: str = Field(default="VIGIL_SLACK_TOKEN", description="environment variable holding the bot token")
    base_url: HttpUrl = "https://slack.com/api/"

    def token(self) -> str:
        token = os.environ.get(self.token_env, "")
        if not token:
            raise ValueError(f"the Slack pager needs a bot token in ${self.token_env}")
        return token


class WebhookConfig(ConfigModel):
    url: HttpUrl
    headers: dict[str, str] = Field(default_factory=dict)


class LeaderElectionConfig(ConfigModel):
    enabled: bool = False
    namespace: str = "vigil"
    lease_name: str = "vigil-controller"
    identity: str = Field(default_factory=lambda: os.environ.get("POD_NAME") or socket.gethostname())
    lease_duration_s: int = Field(default=15, ge=2)
    renew_deadline_s: int = Field(default=10, ge=1)
    retry_period_s: int = Field(default=2, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> LeaderElectionConfig:
        if not self.lease_duration_s > self.renew_deadline_s > 1.2 * self.retry_period_s:
            raise ValueError("need lease_duration_s > renew_deadline_s > 1.2 * retry_period_s")
        return self


class LimitsConfig(ConfigModel):
    """What one client may send: beyond these, a call is refused (RESOURCE_EXHAUSTED) and logged."""

    max_message_bytes: int = Field(default=4 << 20, ge=64 << 10, le=64 << 20, description="one gRPC message")
    agent_messages_per_s: float = Field(default=20.0, gt=0, description="per node: heartbeats, batches, results")
    agent_burst: int = Field(default=200, ge=1)
    reports_per_s: float = Field(default=5.0, gt=0, description="per training job: Progress and Plan calls")
    report_burst: int = Field(default=50, ge=1)
    check_results_per_node_hour: int = Field(
        default=120, ge=1, description="check results nobody asked for, stored per node and hour; past it, counted"
    )
    max_nodes: int = Field(
        default=50_000, ge=1, description="nodes the controller knows at most; a Hello from a new one beyond is refused"
    )
    max_seq_gap: int = Field(
        default=10_000_000,
        ge=1000,
        description="a signal numbered this far past its spool's last one is refused (INVALID_ARGUMENT), "
        "not taken: taking it would silence every later signal of that spool",
    )


class ControllerConfig(ConfigModel):
    listen: str | None = Field(
        default=None,
        description="the gRPC address; default 0.0.0.0 under TLS, 127.0.0.1 in plaintext (another is warned about)",
    )
    port: int = Field(default=7070, ge=0, le=65535)
    port_file: Path | None = Field(default=None, description="write the bound port here (for port 0)")
    database: DatabaseTarget = Field(
        default=Path("/var/lib/vigil/controller.db"),
        description="an SQLite file (one controller) or a postgresql:// DSN (HA replicas sharing one database)",
    )
    database_dsn_file: Path | None = Field(
        default=None, description="a file holding the postgresql:// DSN (a mounted Secret); overrides database"
    )
    cluster_name: str = Field(
        default="default",
        pattern=r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$",
        description="recorded in the database at creation: a database of another cluster is refused",
    )
    policy: Path | None = None
    actuator: Literal["local", "kubernetes"] = "local"
    pager: Literal["console", "none", "slack", "webhook"] = "console"
    fold_report_s: float = Field(default=300.0, gt=0, description="a flooding incident's count: at most this often")
    retention_days: float | None = Field(
        default=28.0,
        gt=0,
        description="finished incidents, their signals, check results and sweeps older than this are deleted "
        "(null: kept forever); open incidents and unsettled actions are kept whatever their age",
    )
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    metrics_address: str | None = Field(
        default=None, description="where /metrics and /readyz listen; default: the gRPC address (listen)"
    )
    kubernetes: KubernetesConfig = Field(default_factory=KubernetesConfig)
    slack: SlackConfig | None = None
    webhook: WebhookConfig | None = None
    guardrails: GuardrailConfig = Field(default_factory=GuardrailConfig)
    recovery: RecoveryConfig = Field(default_factory=RecoveryConfig)
    leader_election: LeaderElectionConfig = Field(default_factory=LeaderElectionConfig)
    sweep: SweepConfig = Field(default_factory=SweepConfig)
    jobs: JobsConfig = Field(default_factory=JobsConfig)
    app_faults: AppFaultConfig = Field(default_factory=AppFaultConfig)
    node_labels: dict[str, dict[str, str]] = Field(
        default_factory=dict, description="the local actuator's nodes' labels (failure domains); Kubernetes has its own"
    )
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    tls_dir: Path | None = Field(
        default=None, description="mutual TLS: ca.crt, tls.crt and tls.key (vigil certs, or a cert-manager secret)"
    )
    plaintext: bool = Field(default=False, description="serve without TLS and without identities: local use only")
    agent_tokens: AgentTokensConfig = Field(default_factory=AgentTokensConfig)

    @model_validator(mode="after")
    def _transport(self) -> ControllerConfig:
        if problem := transport_problem(self.tls_dir, self.plaintext):
            raise ValueError(problem)
        if self.agent_tokens.enabled and self.tls_dir is None:
            raise ValueError("agent_tokens needs tls_dir: a token is only sent over TLS")
        return self

    @property
    def listen_address(self) -> str:
        """Where gRPC listens: plaintext stays on loopback unless told otherwise."""
        if self.listen is not None:
            return self.listen
        return "127.0.0.1" if self.tls_dir is None else "0.0.0.0"

    @property
    def metrics_bind(self) -> str:
        return self.metrics_address if self.metrics_address is not None else self.listen_address

    @model_validator(mode="after")
    def _dsn_from_file(self) -> ControllerConfig:
        if self.database_dsn_file is None:
            return self
        try:
            dsn = self.database_dsn_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"database_dsn_file {self.database_dsn_file}: cannot read: {exc}") from None
        if not dsn.startswith(("postgresql://", "postgres://")):
            raise ValueError(f"database_dsn_file {self.database_dsn_file}: does not hold a postgresql:// DSN")
        object.__setattr__(self, "database", dsn)  # frozen: set once, here, before anyone reads it
        return self

    @model_validator(mode="after")
    def _pager_settings(self) -> ControllerConfig:
        if self.pager == "slack" and self.slack is None:
            raise ValueError("pager 'slack' needs a slack: section (channel, token_env)")
        if self.pager == "webhook" and self.webhook is None:
            raise ValueError("pager 'webhook' needs a webhook: section (url)")
        return self


def load_controller_config(path: Path | None, overrides: dict[str, Any]) -> ControllerConfig:
    return load_yaml_model(ControllerConfig, path, overrides)
