"""``vigil plan``: the plan as JSON and as a plot, bad input named, and the history asked of a real
controller over gRPC."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from controller.config import ControllerConfig
from controller.daemon import Controller
from tests.helpers import stop_controller
from vigil.cli import app


def vigil(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vigil", *args], capture_output=True, text=True, timeout=120)


def test_the_plan_as_json_and_as_a_plot(tmp_path: Path) -> None:
    png = tmp_path / "plan.png"
    out = vigil(
        "plan", "--gpus", "3072", "--failures-per-1000-gpu-days", "1", "--days", "90", "--save-s", "30",
        "--restart-s", "300", "--runs", "50", "--json", "--plot", str(png),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["mtbf_s"] == pytest.approx(1000 * 86400 / 3072)
    assert plan["vigil"]["ettr"] > plan["baseline"]["ettr"] and plan["ettr_points_saved"] > 0.03
    assert set(plan["vigil"]["badput"]) == {"checkpoint", "lost_work", "detection", "restart", "stragglers"}
    assert plan["vigil"]["simulated"]["runs"] == 50 and len(plan["vigil"]["curve"]) == 60
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_node_rate_and_every_time_given_reproduce_the_published_example() -> None:
    out = vigil(
        "plan", "--gpus", "16384", "--gpus-per-node", "8", "--failures-per-1000-node-days", "6.5",
        "--save-s", "60", "--restart-s", "540", "--restore-s", "60", "--detect-s", "0", "--runs", "20", "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["mtbf_s"] / 3600 == pytest.approx(1.80, abs=0.01)
    assert plan["vigil"]["times"]["restart_s"] == 600 and plan["vigil"]["times"]["detect_s"] == 0
    assert plan["vigil"]["ettr"] == pytest.approx(0.77, abs=0.02)  # the 16K-GPU worked example


def test_a_table_by_default_with_the_measured_defaults_named() -> None:
    out = vigil("plan", "--gpus", "16384", "--gpu-mtbf-hours", "50000", "--runs", "20")
    assert out.returncode == 0, out.stderr
    assert "ETTR (formula)" in out.stdout and "without Vigil" in out.stdout
    assert "Vigil's measurement" in out.stdout  # save and restart defaulted: where they come from


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--gpus", "8"], "give one failure rate"),
        (["--gpus", "8", "--failures-per-1000-gpu-days", "1", "--gpu-mtbf-hours", "9"], "give one failure rate"),
        (["--gpus", "8", "--gpu-mtbf-hours", "0"], "--gpu-mtbf-hours must be above 0"),
        (["--gpus", "8", "--failures-per-1000-gpu-days", "1", "--save-s", "-1"], "--save-s must be 0 or more"),
        (["--gpus", "0", "--failures-per-1000-gpu-days", "1"], "--gpus"),
        (["--gpus", "12", "--failures-per-1000-gpu-days", "1"], "not a whole number of nodes"),
        (["--gpus", "8", "--failures-per-1000-gpu-days", "1", "--plot", "/nonexistent/dir/p.png"], "--plot"),
        (["--gpus", "8", "--gpu-rate", "1", "--plot", "plan.txt"], "the name's suffix picks the format"),
        (["--gpus", "8", "--gpu-rate", "1", "--watchdog-s", "-5"], "--watchdog-s"),
        (["--gpus", "8", "--gpu-rate", "1", "--person-s", "-1"], "--person-s"),
        # A restart longer than the time between failures: said at once, not 0.0% after a simulation.
        (["--gpus", "3072", "--gpu-rate", "1000", "--restart-s", "600"], "would never train again"),
    ],
)
def test_bad_input_is_named_without_a_traceback(args: list[str], says: str) -> None:
    out = CliRunner().invoke(app, ["plan", *args])  # in-process: the command as the shell runs it
    assert out.exit_code == 2 and says in out.output and "Traceback" not in out.output, out.output


def test_from_history_asks_the_controller_and_says_why_it_cannot_fit(tmp_path: Path) -> None:
    async def scenario() -> subprocess.CompletedProcess[str]:
        cfg = ControllerConfig(listen="127.0.0.1", port=0, database=tmp_path / "c.db", pager="none", plaintext=True)
        controller = Controller(cfg)
        await controller.start()
        try:
            target = f"127.0.0.1:{controller.port}"
            return await asyncio.to_thread(vigil, "plan", "--gpus", "64", "--from-history", "--controller", target)
        finally:
            await stop_controller(controller)

    out = asyncio.run(scenario())
    assert out.returncode == 2 and "--from-history: " in out.stderr, out.stderr
    assert "watches no GPU node" in out.stderr  # a fresh controller: no agent, no history


def test_the_rate_options_read_apart_at_80_columns() -> None:
    """Rich cuts long option names at 80 columns: the short forms come first, so the two rates
    still read apart (both showed as "--failures-per-1000-…")."""
    shown = subprocess.run(
        [sys.executable, "-m", "vigil", "plan", "--help"], capture_output=True, text=True, timeout=60,
        env={**os.environ, "COLUMNS": "80", "TERM": "dumb"},
    )  # fmt: skip
    assert "--gpu-rate" in shown.stdout and "--node-rate" in shown.stdout, shown.stdout
