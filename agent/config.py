"""The agent's configuration: YAML, validated into a frozen object, overridable from the CLI."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from vigil.config_file import load_yaml_model

NODE_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"


def default_node_name() -> str:
    """The Kubernetes downward API sets NODE_NAME; elsewhere, the host name."""
    return os.environ.get("NODE_NAME") or socket.gethostname().lower()


class AgentConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    node: str = Field(default_factory=default_node_name, pattern=NODE_NAME_PATTERN)
    controller: str = "127.0.0.1:7070"
    gpu_backend: Literal["simulated"] = "simulated"
    simulated_gpus: int = Field(8, ge=1, le=64)
    kernel_log: Path | None = None
    spool: Path = Path("/var/lib/vigil/spool.db")
    metrics_port: int | None = Field(9400, ge=0, le=65535)
    metrics_address: str = "0.0.0.0"
    gpu_poll_s: float = Field(1.0, gt=0, le=300)
    kernel_log_poll_s: float = Field(0.1, gt=0, le=60)
    heartbeat_s: float = Field(5.0, gt=0, le=300)
    throttle_report_s: float = Field(5.0, gt=0)

    @field_validator("controller")
    @classmethod
    def _host_port(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"expected HOST:PORT, got {value!r}")
        return value


def load_agent_config(path: Path | None, overrides: dict[str, Any]) -> AgentConfig:
    return load_yaml_model(AgentConfig, path, overrides)
