"""Where a hung job is stuck, from its ranks' progress records (``vigil_core.rank_progress``, sent by
the nodes' agents): for a job whose ranks' stacks do not come (not under ``vigil launch``). Pure.

Each record says the step a rank last finished and what it is in since: ``compute`` (the next step),
``exchange`` (the hook's exchange with the other ranks), or a save or pause. In a hang:

- ranks at a lower step than the others are behind: they are the culprits;
- at one step, the ranks still in ``compute`` never reached the exchange the others wait in: culprits;
- every rank at one step and in one phase (``HangClass.ALIKE``): nothing singles a rank out (every
  rank waits in a training collective, or every rank is stuck the same way): the nodes must say.

The records carry no frames: they name the rank and node, not whether its own code, a read or its
host holds it (``HangClass.BEHIND``).
"""

from __future__ import annotations

from collections.abc import Sequence

from controller.jobs.stacks import HangClass, RankPlace, Wavefront
from vigil_core.rank_progress import RankRecord


def progress_wavefront(records: Sequence[RankRecord]) -> Wavefront | None:
    """The wavefront of one job's ranks' latest records (one per rank); None when there are none."""
    latest: dict[int, RankRecord] = {}
    for r in records:
        if r.rank not in latest or r.at > latest[r.rank].at:
            latest[r.rank] = r
    if not latest:
        return None
    ranks = sorted(latest.values(), key=lambda r: r.rank)
    top = max(r.step for r in ranks)
    behind = [r for r in ranks if r.step < top]
    at_top = [r for r in ranks if r.step == top]
    if not behind and any(r.phase == "exchange" for r in at_top):
        behind = [r for r in at_top if r.phase != "exchange"]
    waiting = len(ranks) - len(behind)
    if not behind:
        return Wavefront(HangClass.ALIKE, (), len(ranks))
    culprits = tuple(RankPlace(r.rank, r.node, True, False, f"step {r.step}, in {r.phase}", False) for r in behind)
    return Wavefront(HangClass.BEHIND, culprits, waiting)
