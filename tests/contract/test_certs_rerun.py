"""``vigil certs`` run again on the same directory: it adds only what is new, keeps the keys it made
before (unless --renew), and mends permissions on every run, whatever the umask."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def certs(out: Path, *args: str, umask: int = 0o022) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "vigil", "certs", str(out), "--controller-name", "127.0.0.1", *args]
    # The umask set by a shell, not by Python code run between fork and exec (``preexec_fn``): a
    # worker that has loaded gRPC may abort in that window while gRPC's threads run.
    umasked = ["sh", "-c", f'umask {umask:03o} && exec "$0" "$@"', *command]
    return subprocess.run(umasked, capture_output=True, text=True, timeout=60, check=True)


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_a_second_run_adds_only_what_is_new_and_keeps_the_rest(tmp_path: Path) -> None:
    out = tmp_path / "pki"
    certs(out, "--nodes", "node-1", "--admin", "alice")
    before = {d: (out / d / "tls.key").read_bytes() for d in ("controller", "node-node-1", "admin-alice")}
    done = certs(out, "--nodes", "node-1,node-2", "--admin", "alice")
    for directory, key in before.items():
        assert (out / directory / "tls.key").read_bytes() == key, directory
        assert f"{out / directory}: kept as it was" in done.stdout
    assert (out / "node-node-2" / "tls.key").exists()
    certs(out, "--nodes", "node-1", "--renew")
    assert (out / "node-node-1" / "tls.key").read_bytes() != before["node-node-1"]
    assert (out / "admin-alice" / "tls.key").read_bytes() == before["admin-alice"]  # not named: untouched


def test_every_run_sets_0600_keys_and_0700_directories_whatever_the_umask(tmp_path: Path) -> None:
    out = tmp_path / "pki"
    certs(out, "--nodes", "node-1", umask=0o000)
    dirs = [out, out / "ca", out / "controller", out / "node-node-1"]
    keys = [out / "ca" / "ca.key", out / "controller" / "tls.key", out / "node-node-1" / "tls.key"]
    assert [mode(d) for d in dirs] == [0o700] * 4 and [mode(k) for k in keys] == [0o600] * 3
    (out / "node-node-1" / "tls.key").chmod(0o644)  # loosened by hand, or by a copy
    (out / "ca").chmod(0o755)
    certs(out, "--nodes", "node-1")
    assert mode(out / "node-node-1" / "tls.key") == 0o600 and mode(out / "ca") == 0o700
