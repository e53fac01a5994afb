"""The ``remediation:`` section of the controller's configuration: the ladder, its timeouts, who may
be repaired when, how a node is rebooted and how a repaired node is certified."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from controller.repairs.ladder import Step
from controller.sweeps.spec import LOCAL_CHECKS, PAIRS
from controller.vocab.repair_steps import ORDER, check_ladder
from vigil_core.config_file import ConfigModel, HttpUrl

DEFAULT_TIMEOUTS_S = {Step.RECHECK: 60.0, Step.GPU_RESET: 300.0, Step.BUS_RESET: 300.0, Step.REBOOT: 1800.0}
# Labels whose presence means another owner holds the node: the GPU Operator upgrading its driver
# ("upgrade-done" and "" are not an upgrade under way), a maintenance window.
DEFAULT_HANDS_OFF = {"nvidia.com/gpu-driver-upgrade-state": "upgrade-done", "vigil.dev/maintenance": ""}


class RebootConfig(ConfigModel):
    executor: Literal["job", "node_health_check", "command"] = Field(
        default="job",
        description="job: a privileged Job on the node; node_health_check: medik8s NodeHealthCheck reboots it, "
        "seeing the node condition Vigil writes; command: the operator's own command ({node} in it)",
    )
    command: tuple[str, ...] = Field(default=(), description="for executor: command; {node} is the node's name")
    namespace: str = Field(default="vigil", description="where the reboot Job runs")
    image: str = Field(default="busybox:1.36", description="the reboot Job's image")

    @model_validator(mode="after")
    def _command_named(self) -> RebootConfig:
        if self.executor == "command" and not self.command:
            raise ValueError("reboot.executor command needs reboot.command (a list: the program and its arguments)")
        return self


class CertifyConfig(ConfigModel):
    checks: tuple[str, ...] = Field(
        default=("gpu_health", "matmul", "membw", PAIRS),
        description="run on the repaired node and a known-good peer; pairs: an all-reduce between the two",
    )
    params: dict[str, dict[str, str]] = Field(default_factory=dict, description="arguments per check, as a sweep's")

    @field_validator("checks")
    @classmethod
    def _known(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        known = (*LOCAL_CHECKS, PAIRS)
        if bad := [c for c in value if c not in known]:
            raise ValueError(f"no check named {', '.join(bad)}; certification runs: {', '.join(known)}")
        if "gpu_health" not in value:
            raise ValueError("certification always runs gpu_health (the GPUs present, the recovery action none)")
        return value


class RemediationConfig(ConfigModel):
    enabled: bool = Field(default=False, description="repair quarantined nodes by the ladder; off: a person does")
    steps: tuple[Step, ...] = Field(default=ORDER, description="the rungs in use, mildest first; replace is last")
    timeouts_s: dict[Step, float] = Field(default_factory=lambda: dict(DEFAULT_TIMEOUTS_S))
    settle_s: float = Field(default=30.0, ge=0, description="after a step, before certifying the node")
    hold_down_s: float = Field(
        default=300.0, ge=0, description="certified, the node stays out this long; a fault meanwhile climbs the ladder"
    )
    workload_wait_s: float = Field(
        default=3600.0, gt=0, description="how long to wait for the node's workload to leave before paging"
    )
    max_repairs: int = Field(default=3, ge=1, description="repaired this often within repairs_window_s: replace")
    repairs_window_s: float = Field(default=7 * 86400.0, gt=0)
    per_domain: int = Field(default=1, ge=1, description="repairs under way at once in one failure domain")
    per_hour: int = Field(default=10, ge=1, description="repairs started in the fleet per hour")
    hands_off: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_HANDS_OFF),
        description="label -> the one value that does not hold the node ('' : any value holds it)",
    )
    resets: Literal["agent", "job"] = Field(
        default="agent",
        description="who resets a GPU or its bus: the node's agent (remedies on, run as root), or a short-lived "
        "privileged Job on the node running `vigil remedy` (the agent's DaemonSet stays unprivileged)",
    )
    resets_image: str = Field(default="", description="for resets: job, an image with the vigil command (the agent's)")
    reboot: RebootConfig = Field(default_factory=RebootConfig)
    certify: CertifyConfig = Field(default_factory=CertifyConfig)
    ticket_url: HttpUrl | None = Field(default=None, description="a webhook that opens a ticket when hands are needed")
    agent_answer_s: float = Field(default=15.0, gt=0, description="past a step's timeout: the agent is gone")

    @model_validator(mode="after")
    def _image_named(self) -> RemediationConfig:
        if self.resets == "job" and not self.resets_image:
            raise ValueError("remediation.resets job needs remediation.resets_image (the agent's image: it has vigil)")
        return self

    @field_validator("steps")
    @classmethod
    def _ordered(cls, value: tuple[Step, ...]) -> tuple[Step, ...]:
        return check_ladder(value)

    @field_validator("timeouts_s")
    @classmethod
    def _timeouts(cls, value: dict[Step, float]) -> dict[Step, float]:
        if bad := [s.value for s, t in value.items() if not t > 0]:
            raise ValueError(f"timeouts must be positive: {', '.join(bad)}")
        return {**DEFAULT_TIMEOUTS_S, **value}

    def timeout_s(self, step: Step) -> float:
        return self.timeouts_s.get(step, DEFAULT_TIMEOUTS_S.get(step, 300.0))
