"""``vigil launch`` stopped (its pod or Slurm job ending, an operator's Ctrl-C): the real command in a
subprocess, its ranks real processes. The stop goes on to the ranks (SIGTERM: time to save), those
left after ``--stop-grace-s`` are killed, nothing the launcher made is left behind, and it exits 128
plus the signal's number. Before, the launcher died at once and its ranks ran on with nobody to
watch them or start them again, and its stacks directory stayed in /tmp."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest

from tests.helpers import poll_until
from vigil.launch import LaunchConfig, Launcher

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

# A rank: says it is up (its pid), then runs until stopped; on SIGTERM it "saves" (says so) and exits
# with the checkpoint code, unless told to ignore SIGTERM (a rank stuck in C would not act on it).
RANK = """
import os, signal, sys, time, pathlib
here, ignore = pathlib.Path(sys.argv[1]), sys.argv[2] == "ignore"
rank = os.environ["RANK"]
def saved(number, frame):
    (here / f"saved-{rank}").write_text(str(os.getpid()))
    sys.exit(75)
signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore else saved)
(here / f"up-{rank}").write_text(str(os.getpid()))
while True:
    time.sleep(0.05)
"""


Launch = Callable[[Path, bool, float], "subprocess.Popen[bytes]"]


@pytest.fixture
def launched() -> Iterator[Launch]:
    """``launch``, each launcher in a session of its own, killed with its ranks after the test
    whatever it asserted (a failed test leaves nothing running)."""
    started: list[subprocess.Popen[bytes]] = []
    yield partial(launch, started=started)
    for proc in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def launch(
    tmp_path: Path, ranks_ignore_term: bool, stop_grace_s: float, started: list[subprocess.Popen[bytes]]
) -> subprocess.Popen[bytes]:
    temp = tmp_path / "tmp"  # where the launcher makes its stacks directory
    temp.mkdir()
    args = [
        sys.executable, "-m", "vigil", "launch", "--job-id", "stopped", "--nodes", "n1,n2", "--controller", "none",
        "--stop-grace-s", str(stop_grace_s), "--log-format", "json",
        "--", sys.executable, "-c", RANK, str(tmp_path), "ignore" if ranks_ignore_term else "save",
    ]  # fmt: skip
    with open(tmp_path / "launch.out", "wb") as out:
        proc = subprocess.Popen(
            args, env={**os.environ, "TMPDIR": str(temp)}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    started.append(proc)
    poll_until(
        lambda: all((tmp_path / f"up-{rank}").exists() for rank in (0, 1)) or proc.poll() is not None,
        timeout=60,
        what="both ranks up",
    )
    assert proc.poll() is None, said(tmp_path)
    assert [p.name.startswith("vigil-stacks-stopped-0-") for p in stacks_dirs(tmp_path)] == [True]
    return proc


def stacks_dirs(tmp_path: Path) -> list[Path]:
    """The launcher's stacks directories in its TMPDIR (beside them, the ports' lock files, shared)."""
    return [p for p in (tmp_path / "tmp").iterdir() if p.name.startswith("vigil-stacks-")]


def said(tmp_path: Path) -> str:
    """What the launcher printed (JSON lines)."""
    return (tmp_path / "launch.out").read_text()


def ended(proc: subprocess.Popen[bytes], tmp_path: Path, signum: int) -> str:
    """What the launcher said, once it has ended as one stopped by ``signum`` ends: its exit code
    128 plus the signal's, none of its ranks left, its stacks directory removed."""
    proc.wait(timeout=60)
    out = said(tmp_path)
    assert proc.returncode == 128 + signum, out
    assert all(gone(pid) for pid in rank_pids(tmp_path))
    assert stacks_dirs(tmp_path) == []
    return out


def rank_pids(tmp_path: Path) -> list[int]:
    return [int((tmp_path / f"up-{rank}").read_text()) for rank in (0, 1)]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_launcher_stopped_passes_the_stop_to_its_ranks_which_save_and_leaves_nothing_behind(
    tmp_path: Path, launched: Launch
) -> None:
    proc = launched(tmp_path, False, 60)
    proc.send_signal(signal.SIGTERM)
    out = ended(proc, tmp_path, signal.SIGTERM)
    assert all((tmp_path / f"saved-{rank}").exists() for rank in (0, 1))  # each rank had its SIGTERM
    assert '"launch_stopped"' in out and '"SIGTERM"' in out
    assert '"job_starting"' in out and out.count('"job_starting"') == 1  # not started again


def test_ranks_that_do_not_stop_are_killed_after_the_grace_and_a_second_stop_does_not_wait(
    tmp_path: Path, launched: Launch
) -> None:
    proc = launched(tmp_path, True, 1)  # ranks that ignore SIGTERM, a grace of 1 s
    proc.send_signal(signal.SIGTERM)
    ended(proc, tmp_path, signal.SIGTERM)
    assert not any((tmp_path / f"saved-{rank}").exists() for rank in (0, 1))

    again = tmp_path / "again"
    again.mkdir()
    proc = launched(again, True, 3600)  # a grace the test would never see end
    proc.send_signal(signal.SIGINT)
    poll_until(lambda: '"launch_stopping"' in said(again), timeout=30, what="the first stop taken")
    proc.send_signal(signal.SIGINT)  # an operator who will not wait for a save
    out = ended(proc, again, signal.SIGINT)
    assert out.count('"launch_stopping"') == 2 and '"kill_in_s": 0.0' in out


def test_a_launcher_that_fails_while_supervising_aborts_its_ranks_and_removes_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in the supervising loop (injected) ends the launcher with its error, not with ranks
    running on and a stacks directory left."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def failing(self: Launcher, start: object) -> None:
        poll_until(lambda: all((tmp_path / f"up-{rank}").exists() for rank in (0, 1)), timeout=60, what="ranks up")
        raise RuntimeError("a bug while supervising")

    monkeypatch.setattr(Launcher, "_supervise", failing)
    command = (sys.executable, "-c", RANK, str(tmp_path), "ignore")
    config = LaunchConfig(job_id="failing", nodes=("n1", "n2"), command=command, term_grace_s=0.5)
    try:
        with pytest.raises(RuntimeError, match="a bug while supervising"):
            Launcher(config).run()
        assert all(gone(pid) for pid in rank_pids(tmp_path))
    finally:  # whatever was asserted, no rank left running
        for pid in (int(up.read_text()) for up in tmp_path.glob("up-*")):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("vigil-stacks-")]
