"""Vigil processes for end-to-end tests: the real CLI in subprocesses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import poll_until


def vigil(*args: str, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "vigil", *args],
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
    tmp: Path, node: str, controller: str, spool: Path | None = None
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
    )
    return proc, kmsg
