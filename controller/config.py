"""The controller's configuration: YAML, validated into a frozen object, overridable from the CLI."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from controller.act.agent_tokens import AgentTokensConfig
from controller.edge.limits import LimitsConfig
from controller.jobs.settings import JobsConfig
from controller.nodes.app_faults import AppFaultConfig
from controller.nodes.guards.rules import GuardrailConfig
from controller.nodes.recovery.rules import RecoveryConfig
from controller.repairs.config import RemediationConfig
from controller.sweeps.spec import SweepConfig
from vigil_core.config_file import ConfigModel, DatabaseTarget, HttpUrl, load_yaml_model
from vigil_core.tls import transport_problem


class KubernetesConfig(ConfigModel):
    kubeconfig: Path | None = Field(default=None, description="default: in-cluster, else ~/.kube/config")
    context: str | None = None
    events_namespace: str = "default"
    drain: bool = Field(
        default=False, description="after a quarantine, evict the node's pods (honouring PodDisruptionBudgets)"
    )


class SlurmRestConfig(ConfigModel):
    """slurmrestd in place of Slurm's commands (Slurm 24.05 and later)."""

    url: HttpUrl = Field(description="slurmrestd's address, http(s)://host:port")
    token_file: Path = Field(
        description="a file holding a JWT for slurmrestd (read on every request: rotate it in place)"
    )
    user: str = Field(default="root", min_length=1, description="the Slurm user the token is for")
    api_version: str = Field(
        default="v0.0.41",
        pattern=r"^v0\.0\.(4[1-9]|[5-9][0-9])$",
        description="the REST API's version, v0.0.41 or later (tested: v0.0.41 on Slurm 24.11)",
    )


class SlurmConfig(ConfigModel):
    rest: SlurmRestConfig | None = Field(
        default=None, description="reach slurmctld through slurmrestd instead of Slurm's commands"
    )
    conf: Path | None = Field(
        default=None, description="slurm.conf for Slurm's commands (default: $SLURM_CONF, then Slurm's own)"
    )
    bin_dir: Path | None = Field(default=None, description="where sinfo, squeue and scontrol are (default: the PATH)")
    timeout_s: float = Field(default=10.0, gt=0, description="one Slurm command's deadline")
    node_names: dict[str, str] = Field(
        default_factory=dict, description="Vigil's node name -> Slurm's, where they differ (default: the same)"
    )
    read_drains_s: float = Field(
        default=30.0, ge=0, description="read others' drains (NHC, people, Slurm) this often, as signals (0: never)"
    )

    @model_validator(mode="after")
    def _one_to_one(self) -> SlurmConfig:
        slurm = list(self.node_names.values())
        if twice := sorted({n for n in slurm if slurm.count(n) > 1}):
            raise ValueError(f"node_names: Slurm node {twice[0]!r} is named for two Vigil nodes")
        return self


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


class ControllerConfig(ConfigModel):
    listen: str | None = Field(
        default=None,
        description="the gRPC address; default 0.0.0.0 under TLS, 127.0.0.1 in plaintext (another is warned about)",
    )
    port: int = Field(default=7070, ge=0, le=65535)
    port_file: Path | None = Field(default=None, description="write the bound port here (for port 0)")
    urgent_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="a second gRPC port, on the same address, for agents with faults waiting only: taken beside the"
        " main port's calls, not behind them, while a fleet connects (vigil_core.urgent_port); null: none",
    )
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
    actuator: Literal["local", "kubernetes", "slurm"] = "local"
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
    slurm: SlurmConfig = Field(default_factory=SlurmConfig, description="the Slurm actuator's (actuator: slurm)")
    slack: SlackConfig | None = None
    webhook: WebhookConfig | None = None
    guardrails: GuardrailConfig = Field(default_factory=GuardrailConfig)
    recovery: RecoveryConfig = Field(default_factory=RecoveryConfig)
    remediation: RemediationConfig = Field(
        default_factory=RemediationConfig, description="repair quarantined nodes without a person (off by default)"
    )
    leader_election: LeaderElectionConfig = Field(default_factory=LeaderElectionConfig)
    sweep: SweepConfig = Field(default_factory=SweepConfig)
    jobs: JobsConfig = Field(default_factory=JobsConfig)
    app_faults: AppFaultConfig = Field(default_factory=AppFaultConfig)
    node_labels: dict[str, dict[str, str]] = Field(
        default_factory=dict,
        description="nodes' labels (failure domains) for the local and Slurm actuators; Kubernetes has its own",
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
        if self.urgent_port is not None and self.urgent_port == self.port:
            raise ValueError(f"urgent_port must differ from port (both {self.port})")
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
