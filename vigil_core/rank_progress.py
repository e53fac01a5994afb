"""Each rank's progress record: where it is, written by its hook to a small file on its node, read by
the node's agent and sent with its heartbeat. Neither side waits on the other, on the training
thread or on any collective: a job whose process group is stuck still shows where each rank is. Pure.

A record is one JSON object padded with spaces to ``RECORD_BYTES``, rewritten in place at offset 0
(``os.pwrite``): a reader sees the whole of one record or a record it cannot parse (skipped until the
next read), never a mix it would believe. The file is ``<dir>/<job>.rank<N>``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from vigil_core.names import is_job_id, is_node_name

RECORD_BYTES = 256
MAX_PHASE = 32


@dataclass(frozen=True, slots=True)
class RankRecord:
    job: str
    rank: int
    node: str
    step: int
    phase: str  # "compute" (between steps), "exchange" (the hook's), "checkpoint", a pause the job said
    at: float  # when it was written (the node's clock)


def file_name(job: str, rank: int) -> str:
    return f"{job}.rank{rank}"


def encode(record: RankRecord) -> bytes:
    text = json.dumps(
        {"job": record.job, "rank": record.rank, "node": record.node, "step": record.step,
         "phase": record.phase[:MAX_PHASE], "at": round(record.at, 3)},
        separators=(",", ":"),
    )  # fmt: skip
    data = text.encode()
    if len(data) > RECORD_BYTES:
        raise ValueError(f"a progress record of {len(data)} bytes is over {RECORD_BYTES}")
    return data.ljust(RECORD_BYTES)


def decode(data: bytes) -> RankRecord | None:
    """The record in a file's bytes; None for anything that is not one whole, valid record."""
    try:
        raw = json.loads(data[:RECORD_BYTES].decode())
        record = RankRecord(
            str(raw["job"]), int(raw["rank"]), str(raw["node"]), int(raw["step"]), str(raw["phase"]), float(raw["at"])
        )
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None
    return record if is_valid(record) else None


def is_valid(record: RankRecord) -> bool:
    """Names and numbers a controller may keep and print (a record comes from a file any process on the
    node may write, then over the wire)."""
    return (
        is_job_id(record.job)
        and is_node_name(record.node)
        and 0 <= record.rank < 1 << 24
        and 0 <= record.step < 1 << 62
        and 0 < len(record.phase) <= MAX_PHASE
        and record.phase.replace("-", "").replace("_", "").isalnum()
        and math.isfinite(record.at)
    )
