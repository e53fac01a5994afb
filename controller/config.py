"""The controller's configuration: YAML, validated into a frozen object, overridable from the CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from vigil.config_file import load_yaml_model


class ControllerConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    listen: str = "0.0.0.0"
    port: int = Field(7070, ge=0, le=65535)
    port_file: Path | None = Field(None, description="write the bound port here (for port 0)")
    database: Path = Path("/var/lib/vigil/controller.db")
    policy: Path | None = None
    actuator: Literal["local"] = "local"
    pager: Literal["console", "none"] = "console"
    metrics_port: int | None = Field(None, ge=0, le=65535)


def load_controller_config(path: Path | None, overrides: dict[str, Any]) -> ControllerConfig:
    return load_yaml_model(ControllerConfig, path, overrides)
