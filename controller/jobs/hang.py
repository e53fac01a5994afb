"""A job that stopped stepping: how long is too long, learnt from the job's own steps. Pure.

Rank 0's hook reports every window and heartbeats in between (``poll_s``, 1 s) with the step it is
at; its exchange with the other ranks at every step boundary (or the training's own collectives)
holds it at a step when any rank stops, so one stuck rank stops rank 0's step too. A job whose step
has not moved for longer than its bound is **hung**, whether rank 0 still heartbeats (a rank stuck
in a collective, a data loader on a dead mount, a spinning GPU) or the job went silent (a frozen
host, a killed launcher). The bound is ``factor`` times the p99 of the job's own seconds per step
over its recent windows, within ``floor_s`` and ``ceiling_s``; before the job has a window to learn
from, ``unlearned_s``. A save (the hook says so while the loop saves) or a pause the job announces
(an evaluation) is not a hang, nor is a job told to stop; a save or pause still said after
``pause_limit_s`` (an hour) is (a save stuck on a dead filesystem says "checkpoint" forever).

A hang alone does not say the hardware (most watchdog timeouts are on the CPU side: the
application, the host): it pages, and cordons nothing. Joined with where its ranks are stuck and
its nodes' own signals (``controller.jobs.hang_evidence``), a node with evidence is quarantined.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import Field, model_validator

from vigil_core.config_file import ConfigModel


class HangConfig(ConfigModel):
    enabled: bool = Field(default=True, description="page a job whose step stopped moving")
    factor: float = Field(default=8.0, gt=1, description="k: hung past k x the p99 of its own seconds per step")
    floor_s: float = Field(default=10.0, gt=0, description="never hung sooner than this")
    ceiling_s: float = Field(default=600.0, gt=0, description="always hung past this (the NCCL watchdog's default)")
    unlearned_s: float = Field(default=300.0, gt=0, description="the bound before the job has a window to learn from")
    learn_windows: int = Field(default=30, ge=1, description="the recent windows the bound learns from")
    pause_limit_s: float = Field(
        default=3600.0, gt=0, description="a save or pause still said after this long is a hang all the same "
        "(a save stuck on a dead filesystem says 'checkpoint' forever)"
    )  # fmt: skip
    evidence_s: float = Field(
        default=60.0, ge=0, description="a node's hardware signal from this long before the job's last step on "
        "joins its hang (controller.jobs.hang_evidence): that node is quarantined and the job restarted without it"
    )  # fmt: skip
    stacks_wait_s: float = Field(
        default=15.0, gt=0, description="after a hang is found, how long to wait for its ranks' stacks before "
        "judging it without them (a job not under vigil launch gives none)"
    )  # fmt: skip
    abort_after_s: float = Field(
        default=10.0, gt=0, description="a hung job told to restart cannot save: its launcher aborts it after this"
    )

    @model_validator(mode="after")
    def _ordered(self) -> HangConfig:
        if self.floor_s > self.ceiling_s:
            raise ValueError(f"floor_s {self.floor_s} is above ceiling_s {self.ceiling_s}")
        return self


@dataclass(frozen=True, slots=True)
class Hang:
    since: float  # when its step last moved (or its last word, if later): the controller's clock
    stalled_s: float
    bound_s: float
    silent: bool  # nothing heard from the job for longer than the bound either

    def describe(self, step: int) -> str:
        how = "and nothing has come from it since" if self.silent else "though its rank 0 still reports"
        return f"no step for {self.stalled_s:.0f} s at step {step} ({how}; its bound is {self.bound_s:.0f} s)"


def seconds_per_step(window_s: float, steps: int, checkpoint_s: float = 0.0) -> float | None:
    """One window's seconds per step, saves left out; None when it says nothing (no step in it)."""
    if steps <= 0 or window_s <= 0:
        return None
    return max(0.0, window_s - checkpoint_s) / steps


def step_bound(per_step: Sequence[float], config: HangConfig) -> float:
    """How long the job may go without a step: k x the p99 of its own, within the floor and ceiling."""
    if not per_step:
        return config.unlearned_s
    ordered = sorted(per_step)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return min(config.ceiling_s, max(config.floor_s, config.factor * p99))


def hang_of(
    stepped_at: float,
    last_report: float,
    pause: str,
    per_step: Sequence[float],
    config: HangConfig,
    now: float,
    held_since: Callable[[float], float] = lambda _: 0.0,
) -> Hang | None:
    """Whether a running job is hung now: its step last moved at ``stepped_at``, its last word came
    at ``last_report``, and ``pause`` is what it announced it is doing between steps ('' for none).
    The time the controller itself was held since then (``held_since``: its event loop's lateness)
    does not count against the job: its reports may be waiting to be read."""
    if not config.enabled:
        return None
    bound = step_bound(per_step, config)
    silent = now - last_report - held_since(last_report) > bound
    stalled = now - stepped_at
    watched = stalled - held_since(stepped_at)  # what the controller was there to see of it
    if pause and not silent and watched <= max(bound, config.pause_limit_s):  # while the job still says so
        return None
    if watched <= bound:
        return None
    return Hang(since=stepped_at, stalled_s=stalled, bound_s=bound, silent=silent)


def gone_silent(
    last_report: float, now: float, forget_after_s: float, held_since: Callable[[float], float] = lambda _: 0.0
) -> bool:
    """Whether a job has said nothing for ``forget_after_s`` (it is forgotten), not counting the time
    the controller itself was held since its last word (``held_since``), as for a hang."""
    return now - last_report - held_since(last_report) > forget_after_s
