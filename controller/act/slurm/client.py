"""How the Slurm actuator reaches slurmctld (``Slurm``): Slurm's own commands here, run as a person
would run them (``sinfo --json``, ``squeue --json``, ``scontrol update`` and ``scontrol show
hostnames``, against the cluster that ``SLURM_CONF`` or the configured file names), or slurmrestd
(``controller.act.slurm.rest``). Thin: every decision is in ``controller.act.slurm.plans``.

Slurm 22.05's ``--json`` ignores the other filters (``-n``, ``-p``, ``-j``): the whole list comes
back and is filtered here. Later releases' ``sinfo --json`` lists groups of nodes, not nodes (seen on 24.11):
``scontrol --json show nodes`` reads them then.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Protocol

from controller.act.actuators import PermanentActionError
from controller.act.slurm.plans import (
    Json,
    SlurmAnswerError,
    SlurmJob,
    SlurmNode,
    parse_jobs,
    parse_nodes,
    parse_show_node,
    refused_for_good,
)


class SlurmUnavailable(Exception):
    """slurmctld could not be asked (not running, unreachable, too slow): try again later."""


class Slurm(Protocol):
    """What the actuator asks of slurmctld. Each raises PermanentActionError where Slurm refuses the
    request itself (no such node), SlurmUnavailable where it could not be asked, SlurmAnswerError
    where the answer does not read."""

    def nodes(self) -> list[SlurmNode]: ...

    def node(self, name: str) -> SlurmNode: ...

    def drain(self, name: str, reason: str) -> None: ...

    def resume(self, name: str) -> None: ...

    def jobs(self) -> list[SlurmJob]: ...

    def hosts(self, job: SlurmJob) -> list[str]:
        """The nodes the job holds, one name each."""
        ...

    def close(self) -> None: ...


class SlurmCommands:
    def __init__(self, conf: Path | None = None, bin_dir: Path | None = None, timeout_s: float = 10.0) -> None:
        self._env = {**os.environ, **({"SLURM_CONF": str(conf)} if conf is not None else {})}
        self._bin = bin_dir
        self._timeout = timeout_s

    def nodes(self) -> list[SlurmNode]:
        doc = self._json("sinfo", "--json")
        if "nodes" not in doc and "sinfo" in doc:  # a later release: groups of nodes
            doc = self._json("scontrol", "--json", "show", "nodes")
        return parse_nodes(doc)

    def node(self, name: str) -> SlurmNode:
        """One node, read alone (``scontrol show node -o``: a burst of quarantines reads each node,
        not the whole cluster each time)."""
        try:
            line = self._run("scontrol", "show", "node", "-o", name)
        except SlurmUnavailable as exc:
            if "not found" in str(exc).lower():
                raise PermanentActionError(f"Slurm has no node {name!r}") from None
            raise
        return parse_show_node(line, _local_epoch)

    def jobs(self) -> list[SlurmJob]:
        return parse_jobs(self._json("squeue", "--json"))

    def hosts(self, job: SlurmJob) -> list[str]:
        """Slurm's expansion of the job's host list (``gpu-[01-03,07]``), where the answer had none."""
        return list(job.hosts) or self._run("scontrol", "show", "hostnames", job.nodes).split()

    def drain(self, name: str, reason: str) -> None:
        self._run("scontrol", "update", f"nodename={name}", "state=drain", f"reason={reason}")

    def resume(self, name: str) -> None:
        self._run("scontrol", "update", f"nodename={name}", "state=resume")

    def close(self) -> None:
        pass  # each call is its own command

    def _json(self, *command: str) -> Json:
        out = self._run(*command)
        try:
            doc = json.loads(out)
        except json.JSONDecodeError as exc:
            raise SlurmAnswerError(f"{' '.join(command)}: not JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise SlurmAnswerError(f"{' '.join(command)}: not a JSON object")
        return doc

    def _run(self, program: str, *args: str) -> str:
        path = str(self._bin / program) if self._bin is not None else program
        try:
            done = subprocess.run(
                [path, *args], env=self._env, capture_output=True, text=True, timeout=self._timeout, check=False
            )
        except FileNotFoundError:
            raise PermanentActionError(f"{program} is not installed here ({path}): Slurm's client commands") from None
        except subprocess.TimeoutExpired:
            raise SlurmUnavailable(f"{program} {' '.join(args[:2])}: no answer within {self._timeout:g} s") from None
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip().splitlines()
            text = said[-1] if said else f"exit code {done.returncode}"
            if refused_for_good(text):
                raise PermanentActionError(f"{program} {' '.join(args)}: {text}")
            raise SlurmUnavailable(f"{program} {' '.join(args[:2])}: {text}")
        return done.stdout


def _local_epoch(text: str) -> float:
    """Slurm's timestamps (``2026-11-26T17:54:31``) are in the local time of whoever printed them."""
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return 0.0
