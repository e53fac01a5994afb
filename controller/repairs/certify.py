"""Certification before a repaired node goes back: every GPU it ever had, then a sweep of the node and
a known-good peer (``remediation.certify.checks``: ``gpu_health``, the burn and bandwidth checks
judged against the peer, an all-reduce between the two). Any check not OK fails it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

from controller.nodes.fleet import Fleet
from controller.repairs.config import RemediationConfig
from controller.repairs.repair import Phase, Repair, certified, not_certified
from controller.sweeps.result import SweepDone, SweepEvent
from controller.sweeps.spec import DEFAULT_DEADLINES_S, PAIRS, SweepSpec
from controller.sweeps.sweeper import SweepBusy, Sweeper
from controller.vocab.node_state import Health


class Certification:
    def __init__(self, config: RemediationConfig, fleet: Fleet, sweeper: Sweeper, clock: Callable[[], float]) -> None:
        self.config = config
        self._fleet = fleet
        self._sweeper = sweeper
        self._clock = clock

    async def run(self, repair: Repair) -> Repair:
        node = repair.node
        entry = self._fleet.entry(node)
        if entry.gpus < entry.expected_gpus:
            return certified(repair, False, f"{entry.gpus} of its {entry.expected_gpus} GPUs", self._clock())
        peer = self._peer(node)
        checks = tuple(c for c in self.config.certify.checks if c != PAIRS or peer)
        spec = SweepSpec(
            checks=checks,
            params={c: dict(a) for c, a in self.config.certify.params.items()},
            deadline_s=dict(DEFAULT_DEADLINES_S),
            quarantine=False,
            min_busbw_gbps=0.0,
            requested_by=f"vigil repair {repair.incident_id}",
        )
        done: asyncio.Future[SweepDone] = asyncio.get_running_loop().create_future()

        def emit(event: SweepEvent) -> None:
            if isinstance(event, SweepDone) and not done.done():
                done.set_result(event)

        try:
            self._sweeper.start(spec, [node, *([peer] if peer else [])], emit)
        except SweepBusy as exc:
            return replace(repair, phase=Phase.SETTLING, waiting_for=f"certification: {exc}")
        result = (await done).result
        if result is None:
            return certified(repair, False, "the certification sweep broke", self._clock())
        rows = [r for r in result.rows if r.node == node]
        failed = [r for r in rows if r.verdict.value != "OK"]
        bad = [f"{r.check} {r.verdict.value}: {r.reason}"[:200] for r in failed]
        with_peer = f" with {peer}" if peer else " (no known-good peer free: no all-reduce)"
        detail = "; ".join(bad) if bad else f"{', '.join(checks)} OK{with_peer} ({result.sweep_id})"
        if failed and all(r.not_run for r in failed):  # nothing judged the node: not a failure of its own
            return not_certified(repair, detail, self._clock())
        return certified(repair, not bad and bool(rows), detail, self._clock())

    def _peer(self, node: str) -> str:
        """A known-good node to certify against: connected, HEALTHY, no open incident, idle first."""
        good = [
            (bool(e.jobs), name)
            for name, e in self._fleet.entries()
            if name != node and e.connected and e.state.health is Health.HEALTHY and not self._fleet.incident_of(name)
        ]
        return min(good)[1] if good else ""
