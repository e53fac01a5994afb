"""The command line: subcommands listed, bad input answered with a clear error, never a traceback."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path


def vigil(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vigil", *args], capture_output=True, text=True, timeout=60)


def test_help_lists_the_subcommands() -> None:
    out = vigil("--help")
    assert out.returncode == 0
    for name in ("agent", "controller", "demo", "status", "incidents", "uncordon"):
        assert name in out.stdout


def test_bad_policy_file_is_named_without_a_traceback(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("xid:\n  79: {action: reboot_everything}\n")
    out = vigil("controller", "--policy", str(policy), "--database", str(tmp_path / "c.db"))
    assert out.returncode == 2
    assert "xid.79.action" in out.stderr and "Traceback" not in out.stderr


def test_bad_agent_argument_is_named(tmp_path: Path) -> None:
    out = vigil("agent", "--controller", "nowhere", "--spool", str(tmp_path / "s.db"))
    assert out.returncode == 2 and "controller" in out.stderr and "Traceback" not in out.stderr


def test_unusable_spool_path_is_a_clear_error(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    out = vigil("agent", "--gpu-backend", "simulated", "--spool", str(not_a_dir / "spool.db"), "--metrics-port", "0")
    assert out.returncode == 2 and "cannot start" in out.stderr and "Traceback" not in out.stderr


def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = vigil("controller", "--port", str(port), "--database", str(tmp_path / "c.db"))
    assert out.returncode == 2 and f"cannot listen on 0.0.0.0:{port}" in out.stderr
    assert "Traceback" not in out.stderr


def test_status_without_a_controller_says_so() -> None:
    out = vigil("status", "--controller", "127.0.0.1:1")
    assert out.returncode == 2 and "UNAVAILABLE" in out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr


def test_agent_without_a_gpu_driver_says_so(tmp_path: Path) -> None:
    out = vigil("agent", "--spool", str(tmp_path / "s.db"), "--metrics-port", "0", "--kernel-log-source", "none")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "NVML" in out.stderr and "--gpu-backend simulated" in out.stderr


def test_unknown_gpu_backend_is_named(tmp_path: Path) -> None:
    out = vigil("agent", "--gpu-backend", "rocm", "--spool", str(tmp_path / "s.db"))
    assert out.returncode == 2 and "gpu_backend" in out.stderr and "Traceback" not in out.stderr
