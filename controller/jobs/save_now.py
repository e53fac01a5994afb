"""When to ask a running job for a checkpoint now (CHECKPOINT_NOW: save, do not stop). Pure.

A node of the job turning SUSPECT, or an early warning on one (harmful throttling, a flapping or
erroring InfiniBand port, NVLink or PCIe errors, a non-fatal NVSwitch error, retired pages), is a
sign it may fail soon: the work since the last save is worth saving before it does. A SUSPECT node
asks once per suspicion (not again while it stays SUSPECT); warnings ask each time; and a job is
asked at most once per ``every_s``: signs that come in between wait for the next ask. The request is
repeated in the replies to the job until it acknowledges it, or for ``resend_s``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from protos.vigil.v1 import trainer_pb2


@dataclass
class SaveRequests:
    """One job's asks for a save."""

    asked_at: float = float("-inf")
    asks: int = 0
    covered: set[str] = field(default_factory=set)  # SUSPECT nodes asked for already
    warnings: dict[str, str] = field(default_factory=dict)  # node -> its latest warning, not asked for yet
    pending: trainer_pb2.CheckpointNow | None = None
    pending_since: float = 0.0

    def warn(self, node: str, what: str) -> None:
        self.warnings[node] = what

    def decide(
        self, job_id: str, nodes: Sequence[str], suspects: Collection[str], now: float, every_s: float
    ) -> trainer_pb2.CheckpointNow | None:
        """A new request, when there is a new sign and the job was not asked within ``every_s``."""
        self.covered &= set(suspects)  # a node no longer SUSPECT may be asked for again next time
        fresh = [n for n in nodes if n in suspects and n not in self.covered]
        reasons = [f"{n} is SUSPECT" for n in fresh] + [f"{n}: {w}" for n, w in self.warnings.items() if n in nodes]
        if not reasons or now - self.asked_at < every_s:
            return None
        self.covered |= set(fresh)
        self.warnings.clear()
        self.asks += 1
        self.asked_at, self.pending_since = now, now
        self.pending = trainer_pb2.CheckpointNow(id=f"{job_id}-save-{self.asks}", reason="; ".join(reasons)[:1000])
        return self.pending

    def outstanding(self, now: float, resend_s: float) -> trainer_pb2.CheckpointNow | None:
        """The request to send with a reply: until acknowledged, for ``resend_s`` at most."""
        if self.pending is not None and now - self.pending_since > resend_s:
            self.pending = None
        return self.pending

    def acknowledged(self, command_id: str) -> bool:
        if self.pending is not None and self.pending.id == command_id:
            self.pending = None
            return True
        return False
