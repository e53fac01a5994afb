"""`vigil demo --json`, end to end, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e


def test_demo_quarantines_exactly_the_faulted_node() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "vigil", "demo", "--json"], capture_output=True, text=True, timeout=110
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["ok"] is True
    assert summary["quarantined_nodes"] == [summary["faulted_node"]] == ["node-2"]
    assert summary["xid"] == 79 and summary["incidents_on_other_nodes"] == 0
    assert {n: h for n, h in summary["node_health"].items() if n != "node-2"} == {
        "node-1": "HEALTHY",
        "node-3": "HEALTHY",
        "node-4": "HEALTHY",
    }
    lat = summary["latency_s"]
    assert 0 <= lat["observed"] <= lat["received"] <= lat["incident_opened"] <= lat["quarantined"]
    assert lat["incident_opened"] <= lat["paged"]
    assert "PAGE [QUARANTINE]" in summary["page_text"] and "node-2" in summary["page_text"]


def test_demo_human_output_has_a_timeline() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "vigil", "demo", "--nodes", "2", "--gpus", "2"],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for step in ("injected", "observed", "received", "incident", "quarantined", "paged", "Summary"):
        assert step in proc.stdout


@pytest.mark.timeout(400)
@pytest.mark.serial  # its slow rank is found by step times: nothing else may load the CPUs
def test_the_training_demo_brings_the_job_back_after_a_fault_and_after_a_slow_rank() -> None:
    pytest.importorskip("torch", reason="the training demo needs torch (make test installs the CPU build)")
    command = [sys.executable, "-m", "vigil", "demo", "--with-training", "--json"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=380)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    fault, slow = summary["fault"], summary["slow_rank"]
    assert summary["ok"] and fault["ok"] and slow["ok"], (fault["failed"], slow["failed"], proc.stdout[-6000:])
    assert fault["resumed_step"] == fault["checkpoint_step"] and fault["restarted_on"] == "node-1"
    assert 0 < fault["fault_to_quarantine_s"] < fault["fault_to_first_step_after_restart_s"]
    assert fault["goodput"]["wasted_s"] == 0 and 0 < fault["goodput"]["ratio"] < 1
    assert slow["blamed"] == ["node-3"] and slow["drops"] == 1 and slow["drop_step"] > 40
    assert "Traceback" not in proc.stderr
