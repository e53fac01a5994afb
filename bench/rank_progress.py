"""What each rank's progress record costs its step, and the agent its read.

    python -m bench.rank_progress [--steps 20000] [--rounds 5]

The real hook (``VigilHook``, one rank, no controller) with and without ``progress_dir`` (a tmpfs
directory where /dev/shm is one, else the temp directory), side by side in alternating rounds:
``step_end`` wall time per call, median over rounds; the record's cost is the difference (two
``os.pwrite`` of 256 bytes a step: on entering the exchange and on leaving it). Printed as
microseconds and as a share of 10 ms, 100 ms and 1 s steps. And the agent's read of 8, 64 and 256
records (``agent.rank_progress.read_progress``). Appended to ``bench/results/rank_progress.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import structlog

from agent.rank_progress import read_progress
from bench.record import append_result, header
from trainer_hooks.hook import HookConfig, VigilHook
from vigil_core.rank_progress import RankRecord, encode, file_name


def per_call_us(progress_dir: str, steps: int) -> float:
    hook = VigilHook(HookConfig(job_id="bench", node="node-a", progress_dir=progress_dir))
    hook.start(0)
    began = time.perf_counter()
    for step in range(1, steps + 1):
        hook.step_end(step, 1000, 0.01)
    spent = time.perf_counter() - began
    hook.end()
    return spent / steps * 1e6


def read_us(where: Path, records: int, reads: int = 200) -> float:
    for rank in range(records):
        record = RankRecord("bench", rank, "node-a", 1000, "compute", time.time())
        (where / file_name("bench", rank)).write_bytes(encode(record))
    began = time.perf_counter()
    for _ in range(reads):
        assert len(read_progress(where, "node-a").records) == records
    return (time.perf_counter() - began) / reads * 1e6


def measure(args: argparse.Namespace) -> dict[str, Any]:
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        without, with_ = [], []
        for _ in range(args.rounds):
            without.append(per_call_us("", args.steps))
            with_.append(per_call_us(str(Path(tmp) / "{node}"), args.steps))
        cost = statistics.median(with_) - statistics.median(without)
        reads = {}
        for n in (8, 64, 256):
            where = Path(tmp) / f"read-{n}"
            where.mkdir()
            reads[str(n)] = round(read_us(where, n), 1)
    return {
        "directory": str(base),
        "step_end_us": {"without": round(statistics.median(without), 2), "with": round(statistics.median(with_), 2)},
        "record_us_per_step": round(cost, 2),
        "share_of_step": {f"{s}s": f"{cost / (s * 1e6):.5%}" for s in (0.01, 0.1, 1.0)},
        "agent_read_us": reads,
        "steps": args.steps,
        "rounds": args.rounds,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.steps < 1 or args.rounds < 1:
        parser.error("--steps and --rounds at least 1")
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    record = {**header("rank_progress"), **measure(args)}
    print(json.dumps(record, indent=2))
    print(f"the progress record costs {record['record_us_per_step']} us a step "
          f"({record['share_of_step']['0.01s']} of a 10 ms step); the agent reads 256 records in "
          f"{record['agent_read_us']['256']} us")  # fmt: skip
    append_result("rank_progress", record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
