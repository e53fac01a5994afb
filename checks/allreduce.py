"""All-reduce bandwidth with torch.distributed: NCCL between GPUs, gloo between CPU processes.

    python -m checks.allreduce [--nproc N]                      # N processes on this machine
    python -m checks.allreduce --master HOST:PORT --rank R --world-size W [--local-ranks L]
        # machine R of W in a group: L processes here (one per GPU), ranks R·L .. R·L+L-1 of W·L

Reported as nccl-tests does: algorithm bandwidth = bytes / time, bus bandwidth = algbw · 2(n−1)/n
(what each link carries in a ring all-reduce, comparable across group sizes). Each of ``--iters``
calls after warm-up is timed on its own; a size's time is the median call's, of the slowest rank.
The median, not the mean: one call stalled by the scheduler or a page fault says nothing about the
link, and a sweep that flagged it would quarantine a healthy node; a slow link slows every call.
The mean is reported beside it (``us_mean_<bytes>``), so jitter stays visible.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time
from datetime import timedelta
from typing import TYPE_CHECKING, NamedTuple

from checks.devices import Device, refuse_if_busy
from checks.program import check_main
from checks.result import CheckResult, NotRun, Verdict, unknown
from vigil_core.ports import port_block

if TYPE_CHECKING:
    import torch

CPU_SIZES = [2**k for k in range(10, 25, 2)]  # 1 KiB .. 16 MiB
GPU_SIZES = [2**k for k in range(20, 31, 2)]  # 1 MiB .. 1 GiB


def alg_bandwidth_gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def bus_bandwidth_gbps(algbw_gbps: float, world_size: int) -> float:
    return algbw_gbps * 2 * (world_size - 1) / world_size


class Timing(NamedTuple):
    """One size's seconds per all-reduce: the median call and the mean, each the slowest rank's."""

    nbytes: int
    median_s: float
    mean_s: float


def measure(sizes: list[int], iters: int, device: str) -> list[Timing]:
    """Inside an initialised process group: the timing of each size."""
    import torch
    import torch.distributed as dist

    out = []
    for nbytes in sizes:
        buf = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
        for _ in range(2):
            dist.all_reduce(buf)
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
        dist.barrier()
        mine = torch.tensor(typical_and_mean(_timed_calls(buf, iters, device)), dtype=torch.float64, device=device)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
        median_s, mean_s = (float(v) for v in mine.tolist())
        out.append(Timing(nbytes, median_s, mean_s))
    return out


def typical_and_mean(seconds: list[float]) -> tuple[float, float]:
    """The median call's seconds, and the mean."""
    return statistics.median(seconds), statistics.fmean(seconds)


def _timed_calls(buf: torch.Tensor, iters: int, device: str) -> list[float]:
    """Seconds of each of ``iters`` all-reduces of ``buf``."""
    import torch
    import torch.distributed as dist

    if device.startswith("cuda"):
        # Events on the current stream: the NCCL stream waits for the start event's work before the
        # collective, and a blocking all_reduce makes the current stream wait for it before the end.
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
        for start, end in events:
            start.record()
            dist.all_reduce(buf)
            end.record()
        torch.cuda.synchronize(device)
        return [start.elapsed_time(end) / 1e3 for start, end in events]
    times = []
    for _ in range(iters):
        began = time.perf_counter()
        dist.all_reduce(buf)  # gloo on CPU: returns when the call is done
        times.append(time.perf_counter() - began)
    return times


def figures_for(timings: list[Timing], world_size: int) -> dict[str, float]:
    """Bandwidths from the median call; ``us_<bytes>`` is its time, ``us_mean_<bytes>`` the mean's."""
    figures: dict[str, float] = {"world_size": float(world_size)}
    for nbytes, median_s, mean_s in timings:
        algbw = alg_bandwidth_gbps(nbytes, median_s)
        figures[f"algbw_gbps_{nbytes}"] = algbw
        figures[f"busbw_gbps_{nbytes}"] = bus_bandwidth_gbps(algbw, world_size)
        figures[f"us_{nbytes}"] = median_s * 1e6
        figures[f"us_mean_{nbytes}"] = mean_s * 1e6
    return figures


def judge(figures: dict[str, float], largest: int, min_busbw_gbps: float) -> tuple[Verdict, str]:
    busbw = figures[f"busbw_gbps_{largest}"]
    n = int(figures["world_size"])
    summary = f"{n} ranks: bus bandwidth {busbw:.2f} GB/s at {largest / 2**20:g} MiB"
    if min_busbw_gbps and busbw < min_busbw_gbps:
        return Verdict.FAIL, f"{summary}, below the {min_busbw_gbps:g} GB/s required"
    return Verdict.OK, summary


def member(rank: int, world_size: int, master: str, sizes: list[int], iters: int, gpu: int | None) -> list[Timing]:
    import torch
    import torch.distributed as dist

    host, _, port = master.rpartition(":")
    host = host.strip("[]")
    backend = "nccl" if gpu is not None else "gloo"
    device = f"cuda:{gpu}" if gpu is not None else "cpu"
    if gpu is not None:
        torch.cuda.set_device(gpu)
    elif "GLOO_SOCKET_IFNAME" not in os.environ and (iface := route_interface(host)):
        # Left to itself gloo binds the address the host name resolves to, often 127.0.1.1: the
        # peer could not reach it. The interface that routes to rank 0 is the one to use.
        os.environ["GLOO_SOCKET_IFNAME"] = iface
    store = dist.TCPStore(  # type: ignore[attr-defined]  # exported at runtime, not in the stubs
        host, int(port), world_size, is_master=rank == 0, timeout=timedelta(seconds=60)
    )
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=120))
    try:
        return measure(sizes, iters, device)
    finally:
        dist.destroy_process_group()


def route_interface(host: str) -> str | None:
    """The network interface this machine would use to reach ``host``; None if none is found."""
    import psutil

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))  # UDP: no packet is sent, the kernel just picks the route
            local = s.getsockname()[0]
    except OSError:
        return None
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == local for a in addresses):
            return name
    return None


def _local_member(
    index: int,
    first_rank: int,
    world_size: int,
    master: str,
    sizes: list[int],
    iters: int,
    use_gpus: bool,
    queue: object,
) -> None:
    timings = member(first_rank + index, world_size, master, sizes, iters, index if use_gpus else None)
    if index == 0:  # every rank holds the same (slowest-rank) timings
        queue.put(timings)  # type: ignore[attr-defined]


def spawn_members(
    first_rank: int, local: int, world_size: int, master: str, sizes: list[int], iters: int, use_gpus: bool
) -> list[Timing]:
    """``local`` processes of a group, ranks ``first_rank`` onwards, one GPU each where there are GPUs."""
    import torch.multiprocessing as mp

    queue = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(  # type: ignore[attr-defined]
        _local_member,
        args=(first_rank, world_size, master, sizes, iters, use_gpus, queue),
        nprocs=local,
        start_method="spawn",
    )  # raises if any member failed: the check then reports UNKNOWN with the error
    timings: list[Timing] = queue.get()
    return timings


def run(args: argparse.Namespace) -> CheckResult:
    import torch

    started = time.time()
    use_gpus = torch.cuda.is_available()
    sizes = args.sizes or (GPU_SIZES if use_gpus else CPU_SIZES)
    if use_gpus:  # invasive, like matmul and membw: never on GPUs a workload is using
        gpus = gpus_used(args, torch.cuda.device_count())
        if (refusal := refuse_if_busy("allreduce", [Device(g, "", f"cuda:{g}") for g in gpus])) is not None:
            return unknown("allreduce", refusal, started, NotRun.BUSY)
    if args.master:  # one member (a machine) of a group another program started
        local = args.local_ranks
        world_size = args.world_size * local
        try:
            if local == 1:
                gpu = args.gpu if use_gpus else None
                timings = member(args.rank, world_size, args.master, sizes, args.iters, gpu)
            else:
                timings = spawn_members(args.rank * local, local, world_size, args.master, sizes, args.iters, use_gpus)
        except Exception as exc:  # a member spawned for a GPU raises its error as text
            if args.rank != 0 or not port_taken(str(exc)):
                raise
            why = f"rank 0 could not listen on {args.master}: another program holds the port ({exc})"
            return unknown("allreduce", why, started, NotRun.PORT_TAKEN)
    else:
        world_size = args.nproc or (torch.cuda.device_count() if use_gpus else 2)
        if world_size < 2:  # its bus bandwidth would be 0 GB/s, and say nothing about anything
            why = "not applicable: one GPU has nobody to all-reduce with (run it across nodes: vigil sweep)"
            return CheckResult("allreduce", Verdict.UNKNOWN, why, {}, started, time.time())
        with port_block(1) as port:  # below the ephemeral range: not any outgoing connection's meanwhile
            timings = spawn_members(0, world_size, world_size, f"127.0.0.1:{port}", sizes, args.iters, use_gpus)
    figures = figures_for(timings, world_size)
    verdict, reason = judge(figures, max(sizes), args.min_busbw_gbps)
    return CheckResult(
        "allreduce", verdict, f"{'nccl' if use_gpus else 'gloo'}, {reason}", figures, started, time.time()
    )


def port_taken(error: str) -> bool:
    """Whether an error is rank 0's store failing to listen because its port is taken (torch's
    DistNetworkError: "... name: EADDRINUSE, message: address already in use"). Pure."""
    return "EADDRINUSE" in error or "address already in use" in error.lower()


def gpus_used(args: argparse.Namespace, device_count: int) -> list[int]:
    """The GPUs this machine's members of the all-reduce will use. Pure."""
    if args.master:
        return [args.gpu] if args.local_ranks == 1 else list(range(args.local_ranks))
    return list(range(args.nproc or device_count))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nproc", type=int, default=0, help="processes on this machine (default: GPUs, or 2 on CPU)")
    parser.add_argument("--master", default="", help="HOST:PORT of the group's rank 0 store: join a group instead")
    parser.add_argument("--rank", type=int, default=0, help="with --master: this machine's place in the group")
    parser.add_argument("--world-size", type=int, default=0, help="with --master: machines in the group")
    parser.add_argument(
        "--local-ranks", type=int, default=1, help="with --master: processes on this machine (GPUs 0..N-1)"
    )
    parser.add_argument("--gpu", type=int, default=0, help="with --master and one local rank: the GPU it uses")
    parser.add_argument(
        "--sizes", type=lambda s: [int(x) for x in s.split(",")], default=None, help="bytes, comma-separated"
    )
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument(
        "--min-busbw-gbps", type=float, default=0.0, help="FAIL below this bus bandwidth at the largest size"
    )


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    check_main("allreduce", __doc__ or "", add_arguments, run)
