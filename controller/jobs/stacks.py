"""Where a hung job is stuck, from its ranks' Python stacks: the wavefront. Pure.

Each rank's dump is Python's ``faulthandler`` output (every thread, most recent call first), as the
hook writes it on SIGUSR2 and its launcher reads it. In a hang, the ranks that reached the collective
the others wait in show ``torch.distributed`` frames in their training thread; the rank that never
entered it is the culprit, and its innermost frames say where it is instead (a data loader's read,
a sleep or a loop in the job's own code). A read in C (``f.read()``, ``os.read``) leaves no Python
frame of its own: there the kernel's view of the rank's main thread, which its launcher reads from
``/proc`` (its state and the kernel function it waits in, "wchan"), says it: waiting on I/O ("D"),
or in a pipe's, a socket's or a network filesystem's read. A rank that gives no dump at all is
stopped or frozen (the host). When every rank waits in a collective, the collective itself does not
complete: the network or a GPU, which only the nodes' own signals can name.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)", re.MULTILINE)
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<func>\S+)', re.MULTILINE)
_IO_FUNCS = frozenset({"read", "readinto", "readline", "recv", "recv_into", "select", "poll", "accept", "_recv"})
_STDLIB = ("/lib/python", "site-packages", "dist-packages", "<frozen")
# Kernel functions a thread blocked reading waits in: a pipe or FIFO, a socket, a network or FUSE
# filesystem, a block device (the names vary across kernel versions; matched as prefixes).
_IO_WAITS = ("pipe_read", "anon_pipe_read", "pipe_wait", "sk_wait_data", "wait_woken", "unix_stream_read",
             "tcp_recvmsg", "inet_csk_accept", "nfs", "rpc_", "fuse", "io_schedule", "folio_wait", "wait_on_page",
             "do_select", "do_sys_poll", "ep_poll", "request_wait_answer")  # fmt: skip


class HangClass(StrEnum):
    APPLICATION = "application"  # a rank busy in its own code (a sleep, a loop, a lock)
    IO = "I/O or data loading"  # a rank blocked reading: a data loader, a dead mount, a socket
    HOST = "host"  # a rank that does not answer at all: stopped or frozen
    COLLECTIVE = "network or GPU"  # every rank waits in a collective that does not complete
    BEHIND = "a rank behind the others"  # from the ranks' progress records: named, not explained
    ALIKE = "every rank at one step"  # from the ranks' progress records: none stands out
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Collective:
    """The last collective a rank entered in one process group, from its flight recorder."""

    group: str
    seq: int
    op: str
    completed: bool


@dataclass(frozen=True, slots=True)
class RankDump:
    rank: int
    node: str
    answered: bool
    text: str = ""
    state: str = ""  # the main thread's, from /proc: "S", "D" (waiting on I/O), "T" (stopped); "" unknown
    kernel_wait: str = ""  # the kernel function it waits in (wchan); "" unknown
    collectives: tuple[Collective, ...] = ()  # its flight recorder's, per process group


@dataclass(frozen=True, slots=True)
class RankPlace:
    rank: int
    node: str
    answered: bool
    in_collective: bool
    where: str  # its innermost frame of the job's own code: "train.py:123 in main"
    io: bool  # its innermost frame is a read, a receive or a select


@dataclass(frozen=True, slots=True)
class Wavefront:
    verdict: HangClass
    culprits: tuple[RankPlace, ...]
    waiting: int  # ranks waiting for the culprits (in a collective, or ahead of them); ALIKE: every rank
    collectives: str = ""  # what the ranks' flight recorders say, where they differ or stall

    def describe(self) -> str:
        said = self._describe()
        return f"{said} (flight recorder: {self.collectives})" if self.collectives else said

    def _describe(self) -> str:
        if self.verdict is HangClass.COLLECTIVE:
            return f"every rank that answered ({self.waiting}) waits in a collective: the network or a GPU"
        if self.verdict is HangClass.ALIKE:
            return (f"all {self.waiting} ranks at one step, in the same place: none stands out (a collective "
                    "that does not complete, or every rank stuck the same way)")  # fmt: skip
        if not self.culprits:
            return "no rank waits in a collective and none stands out: the stacks do not say"
        named = "; ".join(
            f"rank {c.rank} on {c.node}"
            + (
                f" at {c.where}"
                if c.answered
                else ": no answer (stopped or frozen" + (f"; {c.where})" if c.where else ")")
            )
            for c in self.culprits[:8]
        )
        more = f" and {len(self.culprits) - 8} more" if len(self.culprits) > 8 else ""
        others = "wait for it" if self.verdict is HangClass.BEHIND else "wait in a collective"
        return f"{self.verdict.value}: {named}{more}, while {self.waiting} rank(s) {others}"


def place(dump: RankDump) -> RankPlace:
    """Where one rank is, from its dump: its training thread's frames."""
    frames = _training_thread(dump.text)
    in_collective = any("torch/distributed" in f for f, _, _ in frames)
    own = next(((f, line, func) for f, line, func in frames if not any(s in f for s in _STDLIB)), None)
    top = frames[0] if frames else None
    where = f"{own[0].rsplit('/', 1)[-1]}:{own[1]} in {own[2]}" if own else (f"{top[2]}" if top else "")
    io = top is not None and (top[2] in _IO_FUNCS or "torch/utils/data" in top[0])
    io = io or kernel_reading(dump.state, dump.kernel_wait)
    if not dump.answered:  # no frames: what the kernel says of it is all there is
        where = ", ".join(w for w in (f"kernel state {dump.state}" if dump.state else "", dump.kernel_wait) if w)
    elif dump.kernel_wait and not in_collective:
        where += f" (kernel: {dump.kernel_wait})"
    return RankPlace(dump.rank, dump.node, dump.answered, in_collective, where, io)


def kernel_reading(state: str, kernel_wait: str) -> bool:
    """Whether the kernel says the thread is blocked on I/O: uninterruptible, or waiting in a read."""
    return state == "D" or kernel_wait.startswith(_IO_WAITS)


def wavefront(dumps: Sequence[RankDump]) -> Wavefront:
    """The ranks that never entered the collective the others wait in, and what that says; with what
    their flight recorders say beside it."""
    return replace(_from_stacks(dumps), collectives=collective_front(dumps))


def collective_front(dumps: Sequence[RankDump]) -> str:
    """Per process group, from the ranks' flight recorders: the ranks behind the last collective the
    others entered and wait in, or every rank in one that does not complete; '' when they say nothing."""
    groups: dict[str, dict[int, Collective]] = {}
    for d in dumps:
        for c in d.collectives:
            groups.setdefault(c.group, {})[d.rank] = c
    said = []
    for group, ranks in sorted(groups.items()):
        top = max(c.seq for c in ranks.values())
        lead = next(c for c in ranks.values() if c.seq == top)
        behind = sorted(r for r, c in ranks.items() if c.seq < top)
        if lead.completed:
            continue
        if behind:
            named = ", ".join(str(r) for r in behind[:8]) + (f" and {len(behind) - 8} more" if len(behind) > 8 else "")
            said.append(f"{group}: rank {named} never entered {lead.op} #{top}, which "
                        f"{len(ranks) - len(behind)} rank(s) wait in")  # fmt: skip
        elif len(ranks) > 1:
            said.append(f"{group}: all {len(ranks)} ranks entered {lead.op} #{top}, and it does not complete")
    return "; ".join(said[:4])


def _from_stacks(dumps: Sequence[RankDump]) -> Wavefront:
    places = [place(d) for d in dumps]
    silent = tuple(p for p in places if not p.answered)
    waiting = sum(1 for p in places if p.answered and p.in_collective)
    if silent:
        return Wavefront(HangClass.HOST, silent, waiting)
    outside = tuple(p for p in places if not p.in_collective)
    if not outside:
        return Wavefront(HangClass.COLLECTIVE if places else HangClass.UNKNOWN, (), waiting)
    if waiting == 0:  # nobody waits for anybody: the stacks do not single one out
        return Wavefront(HangClass.UNKNOWN, (), 0)
    verdict = HangClass.IO if all(p.io for p in outside) else HangClass.APPLICATION
    return Wavefront(verdict, outside, waiting)


def _training_thread(text: str) -> list[tuple[str, int, str]]:
    """The frames of the thread that runs the training loop: the one started as the program
    (``<module>`` at its bottom), else the thread that took the signal, else the first."""
    blocks = _blocks(text)
    for frames in blocks:
        if frames and frames[-1][2] == "<module>":
            return frames
    return blocks[0] if blocks else []


def _blocks(text: str) -> list[list[tuple[str, int, str]]]:
    starts = [m.start() for m in _THREAD.finditer(text)] or [0]
    current = [i for i, m in enumerate(_THREAD.finditer(text)) if m.group(1) == "Current thread"]
    blocks = []
    for i, start in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else len(text)
        chunk = text[start:end]
        blocks.append([(m["file"], int(m["line"]), m["func"]) for m in _FRAME.finditer(chunk)])
    if current:  # the signal's own thread next after the program's
        blocks.insert(0, blocks.pop(current[0]))
    return blocks
