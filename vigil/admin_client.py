"""A small client of the controller's admin service, for the CLI and the demo."""

from __future__ import annotations

import os
from collections.abc import Iterator

from protos.vigil.v1 import admin_pb2, admin_pb2_grpc
from vigil_core.tls import channel, from_env


class AdminClient:
    def __init__(self, target: str, timeout_s: float = 5.0, plaintext: bool = False) -> None:
        """Mutual TLS with the certificates VIGIL_TLS_DIR names (an admin: one), if it names any;
        ``plaintext``: never (a local controller, as the demo's)."""
        self._channel = channel(target, None if plaintext else from_env(os.environ))
        self._stub = admin_pb2_grpc.AdminStub(self._channel)
        self._timeout = timeout_s

    def status(self) -> admin_pb2.StatusReply:
        reply: admin_pb2.StatusReply = self._stub.GetStatus(admin_pb2.StatusRequest(), timeout=self._timeout)
        return reply

    def incidents(self, open_only: bool = False, node: str = "", limit: int = 100) -> list[admin_pb2.Incident]:
        request = admin_pb2.IncidentsRequest(open_only=open_only, node=node, limit=limit)
        return list(self._stub.ListIncidents(request, timeout=self._timeout).incidents)

    def uncordon(self, node: str, requested_by: str, reason: str, verdict: str = "") -> admin_pb2.UncordonReply:
        request = admin_pb2.UncordonRequest(node=node, requested_by=requested_by, reason=reason, verdict=verdict)
        reply: admin_pb2.UncordonReply = self._stub.Uncordon(request, timeout=self._timeout)
        return reply

    def resolve(self, incident_id: str, requested_by: str, note: str) -> admin_pb2.ResolveReply:
        request = admin_pb2.ResolveRequest(incident_id=incident_id, requested_by=requested_by, note=note)
        reply: admin_pb2.ResolveReply = self._stub.Resolve(request, timeout=self._timeout)
        return reply

    def resume(self, requested_by: str, reason: str, apply_held: bool) -> admin_pb2.ResumeReply:
        request = admin_pb2.ResumeRequest(requested_by=requested_by, reason=reason, apply_held=apply_held)
        reply: admin_pb2.ResumeReply = self._stub.Resume(request, timeout=self._timeout)
        return reply

    def rules(self) -> admin_pb2.RulesReply:
        reply: admin_pb2.RulesReply = self._stub.ListRules(admin_pb2.RulesRequest(), timeout=self._timeout)
        return reply

    def jobs(self) -> list[admin_pb2.JobStatus]:
        return list(self._stub.ListJobs(admin_pb2.JobsRequest(), timeout=self._timeout).jobs)

    def repairs(self) -> admin_pb2.RepairsReply:
        reply: admin_pb2.RepairsReply = self._stub.ListRepairs(admin_pb2.RepairsRequest(), timeout=self._timeout)
        return reply

    def sweep(self, request: admin_pb2.SweepRequest) -> Iterator[admin_pb2.SweepUpdate]:
        """The sweep's updates as they come; a sweep takes as long as its checks (no deadline here)."""
        updates: Iterator[admin_pb2.SweepUpdate] = self._stub.Sweep(request)
        return updates

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
