"""slurmrestd in place of Slurm's commands: for a controller with no Slurm client and no munge key
beside it (a pod under Slinky, SUNK or soperator), which reaches slurmctld through its REST API
with a JWT. The API's v0.0.41 by default (tested on Slurm 24.11, which speaks v0.0.40 to v0.0.42;
22.05's v0.0.38 cannot update a node at all).

The token is read from its file on every request, so a rotated token is used at once (Slinky
and ``scontrol token`` write a new one before the old expires). Thin, as the commands are: every
decision is in ``controller.act.slurm.plans``.
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import urllib3

from controller.act.actuators import PermanentActionError
from controller.act.slurm.client import SlurmUnavailable
from controller.act.slurm.plans import (
    Json,
    SlurmAnswerError,
    SlurmJob,
    SlurmNode,
    errors_of,
    parse_jobs,
    parse_nodes,
    refused_for_good,
)


class SlurmRest:
    def __init__(
        self, url: str, token_file: Path, user: str = "root", api_version: str = "v0.0.41", timeout_s: float = 10.0
    ) -> None:
        self._base = f"{url.rstrip('/')}/slurm/{api_version}"
        self._token_file = token_file
        self._user = user
        self._http = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=timeout_s, read=timeout_s), retries=False, maxsize=4
        )
        self._timeout = timeout_s

    def nodes(self) -> list[SlurmNode]:
        return parse_nodes(self._call("GET", "/nodes"))

    def node(self, name: str) -> SlurmNode:
        doc = self._call("GET", f"/node/{quote(name, safe='')}", answer_errors=False)
        if errors_of(doc) and not doc.get("nodes"):
            raise PermanentActionError(f"Slurm has no node {name!r} ({errors_of(doc)})")
        found = [n for n in parse_nodes(doc) if n.name == name]
        if not found:
            raise PermanentActionError(f"Slurm has no node {name!r}")
        return found[0]

    def drain(self, name: str, reason: str) -> None:
        self._call("POST", f"/node/{quote(name, safe='')}", {"state": ["DRAIN"], "reason": reason})

    def resume(self, name: str) -> None:
        self._call("POST", f"/node/{quote(name, safe='')}", {"state": ["RESUME"]})

    def jobs(self) -> list[SlurmJob]:
        return parse_jobs(self._call("GET", "/jobs"))

    def hosts(self, job: SlurmJob) -> list[str]:
        if not job.hosts:  # slurmrestd lists a running job's nodes one by one; there is no expansion call
            raise SlurmAnswerError(f"job {job.id}: slurmrestd listed no nodes for {job.nodes!r}")
        return list(job.hosts)

    def close(self) -> None:
        self._http.clear()

    def _call(self, method: str, path: str, body: Json | None = None, answer_errors: bool = True) -> Json:
        """One request; the answer's document. Raises SlurmUnavailable where slurmrestd or slurmctld
        could not answer, PermanentActionError where Slurm refused the request itself, and (with
        ``answer_errors``) SlurmAnswerError for Slurm's other errors."""
        where = f"slurmrestd {method} {path}"
        headers = {"X-SLURM-USER-NAME": self._user, "X-SLURM-USER-TOKEN": self._token()}
        if body is not None:
            headers["Content-Type"] = "application/json"
        try:
            answer = self._http.request(
                method, self._base + path, body=None if body is None else json.dumps(body), headers=headers
            )
        except urllib3.exceptions.HTTPError as exc:
            raise SlurmUnavailable(f"{where}: {exc}") from None
        try:
            doc = json.loads(answer.data or b"{}")
        except json.JSONDecodeError:
            doc = None
        if not isinstance(doc, dict):
            raise SlurmUnavailable(f"{where}: HTTP {answer.status}, not Slurm's JSON: {answer.data[:200]!r}")
        errors = errors_of(doc)
        if refused_for_good(errors):
            raise PermanentActionError(f"{where}: {errors}")
        if answer.status in (401, 403) or "authentication" in errors.lower():
            raise SlurmUnavailable(f"{where}: the token in {self._token_file} was refused ({errors or answer.status})")
        if answer.status >= 500 and not errors:
            raise SlurmUnavailable(f"{where}: HTTP {answer.status}")
        if errors and answer_errors:
            raise SlurmUnavailable(f"{where}: {errors}")
        return doc

    def _token(self) -> str:
        try:
            token = self._token_file.read_text().strip()
        except OSError as exc:
            why = exc.strerror or exc
            raise SlurmUnavailable(f"slurmrestd: cannot read its token from {self._token_file}: {why}") from None
        return token.removeprefix("SLURM_JWT=")  # as `scontrol token` prints it
