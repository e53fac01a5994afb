"""Which training jobs run on this node, as its own processes say: a rank started by ``vigil launch``
(or any launcher that sets it) carries ``VIGIL_JOB_ID`` in its environment, and ``VIGIL_NODE`` where
it names the node. The agent reports the job ids it finds in its heartbeat, so the controller acts on
a job's blame of a node only where that node's own agent confirms the job runs there: a trainer's
certificate alone cannot get a node quarantined that it does not run on.

Bounded: at most ``MAX_JOBS`` ids, the first ``ENVIRON_BYTES`` of each process's environment; a
process that went away or is not readable is skipped.
"""

from __future__ import annotations

from pathlib import Path

from vigil_core.names import is_job_id

MAX_JOBS = 64
ENVIRON_BYTES = 65536


def _variables(environ: bytes) -> dict[bytes, bytes]:
    found = {}
    for item in environ.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key in (b"VIGIL_JOB_ID", b"VIGIL_NODE"):
            found[key] = value
    return found


def jobs_on_node(node: str, proc: Path = Path("/proc")) -> list[str]:
    """The job ids this node's processes run, sorted (at most ``MAX_JOBS``)."""
    jobs: set[str] = set()
    try:
        pids = [p for p in proc.iterdir() if p.name.isdigit()]
    except OSError:
        return []
    for pid in pids:
        try:
            with open(pid / "environ", "rb") as f:
                found = _variables(f.read(ENVIRON_BYTES))
        except OSError:  # gone, or not ours to read
            continue
        job = found.get(b"VIGIL_JOB_ID", b"").decode(errors="replace")
        where = found.get(b"VIGIL_NODE", b"").decode(errors="replace")
        if job and is_job_id(job) and where in ("", node):
            jobs.add(job)
            if len(jobs) >= MAX_JOBS:
                break
    return sorted(jobs)
