"""The controller makes room for its agents' connections (``controller.edge.open_files``): one
descriptor each, so it raises its open-file limit at start, and says aloud when the system's hard
limit leaves too little. Started under ``prlimit`` with a low limit, as systemd (1,024) would."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.e2e.processes import json_lines, port_of, stop_all

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs util-linux's prlimit")]


def started(tmp: Path, soft: int, hard: int, max_nodes: int) -> tuple[int, list[dict[str, object]]]:
    """The controller's open-file limit once it serves, and what it logged."""
    config = {
        "listen": "127.0.0.1",
        "port": 0,
        "port_file": str(tmp / "ctl.port"),
        "database": str(tmp / "ctl.db"),
        "plaintext": True,
        "limits": {"max_nodes": max_nodes},
    }
    (tmp / "ctl.yaml").write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "vigil", "controller", "--config", str(tmp / "ctl.yaml"), "--log-format", "json"]
    with open(tmp / "ctl.log", "wb") as log:
        proc = subprocess.Popen(["prlimit", f"--nofile={soft}:{hard}", *command], stdout=log, stderr=log)
    try:
        port_of(tmp, "ctl")
        limits = Path(f"/proc/{proc.pid}/limits").read_text().splitlines()
        (line,) = [x for x in limits if x.startswith("Max open files")]
        return int(line.split()[3]), json_lines(tmp / "ctl.log")
    finally:
        stop_all([proc])


def test_the_limit_is_raised_for_every_agent_the_controller_may_have(tmp_path: Path) -> None:
    soft, said = started(tmp_path, soft=256, hard=8192, max_nodes=5000)
    assert soft == 5000 + 1024
    assert not [e for e in said if e["event"] == "open_files_limit_low"]


def test_a_hard_limit_below_the_fleet_is_said_aloud(tmp_path: Path) -> None:
    soft, said = started(tmp_path, soft=256, hard=2048, max_nodes=100_000)
    assert soft == 2048  # as far as it goes
    (low,) = [e for e in said if e["event"] == "open_files_limit_low"]
    assert low["limit"] == 2048 and low["needed"] == 101_024 and "about 1024 agents can connect" in str(low["detail"])
