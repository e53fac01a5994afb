"""Each rank's collective state from PyTorch's flight recorder, taken on its launcher's request while
the training thread is stuck.

The flight recorder (``TORCH_FR_BUFFER_SIZE`` set before the process group starts; ``vigil launch``
sets it; gloo records into it too) keeps the last collectives each process group ran. A signal
handler cannot read it (Python runs handlers on the main thread, which is blocked in the collective),
so a daemon thread watches for the launcher's request (``rankN.fr.want`` in the stacks directory,
checked every ``poll_s``) and writes ``rankN.fr.json``: for each process group, the last collective
this rank entered, its sequence number and whether it completed. A rank whose last sequence number is
below the others' never entered the collective they wait in.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)

MAX_GROUPS = 16


def last_collectives(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """The flight recorder's JSON dump → per process group, its last collective (not point-to-point):
    ``{"group", "seq", "op", "completed"}``. Pure."""
    last: dict[str, dict[str, Any]] = {}
    for entry in trace.get("entries", []):
        if entry.get("is_p2p"):
            continue
        group = entry.get("process_group") or ["", ""]
        name = str(group[1] if len(group) > 1 and group[1] else group[0])
        seq = int(entry.get("collective_seq_id", 0))
        if name not in last or seq > last[name]["seq"]:
            done = bool(entry.get("retired")) or entry.get("state") == "completed"
            last[name] = {"group": name, "seq": seq, "op": str(entry.get("profiling_name", "")), "completed": done}
    return sorted(last.values(), key=lambda c: c["group"])[:MAX_GROUPS]


def dump_now() -> list[dict[str, Any]] | None:
    """This process's flight recorder, summarised; None where torch has none to give."""
    try:
        from torch._C._distributed_c10d import _dump_fr_trace_json  # type: ignore[attr-defined]  # not public yet

        return last_collectives(json.loads(_dump_fr_trace_json(True, True)))
    except Exception as exc:  # a torch without it, or a recorder that is off: nothing to say
        log.info("vigil_flight_recorder_unavailable", error=str(exc)[:200])
        return None


def watch_requests(where: Path, rank: int, poll_s: float = 0.25) -> threading.Thread:
    """Start the daemon thread that answers the launcher's requests for this rank's collective state."""
    want, out = where / f"rank{rank}.fr.want", where / f"rank{rank}.fr.json"

    def run() -> None:
        stop = threading.Event()
        while not stop.wait(poll_s):
            if not want.exists():
                continue
            state = dump_now()
            tmp = out.with_suffix(".tmp")
            try:
                tmp.write_text(json.dumps(state if state is not None else []))
                os.replace(tmp, out)  # whole or not at all
                want.unlink(missing_ok=True)
            except OSError as exc:
                log.warning("vigil_flight_recorder_unwritable", path=str(out), error=str(exc))
                return

    thread = threading.Thread(target=run, name="vigil-collectives", daemon=True)
    thread.start()
    return thread
