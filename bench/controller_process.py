"""A real ``vigil controller`` process for a benchmark: its config written, started, its port awaited."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml


def start_controller(
    workdir: Path, settings: dict[str, Any], env: dict[str, str] | None = None, name: str = "controller"
) -> subprocess.Popen[bytes]:
    """``name``: its files in ``workdir`` (``<name>.yaml``, ``<name>.out``; its port file ``port`` for
    the first, ``<name>.port`` for another beside it, a standby)."""
    config = {
        "listen": "127.0.0.1",
        "port": 0,
        "port_file": str(port_file(workdir, name)),
        "database": str(workdir / "ctl.db"),
        **settings,
    }
    (workdir / f"{name}.yaml").write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "vigil", "controller", "--plaintext", "--config", str(workdir / f"{name}.yaml")]
    return subprocess.Popen(
        [*command, "--log-format", "json"],
        stdout=open(workdir / f"{name}.out", "wb"),
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )


def port_file(workdir: Path, name: str = "controller") -> Path:
    return workdir / ("port" if name == "controller" else f"{name}.port")


async def controller_target(workdir: Path, controller: subprocess.Popen[bytes], name: str = "controller") -> str:
    """HOST:PORT once the controller serves; raises with its last words if it died first."""
    while not port_file(workdir, name).exists():
        if controller.poll() is not None:
            raise RuntimeError((workdir / f"{name}.out").read_text()[-2000:])
        await asyncio.sleep(0.05)
    return f"127.0.0.1:{port_file(workdir, name).read_text()}"


def wide_open(faulting: int, settle_s: float | None) -> dict[str, Any]:
    """``guardrails.shared`` for a benchmark whose faults must all be acted on: no fleet incident
    until one more node faults than the benchmark makes fail, yet one could open, so each quarantine
    and page waits the settling window as with the guard on (``settle_s``; None: the controller's
    30 ms). With every node failing, none could open and nothing settles
    (``controller.nodes.guards.shared.settles``)."""
    return {"min_nodes": max(2, faulting + 1)} | ({} if settle_s is None else {"settle_s": settle_s})
