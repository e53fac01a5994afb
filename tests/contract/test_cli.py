"""The command line: subcommands listed, bad input answered with a clear error, never a traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path


def vigil(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vigil", *args], capture_output=True, text=True, timeout=60)


def test_help_lists_the_subcommands() -> None:
    out = vigil("--help")
    assert out.returncode == 0
    for name in ("agent", "controller", "demo", "status", "incidents", "uncordon", "resolve", "rules", "resume"):
        assert name in out.stdout


def test_bad_policy_file_is_named_without_a_traceback(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("xid:\n  79: {action: reboot_everything}\n")
    out = vigil("controller", "--plaintext", "--policy", str(policy), "--database", str(tmp_path / "c.db"))
    assert out.returncode == 2
    assert "xid.79.action" in out.stderr and "Traceback" not in out.stderr


def test_bad_agent_argument_is_named(tmp_path: Path) -> None:
    out = vigil("agent", "--plaintext", "--controller", "nowhere", "--spool", str(tmp_path / "s.db"))
    assert out.returncode == 2 and "controller" in out.stderr and "Traceback" not in out.stderr


def test_unusable_spool_path_is_a_clear_error(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    out = vigil(
        "agent",
        "--plaintext",
        "--gpu-backend",
        "simulated",
        "--spool",
        str(not_a_dir / "spool.db"),
        "--metrics-port",
        "0",
    )
    assert out.returncode == 2 and "spool: " in out.stderr and "Traceback" not in out.stderr
    assert f"{not_a_dir} is a file, not a directory" in out.stderr  # what is wrong, before anything starts


def test_an_invalid_default_node_name_is_refused_at_start(tmp_path: Path) -> None:
    """$NODE_NAME (or the host name) is validated like --node: the controller would refuse it forever."""
    out = subprocess.run(
        [sys.executable, "-m", "vigil", "agent", "--plaintext", "--gpu-backend", "simulated", "--spool",
         str(tmp_path / "s.db"), "--metrics-port", "0"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "NODE_NAME": "gpu_node_7"},
    )  # fmt: skip
    assert out.returncode == 2 and "gpu_node_7" in out.stderr and "--node" in out.stderr
    assert "Traceback" not in out.stderr


def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = vigil("controller", "--plaintext", "--port", str(port), "--database", str(tmp_path / "c.db"))
    assert out.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in out.stderr  # plaintext: loopback
    assert "Traceback" not in out.stderr


def test_status_without_a_controller_says_so() -> None:
    out = vigil("status", "--controller", "127.0.0.1:1")
    said = " ".join((out.stdout + out.stderr).split())
    assert out.returncode == 2 and "127.0.0.1:1 is not reachable" in said and "Connection refused" in said, said
    assert "Traceback" not in out.stdout + out.stderr


def test_launch_watches_by_default_and_says_loudly_when_nothing_does() -> None:
    """``vigil launch`` takes the controller every command does (127.0.0.1:7070); ``--controller
    none`` runs the job with nothing watching, said on stderr; an unreachable controller is named."""
    assert "127.0.0.1:7070" in " ".join(vigil("launch", "--help").stdout.split())
    alone = vigil("launch", "--nodes", "node-1", "--controller", "none", "--", sys.executable, "-c", "pass")
    assert alone.returncode == 0 and "nothing watches this job" in alone.stderr, alone.stderr
    away = vigil("launch", "--nodes", "node-1", "--controller", "127.0.0.1:1", "--log-format", "json", "--",
                 sys.executable, "-c", "pass")  # fmt: skip
    assert away.returncode == 0, away.stderr
    said = away.stdout + away.stderr
    assert "launch_controller_unreachable" in said and "127.0.0.1:1 is not reachable" in said, said


def test_agent_without_a_gpu_driver_says_so(tmp_path: Path) -> None:
    out = vigil(
        "agent", "--plaintext", "--spool", str(tmp_path / "s.db"), "--metrics-port", "0", "--kernel-log-source", "none"
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "NVML" in out.stderr and "--gpu-backend simulated" in out.stderr


def test_unknown_gpu_backend_is_named(tmp_path: Path) -> None:
    out = vigil("agent", "--plaintext", "--gpu-backend", "rocm", "--spool", str(tmp_path / "s.db"))
    assert out.returncode == 2 and "gpu_backend" in out.stderr and "Traceback" not in out.stderr


def test_slack_pager_without_its_token_says_so(tmp_path: Path) -> None:
    config = tmp_path / "ctl.yaml"
    config.write_text(
        f"pager: slack\nslack: {{channel: C123, token_env: VIGIL_TEST_NO_SUCH_TOKEN}}\ndatabase: {tmp_path}/c.db\n"
    )
    out = vigil("controller", "--plaintext", "--config", str(config), "--port", "0")
    assert out.returncode == 2 and "$VIGIL_TEST_NO_SUCH_TOKEN" in out.stderr and "Traceback" not in out.stderr
    config.write_text("pager: slack\n")
    out = vigil("controller", "--plaintext", "--config", str(config))
    assert out.returncode == 2 and "needs a slack: section" in out.stderr


def test_kubernetes_actuator_without_credentials_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "no-kubeconfig"
    config = tmp_path / "ctl.yaml"
    config.write_text(f"actuator: kubernetes\nkubernetes: {{kubeconfig: {missing}}}\ndatabase: {tmp_path}/c.db\n")
    out = vigil("controller", "--plaintext", "--config", str(config), "--port", "0")
    assert out.returncode == 2 and "no usable Kubernetes credentials" in out.stderr and str(missing) in out.stderr
    assert "Traceback" not in out.stderr


def test_leader_election_timings_are_checked(tmp_path: Path) -> None:
    config = tmp_path / "ctl.yaml"
    config.write_text("leader_election: {enabled: true, lease_duration_s: 5, renew_deadline_s: 10}\n")
    out = vigil("controller", "--plaintext", "--config", str(config))
    assert out.returncode == 2 and "lease_duration_s > renew_deadline_s" in out.stderr


def test_a_checks_own_options_its_help_and_bad_arguments_are_its_own() -> None:
    """``vigil check matmul --help`` shows the check's options, not vigil's; a bad value is named as
    the check names it, before anything runs; a deadline must be positive."""
    shown = vigil("check", "matmul", "--help")
    assert shown.returncode == 0 and "usage: vigil check matmul" in shown.stdout and "--seconds" in shown.stdout
    bad = vigil("check", "matmul", "--seconds", "abc")
    assert bad.returncode == 2 and "error: matmul: argument --seconds: invalid float value: 'abc'" in bad.stderr
    assert "usage" not in bad.stderr.lower() and "Traceback" not in bad.stderr
    assert "--deadline must be above 0" in vigil("check", "matmul", "--deadline", "-1").stderr
    assert "no check named 'burn'" in vigil("check", "burn").stderr


def test_sweep_choices_on_slurm_are_checked_before_anything_is_asked() -> None:
    for args, said in (
        (("--partition", "gpu", "--job", "moe"), "choose nodes one way"),
        (("--slurm-job", "4411", "gpu-01"), "choose nodes one way"),
        (("--slurm-job", "moe-pretrain"), "--slurm-job 'moe-pretrain': a Slurm job id is a number"),
    ):
        out = vigil("sweep", *args, "--controller", "127.0.0.1:9")
        assert out.returncode == 2 and said in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_launch_without_a_free_rendezvous_port_says_so() -> None:
    """No port free below the kernel's ephemeral range for the ranks' rendezvous (here: a range that
    leaves none): named, exit 2, no traceback, and no rank started."""
    no_room = "import sys, vigil_core.ports as p; p.ephemeral_range = lambda: (10_000, 60_999); sys.argv[0] = 'vigil'"
    command = f"{no_room}; from vigil.cli import main; main()"
    out = subprocess.run(
        [sys.executable, "-c", command, "launch", "--nodes", "node-1", "--controller", "none", "--",
         sys.executable, "-c", "print('a rank ran')"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "no rendezvous port for the ranks" in out.stderr and "a rank ran" not in out.stdout
