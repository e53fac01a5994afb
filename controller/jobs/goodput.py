"""Goodput: where a training job's wall-clock time went. Pure; the job monitor feeds it the job's
reports, whose times are the job's own clock (rank 0's), never the controller's.

- productive: steps trained and kept (window time less the checkpoint pauses in it);
- checkpoint: time the ranks were blocked saving (every save, and the stop's save);
- restore: the time each run took from its process start to its first step: start-up and loading
  its checkpoint (the job says how long);
- wasted: steps trained and then lost, because the job restarted from an older committed step;
- recovery: from the last thing a run did to the next run's first step, less the restore: the
  stop, the launcher's wait for the controller's sweep, starting the processes again.

The steps a run trained after its last window and before it died (no clean stop) are not reported
by anything and fall in recovery.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

KINDS = ("productive", "checkpoint", "restore", "wasted", "recovery")


@dataclass(frozen=True)
class Span:
    """Steps (first, last] trained in ``seconds``, which a restart from before ``last`` would lose."""

    first: int
    last: int
    seconds: float


@dataclass(frozen=True)
class Goodput:
    productive_s: float = 0.0
    checkpoint_s: float = 0.0
    restore_s: float = 0.0
    wasted_s: float = 0.0
    recovery_s: float = 0.0
    step: int = 0  # the newest step accounted for
    at: float | None = None  # the job's clock at the newest time accounted for
    spans: tuple[Span, ...] = field(default=())  # productive time not yet protected by a commit
    committed_step: int = 0  # the newest committed checkpoint
    saves: int = 0  # checkpoints committed (each a new, later step)
    restarts: int = 0  # runs started after the first
    restarts_s: float = 0.0  # their restore and recovery, together

    @property
    def mean_save_s(self) -> float | None:
        """What one save blocked the job, on average; None before any."""
        return self.checkpoint_s / self.saves if self.saves else None

    @property
    def mean_restart_s(self) -> float | None:
        """From a run's last report to the next run's first step (restore included); None before any."""
        return self.restarts_s / self.restarts if self.restarts else None

    @property
    def total_s(self) -> float:
        return self.productive_s + self.checkpoint_s + self.restore_s + self.wasted_s + self.recovery_s

    @property
    def ratio(self) -> float | None:
        """Productive time over all the time seen; None before any."""
        return self.productive_s / self.total_s if self.total_s > 0 else None


def started(g: Goodput, at: float, step: int, restore_s: float) -> Goodput:
    """A run started at ``step`` (its committed checkpoint), having spent ``restore_s`` loading it."""
    restore_s = max(0.0, restore_s)
    if g.at is None:  # the first start: nothing before it is seen
        return replace(g, restore_s=g.restore_s + restore_s, step=step, at=at)
    kept, lost = _rewind(g.spans, step)
    recovery = max(0.0, at - g.at - restore_s)
    return replace(
        g,
        productive_s=g.productive_s - lost,
        wasted_s=g.wasted_s + lost,
        restore_s=g.restore_s + restore_s,
        recovery_s=g.recovery_s + recovery,
        step=step,
        at=max(at, g.at),
        spans=kept,
        restarts=g.restarts + 1,
        restarts_s=g.restarts_s + restore_s + recovery,
    )


def trained(g: Goodput, at: float, step: int, checkpoint_s: float, since: float | None = None) -> Goodput:
    """Steps up to ``step`` trained until ``at`` (a window that began at ``since``, or everything
    since the last report: a stop's tail), ``checkpoint_s`` of it blocked saving."""
    begin = since if since is not None else g.at if g.at is not None else at
    if g.at is not None:
        begin = max(begin, g.at)  # never count the same seconds twice
    elapsed = max(0.0, at - begin)
    blocked = min(max(0.0, checkpoint_s), elapsed)
    seconds = elapsed - blocked
    spans = (*g.spans, Span(g.step, step, seconds)) if step > g.step else g.spans
    return replace(
        g,
        productive_s=g.productive_s + seconds,
        checkpoint_s=g.checkpoint_s + blocked,
        step=max(step, g.step),
        at=max(at, begin),
        spans=spans,
    )


def committed(g: Goodput, step: int) -> Goodput:
    """A checkpoint at ``step`` is committed: the steps up to it can no longer be lost."""
    saves = g.saves + 1 if step > g.committed_step else g.saves
    spans = tuple(s for s in g.spans if s.last > step)
    return replace(g, spans=spans, committed_step=max(step, g.committed_step), saves=saves)


def _rewind(spans: tuple[Span, ...], step: int) -> tuple[tuple[Span, ...], float]:
    """The spans a restart from ``step`` keeps, and the seconds it loses (the part of a span after
    ``step``, in proportion to its steps)."""
    kept: list[Span] = []
    lost = 0.0
    for s in spans:
        if s.last <= step:
            kept.append(s)
        elif s.first >= step:
            lost += s.seconds
        else:
            share = (s.last - step) / (s.last - s.first)
            lost += s.seconds * share
            kept.append(Span(s.first, step, s.seconds * (1 - share)))
    return tuple(kept), lost
