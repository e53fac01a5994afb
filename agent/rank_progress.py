"""The training ranks' progress records on this node (``vigil_core.rank_progress``), read from the
directory their hooks write them to, for the heartbeat. Bounded: at most ``MAX_RECORDS`` files of
``RECORD_BYTES`` each; a record that is not whole, names another node, or was last written more than
``STALE_S`` ago (a job long gone) is left out; the files not whole or naming another node are
counted (``unreadable``), so that a writer gone wrong is seen, not silently ignored."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from protos.vigil.v1 import agent_pb2
from vigil_core.rank_progress import RECORD_BYTES, RankRecord, decode

MAX_RECORDS = 256
STALE_S = 3600.0


@dataclass
class ProgressRead:
    records: list[RankRecord] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)  # file names: not one whole record of this node


def read_progress(where: Path, node: str, now: float | None = None) -> ProgressRead:
    now = time.time() if now is None else now
    found = ProgressRead()
    try:
        paths = sorted(p for p in where.iterdir() if ".rank" in p.name)[:MAX_RECORDS]
    except OSError:
        return found
    for path in paths:
        try:
            with open(path, "rb") as f:
                record = decode(f.read(RECORD_BYTES))
        except OSError:  # gone meanwhile
            continue
        if record is None or record.node != node:
            found.unreadable.append(path.name)
        elif now - record.at <= STALE_S:
            found.records.append(record)
    return found


def to_proto(record: RankRecord) -> agent_pb2.RankProgress:
    return agent_pb2.RankProgress(
        job_id=record.job, rank=record.rank, step=record.step, phase=record.phase, at=record.at
    )
