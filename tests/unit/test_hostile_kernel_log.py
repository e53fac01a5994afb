"""No kernel-log line can stop the agent: hostile lines through the parser and the agent's whole path
to the spool (storm folder, wire checks, spool), then a real XID that must still be delivered.

Hypothesis draws ``SEEDS_PER_EXAMPLE`` hostile lines per example, and each is fed in ``VARIANTS`` forms
(with a kmsg header, a huge number spliced into its digits, cut in half, a surrogate inside...), so
``EXAMPLES`` examples make 100,000 lines a run at a tenth of what drawing them all would cost.
The lines are what a root process, a buggy driver or journald can produce: binary, numbers of
thousands of digits or beyond 64 bits, odd PCI ids, truncated records, megabyte lines, lone
surrogates (journald's JSON escapes), and real lines with all of those spliced in.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.collectors import KernelLog
from agent.config import AgentConfig
from agent.daemon import Agent
from agent.driver_lines import UnparsedLine, parse_nvrm, parse_record
from agent.kernel_log import FileTail, KernelLogCollector
from tests.unit.test_driver_lines import REAL_LINES
from vigil_core.signals import SignalKind

EXAMPLES = int(os.environ.get("VIGIL_FUZZ_EXAMPLES", "150"))  # each a whole agent fed a burst; more: set it
SEEDS_PER_EXAMPLE = 10  # hypothesis draws these; each is fed in VARIANTS forms
VARIANTS = 10
REAL = [line for line, *_ in REAL_LINES]
PROBE_BUS = "0000:ee:00"  # the bus of the XID each example ends with; no generated line names it

_bus = st.from_regex(r"[0-9a-fA-F]{0,9}(:[0-9a-fA-F]{0,3}){0,3}(\.[0-9]{0,2})?", fullmatch=True)
_huge = st.sampled_from([19, 20, 25, 4301, 5000, 100_000]).map(lambda n: "9" * n)
_number = st.one_of(st.integers(min_value=-(2**70), max_value=2**70).map(str), _huge)
_body = st.one_of(
    st.builds(lambda b, c, r: f"NVRM: Xid (PCI:{b}): {c}, {r}", _bus, _number, st.text(max_size=40)),
    st.builds(lambda c, p: f"NVRM: Xid (PCI:0000:3b:00): {c}, pid={p}, name=python, boom", _number, _number),
    st.builds(lambda line, n: line[:n], st.sampled_from(REAL), st.integers(0, 200)),
    st.builds(lambda line, i: line[:i] + "\ud800" + line[i:], st.sampled_from(REAL), st.integers(0, 120)),
    st.binary(max_size=200).map(lambda b: b.decode("utf-8", "surrogateescape")),
    st.builds(lambda n, line: "x" * n + line, st.sampled_from([1_000, 70_000]), st.sampled_from(REAL)),
    st.builds(lambda b, u: f"NVRM: GPU at PCI:{b}: GPU-{u}", _bus, st.text("0123456789abcdef-", max_size=40)),
    st.builds(lambda b: f"NVRM: GPU {b}: GPU has fallen off the bus.", _bus),
    st.sampled_from(REAL),
    st.text(max_size=100),
)
_header = st.one_of(
    st.just(""),
    st.builds(lambda p, s, t: f"{p},{s},{t},-;", _number, _number, _number),
    st.sampled_from(["[ 1234.5] ", "kernel: ", "6,99,100,-;"]),
)
hostile_line = st.builds(lambda header, body: header + body, _header, _body)
_DIGITS = re.compile(r"[0-9]+")


def variants(line: str) -> list[str]:
    """One hostile line in ``VARIANTS`` forms."""
    half = len(line) // 2
    return [
        line,
        "6,1234,5678901234,-;" + line,
        "3," + "9" * 5000 + ",1,-;" + line,
        _DIGITS.sub("9" * 4400, line, count=1),
        _DIGITS.sub(str(2**64), line),
        line[:half],
        line[:half] + "\ud800" + line[half:],
        line[half:] + " NVRM: Xid (PCI:0000:3b:00): " + "1" * 30,
        "kernel: [ 12.5] " + line + "\x00\x1b[31m",
        line.replace("PCI:", "PCI:fffffffff:"),
    ]


@given(st.lists(hostile_line, min_size=5, max_size=5))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
def test_the_parser_raises_nothing_but_unparsed_line(seeds: list[str]) -> None:
    for line in [v for seed in seeds for v in variants(seed)]:
        try:
            parse_nvrm(parse_record(line).message)
        except UnparsedLine as exc:
            assert exc.reason in ("unrecognised", "out_of_range")


@pytest.fixture(scope="module")
def agent() -> Iterator[Agent]:
    with tempfile.TemporaryDirectory() as tmp:
        clock = [1_000.0]
        config = AgentConfig(
            node="node-h",
            gpu_backend="simulated",
            kernel_log=Path(tmp) / "kmsg",
            spool=Path(tmp) / "spool.db",
            metrics_port=None,
            plaintext=True,
        )
        (Path(tmp) / "kmsg").write_text("")
        agent = Agent(config, clock=lambda: clock[0])
        agent.clock_box = clock  # type: ignore[attr-defined]
        agent.fed = 0  # type: ignore[attr-defined]
        yield agent
        agent.spool.close()
        print(f"\nhostile lines through the agent's path to the spool: {agent.fed}")  # type: ignore[attr-defined]


@given(seeds=st.lists(hostile_line, min_size=SEEDS_PER_EXAMPLE, max_size=SEEDS_PER_EXAMPLE))
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
        HealthCheck.large_base_example,
    ],
)
def test_no_line_stops_the_agent_and_a_real_xid_after_them_is_spooled(agent: Agent, seeds: list[str]) -> None:
    lines = [v for seed in seeds for v in variants(seed)]
    probe = f"NVRM: Xid (PCI:{PROBE_BUS}): 79, pid=0, GPU has fallen off the bus."
    agent.clock_box[0] += 10.0  # type: ignore[attr-defined]  # a new storm window: the probe is not a repeat
    agent.spool.ack(agent.spool.last_seq)
    before = agent.spool.last_seq
    kernel_log = next(c for c in agent.collectors if isinstance(c, KernelLog))
    kernel_log.collector = KernelLogCollector("node-h", lambda: [*lines, probe], [], agent.clock)
    agent.poll_now(kernel_log)
    agent.fed += len(lines)  # type: ignore[attr-defined]
    spooled = agent.spool.pending(after_seq=before, limit=100_000)
    probes = [s for s in spooled if s.kind is SignalKind.XID and s.gpu.pci_bus_id == PROBE_BUS]
    assert [(s.code, s.count) for s in probes] == [(79, 1)]
    assert agent._unsaved == []  # nothing left behind because the spool refused it


def test_hostile_bytes_in_a_tailed_file_cost_only_their_lines(tmp_path: Path) -> None:
    """Through the file source: binary, a 3 MB line with no newline for a while, then a real XID."""
    log = tmp_path / "kmsg"
    log.write_bytes(b"")
    tail = FileTail(log)
    assert tail.read_lines() == []
    with open(log, "ab") as f:
        f.write(b"\xff\xfe\x00binary\n" + b"A" * 3_000_000 + b"NVRM: Xid (PCI:0000:3b:00): 48, hidden\n")
        f.write(b"3,9,9,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.\n")
    lines: list[str] = []
    for _ in range(10):
        lines += tail.read_lines()
    assert max(len(line) for line in lines) <= 64 * 1024  # the long line kept its head only
    collector = KernelLogCollector("n", lambda: lines, [])
    assert [s.code for s in collector.collect()] == [79]
    assert tail.long_lines >= 1
