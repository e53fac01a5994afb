"""Sweeps: checks on many nodes at once through their agents, then pairwise all-reduce between them.

The shell around ``controller.sweeps.spec``, ``controller.sweeps.judge`` and ``controller.sweeps.pairing``
(pure): it sends ``RunCheck`` to the agents, waits for their results under each check's deadline,
runs the pairing rounds, and files everything in the incident store. A sweep runs as its own
task: the operator's terminal going away does not stop it, and its failures are quarantined (with
``quarantine``) all the same.
One sweep runs at a time; two would measure each other.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import structlog

from checks.codec import result_from_proto
from checks.result import CheckResult, NotRun, Verdict, unknown
from controller.act.actuators import NodeSelector
from controller.nodes.check_requests import CheckRequests
from controller.nodes.fleet import FleetView
from controller.nodes.found import Found, Report, Source
from controller.store import Records
from controller.sweeps.fabric import (
    FabricJudge,
    better_of,
    findings,
    first_stage,
    judge_first_stage,
    slow_in_first_stage,
)
from controller.sweeps.judge import (
    NodeCheck,
    PairRun,
    Row,
    failure_reasons,
    judge_fleet,
    make_up_pairs,
    measured,
    outcome,
    pair_basis,
    pair_result,
    pair_rows,
    pair_run,
    row_for,
)
from controller.sweeps.pairing import (
    Finding,
    Pair,
    batches,
    confirmed,
    culprits,
    pair_up,
    plan_isolation,
    slow_beside_first,
    slow_pairs,
    to_confirm,
)
from controller.sweeps.result import Emit, SweepDone, SweepProgress, SweepResult
from controller.sweeps.spec import (
    PAIR_PORT_TRIES,
    PAIR_PROGRAM,
    PAIRS,
    SweepConfig,
    SweepError,
    SweepSpec,
    master_address,
    pair_params,
    pair_port,
    pairs_at_once,
)
from controller.sweeps.topology import Place, TopologyError, from_labels, is_topology_aware, merged, parse_topology_file
from protos.vigil.v1 import agent_pb2

log = structlog.get_logger(__name__)


class SweepBusy(Exception):
    pass


@dataclass
class _PairStage:
    rows: list[Row]
    findings: list[Finding] = field(default_factory=list)
    rounds: int = 0
    pairs: int = 0
    domains: dict[str, str] = field(default_factory=dict)  # blamed component -> its failure domain


Labels = Callable[[], Mapping[str, Mapping[str, str]]]


class _Progress:
    def __init__(self, emit: Emit, total: int) -> None:
        self._emit = emit
        self.done, self.total = 0, total

    def report(self, phase: str, node: str, result: CheckResult, request_id: str = "") -> None:
        self.done += 1
        self._emit(SweepProgress(phase, node, result, request_id, self.done, self.total))


class Sweeper:
    def __init__(
        self,
        fleet: FleetView,
        checks: CheckRequests,
        selector: NodeSelector,
        report: Report,
        records: Records,
        config: SweepConfig,
        labels: Labels = dict,
    ) -> None:
        self._fleet = fleet
        self._labels = labels  # every node's labels (where it sits in the fabric), read off the event loop
        self._checks = checks
        self._selector = selector
        self._report = report  # failed nodes and blamed components, through the policy and the guardrails
        self._records = records
        self.config = config
        self.current = ""  # the running sweep's id
        self._tasks: set[asyncio.Task[SweepResult | None]] = set()

    async def select(self, nodes: Sequence[str], selector: str, job: str, namespace: str) -> list[str]:
        """The nodes to sweep: as named, by label selector, by Job, or every connected agent's."""
        if nodes:
            chosen = list(dict.fromkeys(nodes))
        elif selector:
            chosen = await asyncio.to_thread(self._selector.nodes_matching, selector)
        elif job:
            chosen = await asyncio.to_thread(self._selector.job_nodes, namespace or "default", job)
        else:
            chosen = self._fleet.connected()
        if not chosen:
            raise SweepError("no nodes to sweep: none named, none matched, or no agent is connected")
        if self.config.topology.file is not None:
            await self._topology(chosen)  # a bad topology file is refused now, not half-way through the sweep
        return chosen

    def start(self, spec: SweepSpec, nodes: Sequence[str], emit: Emit) -> str:
        """Start a sweep as its own task; ``emit`` gets every update, the summary last. Returns its id."""
        if self.current:
            raise SweepBusy(f"sweep {self.current} is running; one sweep at a time")
        sweep_id = f"sweep-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
        self.current = sweep_id
        task = asyncio.get_running_loop().create_task(self._guarded(sweep_id, spec, list(nodes), emit))
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return sweep_id

    def _finished(self, task: asyncio.Task[SweepResult | None]) -> None:
        self._tasks.discard(task)
        self.current = ""

    async def wait(self) -> None:
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await self.wait()

    async def _guarded(self, sweep_id: str, spec: SweepSpec, nodes: list[str], emit: Emit) -> SweepResult | None:
        """A sweep that breaks says so to whoever watches it, rather than leaving them waiting."""
        try:
            return await self._run(sweep_id, spec, nodes, emit)
        except Exception as exc:
            log.exception("sweep_crashed", sweep=sweep_id)
            emit(SweepDone(None, error=repr(exc)))
            return None

    async def _run(self, sweep_id: str, spec: SweepSpec, nodes: list[str], emit: Emit) -> SweepResult:
        started = time.time()
        log.info("sweep_started", sweep=sweep_id, nodes=len(nodes), checks=list(spec.checks), by=spec.requested_by)
        progress = _Progress(emit, len(nodes) * len(spec.local_checks))
        local = await self._local_checks(sweep_id, spec, nodes, progress)
        rows = [row_for(nc.node, nc.result) for nc in judge_fleet(local, self.config.fleet_max_below_median)]
        findings: list[Finding] = []
        domains: dict[str, str] = {}
        rounds = pairs = 0
        if spec.pairs:
            pair_result = await self._pairwise(sweep_id, spec, nodes, progress)
            rows += pair_result.rows
            findings, rounds, pairs = pair_result.findings, pair_result.rounds, pair_result.pairs
            domains = pair_result.domains
        order = {n: i for i, n in enumerate(nodes)}
        rows.sort(key=lambda r: (order.get(r.node, len(order)), spec.checks.index(r.check)))
        result = outcome(rows, findings)
        quarantine = {}
        if spec.quarantine:
            for node in result.failed:
                found = Found(node, sweep_id, failure_reasons(rows, node), Source.SWEEP)
                quarantine[node] = str(self._report(found))
            for f in findings:
                if f.is_component:
                    behind, domain = tuple(f.nodes), domains.get(f.node, "")
                    quarantine[f.node] = str(
                        self._report(Found(f.node, sweep_id, f.reason, Source.SWEEP, behind=behind, domain=domain))
                    )
        summary = SweepResult(
            sweep_id=sweep_id,
            rows=tuple(rows),
            findings=tuple(findings),
            nodes=len(nodes),
            unknown=tuple(result.unknown),
            failed=tuple(result.failed),
            rounds=rounds,
            pairs=pairs,
            wall_s=time.time() - started,
            verdict=result.verdict,
            quarantine=quarantine,
        )
        await asyncio.to_thread(
            self._records.sweep, sweep_id, spec.requested_by, started, time.time(), summary.to_json()
        )
        log.info(
            "sweep_finished",
            sweep=sweep_id,
            nodes=len(nodes),
            failed=result.failed,
            unknown=len(result.unknown),
            findings=[f.node for f in findings],
            rounds=rounds,
            wall_s=round(summary.wall_s, 2),
        )
        emit(SweepDone(summary, done=progress.done, total=progress.total))
        return summary

    # Local checks ----------------------------------------------------------------------------

    async def _local_checks(
        self, sweep_id: str, spec: SweepSpec, nodes: list[str], progress: _Progress
    ) -> list[NodeCheck]:
        results: list[NodeCheck] = []

        async def on(node: str) -> None:
            for check in spec.local_checks:  # one at a time: two invasive checks never share a GPU
                request_id = f"{sweep_id}/{node}/{check}"
                params = spec.params.get(check, {})
                result = await self._ask(node, check, params, spec.deadline_s[check], request_id)
                results.append(NodeCheck(node, result))
                progress.report("checks", node, result, request_id)

        await asyncio.gather(*(on(n) for n in nodes))
        return results

    async def _ask(
        self, node: str, check: str, params: dict[str, str], deadline_s: float, request_id: str
    ) -> CheckResult:
        run = agent_pb2.RunCheck(request_id=request_id, check=check, params=params, deadline_s=deadline_s)
        future = self._checks.ask(node, run)
        if future is None:
            return unknown(check, "the node's agent is not connected", not_run=NotRun.NO_AGENT)
        wait_s = deadline_s + self.config.answer_grace_s
        try:
            answer = await asyncio.wait_for(future, wait_s)
        except TimeoutError:
            self._checks.forget(request_id)
            return unknown(check, f"no answer from the node's agent within {wait_s:g} s", not_run=NotRun.NO_AGENT)
        return replace(result_from_proto(answer), check=check)  # filed under what was asked, whatever it says

    # Pairwise all-reduce --------------------------------------------------------------------

    async def _pairwise(self, sweep_id: str, spec: SweepSpec, nodes: list[str], progress: _Progress) -> _PairStage:
        reachable = [n for n in nodes if self._fleet.is_connected(n) and self._fleet.address(n)]
        left_out = [
            Row(n, PAIRS, Verdict.UNKNOWN, "", "not paired: the node's agent is not connected", NotRun.NO_AGENT)
            for n in nodes
            if n not in reachable
        ]
        if len(reachable) < 2:
            why = "pairwise all-reduce needs at least two nodes with connected agents"
            return _PairStage(left_out + [Row(n, PAIRS, Verdict.UNKNOWN, "", why) for n in reachable])
        topology = await self._topology(reachable)
        if is_topology_aware(reachable, topology):
            return await self._fabric(sweep_id, spec, reachable, topology, progress, _PairStage(left_out))
        stage = _PairStage(left_out)
        first_pairs = pair_up(reachable)
        progress.total += len(first_pairs)
        first = await self._round(sweep_id, "pairs", spec, first_pairs, progress, stage)
        first = await self._made_up(sweep_id, spec, first, progress, stage)
        ran = measured(first)  # a pair not run is no evidence, and makes nobody a known-good partner
        busbw = {p: run.busbw_gbps for p, run in ran.items()}
        cfg = self.config
        failed = [p for p, run in ran.items() if run.error]
        slow = list(dict.fromkeys(failed + slow_pairs(busbw, spec.min_busbw_gbps, cfg.pair_max_below_median)))
        plan = plan_isolation(slow, list(ran))
        retest: dict[Pair, PairRun] = {}
        if plan.pairs:
            progress.total += len(plan.pairs)
            retest = await self._round(sweep_id, "isolation", spec, plan.pairs, progress, stage)
        errors = {p: run.error for p, run in measured(retest).items() if run.error}
        rerun = {p: run.busbw_gbps for p, run in measured(retest).items()}
        found = culprits(slow, rerun, busbw, spec.min_busbw_gbps, cfg.pair_max_below_median, errors)
        if again := measured(await self._again(sweep_id, spec, found, progress, stage)):
            values = {p: run.busbw_gbps for p, run in again.items()}
            slow_again = slow_beside_first(values, busbw, slow, spec.min_busbw_gbps, cfg.pair_max_below_median)
            evidence = {p: again[p].error or f"{v:.3g} GB/s" for p, v in slow_again.items()}
            found = confirmed(found, list(again), evidence)
        stage.findings = found
        basis = pair_basis(first, spec.min_busbw_gbps, cfg.pair_max_below_median)
        stage.rows += pair_rows(reachable, first, retest, slow, plan.untestable, stage.findings, basis, again=again)
        return stage

    async def _topology(self, nodes: list[str]) -> dict[str, Place]:
        """Where the swept nodes sit: their labels, then the topology file (which wins)."""
        cfg = self.config.topology
        try:
            labels = await asyncio.to_thread(self._labels)
        except Exception as exc:  # the API server is away: the file alone, or no topology
            log.warning("sweep_labels_unavailable", error=repr(exc)[:300])
            labels = {}
        found = from_labels(labels, cfg)
        if cfg.file is not None:
            try:
                text = await asyncio.to_thread(cfg.file.read_text, encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise SweepError(f"topology file {cfg.file}: cannot read it: {exc}") from None
            try:
                found = merged(found, parse_topology_file(text, str(cfg.file)))
            except TopologyError as exc:
                raise SweepError(str(exc)) from None
        return {n: found[n] for n in nodes if n in found}

    async def _fabric(
        self,
        sweep_id: str,
        spec: SweepSpec,
        nodes: list[str],
        topology: dict[str, Place],
        progress: _Progress,
        stage: _PairStage,
    ) -> _PairStage:
        """Neighbours first, then across leaves, at several sizes; then the component to blame
        (``controller.sweeps.fabric``), and node re-tests for the slow pairs no component explains."""
        cfg, sizes = self.config, ",".join(map(str, self.config.topology.pair_sizes))
        spec = replace(spec, params={**spec.params, PAIRS: {"sizes": sizes, **spec.params.get(PAIRS, {})}})
        judge = FabricJudge(
            topology, spec.min_busbw_gbps, cfg.pair_max_below_median, cfg.topology.leaf_label, cfg.topology.spine_label
        )
        within, across = first_stage(nodes, topology)
        progress.total += len(within) + len(across)
        # One stage: batches pack the pairs of both (a leaf's odd one out meets its neighbour while
        # the others run across), so an uneven fleet costs a round or two less.
        first = await self._round(sweep_id, "neighbours and across leaves", spec, across + within, progress, stage)
        first = await self._made_up(sweep_id, spec, first, progress, stage)
        if slow := slow_in_first_stage(first, judge):  # each at its better run (``fabric.better_of``)
            progress.total += len(slow)
            first = better_of(first, await self._round(sweep_id, "slow pairs once more", spec, slow, progress, stage))
        judged = judge_first_stage(nodes, first, judge)
        retest: dict[Pair, PairRun] = {}
        if judged.plan.pairs:
            progress.total += len(judged.plan.pairs)
            retest = await self._round(sweep_id, "isolation", spec, judged.plan.pairs, progress, stage)
        found = findings(judged, first, retest, judge)
        if again := await self._again(sweep_id, spec, found, progress, stage):
            found = findings(judged, first, retest, judge, again)
        stage.findings = found
        stage.domains = judged.where.domains
        basis = f"within {cfg.pair_max_below_median:.0%} of healthy pairs at each size"
        explained = judged.where.explained
        stage.rows += pair_rows(
            nodes, first, retest, judged.slow, judged.plan.untestable, stage.findings, basis, explained, again
        )
        return stage

    async def _made_up(
        self, sweep_id: str, spec: SweepSpec, first: dict[Pair, PairRun], progress: _Progress, stage: _PairStage
    ) -> dict[Pair, PairRun]:
        """The first round, with a make-up round for the nodes it left unmeasured through no fault of
        their own (``judge.make_up_pairs``)."""
        extra = [p for p in make_up_pairs(first) if p not in first]
        if not extra:
            return first
        progress.total += len(extra)
        return first | await self._round(sweep_id, "make-up pairs", spec, extra, progress, stage)

    async def _again(
        self, sweep_id: str, spec: SweepSpec, found: list[Finding], progress: _Progress, stage: _PairStage
    ) -> dict[Pair, PairRun]:
        """The pair each node or link finding rests on, run once more (none: no round)."""
        pairs = to_confirm(found)
        if not pairs:
            return {}
        progress.total += len(pairs)
        return await self._round(sweep_id, "once more", spec, pairs, progress, stage)

    async def _round(
        self,
        sweep_id: str,
        phase: str,
        spec: SweepSpec,
        pairs: list[Pair],
        progress: _Progress,
        stage: _PairStage,
    ) -> dict[Pair, PairRun]:
        """Run the pairs, each batch at once (no node twice in a batch, no more pairs than have
        ports: ``pairs_at_once``); one batch is one round."""
        out: dict[Pair, PairRun] = {}
        at_once = pairs_at_once(self.config)
        for whole in batches(pairs):
            for batch in (whole[i : i + at_once] for i in range(0, len(whole), at_once)):
                stage.rounds += 1
                prefix = f"{sweep_id}/r{stage.rounds}"
                runs = await asyncio.gather(*(self._pair(prefix, spec, k, len(batch), p) for k, p in enumerate(batch)))
                for pair, (run, rank0, request_id) in zip(batch, runs, strict=True):
                    out[pair] = run
                    stage.pairs += 1
                    progress.report(phase, f"{pair[0]}|{pair[1]}", pair_result(run, rank0), request_id)
        return out

    async def _pair(
        self, prefix: str, spec: SweepSpec, k: int, pairs: int, pair: Pair
    ) -> tuple[PairRun, CheckResult, str]:
        """The k-th pair of a round of ``pairs``: rank 0 listens on a port of its own (``pair_port``).
        Where another program holds it, the pair runs again on the next port it may use."""
        a, b = pair
        for attempt in range(PAIR_PORT_TRIES):
            port = pair_port(self.config, k, pairs, attempt)
            master = master_address(self._fleet.address(a), port)
            ids = [f"{prefix}/{a}|{b}/{rank}" + (f"/try{attempt + 1}" if attempt else "") for rank in (0, 1)]
            ra, rb = await self._both(pair, [pair_params(spec, master, rank) for rank in (0, 1)], ids, spec)
            run = pair_run(pair, ra, rb)
            if run.not_run != NotRun.PORT_TAKEN:
                break
            log.info("sweep_pair_port_taken", pair=f"{a}|{b}", port=port, tries=attempt + 1, of=PAIR_PORT_TRIES)
        return run, ra, ids[0]

    async def _both(
        self, pair: Pair, params: list[dict[str, str]], ids: list[str], spec: SweepSpec
    ) -> tuple[CheckResult, CheckResult]:
        """Both members' answers. The first to end UNKNOWN leaves its partner nothing to do but wait
        for it (until the store's or the collective's timeout, on a port another program may hold):
        the partner's check is stopped, and answers so (``NotRun.STOPPED``)."""
        deadline = spec.deadline_s[PAIRS]
        asks = [
            asyncio.ensure_future(self._ask(node, PAIR_PROGRAM, p, deadline, i))
            for node, p, i in zip(pair, params, ids, strict=True)
        ]
        done, _ = await asyncio.wait(asks, return_when=asyncio.FIRST_COMPLETED)
        for i, ask in enumerate(asks):
            other = 1 - i
            if ask in done and ask.result().verdict is Verdict.UNKNOWN and not asks[other].done():
                why = f"its pair's partner {pair[i]} ended first: {ask.result().reason}"
                self._checks.stop(pair[other], ids[other], why[:500])
                break
        first, second = await asyncio.gather(*asks)
        return first, second
