"""What a sweep runs: the checks, their arguments and deadlines, and the pairwise all-reduce's
parameters, validated into a ``SweepSpec``. Pure.

A sweep runs the local checks on each node (in order, one at a time, so that two invasive checks
never share a GPU), then pairwise all-reduce between nodes (``controller.sweeps.pairing``); how the results
are judged is ``controller.sweeps.judge``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import Field, field_validator

from checks.program import argument_problem
from controller.sweeps.topology import TopologyConfig
from vigil_core.config_file import ConfigModel

LOCAL_CHECKS = ("gpu_health", "matmul", "membw", "allreduce")
PAIRS = "pairs"
ALL_CHECKS = (*LOCAL_CHECKS, PAIRS)
# The program behind the pairwise stage, and the arguments the sweep sets itself.
PAIR_PROGRAM = "allreduce"
_PAIR_OWN_ARGS = frozenset({"master", "rank", "world-size", "nproc", "json"})
_ARG_RE = re.compile(r"^[a-z][a-z0-9-]{0,40}$")
_VALUE_RE = re.compile(r"^[A-Za-z0-9.,:_/+-]{0,200}$")


# Rank 0 of a pair whose port another program holds answers "port taken" (checks.result.NotRun):
# the pair runs again on another port, this many tries in all.
PAIR_PORT_TRIES = 3
DEFAULT_DEADLINES_S = {"gpu_health": 30.0, "matmul": 180.0, "membw": 180.0, "allreduce": 300.0, PAIRS: 180.0}


class SweepError(ValueError):
    """A sweep request that cannot run: the message names the problem."""


class SweepConfig(ConfigModel):
    checks: tuple[str, ...] = ALL_CHECKS
    deadline_s: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_DEADLINES_S))
    params: dict[str, dict[str, str]] = Field(
        default_factory=dict, description="arguments per check, e.g. {matmul: {seconds: '10'}}"
    )
    answer_grace_s: float = Field(default=15.0, gt=0, description="past a check's deadline: the agent is gone")
    pair_port_base: int = Field(
        default=26000, ge=1024, le=65000, description="the pairs' rank 0 listen on ports from here up"
    )
    pair_port_span: int = Field(
        default=3000, ge=PAIR_PORT_TRIES, description="how many ports from pair_port_base the pairs may use"
    )
    min_busbw_gbps: float = Field(default=0.0, ge=0, description="pairs below this bus bandwidth are slow")
    pair_max_below_median: float = Field(default=0.5, gt=0, lt=1, description="pairs this far below the median")
    fleet_max_below_median: float = Field(default=0.25, gt=0, lt=1, description="GPUs this far below the fleet's")
    topology: TopologyConfig = Field(
        default_factory=TopologyConfig, description="where each node sits in the fabric: labels or a file"
    )

    @field_validator("checks")
    @classmethod
    def _known_checks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_known(value))

    @field_validator("deadline_s")
    @classmethod
    def _deadlines(cls, value: dict[str, float]) -> dict[str, float]:
        _known(value)
        if bad := [k for k, v in value.items() if not v > 0]:
            raise ValueError(f"deadlines must be positive: {', '.join(bad)}")
        return {**DEFAULT_DEADLINES_S, **value}  # a check the file leaves out keeps its default

    @field_validator("params")
    @classmethod
    def _params(cls, value: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        for check, args in value.items():
            _check_args(check, args)
        return value


def _known(names: Sequence[str] | Mapping[str, object]) -> list[str]:
    unknown = [n for n in names if n not in ALL_CHECKS]
    if unknown:
        raise SweepError(f"no check named {', '.join(map(repr, unknown))}; a sweep runs: {', '.join(ALL_CHECKS)}")
    return list(names)


def _check_args(check: str, args: Mapping[str, str]) -> None:
    _known([check])
    for arg, value in args.items():
        if not _ARG_RE.match(arg):
            raise SweepError(f"{check}.{arg}: not an argument name (lower-case letters, digits, '-')")
        if not _VALUE_RE.match(str(value)):
            raise SweepError(f"{check}.{arg}: value {value!r} has characters a check argument never needs")
        if check == PAIRS and arg in _PAIR_OWN_ARGS:
            raise SweepError(f"{check}.{arg} is set by the sweep itself")
    # As the check's own command line would take them (a bad value would make every node UNKNOWN).
    program = PAIR_PROGRAM if check == PAIRS else check
    flags = [a for arg, value in sorted(args.items()) for a in (f"--{arg}", str(value))]
    if problem := argument_problem(program, flags):
        raise SweepError(f"{check}: {problem.partition(': ')[2]}")


@dataclass(frozen=True, slots=True)
class SweepSpec:
    checks: tuple[str, ...]
    params: dict[str, dict[str, str]]  # check -> its arguments (configured, then the request's)
    deadline_s: dict[str, float]
    quarantine: bool
    min_busbw_gbps: float
    requested_by: str

    @property
    def local_checks(self) -> tuple[str, ...]:
        return tuple(c for c in self.checks if c != PAIRS)

    @property
    def pairs(self) -> bool:
        return PAIRS in self.checks


def sweep_spec(
    config: SweepConfig,
    checks: Sequence[str],
    params: Mapping[str, str],
    quarantine: bool,
    min_busbw_gbps: float,
    requested_by: str,
) -> SweepSpec:
    """The request, completed from the configuration; raises SweepError naming what is wrong."""
    chosen = tuple(dict.fromkeys(_known(list(checks)))) or config.checks
    merged = {check: dict(args) for check, args in config.params.items()}
    for key, value in params.items():
        check, dot, arg = key.partition(".")
        if not dot:
            raise SweepError(f"parameter {key!r}: expected CHECK.ARG=VALUE, e.g. matmul.seconds=5")
        _check_args(check, {arg: value})
        merged.setdefault(check, {})[arg] = value
    if min_busbw_gbps < 0:
        raise SweepError(f"min_busbw_gbps must be >= 0, not {min_busbw_gbps}")
    return SweepSpec(
        checks=chosen,
        params=merged,
        deadline_s=dict(config.deadline_s),
        quarantine=quarantine,
        min_busbw_gbps=min_busbw_gbps or config.min_busbw_gbps,
        requested_by=requested_by or "unknown",
    )


def pair_params(spec: SweepSpec, master: str, rank: int) -> dict[str, str]:
    """The all-reduce program's arguments for one member of a pair."""
    return {**spec.params.get(PAIRS, {}), "master": master, "rank": str(rank), "world-size": "2"}


def pair_ports(config: SweepConfig) -> tuple[int, int]:
    """The ports pairs may use, [first, first + count), within the port range. Pure."""
    return config.pair_port_base, min(config.pair_port_span, 65536 - config.pair_port_base)


def pairs_at_once(config: SweepConfig) -> int:
    """How many pairs one round runs at most: each of its pairs' tries has a port of its own."""
    return pair_ports(config)[1] // PAIR_PORT_TRIES


def pair_port(config: SweepConfig, k: int, pairs: int, attempt: int) -> int:
    """Rank 0's port for a round's k-th pair of ``pairs`` (at most ``pairs_at_once``) on its
    attempt-th try (from 0): no two pairs of a round, nor two tries, share one. Pure."""
    first, count = pair_ports(config)
    return first + (attempt * pairs + k) % count


def master_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
