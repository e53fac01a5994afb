"""The job monitor's settings (the ``jobs:`` section of the controller's configuration)."""

from __future__ import annotations

from pydantic import Field

from controller.jobs.hang import HangConfig
from vigil_core.config_file import ConfigModel


class JobsConfig(ConfigModel):
    warmup_windows: int = Field(default=1, ge=0, description="windows after each (re)start that never count")
    baseline_windows: int = Field(default=3, ge=1, description="the baseline is the median of these windows")
    drop_fraction: float = Field(default=0.2, gt=0, lt=1, description="δ: below (1-δ)·baseline is low")
    drop_windows: int = Field(default=2, ge=1, description="N: this many low windows in a row are a drop")
    straggler_ratio: float = Field(default=1.3, gt=1, description="a rank this many times the median step time")
    deadline_s: float = Field(default=300.0, gt=0, description="to checkpoint and exit; past it the job is killed")
    act_on_drop: bool = Field(default=True, description="stop, sweep and restart the job after a blamed drop")
    sweep_checks: tuple[str, ...] = Field(default=("gpu_health",), description="the sweep of a stopped job's nodes")
    forget_after_s: float = Field(default=3600.0, gt=0, description="a job silent this long is forgotten")
    hang: HangConfig = Field(default_factory=HangConfig)
    max_jobs: int = Field(default=1000, ge=1, description="jobs followed at once; a new job id beyond is refused")
    failures_per_1000_gpu_days: float = Field(
        default=1.0, gt=0, description="the GPUs' failure rate, for each job's planned ETTR (vigil plan)"
    )
    checkpoint_now: bool = Field(default=True, description="ask a job to save when a node of it shows early signs")
    checkpoint_now_every_s: float = Field(default=600.0, gt=0, description="at most one such ask per job this often")
    blame_needs_agents: bool | None = Field(
        default=None,
        description="act on a job's blame of a node only where that node's own agent sees the job's processes "
        "(else page only); default: on under TLS, where callers have identities, off in plaintext",
    )
