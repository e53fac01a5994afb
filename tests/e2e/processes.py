"""Vigil processes for end-to-end tests: the real CLI in subprocesses."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.helpers import poll_until


def vigil(*args: str, out: Path, prefix: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    """``python -m vigil ARGS``; ``prefix`` runs it inside something (``ip netns exec NS``)."""
    return subprocess.Popen(
        [*prefix, sys.executable, "-m", "vigil", *args],
        stdout=open(out, "wb"),
        stderr=open(out.with_suffix(".log"), "wb"),
        stdin=subprocess.DEVNULL,
    )


def start_controller(tmp: Path, run: int, port: int = 0) -> tuple[subprocess.Popen[bytes], int]:
    port_file = tmp / f"port{run}"
    proc = vigil(
        "controller",
        "--port",
        str(port),
        "--port-file",
        str(port_file),
        "--database",
        str(tmp / "ctl.db"),
        "--log-format",
        "json",
        out=tmp / f"controller{run}.out",
    )
    poll_until(lambda: port_file.exists() or proc.poll() is not None, what="controller port")
    assert proc.poll() is None, (tmp / f"controller{run}.log").read_text()
    return proc, int(port_file.read_text())


def start_agent(
    tmp: Path, node: str, controller: str, spool: Path | None = None, prefix: Sequence[str] = ()
) -> tuple[subprocess.Popen[bytes], Path]:
    """A simulated-GPU agent tailing its own kmsg-format file (returned, for injecting lines)."""
    kmsg = tmp / f"{node}.kmsg"
    kmsg.write_text("")
    proc = vigil(
        "agent",
        "--gpu-backend",
        "simulated",
        "--node",
        node,
        "--controller",
        controller,
        "--kernel-log",
        str(kmsg),
        "--spool",
        str(spool or tmp / f"{node}.spool"),
        "--metrics-port",
        "0",
        "--log-format",
        "json",
        out=tmp / f"{node}.out",
        prefix=prefix,
    )
    return proc, kmsg


def configured_controller(tmp: Path, name: str, **settings: Any) -> subprocess.Popen[bytes]:
    """``vigil controller --config NAME.yaml`` on loopback, its port file and database named after it."""
    config = {
        "listen": "127.0.0.1",
        "port": 0,
        "port_file": str(tmp / f"{name}.port"),
        "database": str(tmp / f"{name}.db"),
        **settings,
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return vigil("controller", "--config", str(path), "--log-format", "json", out=tmp / f"{name}.out")


def port_of(tmp: Path, name: str) -> int:
    """The port a configured controller bound, once it writes it (a standby writes it when it leads)."""
    poll_until(lambda: (tmp / f"{name}.port").exists(), what=f"{name}'s port")
    return int((tmp / f"{name}.port").read_text())
