"""Supervised background work: a failure is logged, counted, retried after a backoff, and shown as
down until the task succeeds again; the other steps of the same loop go on."""

from __future__ import annotations

import asyncio
import threading
import urllib.error
import urllib.request
from functools import partial
from typing import cast

from prometheus_client import CollectorRegistry, Counter
from structlog.testing import capture_logs

from tests.fakes.clock import ManualClock
from tests.helpers import poll_until
from vigil_core.http_status import serve_http
from vigil_core.loop_lag import Lateness, stuck
from vigil_core.supervise import Tasks, backoff_s, supervise


def test_backoff_doubles_up_to_its_cap() -> None:
    assert [backoff_s(n, 0.5, 4.0) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_a_failing_step_is_counted_skipped_during_its_backoff_and_up_again_once_it_succeeds() -> None:
    clock, failures = ManualClock(), []
    tasks = Tasks(failures.append, base_s=1.0, cap_s=8.0, clock=clock)
    broken = {"on": True}
    calls = []

    def step() -> None:
        calls.append(clock.now)
        if broken["on"]:
            raise OSError(28, "No space left on device")

    with capture_logs() as logs:
        assert not tasks.run_step("silence", step)
        assert not tasks.run_step("silence", step)  # within its 1 s backoff: not called
        assert tasks.run_step("gauges", lambda: None)  # the loop's other steps go on
        clock.now = 1.0
        assert not tasks.run_step("silence", step)  # called, fails again: 2 s now
        assert "No space left" in tasks.down()["silence"]
        clock.now = 2.5
        assert not tasks.run_step("silence", step)
        broken["on"] = False
        clock.now = 3.0
        assert tasks.run_step("silence", step)
    assert calls == [0.0, 1.0, 3.0] and failures == ["silence", "silence"] and tasks.down() == {}
    assert [e["event"] for e in logs] == ["task_failed", "task_failed", "task_recovered"]
    assert logs[0]["log_level"] == "error" and logs[0]["task"] == "silence"


def test_a_supervised_loop_that_raises_is_started_again() -> None:
    async def main() -> tuple[int, list[str]]:
        stop, failures, runs = asyncio.Event(), [], []
        tasks = Tasks(failures.append, base_s=0.01, cap_s=0.02)

        async def body() -> None:
            runs.append(1)
            if len(runs) < 3:
                raise RuntimeError("boom")
            stop.set()

        await asyncio.wait_for(supervise("engine", body, stop, tasks, up_after_s=0.001), 5)
        return len(runs), failures

    runs, failures = asyncio.run(main())
    assert runs == 3 and failures == ["engine", "engine"]


def test_a_loop_that_returns_before_the_stop_counts_as_failed() -> None:
    async def main() -> list[str]:
        stop, failures = asyncio.Event(), []
        tasks = Tasks(failures.append, base_s=0.01, cap_s=0.01)
        runs = []

        async def body() -> None:
            runs.append(1)
            if len(runs) == 2:
                stop.set()

        await asyncio.wait_for(supervise("jobs", body, stop, tasks), 5)
        return failures

    assert asyncio.run(main()) == ["jobs"]


def test_readyz_says_what_is_wrong_and_metrics_are_served_beside_it() -> None:
    registry = CollectorRegistry()
    Counter("vigil_test_total", "a counter", registry=registry).inc()
    problems: list[str] = ["task silence failing: OSError(28)"]
    server = serve_http("127.0.0.1", 0, registry, lambda: problems, lambda: [])
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        try:
            urllib.request.urlopen(f"{base}/readyz", timeout=5)
            raise AssertionError("expected 503")
        except urllib.error.HTTPError as exc:
            assert exc.code == 503 and exc.read().decode() == "task silence failing: OSError(28)\n"
        problems.clear()
        with urllib.request.urlopen(f"{base}/readyz", timeout=5) as reply:
            assert reply.status == 200 and reply.read() == b"ok\n"
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as reply:
            assert "vigil_test_total 1.0" in reply.read().decode()
    finally:
        server.shutdown()
        server.server_close()


def test_the_controllers_periodic_steps_resume_after_failing_and_never_stop_each_other(tmp_path: object) -> None:
    """Retention and releases raise for a while (the database away): each is retried after its
    backoff until it works again, and silence detection runs on meanwhile."""
    from pathlib import Path

    from tests.helpers import start_controller, stop_controller, wait_until

    async def main() -> dict[str, int]:
        assert isinstance(tmp_path, Path)
        controller = await start_controller(tmp_path / "c.db")
        route = controller.nodes
        upkeep = route.upkeep
        route.tasks.base_s, route.tasks.cap_s = 0.05, 0.1
        calls = {"retention": 0, "retention_ok": 0, "releases": 0, "releases_ok": 0, "silence": 0}

        def flaky(name: str, fails: int) -> object:
            def step() -> dict[str, int]:
                calls[name] += 1
                if calls[name] <= fails:
                    raise OSError(28, "No space left on device")
                calls[f"{name}_ok"] += 1
                return {}

            return step

        def silence() -> list[str]:
            calls["silence"] += 1
            return []

        upkeep.apply_retention = flaky("retention", 3)  # type: ignore[method-assign]
        route.releases.ask = flaky("releases", 3)  # type: ignore[method-assign]
        upkeep.check_silence = silence  # type: ignore[method-assign]
        stop = asyncio.Event()
        watcher = asyncio.create_task(upkeep.watch(stop, every_s=0.01, retention_every_s=0.0))
        await wait_until(
            lambda: calls["retention_ok"] > 0 and calls["releases_ok"] > 0 and calls["silence"] > 20,
            timeout=30.0,
            what="both failing steps working again, silence detection running on meanwhile",
        )
        stop.set()
        await watcher
        down, failures = route.tasks.down(), route.metrics.task_failures.labels("retention")._value.get()
        await stop_controller(controller)
        assert down == {} and failures == 3
        return calls

    calls = asyncio.run(main())
    assert calls["retention_ok"] > 0 and calls["releases_ok"] > 0 and calls["silence"] > 20


def test_livez_says_an_event_loop_stuck_in_one_step_and_ok_once_it_runs_again() -> None:
    lateness = Lateness()
    loop = asyncio.new_event_loop()
    running = threading.Thread(target=loop.run_forever, daemon=True)
    running.start()
    watching = asyncio.run_coroutine_threadsafe(lateness.watch(interval_s=0.05), loop)
    server = serve_http("127.0.0.1", 0, CollectorRegistry(), lambda: [], partial(stuck, lateness, bound_s=0.3))
    livez = f"http://127.0.0.1:{server.server_port}/livez"

    def probe() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(livez, timeout=5) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    try:
        assert probe() == (200, "ok\n")
        release = threading.Event()
        loop.call_soon_threadsafe(release.wait, 20)  # one step holds the loop until the probe has said so
        with capture_logs() as logs:
            _, said = cast(tuple[int, str], poll_until(lambda: (found := probe())[0] == 503 and found, 10, "a 503"))
        release.set()
        assert "the event loop has not run for" in said
        assert any(entry["event"] == "event_loop_stuck" for entry in logs)  # said, not only answered
        poll_until(lambda: probe() == (200, "ok\n"), timeout=10, what="ok once the loop runs again")
    finally:
        watching.cancel()
        loop.call_soon_threadsafe(loop.stop)
        running.join(5)
        server.shutdown()
