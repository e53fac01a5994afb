"""``vigil plan``: print the plan (``controller.planning.plan``) as tables, as JSON, or as a plot."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from controller.planning.faults import LLAMA3_MIX
from controller.planning.plan import MEASURED, Plan, Scenario

_console = Console()


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 7200:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3600:.3g} h"


def plan_json(plan: Plan) -> dict[str, Any]:
    out: dict[str, Any] = {
        "inputs": asdict(plan.inputs),
        "mtbf_s": plan.mtbf_s,
        "failures_per_day": plan.failures_per_day,
        "ettr_points_saved": plan.saved_share,
    }
    for key, s in (("vigil", plan.vigil), ("baseline", plan.baseline)):
        out[key] = {
            "times": asdict(s.times),
            "young_interval_s": s.young_s,
            "daly_interval_s": s.daly_s,
            "ettr": s.at_optimum.ettr,
            "badput": asdict(s.at_optimum.badput),
            "simulated": asdict(s.simulated),
            "curve": [{"interval_s": e.interval_s, "ettr": e.ettr} for e in s.curve],
        }
    return out


def print_plan(plan: Plan) -> None:
    p = plan.inputs
    _console.print(
        f"[bold]{p.gpus:,} GPUs[/], {p.failures_per_1000_gpu_days:g} failures per 1,000 GPU-days: "
        f"a failure every {_duration(plan.mtbf_s)} ({plan.failures_per_day:.3g} a day); a {p.days:g}-day run"
    )
    table = Table(title="The plan, at each one's optimal checkpoint interval")
    table.add_column("")
    for s in (plan.vigil, plan.baseline):
        table.add_column(s.name, justify="right")
    rows: list[tuple[str, Any]] = [
        ("checkpoint every (Daly)", lambda s: _duration(s.daly_s)),
        ("  (Young)", lambda s: _duration(s.young_s)),
        ("fault -> job told (mean)", lambda s: _duration(s.times.detect_s)),
        ("told -> training again (mean)", lambda s: _duration(s.times.restart_s)),
        ("ETTR (formula)", lambda s: f"{s.at_optimum.ettr:.1%}"),
        ("ETTR simulated p5 / p50 / p95", _simulated),
        ("badput: checkpointing", lambda s: f"{s.at_optimum.badput.checkpoint:.2%}"),
        ("badput: lost work", lambda s: f"{s.at_optimum.badput.lost_work:.2%}"),
        ("badput: detection", lambda s: f"{s.at_optimum.badput.detection:.2%}"),
        ("badput: restart", lambda s: f"{s.at_optimum.badput.restart:.2%}"),
        ("badput: stragglers", lambda s: f"{s.at_optimum.badput.stragglers:.2%}"),
    ]
    for label, cell in rows:
        table.add_row(label, *(cell(s) for s in (plan.vigil, plan.baseline)))
    _console.print(table)
    gpu_days = plan.saved_share * p.gpus * p.days
    _console.print(
        f"Vigil adds [bold]{plan.saved_share * 100:.1f} points[/] of ETTR: {gpu_days:,.0f} GPU-days "
        f"over the run. Faults drawn as Llama 3's {sum(k.count for k in LLAMA3_MIX)} interruptions were; "
        f"{p.runs} runs simulated."
    )
    for key, (value, source) in MEASURED.items():
        if getattr(p, key) == value:
            _console.print(f"[dim]{key} {value:g} s: Vigil's measurement, {source}; at scale, give your own[/]")


def _simulated(s: Scenario) -> str:
    d = s.simulated
    return f"{d.p5:.1%} / {d.p50:.1%} / {d.p95:.1%}"


PLOT_FORMATS = ("png", "svg", "pdf")


def write_plot(plan: Plan, path: Path) -> None:
    """ETTR against the checkpoint interval, the optimum marked, with and without Vigil; the axis
    labelled at 1-2-5 steps, the assumed save and restart in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig, ax = plt.subplots(figsize=(8, 5))
    for s in (plan.vigil, plan.baseline):
        xs = [e.interval_s / 60 for e in s.curve]
        (line,) = ax.plot(xs, [e.ettr * 100 for e in s.curve], label=s.name)
        ax.plot([s.daly_s / 60], [s.at_optimum.ettr * 100], "o", color=line.get_color())
        ax.annotate(f"{_duration(s.daly_s)}: {s.at_optimum.ettr:.1%}", (s.daly_s / 60, s.at_optimum.ettr * 100))
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("checkpoint interval (min)")
    ax.set_ylabel("ETTR (%)")
    times = plan.vigil.times
    ax.set_title(
        f"{plan.inputs.gpus:,} GPUs, a failure every {_duration(plan.mtbf_s)}; "
        f"a save blocks {_duration(times.save_s)}, a restart takes {_duration(times.restart_s)}",
        fontsize=10,
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def dumps(plan: Plan) -> str:
    return json.dumps(plan_json(plan), indent=2)
