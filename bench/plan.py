"""``vigil plan`` at 3,072 and 16,384 GPUs, with Vigil and without: ETTR and the optimal interval.

    python -m bench.plan [--rate 1.0] [--days 90] [--runs 200]

Two sets of job times for each size: Vigil's own measurements (a 2-rank job on 2 CPU cores: an
asynchronous save blocking 0.011 s, 4.3 s from a fault to training again), and times a large job
has (a 30 s save, a 5-minute restart: not measured here, an assumption printed as such). The fault
mix, detection latencies and baseline are ``controller.planning.plan``'s defaults. Figures are appended to
bench/results/plan.jsonl with the command that produced them.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from bench.record import append_result, header
from controller.planning.plan import MEASURED, PlanInputs, make_plan

TIMES = {
    "measured": (MEASURED["save_s"][0], MEASURED["restart_s"][0]),
    "assumed at scale": (30.0, 300.0),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=1.0, help="failures per 1,000 GPU-days")
    parser.add_argument("--days", type=float, default=90.0)
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for gpus in (3072, 16384):
        for label, (save_s, restart_s) in TIMES.items():
            plan = make_plan(PlanInputs(gpus, args.rate, save_s, restart_s, days=args.days, runs=args.runs))
            for s in (plan.vigil, plan.baseline):
                rows.append(
                    {
                        "gpus": gpus,
                        "times": label,
                        "save_s": save_s,
                        "restart_s": restart_s,
                        "scenario": s.name,
                        "daly_interval_s": round(s.daly_s, 1),
                        "ettr": round(s.at_optimum.ettr, 4),
                        "simulated_p5_p50_p95": [
                            round(x, 4) for x in (s.simulated.p5, s.simulated.p50, s.simulated.p95)
                        ],
                    }
                )
                print(
                    f"{gpus:6,} GPUs, {label:16} {s.name:14}: checkpoint every {s.daly_s / 60:6.2f} min, "
                    f"ETTR {s.at_optimum.ettr:.1%} (simulated p5 {s.simulated.p5:.1%}, p95 {s.simulated.p95:.1%})"
                )
    append_result("plan", {**header("plan"), "rate_per_1000_gpu_days": args.rate, "days": args.days, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
