"""A hung job across real processes: a controller, two simulated-GPU agents (node-a, node-b), and
``vigil launch`` running the bundled MoE job with one gloo rank per node. node-b's rank stops before
a step's collectives (an application hang: it sleeps); node-a's rank waits in them, its hook's
reporter still heartbeating. The controller finds the job hung past the bound its own steps set,
pages once, and cordons nothing; ``vigil jobs`` shows HUNG; the launcher takes the ranks' stacks and
the page's thread names rank 1 on node-b, in the job's own code, as where it is stuck."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

pytest.importorskip("torch", reason="the training job needs torch (make test installs the CPU build)")

from tests.e2e.processes import JobCluster, job_cluster, json_lines  # noqa: E402
from tests.helpers import poll_until  # noqa: E402
from vigil.admin_client import AdminClient  # noqa: E402
from vigil.launch import LOCAL_STOP_GRACE_S  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

# Steps of at least 80 ms: the hook reports a window per 10 steps and 0.5 s, the first (warm-up) not
# learnt from, so the step-20 window is learnt before the hang at step 25 or 30 (at 30 ms a step on an
# idle machine, steps 0-25 fit in one window: no bound learnt, and the hang would wait unlearned_s).
ARGS = ("--steps", "400", "--global-batch", "6", "--checkpoint-every", "10", "--step-floor-s", "0.08")
ENV = {"VIGIL_WINDOW_STEPS": "10", "OMP_NUM_THREADS": "1"}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[JobCluster]:
    # A test's patience (the default floor is 10 s). No save asked on early warnings: the SXid the
    # hardware test writes is one, and a save that a hung rank blocks says "checkpoint" until
    # jobs.hang.pause_limit_s, which would make that test a race on when the ask lands.
    jobs = {"hang": {"floor_s": 3.0, "factor": 8.0, "abort_after_s": 2.0}, "checkpoint_now": False}
    with job_cluster(tmp_path, pager="console", jobs=jobs) as c:
        yield c


def _stop(launcher: subprocess.Popen[bytes]) -> None:
    """Stop the launcher as a scheduler does (SIGTERM): it stops its ranks, a hung one too (SIGKILL
    after its grace), and ends with nothing left; whatever is left after that is killed, and fails."""
    tree = [psutil.Process(launcher.pid), *psutil.Process(launcher.pid).children(recursive=True)]
    launcher.send_signal(signal.SIGTERM)
    try:
        launcher.wait(timeout=LOCAL_STOP_GRACE_S + 20)
        _, left = psutil.wait_procs(tree[1:], timeout=5)
    finally:
        for proc in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        psutil.wait_procs(tree, timeout=10)
    assert not left, f"ranks left running after the launcher stopped: {left}"


def test_a_rank_that_stops_is_found_hung_paged_once_and_nothing_is_cordoned(cluster: JobCluster) -> None:
    launcher = cluster.launch(
        "moe", ["node-a", "node-b"], [*ARGS, "--hang-node", "node-b", "--hang-at-step", "25"], ENV
    )
    try:
        with AdminClient(cluster.controller) as admin:
            poll_until(lambda: any(j.hung_s > 0 for j in admin.jobs()), timeout=150, what="the job shown hung")
            (job,) = admin.jobs()
            health = {n.node: n.health for n in admin.status().nodes}
        ranks = "".join(p.read_text() for p in sorted((cluster.tmp / "ranks").glob("*")) if p.is_file())
        assert "injected: rank 1 hangs at step 25" in ranks
        assert job.state == "running" and job.step == 25  # rank 0 finished step 25, then waited for rank 1
        (hung,) = [e for e in json_lines(cluster.tmp / "ctl.log") if e["event"] == "job_hung"]
        # The log rounds both to 0.1 s, so a hang judged just past its bound can read equal to it.
        assert hung["step"] == 25 and not hung["silent"] and hung["stalled_s"] >= hung["bound_s"] >= 3.0
        pages = (cluster.tmp / "ctl.out").read_text()
        assert (
            pages.count("incident hang-moe-") == 1
            and "no step for" in pages
            and "nothing taken out of service" in pages
        )
        # The launcher takes the ranks' stacks (SIGUSR2): rank 1 never entered the collective rank 0 waits in.
        out = cluster.tmp / "ctl.out"
        said = poll_until(lambda: [ln for ln in out.read_text().splitlines() if "WAVEFRONT" in ln], timeout=30)
        assert isinstance(said, list) and len(said) == 1
        assert "application: rank 1 on node-b at inject.py:" in said[0] and "1 rank(s) wait in a collective" in said[0]
        # Its flight recorder, read by the hook's own thread while the training thread sleeps: rank 1
        # never entered the collective rank 0 waits in.
        assert "(flight recorder: default_pg: rank 1 never entered gloo:" in said[0], said[0]
        assert health == {"node-a": "HEALTHY", "node-b": "HEALTHY"}  # a hang alone cordons nothing
        shown = subprocess.run(
            [sys.executable, "-m", "vigil", "jobs", "--controller", cluster.controller],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert "HUNG" in shown.stdout, shown.stdout + shown.stderr
    finally:
        _stop(launcher)


def test_a_stopped_rank_is_named_as_the_host_that_does_not_answer(cluster: JobCluster) -> None:
    launcher = cluster.launch("moe", ["node-a", "node-b"], ARGS, ENV)
    try:
        with AdminClient(cluster.controller) as admin:
            poll_until(lambda: any(j.step >= 25 for j in admin.jobs()), timeout=150, what="25 steps")
            ranks = [p for p in psutil.Process(launcher.pid).children() if p.environ().get("VIGIL_NODE") == "node-b"]
            (rank1,) = ranks
            rank1.suspend()  # SIGSTOP: a frozen host, as far as its rank goes
            poll_until(lambda: any(j.hung_s > 0 for j in admin.jobs()), timeout=60, what="the job shown hung")
        out = cluster.tmp / "ctl.out"
        said = poll_until(lambda: [ln for ln in out.read_text().splitlines() if "WAVEFRONT" in ln], timeout=30)
        assert isinstance(said, list) and len(said) == 1
        assert "host: rank 1 on node-b: no answer (stopped or frozen; kernel state T" in said[0], said[0]
    finally:
        _stop(launcher)


def test_a_rank_blocked_in_a_read_is_named_io_from_the_kernels_view_and_nothing_is_cordoned(
    cluster: JobCluster,
) -> None:
    """node-b's rank blocks reading a FIFO nobody writes (a data loader on a dead mount): the read is in
    C, so its innermost Python frame is the job's own; the kernel's view of it (wchan) says the read."""
    # At step 30, just after a scheduled save (every 10): the save's "checkpoint" pause ends with the
    # save, so rank 0 then waiting for rank 1 is a hang, not a save.
    args = [*ARGS, "--hang-node", "node-b", "--hang-at-step", "30", "--hang-how", "read"]
    launcher = cluster.launch("moe", ["node-a", "node-b"], args, ENV)
    try:
        out = cluster.tmp / "ctl.out"
        said = poll_until(lambda: [ln for ln in out.read_text().splitlines() if "WAVEFRONT" in ln], timeout=180)
        assert isinstance(said, list) and len(said) == 1
        assert "I/O or data loading: rank 1 on node-b at inject.py:" in said[0] and "pipe" in said[0], said[0]
        note = poll_until(lambda: [ln for ln in out.read_text().splitlines() if "NO-EVIDENCE" in ln], timeout=30)
        assert isinstance(note, list) and "not the hardware" in note[0]
        with AdminClient(cluster.controller) as admin:
            assert {n.health for n in admin.status().nodes} == {"HEALTHY"}
    finally:
        _stop(launcher)


def test_a_hang_every_rank_waits_in_joined_with_a_nodes_own_signal_takes_that_node_out_and_restarts(
    cluster: JobCluster,
) -> None:
    """node-b's rank waits for a tensor nobody sends (as on a broken link) while node-a's waits in its
    all-reduce: every rank in a collective, the network or a GPU. node-b's NVSwitch reported a non-fatal
    SXid just before (alone, recorded only): joined with the hang, that is the evidence. node-b is
    quarantined, the hung job is aborted (it cannot save) and starts again on node-a alone."""
    args = [*ARGS, "--hang-node", "node-b", "--hang-at-step", "25", "--hang-how", "collective"]
    launcher = cluster.launch("moe", ["node-a", "node-b"], args, ENV)
    try:
        with AdminClient(cluster.controller) as admin:
            poll_until(lambda: any(j.step >= 15 for j in admin.jobs()), timeout=150, what="15 steps")
            sxid = "nvidia-nvswitch0: SXid (PCI:0000:c5:00.0): 12028, Non-fatal, Link 7 egress non-posted PRIV error"
            cluster.kernel_line("node-b", sxid)

            def health() -> dict[str, str]:
                return {n.node: n.health for n in admin.status().nodes}

            poll_until(lambda: health()["node-b"] == "QUARANTINED", timeout=120, what="node-b quarantined")
            assert health()["node-a"] == "HEALTHY"
            poll_until(
                lambda: any(j.restart_count >= 1 and j.state == "running" for j in admin.jobs()),
                timeout=90,
                what="the job started again",
            )
        out = (cluster.tmp / "ctl.out").read_text()
        (wave,) = [ln for ln in out.splitlines() if "WAVEFRONT" in ln]
        assert "waits in a collective: the network or a GPU" in wave, wave
        (hardware,) = [ln for ln in out.splitlines() if "HARDWARE" in ln]
        assert "node-b: SXID_NONFATAL 12028" in hardware and "quarantine requested" in hardware, hardware
        starts = [e for e in json_lines(cluster.tmp / "launch.log") if e.get("event") == "job_starting"]
        assert [s["nodes"] for s in starts] == [["node-a", "node-b"], ["node-a"]]
        assert any(e.get("event") == "job_deadline_passed_killing" for e in json_lines(cluster.tmp / "launch.log"))
    finally:
        _stop(launcher)


def test_saves_slower_than_the_bound_are_not_hangs(cluster: JobCluster) -> None:
    """Each scheduled save takes 6 s more, twice the job's hang bound here: the job says so (pause
    "checkpoint"), so none is taken for a hang."""
    launcher = cluster.launch("moe", ["node-a", "node-b"], [*ARGS, "--slow-save-s", "6"], ENV)
    try:
        with AdminClient(cluster.controller) as admin:
            poll_until(lambda: any(j.step >= 42 for j in admin.jobs()), timeout=200, what="past four slow saves")
        events = json_lines(cluster.tmp / "ctl.log")
        assert not [e for e in events if e["event"] == "job_hung"]
        assert "hang-moe" not in (cluster.tmp / "ctl.out").read_text()
        run = [json.loads(ln) for ln in (cluster.tmp / "run" / "metrics.jsonl").read_text().splitlines()]
        assert len([e for e in run if e.get("event") == "checkpoint" and e["step"] <= 40]) == 4
    finally:
        _stop(launcher)
