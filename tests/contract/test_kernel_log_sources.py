"""Kernel-log sources for real: /dev/kmsg (when readable), journalctl as a subprocess, a file."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from agent.kernel_log import FileTail, JournaldSource, KmsgSource, current_boot_id
from tests.helpers import poll_until

KMSG = Path("/dev/kmsg")
needs_kmsg = pytest.mark.skipif(not os.access(KMSG, os.R_OK), reason="/dev/kmsg is not readable here")
needs_kmsg_write = pytest.mark.skipif(
    not os.access(KMSG, os.W_OK), reason="writing /dev/kmsg needs root (CI runs as root)"
)


def _kmsg_seqs() -> list[int]:
    """Sequence numbers of every record in the ring buffer now, read with a plain fd."""
    fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK)
    seqs = []
    try:
        while True:
            try:
                seqs.append(int(os.read(fd, 8192).split(b",")[1]))
            except BlockingIOError:
                return seqs
            except BrokenPipeError:
                continue
    finally:
        os.close(fd)


@needs_kmsg
def test_kmsg_starts_at_the_end() -> None:
    last = max(_kmsg_seqs(), default=-1)
    source = KmsgSource(KMSG)
    try:
        assert all(int(line.split(",")[1]) > last for line in source.read_lines())
    finally:
        source.close()


@needs_kmsg_write
def test_kmsg_reads_new_records_and_resumes_from_its_cursor() -> None:
    # A harmless marker line, never an NVRM line: other tools on this host may read the kernel log.
    marker = f"vigil-test marker {uuid.uuid4().hex}"
    source = KmsgSource(KMSG)
    try:
        with open(KMSG, "w") as kmsg:
            kmsg.write(f"<7>{marker} one\n")
        lines = poll_until(lambda: [line for line in source.read_lines() if marker in line], timeout=5)
        assert lines and lines[0].split(";", 1)[1] == f"{marker} one"  # type: ignore[index]
        cursor = source.cursor
        assert cursor is not None and cursor.startswith(current_boot_id() + ":")
        with open(KMSG, "w") as kmsg:
            kmsg.write(f"<7>{marker} two\n")
    finally:
        source.close()
    resumed = KmsgSource(KMSG, cursor)  # as a restarted agent: only what came after
    try:
        lines = [line for line in resumed.read_lines() if marker in line]
        assert [line.split(";", 1)[1] for line in lines] == [f"{marker} two"]
    finally:
        resumed.close()


@needs_kmsg
def test_a_cursor_from_another_boot_reads_this_boot_from_the_start() -> None:
    oldest = min(_kmsg_seqs())
    source = KmsgSource(KMSG, cursor="another-boot:999999999")
    try:
        assert int(source.read_lines()[0].split(",")[1]) <= oldest + 5  # the buffer may have rolled on
    finally:
        source.close()


def test_kmsg_survives_a_buffer_overrun(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    records = [b"6,10,100,-;first\n", OSError(32, "Broken pipe"), b"6,20,200,-;after the overrun\n"]

    def fake_read(fd: int, size: int) -> bytes:
        if not records:
            raise BlockingIOError
        item = records.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    path = tmp_path / "kmsg"
    path.write_text("")
    source = KmsgSource(path, cursor=f"{current_boot_id()}:5")
    monkeypatch.setattr(os, "read", fake_read)
    assert source.read_lines() == ["6,10,100,-;first", "6,20,200,-;after the overrun"]
    assert source.overruns == 1 and source.cursor == f"{current_boot_id()}:20"
    source.close()


FAKE_JOURNALCTL = textwrap.dedent(
    """\
    #!{python}
    # Stands in for journalctl: records its arguments, then follows a file of JSON entries.
    import sys, time
    open({args!r}, "a").write(" ".join(sys.argv[1:]) + "\\n")
    with open({feed!r}) as feed:
        while True:
            line = feed.readline()
            if line:
                sys.stdout.write(line); sys.stdout.flush()
            else:
                time.sleep(0.02)
    """
)


def test_journald_source_follows_and_resumes_after_its_cursor(tmp_path: Path) -> None:
    feed, args = tmp_path / "feed.jsonl", tmp_path / "args.txt"
    feed.write_text("")
    script = tmp_path / "journalctl"
    script.write_text(FAKE_JOURNALCTL.format(python=sys.executable, args=str(args), feed=str(feed)))
    script.chmod(0o755)
    entries = [
        {"MESSAGE": "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.", "__CURSOR": "s=1;i=a"},
        {"MESSAGE": list(b"NVRM: Xid (PCI:0000:3b:00): 48, pid=1, bytes"), "__CURSOR": "s=1;i=b"},
    ]
    with open(feed, "a") as f:
        f.writelines(json.dumps(e) + "\n" for e in entries)
        f.write("not json\n")
    source = JournaldSource(command=str(script))
    try:
        got: list[str] = []
        poll_until(lambda: got.extend(source.read_lines()) or len(got) >= 2, timeout=10)
        assert got[0].endswith("GPU has fallen off the bus.") and got[1].endswith("48, pid=1, bytes")
        assert source.cursor == "s=1;i=b"
    finally:
        source.close()
    resumed = JournaldSource(cursor=source.cursor, command=str(script))
    try:
        poll_until(lambda: args.exists() and len(args.read_text().splitlines()) == 2, timeout=10)
        first, second = args.read_text().splitlines()
        assert "--dmesg" in first and "--lines=0" in first
        assert "--after-cursor=s=1;i=b" in second
    finally:
        resumed.close()


def test_a_missing_journalctl_is_logged_not_fatal(tmp_path: Path) -> None:
    source = JournaldSource(command=str(tmp_path / "no-such-journalctl"))
    assert source.read_lines() == []
    source.close()


def test_file_tail_resumes_at_its_cursor_and_rereads_a_partial_line(tmp_path: Path) -> None:
    path = tmp_path / "kern.log"
    path.write_text("old line\n")
    tail = FileTail(path)
    assert tail.read_lines() == []  # starts at the end
    with open(path, "a") as f:
        f.write("one\ntw")
    assert tail.read_lines() == ["one"]
    cursor = tail.cursor
    with open(path, "a") as f:
        f.write("o\nthree\n")
    assert FileTail(path, cursor).read_lines() == ["two", "three"]
