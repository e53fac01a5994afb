"""The agent's configuration: YAML, validated into a frozen object, overridable from the CLI.

Every key is optional; the defaults are what a production GPU node wants (the NVML backend,
/dev/kmsg, the spool under /var/lib/vigil). deploy/ and the README show a full file.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from agent.remedies import RemediesConfig
from vigil_core.config_file import ConfigModel, FilePath, HttpUrl, load_yaml_model
from vigil_core.names import ADDRESS_RE, NODE_NAME_RE
from vigil_core.tls import transport_problem


def default_node_name() -> str:
    """The Kubernetes downward API sets NODE_NAME; elsewhere, the host name."""
    return os.environ.get("NODE_NAME") or socket.gethostname().lower()


class AgentConfig(ConfigModel):
    # The default is validated too: a host name with "_" would be refused by the controller forever.
    node: str = Field(default_factory=default_node_name, validate_default=True)
    controller: str = "127.0.0.1:7070"
    urgent_controller: str | None = Field(
        None,
        description="the same controller's (or relay's) urgent port, HOST:PORT per address in controller, in its"
        " order: a session with faults waiting in the spool dials it, taken beside a fleet connecting at once"
        " (vigil_core.urgent_port); null: the main port always",
    )
    # GPUs: "nvml" on a real node; "simulated" for the demo and tests (fault injection).
    gpu_backend: Literal["nvml", "simulated"] = "nvml"
    simulated_gpus: int = Field(8, ge=1, le=64)
    simulated_faults: Path | None = None  # a fault file the simulated backend reads (gpus.simulated)
    gpu_poll_s: float = Field(0.5, gt=0, le=300)
    throttle_report_s: float = Field(5.0, gt=0)
    # Kernel log: "auto" picks a file when `kernel_log` names one, else /dev/kmsg when readable,
    # else journald when journalctl exists, else none (with a warning).
    kernel_log_source: Literal["auto", "kmsg", "journald", "file", "none"] = "auto"
    kernel_log: Path | None = None
    kmsg_path: Path = Path("/dev/kmsg")
    journalctl: str = "journalctl"
    kernel_log_poll_s: float = Field(0.1, gt=0, le=60)
    xid_fold_window_s: float = Field(
        10.0, ge=0, description="kernel-log and NVML reports of one XID within this: one signal"
    )
    storm_fold_s: float = Field(
        1.0, ge=0, le=60, description="repeats of one fault within this leave as one signal with a count (0: off)"
    )
    # dcgm-exporter, when it runs on the node: its /metrics URL.
    dcgm_exporter_url: HttpUrl | None = None
    dcgm_poll_s: float = Field(10.0, gt=0, le=600)
    # InfiniBand/RoCE ports (sysfs); a node without them has nothing there and reports nothing.
    ib_sysfs_root: Path = Path("/sys/class/infiniband")
    ib_poll_s: float = Field(1.0, gt=0, le=600)
    ib_transport_timeout_s: float = Field(
        7.0, gt=0, le=600, description="a port down longer than this failed the collectives through it"
    )
    ib_error_rates: dict[str, float] | None = Field(
        None, description="counter -> growth per minute that is a signal (default: agent.infiniband's table)"
    )
    # Host signals.
    host_poll_s: float = Field(5.0, gt=0, le=600)
    checkpoint_path: Path | None = None
    memory_available_min: float = Field(0.05, ge=0, le=1, description="below this fraction: memory pressure")
    disk_used_max: float = Field(0.95, gt=0, le=1, description="checkpoint filesystem used above this: disk full")
    # Watchdog: a collector call that overruns this is reported as COLLECTOR_HUNG.
    collector_deadline_s: float = Field(10.0, gt=0, le=600)
    spool: FilePath = Path("/var/lib/vigil/spool.db")
    spool_max_signals: int = Field(20_000, ge=10)
    metrics_port: int | None = Field(9402, ge=0, le=65535)  # 9400 is dcgm-exporter's
    metrics_address: str | None = Field(
        None, description="where /metrics and /readyz listen; default 0.0.0.0 under TLS, 127.0.0.1 in plaintext"
    )
    heartbeat_s: float = Field(5.0, gt=0, le=300)
    idle_heartbeat_s: float = Field(
        60.0,
        ge=0,
        le=600,
        description="a heartbeat that says nothing new is sent only this often (HTTP/2 keepalive shows the "
        "connection alive meanwhile); 0: every heartbeat_s",
    )
    # The training jobs of this node's processes (their VIGIL_JOB_ID), reported with the heartbeat.
    jobs_scan_s: float = Field(10.0, gt=0, le=3600)
    # Where this node's training ranks keep their progress records (the hook's VIGIL_PROGRESS_DIR, a
    # hostPath both see): sent with every heartbeat, so the controller sees each rank of a stuck job.
    progress_dir: Path | None = Field(None, description="read every heartbeat_s; none: no rank progress")
    proc_root: Path = Path("/proc")
    # GPU and bus resets the controller asks for (agent.remedies); off unless turned on here.
    remedies: RemediesConfig = Field(default_factory=RemediesConfig)
    # Where this node's peers reach it for the sweep's pairwise all-reduce (the DaemonSet passes the
    # node's IP); empty: the address the controller sees this agent's connection come from.
    advertise_address: str = Field("", pattern=ADDRESS_RE.pattern)
    # Mutual TLS with the controller: this node's certificate (node:NAME), its key and the CA.
    tls_dir: Path | None = Field(None, description="ca.crt, tls.crt and tls.key (vigil certs, or cert-manager)")
    plaintext: bool = Field(False, description="talk to the controller without TLS: local use only")
    # On Kubernetes: the pod's projected service-account token (audience vigil) proves the node; the
    # certificate in tls_dir is then the DaemonSet's shared one (CN agents).
    token_file: Path | None = Field(None, description="a service-account token sent with every call")

    @model_validator(mode="after")
    def _transport(self) -> AgentConfig:
        if problem := transport_problem(self.tls_dir, self.plaintext):
            raise ValueError(problem)
        if self.token_file is not None and self.tls_dir is None:
            raise ValueError("token_file needs tls_dir (the agents certificate): a token is only sent over TLS")
        return self

    @property
    def metrics_bind(self) -> str:
        if self.metrics_address is not None:
            return self.metrics_address
        return "127.0.0.1" if self.plaintext else "0.0.0.0"

    @field_validator("node")
    @classmethod
    def _node_name(cls, value: str) -> str:
        if not NODE_NAME_RE.fullmatch(value):
            raise ValueError(
                f"{value[:100]!r} is not a valid node name (lower-case letters, digits, '-' and '.'; the default "
                "comes from $NODE_NAME or the host name): set node in the config file or pass --node"
            )
        return value

    @field_validator("controller", "urgent_controller")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        """HOST:PORT, or several separated by commas (the controller replicas; the agent finds the leader)."""
        for target in value.split(",") if value is not None else ():
            host, sep, port = target.strip().rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"expected HOST:PORT[,HOST:PORT...], got {value!r}")
        return value

    @model_validator(mode="after")
    def _one_urgent_port_each(self) -> AgentConfig:
        if self.urgent_controller is not None:
            urgent, main = self.urgent_controller.split(","), self.controller.split(",")
            if len(urgent) != len(main):
                raise ValueError(
                    f"urgent_controller must name one urgent port per address in controller, in its order:"
                    f" {len(urgent)} for {len(main)} ({self.urgent_controller!r} for {self.controller!r})"
                )
        return self

    @model_validator(mode="after")
    def _file_source_needs_a_file(self) -> AgentConfig:
        if self.kernel_log_source == "file" and self.kernel_log is None:
            raise ValueError("kernel_log_source 'file' needs kernel_log: the file to tail")
        return self


def load_agent_config(path: Path | None, overrides: dict[str, Any]) -> AgentConfig:
    return load_yaml_model(AgentConfig, path, overrides)
