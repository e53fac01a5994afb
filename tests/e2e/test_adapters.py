"""The Lightning and Hugging Face Trainer adapters with the real libraries, across real processes: a
controller, two simulated-GPU agents, and ``vigil launch`` running each adapter's example
(``trainer_hooks/examples``) with one gloo rank per node. The job reports Progress (the controller
knows it, its nodes and its MFU baseline); an early warning on node-a makes both ranks save at the
same step and train on (CHECKPOINT_NOW, acknowledged); and an XID on node-b makes it obey the stop:
both ranks save a checkpoint at the same step and exit 75, and the job comes back on node-a at that
step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.processes import job_cluster, json_lines
from tests.helpers import poll_until
from vigil.admin_client import AdminClient

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ENV = {"VIGIL_WINDOW_STEPS": "10", "OMP_NUM_THREADS": "1"}
STEPS = 400


def ended(log: Path) -> list[dict[str, Any]]:
    """The example's own end-of-run lines in a rank's log (it prints one per start)."""
    lines = log.read_text().splitlines() if log.exists() else []
    return [json.loads(line) for line in lines if line.startswith('{"event": "')]


@pytest.mark.parametrize(
    ("module", "library"),
    [("trainer_hooks.examples.lightning_lm", "lightning"), ("trainer_hooks.examples.hf_lm", "transformers")],
)
def test_the_adapter_reports_progress_and_obeys_the_checkpoint_command(
    tmp_path: Path, module: str, library: str
) -> None:
    pytest.importorskip(library, reason=f"the adapter's test needs {library} (make test installs it)")
    with job_cluster(tmp_path, pager="console") as cluster, AdminClient(cluster.controller) as admin:
        # 20 ms after each step: on a fast machine the job would otherwise finish its last 100 steps
        # before it heard the stop (it asks every second).
        args = ["--steps", str(STEPS), "--step-pause-s", "0.02"]
        launcher = cluster.launch("lm", ["node-a", "node-b"], args, ENV, module=module)

        def learned() -> bool:  # Progress arrived: the job, its two nodes, windows judged into a baseline
            jobs = admin.jobs()
            return (
                bool(jobs)
                and list(jobs[0].nodes) == ["node-a", "node-b"]
                and (jobs[0].baseline_mfu or jobs[0].baseline_tokens_per_s) > 0
            )

        poll_until(learned, timeout=120, what="the job's baseline from its reports")
        # An early warning on node-a (a non-fatal NVSwitch error): the job saves and trains on.
        with open(cluster.kmsg["node-a"], "a") as f:
            f.write(f"3,500,{int(1e9)},-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 3\n")

        def saved_on_request() -> bool:
            return any(e.get("event") == "job_saved_on_request" for e in json_lines(tmp_path / "ctl.log"))

        poll_until(saved_on_request, timeout=60, what="the save CHECKPOINT_NOW asked for, acknowledged")
        assert admin.jobs()[0].state == "running"
        cluster.xid("node-b")
        assert launcher.wait(180) == 0, (tmp_path / "launch.log").read_text()[-3000:]
        (job,) = admin.jobs()

    stopped, finished = ended(tmp_path / "ranks" / "node-a-rank0.log")
    k = stopped["step"]
    assert (stopped["exit_code"], stopped["world_size"]) == (75, 2) and 0 < k < STEPS
    assert (finished["exit_code"], finished["world_size"], finished["step"]) == (0, 1, STEPS)
    launched = json_lines(tmp_path / "launch.log")
    starts = [(e["how"], e["exit_codes"]) for e in launched if e["event"] == "job_start_ended"]
    node_b = (tmp_path / "ranks" / "node-b-rank1.log").read_text()[-3000:]
    assert starts == [("checkpointed", [75, 75]), ("finished", [0])], node_b
    (restarted,) = [e for e in json_lines(tmp_path / "ctl.log") if e.get("event") == "job_restarted"]
    assert (restarted["step"], restarted["left_out"]) == (k, "node-b")  # resumed at the stop's checkpoint
    assert (job.state, job.restart_count, list(job.nodes), job.step, job.wasted_s) == (
        "finished", 1, ["node-a"], STEPS, 0.0)  # fmt: skip
    assert job.productive_s > 0 and job.recovery_s > 0
