"""How a node is rebooted: a pluggable executor (``remediation.reboot.executor``).

Each one only *asks* for the reboot and returns; the repair then waits for the node's agent to
say Hello after the ask from a new boot (``repair.reboot_done``), within the reboot's timeout.

- ``job`` (default): a privileged Job pinned to the node (``controller.act.kube``) that reboots
  the host through ``/proc/sysrq-trigger``'s orderly path (``systemctl reboot`` in the host's
  namespaces). Needs the Kubernetes actuator.
- ``node_health_check``: hand-off to medik8s NodeHealthCheck and Self Node Remediation: the node
  condition Vigil writes on its quarantine (``VigilQuarantined=True``) is what its NodeHealthCheck
  selects (``deploy/examples/node-health-check.yaml``); Vigil asks nothing itself and waits.
- ``command``: the operator's own command, ``{node}`` replaced by the node's name (a cloud
  provider's CLI, a BMC's); exit 0 is asked, anything else failed.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from typing import Protocol

from controller.repairs.config import RebootConfig

COMMAND_TIMEOUT_S = 120.0


class RebootFailed(Exception):
    """The reboot could not be asked for (the message says why): the ladder climbs."""


class Reboot(Protocol):
    def reboot(self, node: str, attempt: int) -> str:
        """Ask for the node's reboot; returns what was done, raises RebootFailed."""
        ...


class CommandReboot:
    def __init__(self, command: Sequence[str], timeout_s: float = COMMAND_TIMEOUT_S) -> None:
        self._command = tuple(command)
        self._timeout_s = timeout_s

    def reboot(self, node: str, attempt: int) -> str:
        argv = [part.replace("{node}", node) for part in self._command]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=self._timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RebootFailed(f"{argv[0]}: {exc}") from None
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip().replace("\n", " ")[:300]
            raise RebootFailed(f"{' '.join(argv)[:200]} exited {done.returncode}: {said}")
        return f"asked by {argv[0]}" + (f": {done.stdout.strip()[:200]}" if done.stdout.strip() else "")


class HandOffReboot:
    """NodeHealthCheck reboots the node, seeing the condition Vigil's quarantine wrote."""

    def reboot(self, node: str, attempt: int) -> str:
        return "left to NodeHealthCheck (the node's VigilQuarantined=True condition selects it)"


RunJob = Callable[[str, str, str, str], str]  # (node, job name, namespace, image) -> what was done


class JobReboot:
    def __init__(self, run_job: RunJob, config: RebootConfig) -> None:
        self._run_job = run_job
        self._config = config

    def reboot(self, node: str, attempt: int) -> str:
        try:
            name = f"vigil-reboot-{node}-{attempt}"[:63]
            return self._run_job(node, name, self._config.namespace, self._config.image)
        except Exception as exc:  # the API server refused it: said, and the ladder climbs
            raise RebootFailed(f"the reboot Job could not be created: {exc}") from None


def build_reboot(config: RebootConfig, run_job: RunJob | None) -> Reboot:
    if config.executor == "command":
        return CommandReboot(config.command)
    if config.executor == "node_health_check":
        return HandOffReboot()
    if run_job is None:
        raise ValueError("remediation.reboot.executor job needs the Kubernetes actuator (actuator: kubernetes)")
    return JobReboot(run_job, config)
