"""The trainer gateway over real gRPC: a real controller, simulated agents, and a test playing a
job's rank 0 (Progress) and its launcher (Plan). The real job, hook and launcher across processes
are in ``tests/e2e/test_job_restart.py``."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import structlog.testing

from controller.config import ControllerConfig, JobsConfig, LimitsConfig
from controller.daemon import Controller
from controller.jobs.hang import HangConfig
from controller.planning.plan import job_plan
from protos.vigil.v1 import admin_pb2, admin_pb2_grpc, agent_pb2, common_pb2, trainer_pb2, trainer_pb2_grpc
from tests.fakes.fleet import Fleet
from tests.fakes.sim_checks import SimulatedChecks
from tests.helpers import stop_controller, wait_until
from trainer_hooks.hook import HookConfig, VigilHook

NODES = ["node-0", "node-1", "node-2"]
FAST = JobsConfig(warmup_windows=1, baseline_windows=2, drop_windows=2, deadline_s=30)


@dataclass
class Rig:
    controller: Controller
    fleet: Fleet
    checks: SimulatedChecks
    trainer: trainer_pb2_grpc.TrainerGatewayStub
    admin: admin_pb2_grpc.AdminStub

    async def window(self, mfu: float, slow: dict[int, float] | None = None, **fields: Any) -> list[str]:
        """One window of job "moe": one rank per node, rank ``r`` taking ``slow[r]`` s (else 0.1 s)."""
        times = [
            trainer_pb2.RankStepTime(rank=r, node=n, step_time_s=(slow or {}).get(r, 0.1)) for r, n in enumerate(NODES)
        ]
        p = trainer_pb2.Progress(
            job_id="moe", step=fields.pop("step", 10), nodes=NODES, world_size=3, tokens=3000, mfu=mfu,
            tokens_per_s=3000.0, step_times=times, **fields,
        )  # fmt: skip
        reply = await self.trainer.Report(p)
        return [c.checkpoint_and_restart.id for c in reply.commands]

    async def stepped_to_30(self) -> None:
        """Job "moe" started and stepped to 30, 10 steps in 0.1 s a window: its hang bound is its floor."""
        now = time.time()
        await self.window(0.5, event="start", step=0, window_end=now)
        for step in (10, 20, 30):
            await self.window(0.5, step=step, window_start=now, window_end=now + 0.1)

    async def plan(self, stopped: bool = False, nodes: list[str] = NODES) -> trainer_pb2.PlanReply:
        return await self.trainer.Plan(trainer_pb2.PlanRequest(job_id="moe", nodes=nodes, stopped=stopped))

    def actions(self, incident_prefix: str) -> list[tuple[str, str, str]]:
        rows = self.controller.store.read(
            "SELECT incident_id, kind, detail FROM actions WHERE incident_id LIKE ? ORDER BY requested_at",
            (f"{incident_prefix}%",),
        )
        return [(str(a), str(b), str(c)) for a, b, c in rows]


@asynccontextmanager
async def rig(tmp_path: Path, jobs: JobsConfig = FAST, heartbeat_s: float = 5.0, **config: Any) -> AsyncIterator[Rig]:
    cfg = ControllerConfig(
        listen="127.0.0.1", port=0, database=tmp_path / "ctl.db", pager="none", jobs=jobs, plaintext=True, **config
    )
    controller = Controller(cfg)
    await controller.start()
    checks = SimulatedChecks()
    fleet = Fleet(f"127.0.0.1:{controller.port}", NODES, heartbeat_s, checks=checks)
    await fleet.start(timeout_s=20)
    watcher_stop = asyncio.Event()
    watcher = asyncio.create_task(controller.jobs.watch(watcher_stop, every_s=0.05))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.port}") as channel:
            trainer, admin = trainer_pb2_grpc.TrainerGatewayStub(channel), admin_pb2_grpc.AdminStub(channel)
            yield Rig(controller, fleet, checks, trainer, admin)
    finally:
        watcher_stop.set()
        await watcher
        await fleet.close()
        await controller.jobs.stop()
        await controller.sweeper.stop()
        await stop_controller(controller)


def run(tmp_path: Path, test: Callable[[Rig], Awaitable[None]], **cfg: Any) -> None:
    async def scenario() -> None:
        async with rig(tmp_path, **cfg) as r:
            await test(r)

    asyncio.run(scenario())


async def learn_baseline(r: Rig, mfu: float = 0.5) -> None:
    await r.window(mfu, event="start", step=0)
    for _ in range(1 + FAST.baseline_windows):  # warm-up, then the baseline
        assert await r.window(mfu) == []


def test_a_quarantined_node_stops_its_job_which_restarts_without_it(tmp_path: Path) -> None:
    async def test(r: Rig) -> None:
        await learn_baseline(r)
        r.fleet.nodes["node-1"].fault(79)
        await wait_until(lambda: r.controller.jobs.jobs["moe"].command is not None, what="the job's command")
        (command_id,) = await r.window(0.5)
        command = r.controller.jobs.jobs["moe"].command
        assert command is not None and list(command.exclude_nodes) == ["node-1"]
        assert "XID 79" in command.reason and command.deadline > r.controller.engine.clock()

        plan = await r.plan()  # the launcher sees the command too (it enforces the deadline)
        assert [c.checkpoint_and_restart.id for c in plan.commands] == [command_id]
        ack = trainer_pb2.CommandAck(id=command_id, checkpoint_step=12)
        assert await r.window(0.5, event="checkpointed", step=12, acks=[ack]) == []
        plan = await r.plan(stopped=True)
        assert plan.ready and list(plan.exclude_nodes) == ["node-1"] and not plan.commands

        # The restart on the two others: a new start, no command, and the incident's thread says so.
        restarted = trainer_pb2.Progress(job_id="moe", step=12, restart_count=1, nodes=["node-0", "node-2"],
                                         event="start")  # fmt: skip
        assert not (await r.trainer.Report(restarted)).commands
        await wait_until(lambda: any("JOB-RESUMED" in k for _, k, _ in r.actions("node-1")), what="resumed note")
        notes = [k for _, k, _ in r.actions("node-1")]
        assert notes.index("NOTE:JOB-STOPPING:moe") < notes.index("NOTE:JOB-CHECKPOINTED:moe")

    run(tmp_path, test)


def test_an_mfu_drop_with_a_straggler_stops_the_job_sweeps_the_rest_and_restarts_without_it(tmp_path: Path) -> None:
    async def test(r: Rig) -> None:
        await learn_baseline(r)
        assert await r.window(0.3, slow={2: 0.3}) == []  # one low window is not yet a drop
        (command_id,) = await r.window(0.3, slow={2: 0.3})
        job = r.controller.jobs.jobs["moe"]
        assert job.command is not None and list(job.command.exclude_nodes) == ["node-2"]
        assert "rank 2 on node-2: step time" in job.command.reason
        # node-2 went through the engine as a failed check: policy, guardrails, quarantine.
        assert r.controller.engine.fleet.nodes["node-2"].state.health.value in ("UNHEALTHY", "QUARANTINED")
        assert not r.checks.requests  # nothing is swept while the job still runs on the GPUs

        plan = await r.plan(stopped=True)  # the job exited (its acknowledgement was lost)
        await wait_until(lambda: len(r.checks.requests) == 2, what="the recovery sweep")
        assert sorted(node for node, run in r.checks.requests) == ["node-0", "node-1"]
        assert {run.check for _, run in r.checks.requests} == {"gpu_health"}
        for _ in range(100):
            plan = await r.plan(stopped=True)
            if plan.ready:
                break
            await asyncio.sleep(0.05)
        assert plan.ready and list(plan.exclude_nodes) == ["node-2"] and "sweep-" in plan.detail
        assert command_id not in [c.checkpoint_and_restart.id for c in plan.commands]

    run(tmp_path, test)


def test_a_blame_acts_only_on_a_node_whose_own_agent_sees_the_job(tmp_path: Path) -> None:
    """Under TLS (and wherever configured) a job's word alone never takes a node out: node-2's agent
    does not see job moe's processes, so the drop blamed on it is paged and nothing is cordoned;
    once its agent reports the job, the next drop is acted on."""

    async def test(r: Rig) -> None:
        await learn_baseline(r)
        for _ in range(FAST.drop_windows):
            assert await r.window(0.3, slow={2: 0.3}) == []
        assert r.controller.engine.fleet.nodes["node-2"].state.health.value == "HEALTHY"
        assert r.controller.engine.metrics.blame_unconfirmed._value.get() == 1
        await wait_until(lambda: r.actions("mfu-moe-1"), what="the drop's page")
        assert [kind for _, kind, _ in r.actions("mfu-moe-1")] == ["PAGE:suspect"]

        r.fleet.nodes["node-2"].jobs = ["moe"]
        r.fleet.nodes["node-2"].beat()
        await wait_until(lambda: r.controller.engine.fleet.runs_job("node-2", "moe"), what="node-2's agent saw moe")
        assert await r.window(0.5) == []  # back to its baseline, then a second drop: acted on
        for _ in range(FAST.drop_windows - 1):
            assert await r.window(0.3, slow={2: 0.3}) == []
        assert len(await r.window(0.3, slow={2: 0.3})) == 1  # the job is told to stop
        assert r.controller.engine.fleet.nodes["node-2"].state.health.value in ("UNHEALTHY", "QUARANTINED")

    run(tmp_path, test, jobs=FAST.model_copy(update={"blame_needs_agents": True}))


def test_a_drop_nobody_is_to_blame_for_pages_and_the_job_runs_on(tmp_path: Path) -> None:
    async def test(r: Rig) -> None:
        await learn_baseline(r)
        assert await r.window(0.3) == []
        assert await r.window(0.3) == []
        assert r.controller.jobs.jobs["moe"].command is None
        await wait_until(lambda: r.actions("mfu-moe-1"), what="the page")
        ((_, kind, _),) = r.actions("mfu-moe-1")
        assert kind == "PAGE:suspect"

    run(tmp_path, test)


def test_the_first_window_after_a_restart_is_warm_up_and_never_a_drop(tmp_path: Path) -> None:
    async def test(r: Rig) -> None:
        await learn_baseline(r)
        await r.window(0.5, event="start", restart_count=1, step=0)
        # Slow right after the restart (compilation, a cold cache): twice, which after warm-up would be a drop.
        assert await r.window(0.05, restart_count=1, slow={2: 0.3}) == []
        job = r.controller.jobs.jobs["moe"]
        assert job.track.baseline is None and job.drops == 0
        for _ in range(FAST.baseline_windows):
            await r.window(0.45, restart_count=1)
        assert job.track.baseline == pytest.approx(0.45)  # learnt again, not the old 0.5

    run(tmp_path, test)


def test_past_the_deadline_the_job_counts_as_stopped(tmp_path: Path) -> None:
    async def test(r: Rig) -> None:
        await learn_baseline(r)
        await r.window(0.3, slow={2: 0.3})
        await r.window(0.3, slow={2: 0.3})
        # No acknowledgement, no word from the launcher: the deadline alone starts the recovery.
        await wait_until(lambda: r.checks.requests, timeout=10, what="the sweep after the deadline")
        assert r.controller.jobs.jobs["moe"].stopped

    run(tmp_path, test, jobs=FAST.model_copy(update={"deadline_s": 0.3}))


def test_in_dry_run_a_blamed_drop_pages_and_stops_nothing(tmp_path: Path) -> None:
    async def test(r: Rig) -> None:
        await learn_baseline(r)
        await r.window(0.3, slow={2: 0.3})
        assert await r.window(0.3, slow={2: 0.3}) == []
        await wait_until(lambda: r.actions("mfu-moe-1"), what="the page")
        assert "took no action" in str(r.controller.store.read("SELECT payload FROM actions"))

    from controller.nodes.guards.rules import GuardrailConfig

    run(tmp_path, test, guardrails=GuardrailConfig(dry_run=True))


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"job_id": "bad id!"}, "job_id"),
        ({"job_id": "moe", "mfu": float("nan")}, "mfu"),
        ({"job_id": "moe", "mfu": 7.0}, "fraction of the peak"),
        ({"job_id": "moe", "step": -1}, "must be >= 0"),
        ({"job_id": "moe", "nodes": ["Not_A_Node"]}, "not a node name"),
        ({"job_id": "moe", "restore_s": -1.0}, "restore_s must be >= 0"),
        ({"job_id": "moe", "window_start": 20.0, "window_end": 10.0}, "window_end not before window_start"),
    ],
)
def test_bad_reports_are_refused_by_name_and_the_server_keeps_serving(
    tmp_path: Path, fields: dict[str, Any], named: str
) -> None:
    async def test(r: Rig) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await r.trainer.Report(trainer_pb2.Progress(**fields))
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT and named in (refused.value.details() or "")
        assert await r.window(0.5, event="start") == []

    run(tmp_path, test)


def test_list_jobs_reports_each_jobs_state_and_where_its_time_went(tmp_path: Path) -> None:
    """A run with two windows, a fault, a stop that commits step 25, and a restart 8 s later: the
    time after the last window is productive up to the stop's save, and the gap is recovery."""

    async def test(r: Rig) -> None:
        async def jobs() -> dict[str, admin_pb2.JobStatus]:
            return {j.job_id: j for j in (await r.admin.ListJobs(admin_pb2.JobsRequest())).jobs}

        await r.window(0.5, event="start", step=0, window_end=1000.0)
        await r.window(0.5, step=10, window_start=1000.0, window_end=1010.0, checkpoint_s=1.0, committed_step=10)
        await r.window(0.5, step=20, window_start=1010.0, window_end=1020.0, committed_step=10)
        r.fleet.nodes["node-1"].fault(79)
        await wait_until(lambda: r.controller.jobs.jobs["moe"].command is not None, what="the job's command")
        assert (await jobs())["moe"].state == "stopping"
        (command_id,) = await r.window(0.5, event="heartbeat", window_end=1022.0)
        ack = trainer_pb2.CommandAck(id=command_id, checkpoint_step=25)
        await r.window(0.5, event="checkpointed", step=25, window_end=1026.0, checkpoint_s=2.0, acks=[ack])
        stopped = (await jobs())["moe"]
        assert (stopped.state, list(stopped.excluded)) == ("stopped", ["node-1"])
        await r.trainer.Report(trainer_pb2.Progress(job_id="moe", step=25, restart_count=1, nodes=["node-0", "node-2"],
                                                    event="start", window_end=1034.0, restore_s=1.5))  # fmt: skip
        j = (await jobs())["moe"]
        assert (j.state, j.restart_count, list(j.nodes), j.step) == ("running", 1, ["node-0", "node-2"], 25)
        assert (j.productive_s, j.checkpoint_s, j.restore_s, j.wasted_s) == (23.0, 3.0, 1.5, 0.0)
        assert j.recovery_s == pytest.approx(34 - 26 - 1.5) and j.goodput == pytest.approx(23 / 34)
        # Beside the goodput, the plan for a job of its size from its own times: two saves of 1.5 s
        # on average, one restart of 8 s back to training (vigil plan's model, the default rate).
        planned = job_plan(3, 1.0, save_s=1.5, restart_s=8.0)
        assert planned is not None and (j.gpus, j.planned_save_s) == (3, 1.5)
        assert (j.planned_ettr, j.recommended_checkpoint_s) == pytest.approx((planned.ettr, planned.interval_s))
        gauge = r.controller.engine.metrics.job_recommended_checkpoint.labels("moe")._value.get()
        assert gauge == pytest.approx(planned.interval_s)
        command = [sys.executable, "-m", "vigil", "jobs", "--controller", f"127.0.0.1:{r.controller.port}"]
        shown = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=60)
        assert f"{planned.ettr:.1%}" in shown.stdout and "(a save: 1.5 s)" in shown.stdout, shown.stderr
        await r.window(0.5, event="end", step=25, window_end=1035.0)
        assert (await jobs())["moe"].state == "finished"
        metrics = r.controller.engine.metrics
        assert metrics.job_time.labels("moe", "recovery")._value.get() == pytest.approx(6.5)

    run(tmp_path, test)


def test_a_blamed_node_whose_quarantine_the_breaker_holds_stops_no_job(tmp_path: Path) -> None:
    """node-0's XID uses the breaker's allowance (one node of three); node-2, blamed for the drop of
    a job on node-1 and node-2, is held: the job runs on and a person is paged."""

    async def report(r: Rig, mfu: float, slow: float = 0.1, **fields: Any) -> list[trainer_pb2.JobCommand]:
        times = [trainer_pb2.RankStepTime(rank=0, node="node-1", step_time_s=0.1),
                 trainer_pb2.RankStepTime(rank=1, node="node-2", step_time_s=slow)]  # fmt: skip
        p = trainer_pb2.Progress(job_id="pair", nodes=["node-1", "node-2"], world_size=2, tokens=2000, mfu=mfu,
                                 tokens_per_s=2000.0, step_times=times, **{"step": 10, **fields})  # fmt: skip
        return list((await r.trainer.Report(p)).commands)

    async def test(r: Rig) -> None:
        r.fleet.nodes["node-0"].fault(79)
        await wait_until(lambda: r.controller.engine.fleet.nodes["node-0"].state.health.value == "QUARANTINED",
                         what="node-0 quarantined")  # fmt: skip
        await report(r, 0.5, event="start", step=0)
        for _ in range(1 + FAST.baseline_windows):
            assert await report(r, 0.5) == []
        for _ in range(FAST.drop_windows):
            assert await report(r, 0.2, slow=0.3) == []
        await wait_until(lambda: r.controller.engine.guard.breaker.held, what="the quarantine held")
        assert await report(r, 0.2, slow=0.3) == [] and r.controller.jobs.jobs["pair"].command is None
        assert r.controller.engine.fleet.nodes["node-2"].state.health.value == "UNHEALTHY"
        assert any(kind.startswith("PAGE") for _, kind, _ in r.actions("mfu-pair-1"))

    run(tmp_path, test)


def test_a_job_calling_too_often_is_refused_and_other_jobs_are_not(tmp_path: Path) -> None:
    async def test(r: Rig) -> None:
        codes = []
        for _ in range(5):
            try:
                await r.window(0.5, event="heartbeat")
                codes.append(grpc.StatusCode.OK)
            except grpc.aio.AioRpcError as exc:
                codes.append(exc.code())
        assert codes[:3] == [grpc.StatusCode.OK] * 3 and grpc.StatusCode.RESOURCE_EXHAUSTED in codes[3:]
        other = trainer_pb2.PlanRequest(job_id="other", nodes=["node-0"])
        assert (await r.trainer.Plan(other)).ready

    run(tmp_path, test, limits=LimitsConfig(reports_per_s=0.5, report_burst=3))


def _fast_job(target: str, steps: int) -> tuple[bool, int, int]:
    """The real hook on one rank, ``steps`` steps of about 1 ms, then its end: (delivered, calls
    refused, calls sent)."""
    hook = VigilHook(HookConfig(job_id="fast", controller=target, node="node-0", poll_s=0.2))
    hook.start()
    for step in range(1, steps + 1):
        time.sleep(0.001)
        hook.step_end(step, 100, 0.001)
    reporter = hook._reporter
    assert reporter is not None
    return hook.end(), reporter.refused, reporter.sent


def _finished_at(r: Rig) -> Callable[[], Awaitable[tuple[str, int]]]:
    async def state() -> tuple[str, int]:
        job = {j.job_id: j for j in (await r.admin.ListJobs(admin_pb2.JobsRequest())).jobs}["fast"]
        return job.state, job.step

    return state


def test_a_job_stepping_in_milliseconds_is_paced_under_the_limit_and_its_end_arrives(tmp_path: Path) -> None:
    """3,000 steps of 1 ms with the real hook, the controller allowing 2.5 calls a second: the
    reporter paces its calls (windows at least 0.5 s long), none is refused, and the job's end
    arrives: finished at step 3,000 (not "running" at the last window's step)."""

    async def test(r: Rig) -> None:
        target = f"127.0.0.1:{r.controller.port}"
        delivered, refused, sent = await asyncio.to_thread(_fast_job, target, 3000)
        assert (delivered, refused) == (True, 0) and sent >= 3
        assert await _finished_at(r)() == ("finished", 3000)

    run(tmp_path, test, limits=LimitsConfig(reports_per_s=2.5, report_burst=3))


def test_a_job_over_a_stricter_limit_is_told_so_waits_and_its_end_still_arrives(tmp_path: Path) -> None:
    """A controller allowing one call every 2 s: the hook's calls are refused, logged as a refusal
    over the rate (not "unreachable"), sent again after a pause, and the end is delivered."""

    async def test(r: Rig) -> None:
        target = f"127.0.0.1:{r.controller.port}"
        with structlog.testing.capture_logs() as logs:
            delivered, refused, _ = await asyncio.to_thread(_fast_job, target, 2000)
        assert delivered and refused > 0
        said = [e for e in logs if e["event"] == "vigil_report_over_rate"]  # once per run of refusals
        assert 1 <= len(said) <= refused
        assert "refused the call, over its limit" in said[0]["error"] and "times/s" in said[0]["error"]
        assert not [e for e in logs if e["event"] == "vigil_controller_unreachable"]
        assert await _finished_at(r)() == ("finished", 2000)

    run(tmp_path, test, limits=LimitsConfig(reports_per_s=0.5, report_burst=2))


def test_a_jobs_figures_come_in_the_unit_it_reports(tmp_path: Path) -> None:
    """MFU where the job knows its GPUs' peak, tokens/s where it does not: two fields, never one
    figure whose unit is guessed from its size."""

    async def test(r: Rig) -> None:
        await learn_baseline(r, mfu=0.5)
        (j,) = (await r.admin.ListJobs(admin_pb2.JobsRequest())).jobs
        assert (j.baseline_mfu, j.last_mfu, j.baseline_tokens_per_s) == (pytest.approx(0.5), pytest.approx(0.5), 0.0)
        for _ in range(1 + FAST.baseline_windows):  # the peak is no longer known: tokens/s from here
            await r.window(0.0)
        (j,) = (await r.admin.ListJobs(admin_pb2.JobsRequest())).jobs
        assert (j.baseline_mfu, j.baseline_tokens_per_s, j.last_tokens_per_s) == (0.0, 3000.0, 3000.0)

    run(tmp_path, test)


def test_new_jobs_beyond_max_jobs_are_refused_and_followed_jobs_go_on(tmp_path: Path) -> None:
    """Job ids are the client's to choose: 12,000 of them were all kept. Beyond ``jobs.max_jobs`` a
    new id is refused (RESOURCE_EXHAUSTED, named); the jobs already followed report on, and a
    finished job's place is free at once."""

    async def test(r: Rig) -> None:
        async def report(job_id: str, event: str = "") -> grpc.StatusCode:
            p = trainer_pb2.Progress(job_id=job_id, step=1, nodes=["node-0"], world_size=1, event=event)
            try:
                await r.trainer.Report(p)
            except grpc.aio.AioRpcError as exc:
                assert "jobs.max_jobs" in str(exc.details())
                return exc.code()
            return grpc.StatusCode.OK

        assert [await report(f"job-{i}") for i in range(4)] == [grpc.StatusCode.OK] * 3 + [
            grpc.StatusCode.RESOURCE_EXHAUSTED
        ]
        assert await report("job-0") == grpc.StatusCode.OK  # a followed job goes on
        assert await report("job-1", event="end") == grpc.StatusCode.OK  # finished: its place is free
        assert await report("job-3") == grpc.StatusCode.OK
        assert len((await r.admin.ListJobs(admin_pb2.JobsRequest())).jobs) == 4  # 3 followed, 1 finished

    run(tmp_path, test, jobs=FAST.model_copy(update={"max_jobs": 3}))


def test_early_signs_on_a_jobs_node_ask_it_to_save_and_the_reply_says_how_often(tmp_path: Path) -> None:
    """An XID no catalog has makes node-1 SUSPECT: the job's next reply asks for a
    checkpoint now (not a stop); it goes out until the job acknowledges it. Every reply carries the
    recommended interval."""

    async def test(r: Rig) -> None:
        async def reply(**fields: Any) -> trainer_pb2.ReportReply:
            p = trainer_pb2.Progress(job_id="moe", nodes=NODES, world_size=3, **{"step": 10, **fields})
            return await r.trainer.Report(p)

        first = await reply(event="start", step=0)
        planned = job_plan(3, 1.0, None, None)
        assert planned is not None and first.recommended_checkpoint_s == pytest.approx(planned.interval_s)
        assert list(first.commands) == []
        r.fleet.nodes["node-1"].fault(4000, message="an error no catalog has")
        health = r.controller.engine.fleet.health
        await wait_until(lambda: health("node-1") is not None and health("node-1").value == "SUSPECT", what="SUSPECT")
        (command,) = (await reply()).commands
        assert command.HasField("checkpoint_now") and command.checkpoint_now.reason == "node-1 is SUSPECT"
        assert (await reply()).commands[0].checkpoint_now.id == command.checkpoint_now.id  # until acknowledged
        ack = trainer_pb2.CommandAck(id=command.checkpoint_now.id, checkpoint_step=12)
        assert list((await reply(step=12, acks=[ack])).commands) == []
        assert r.controller.engine.metrics.checkpoint_now.labels("moe")._value.get() == 1
        assert r.controller.jobs.jobs["moe"].phase.value == "running"  # saved, never stopped

    run(tmp_path, test)


HANGS = FAST.model_copy(update={"hang": HangConfig(floor_s=0.6, factor=3, unlearned_s=5)})
HANGS_JOINED = FAST.model_copy(
    update={"hang": HangConfig(floor_s=0.6, factor=3, unlearned_s=5, stacks_wait_s=0.5, abort_after_s=5)}
)


def test_a_job_whose_step_stops_while_rank_0_heartbeats_is_hung_paged_once_and_cleared(tmp_path: Path) -> None:
    async def test(r: Rig) -> None:
        async def moe() -> admin_pb2.JobStatus:
            return {j.job_id: j for j in (await r.admin.ListJobs(admin_pb2.JobsRequest())).jobs}["moe"]

        now = time.time()
        await r.window(0.5, event="start", step=0, window_end=now)
        for step in (10, 20, 30):  # 10 steps in 0.1 s: the bound is its floor, 0.6 s
            await r.window(0.5, step=step, window_start=now, window_end=now + 0.1)
        for _ in range(4):  # a long save, said: no hang
            await r.window(0.5, event="heartbeat", step=30, pause="checkpoint")
            await asyncio.sleep(0.25)
        assert (await moe()).hung_s == 0 and (await moe()).pause == "checkpoint"
        await r.window(0.5, step=40, window_start=now, window_end=now + 0.1)
        for _ in range(6):  # rank 0 reports, its step does not move: a rank is stuck
            await r.window(0.5, event="heartbeat", step=40)
            await asyncio.sleep(0.2)
        job = await moe()
        assert job.hung_s > 0.6 and job.state == "running"
        (page,) = [a for a in r.actions("hang-moe-") if a[1].startswith("PAGE")]
        assert page[0] == "hang-moe-1"
        (payload,) = r.controller.store.read("SELECT payload FROM actions WHERE incident_id = 'hang-moe-1'")
        assert (
            "no step for" in payload[0] and "at step 40" in payload[0] and "nothing taken out of service" in payload[0]
        )
        assert r.controller.engine.metrics.job_hung.labels("moe")._value.get() > 0.6
        assert {n.node: n.health for n in (await r.admin.GetStatus(admin_pb2.StatusRequest())).nodes} == {
            n: "HEALTHY" for n in NODES
        }  # a hang alone cordons nothing
        await r.window(0.5, step=50, window_start=now, window_end=now + 0.1)
        await wait_until(lambda: len(r.actions("hang-moe-1")) == 2, what="the hang's page resolved")
        assert [a[1] for a in r.actions("hang-moe-1")] == ["PAGE:suspect", "NOTE:RESUMED"]
        assert (await moe()).hung_s == 0

    run(tmp_path, test, jobs=HANGS)


def test_a_job_gone_silent_is_hung_too(tmp_path: Path) -> None:
    async def test(r: Rig) -> None:
        await r.stepped_to_30()
        await wait_until(lambda: r.controller.jobs.jobs["moe"].hang is not None, timeout=10, what="a hang")
        hang = r.controller.jobs.jobs["moe"].hang
        assert hang is not None and hang.silent
        r.fleet.nodes["node-1"].fault(79)  # a node of it goes: the job is told to stop, no longer a hang to watch
        await wait_until(lambda: r.controller.jobs.jobs["moe"].hang is None, timeout=10, what="the hang cleared")
        assert r.controller.jobs.jobs["moe"].state == "stopping"
        await wait_until(lambda: len(r.actions("hang-moe-1")) == 2, what="the hang's page resolved")
        (note,) = r.controller.store.read("SELECT payload FROM actions WHERE kind = 'NOTE:RESUMED'")
        assert "the job is stopping now" in note[0]

    run(tmp_path, test, jobs=HANGS)


def test_a_hung_job_without_stacks_joined_with_a_nodes_own_signal_takes_that_node_out(tmp_path: Path) -> None:
    """A job not under vigil launch gives no stacks: after ``stacks_wait_s`` its hang is judged without
    them. node-2's NVLink error counters grew just before (recorded only, alone): that is the evidence;
    node-2 is quarantined, and the job, which cannot save, is told to restart without it at once."""

    async def test(r: Rig) -> None:
        await r.stepped_to_30()
        r.fleet.nodes["node-2"].fault(4, kind=common_pb2.NVLINK_ERRORS, message="NVLink CRC errors grew by 4")
        commands: list[str] = []
        for _ in range(100):
            commands += [c for c in await r.window(0.5, event="heartbeat", step=30) if c]  # not a save's ask
            if commands:
                break
            await asyncio.sleep(0.1)
        stop = r.controller.jobs.jobs["moe"].command
        assert stop is not None and commands == [stop.id]
        assert list(stop.exclude_nodes) == ["node-2"] and "node-2 quarantined" in stop.reason
        assert stop.deadline - time.time() < HANGS_JOINED.hang.abort_after_s  # it cannot save: aborted soon
        health = {n.node: n.health for n in (await r.admin.GetStatus(admin_pb2.StatusRequest())).nodes}
        assert health["node-2"] == "QUARANTINED" and {health[n] for n in NODES if n != "node-2"} == {"HEALTHY"}
        (note,) = r.controller.store.read("SELECT payload FROM actions WHERE kind = 'NOTE:HARDWARE'")
        assert "no stacks to say where it is stuck" in note[0] and "node-2: NVLINK_ERRORS 4" in note[0]

    run(tmp_path, test, jobs=HANGS_JOINED)


def test_a_hung_job_whose_nodes_show_nothing_is_paged_and_nothing_is_cordoned(tmp_path: Path) -> None:
    async def test(r: Rig) -> None:
        await r.stepped_to_30()
        r.fleet.nodes["node-2"].fault(43, message="a teardown's XID 43: the application's, not evidence")
        for _ in range(100):
            assert not await r.window(0.5, event="heartbeat", step=30)
            if r.controller.store.read("SELECT payload FROM actions WHERE kind = 'NOTE:NO-EVIDENCE'"):
                break
            await asyncio.sleep(0.1)
        (note,) = r.controller.store.read("SELECT payload FROM actions WHERE kind = 'NOTE:NO-EVIDENCE'")
        assert "no node of the job shows a hardware signal of its own: nothing taken out of service" in note[0]
        health = {n.node: n.health for n in (await r.admin.GetStatus(admin_pb2.StatusRequest())).nodes}
        assert set(health.values()) == {"HEALTHY"}

    run(tmp_path, test, jobs=HANGS_JOINED)


def test_a_hung_job_without_stacks_is_located_from_its_ranks_progress_records(tmp_path: Path) -> None:
    """No stacks (not under vigil launch), but each node's agent sends its ranks' progress records with
    its heartbeat: rank 2 on node-2 never finished step 30, which the others wait in the hook's
    exchange after: it is named, and with no evidence on node-2 nothing is cordoned."""
    progress = {"node-0": (0, 30, "exchange"), "node-1": (1, 30, "exchange"), "node-2": (2, 29, "compute")}

    async def test(r: Rig) -> None:
        for node, (rank, step, phase) in progress.items():
            record = agent_pb2.RankProgress(job_id="moe", rank=rank, step=step, phase=phase, at=time.time())
            r.fleet.nodes[node].ranks = [record, agent_pb2.RankProgress(job_id="other", rank=9, step=1, phase="x")]
        await r.stepped_to_30()
        note: list[Any] = []
        for _ in range(200):
            assert not await r.window(0.5, event="heartbeat", step=30)
            if note := r.controller.store.read("SELECT payload FROM actions WHERE kind = 'NOTE:WAVEFRONT'"):
                break
            await asyncio.sleep(0.1)
        assert "from its 3 ranks' progress records" in note[0][0]
        assert "a rank behind the others: rank 2 on node-2 at step 29, in compute, while 2 rank(s) wait" in note[0][0]
        await wait_until(
            lambda: bool(r.controller.store.read("SELECT payload FROM actions WHERE kind = 'NOTE:NO-EVIDENCE'")),
            what="the hang judged",
        )
        health = {n.node: n.health for n in (await r.admin.GetStatus(admin_pb2.StatusRequest())).nodes}
        assert set(health.values()) == {"HEALTHY"}

    slow_stacks = FAST.model_copy(
        update={"hang": HangConfig(floor_s=0.6, factor=3, unlearned_s=5, stacks_wait_s=6, abort_after_s=5)}
    )
    run(tmp_path, test, jobs=slow_stacks)


def test_a_job_whose_reports_stop_but_whose_ranks_step_on_per_their_agents_is_not_hung(tmp_path: Path) -> None:
    """Rank 0's reports stop reaching the controller (its network, its reporter), but every rank's
    progress record, sent by its node's agent, shows the job stepping: not a hang. When the records
    stop moving too, it is."""

    async def test(r: Rig) -> None:
        def records(step: int) -> None:
            for rank, node in enumerate(NODES):
                record = agent_pb2.RankProgress(job_id="moe", rank=rank, step=step, phase="compute", at=time.time())
                r.fleet.nodes[node].ranks = [record]

        await r.stepped_to_30()
        for step in range(31, 46):  # 3 s of steps, seen by the agents only
            records(step)
            await asyncio.sleep(0.2)
            assert r.controller.jobs.jobs["moe"].hang is None
        assert r.controller.jobs.jobs["moe"].step >= 40  # the agents' word moved it on
        await wait_until(lambda: r.controller.jobs.jobs["moe"].hang is not None, timeout=10, what="a hang")

    run(tmp_path, test, jobs=HANGS, heartbeat_s=0.1)
