"""How a simulated fleet answers the controller's RunCheck, for sweep tests and the sweep benchmark.

Local checks answer after ``duration_s`` with plausible figures (an H100 node's, by default), or as
scripted per node and check: "fail", "crash" (UNKNOWN, as the agent reports a crashed check), "hang"
(no answer at all), "slow" (every GPU at 70%: passes its own node's comparison, not the fleet's) or
"misnamed" (answers OK for another check than the one asked). A node's "pairs" may be scripted
"busy" (refuses: a workload uses its GPU) or "hang" (never answers); ``held_ports`` are ports another
program holds on a node.
A pair's all-reduce meets at its master address, as the real members meet at rank 0's store, and
runs at the link speed of its slower member (a throttled NIC caps the pair), or at what ``path_gbps``
says for the two (a fabric with switches on the path). It reports each size it was asked for
(``sizes``), at that speed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from checks.result import NotRun
from protos.vigil.v1 import agent_pb2, common_pb2

PAIR_BYTES = 1 << 30
GPUS = 8


def _figures(check: str, scale: float) -> dict[str, float]:
    if check == "matmul":
        return {f"tflops_GPU{i}": (790.0 + i) * scale for i in range(GPUS)} | {"expected_peak_tflops": 989.0}
    if check == "membw":
        return {f"gbps_GPU{i}": (2900.0 + i) * scale for i in range(GPUS)} | {"expected_peak_gbps": 3350.0}
    if check == "gpu_health":
        return {"gpus": float(GPUS)}
    return {}


@dataclass
class SimulatedChecks:
    duration_s: float = 0.0
    pair_duration_s: float = 0.0
    link_gbps: dict[str, float] = field(default_factory=dict)  # per node; others run at default_gbps
    default_gbps: float = 40.0
    path_gbps: Callable[[str, str], float] | None = None  # the pair's speed through the fabric
    script: dict[tuple[str, str], str] = field(default_factory=dict)  # (node, check) -> behaviour
    requests: list[tuple[str, agent_pb2.RunCheck]] = field(default_factory=list)
    # Per node, ports another program holds there: a pair whose rank 0 is asked to listen on one
    # answers at once that it could not (NotRun.PORT_TAKEN), as the real check does.
    held_ports: dict[str, set[int]] = field(default_factory=dict)
    stopped: list[tuple[str, str]] = field(default_factory=list)  # (node, request id) the controller stopped
    _meeting: dict[str, tuple[str, asyncio.Future[float]]] = field(default_factory=dict)

    async def answer(self, node: str, run: agent_pb2.RunCheck) -> common_pb2.CheckResult | None:
        self.requests.append((node, run))
        started = time.time()
        result = common_pb2.CheckResult(request_id=run.request_id, node=node, check=run.check, started_at=started)
        if "master" in run.params:
            if (refusal := self._pair_refusal(node, run)) is not None:
                result.verdict, (result.reason, result.not_run) = common_pb2.UNKNOWN, refusal
                result.finished_at = time.time()
                return result
            if self.script.get((node, "pairs")) == "hang":
                return None
            busbw = await self._pair(node, run)
            if busbw is None:
                result.verdict, result.reason = common_pb2.UNKNOWN, "the check crashed: the peer never joined"
            else:
                result.verdict, result.reason = common_pb2.OK, f"gloo, 2 ranks: bus bandwidth {busbw:.2f} GB/s"
                sizes = [int(x) for x in run.params["sizes"].split(",")] if "sizes" in run.params else [PAIR_BYTES]
                result.figures.update({"world_size": 2.0} | {f"busbw_gbps_{size}": busbw for size in sizes})
            result.finished_at = time.time()
            return result
        behaviour = self.script.get((node, run.check), "ok")
        if behaviour == "hang":
            return None
        await asyncio.sleep(self.duration_s)
        if behaviour == "crash":
            result.verdict, result.reason = common_pb2.UNKNOWN, "the check crashed: RuntimeError('CUDA error')"
        elif behaviour == "fail":
            result.verdict, result.reason = common_pb2.FAIL, "GPU 3 row remap failure"
        else:
            result.verdict, result.reason = common_pb2.OK, "simulated"
            result.figures.update(_figures(run.check, 0.7 if behaviour == "slow" else 1.0))
            if behaviour == "misnamed":
                result.check = "something_else"
        result.finished_at = time.time()
        return result

    def _pair_refusal(self, node: str, run: agent_pb2.RunCheck) -> tuple[str, str] | None:
        """Why this member of a pair cannot run at all, as the real check answers: its GPU is busy
        (scripted "busy" for the node's "pairs"), or it is rank 0 and its port is held."""
        if self.script.get((node, "pairs")) == "busy":
            return "not running allreduce: a workload is using the GPU (GPU 0 by pid 4242)", NotRun.BUSY
        port = int(run.params["master"].rpartition(":")[2])
        if run.params.get("rank") == "0" and port in self.held_ports.get(node, set()):
            why = f"rank 0 could not listen on {run.params['master']}: another program holds the port (EADDRINUSE)"
            return why, NotRun.PORT_TAKEN
        return None

    async def _pair(self, node: str, run: agent_pb2.RunCheck) -> float | None:
        master = run.params["master"]
        waiting = self._meeting.get(master)
        if waiting is None or waiting[0] == node:
            met: asyncio.Future[float] = asyncio.get_running_loop().create_future()
            self._meeting[master] = (node, met)
            try:
                return await asyncio.wait_for(met, run.deadline_s)
            except TimeoutError:
                return None
            finally:
                if self._meeting.get(master, (None, None))[1] is met:
                    del self._meeting[master]
        partner, met = self._meeting.pop(master)
        await asyncio.sleep(self.pair_duration_s)
        if self.path_gbps is not None:
            busbw = self.path_gbps(node, partner)
        else:
            busbw = min(self.link_gbps.get(node, self.default_gbps), self.link_gbps.get(partner, self.default_gbps))
        if not met.done():
            met.set_result(busbw)
        return busbw
