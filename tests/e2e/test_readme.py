"""The README's commands and snippets, run as written: the by-hand recipe (a controller, two
agents, an XID, ``vigil status``), the policy snippet through the policy loader, ``vigil certs``,
the sweep examples against nodes of the names they give, ``vigil launch``'s example, and ``vigil
plan``'s examples. The ``vigil`` on the PATH is this checkout's; each runs in a directory of its own
(the recipe's ``/tmp/vigil`` becomes one). The two torchrun lines that want GPUs run in
``tests/gpu``."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from agent.config import load_agent_config
from controller.config import load_controller_config
from controller.vocab.policy import load_policy
from tests.e2e.processes import configured_controller, port_of, start_agent, stop_all
from tests.fakes.kube_api import KubeApiServer
from tests.helpers import free_port, poll_until

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("port-7070"), pytest.mark.timeout(180)]
README = Path(__file__).resolve().parents[2] / "README.md"


def blocks(language: str) -> list[str]:
    """The README's fenced blocks in ``language``, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```", README.read_text(), re.S | re.M)


def block_with(language: str, words: str) -> str:
    (found,) = [b for b in blocks(language) if words in b]
    return found


def shell(script: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@contextmanager
def controller_on_7070(tmp_path: Path, agents: tuple[str, ...] = (), **settings: object) -> Iterator[None]:
    """A plaintext controller on 127.0.0.1:7070, where the README's commands look by default, with
    simulated agents of these names registered."""
    ctl = configured_controller(tmp_path, "ctl", port=7070, pager="none", **settings)
    procs = [ctl, *(start_agent(tmp_path, node, "127.0.0.1:7070")[0] for node in agents)]
    try:
        assert port_of(tmp_path, "ctl") == 7070
        if agents:
            poll_until(lambda: all(n in shell("vigil status", tmp_path).stdout for n in agents), 60, "agents")
        yield
    finally:
        stop_all(procs)


def test_the_by_hand_recipe_quarantines_node_2(tmp_path: Path) -> None:
    recipe = block_with("sh", "vigil controller --plaintext --port 7070")
    done = shell(recipe.replace("/tmp/vigil", str(tmp_path / "vigil")), tmp_path)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    quarantined = [line for line in done.stdout.splitlines() if "node-2" in line and "QUARANTINED" in line]
    assert quarantined and "XID 79" in done.stdout and "Traceback" not in said, said[-3000:]
    # The recipe ends with `kill`, which does not wait: the next test's controller wants the port.
    poll_until(lambda: not port_7070_taken(), 30, "the recipe's controller gone from port 7070")


def port_7070_taken() -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", 7070)) == 0


def test_the_policy_snippet_loads_as_the_policy_file(tmp_path: Path) -> None:
    snippet = block_with("yaml", "heartbeat_timeout_s")
    path = tmp_path / "policy.yaml"
    path.write_text(snippet)
    policy = load_policy(path)
    assert policy.heartbeat_timeout_s == 30 and yaml.safe_load(snippet)["xid"][13]["threshold"] == 3


def test_the_slurm_snippets_load_as_the_controllers_configuration(tmp_path: Path) -> None:
    path = tmp_path / "controller.yaml"
    path.write_text(block_with("yaml", "conf: /etc/slurm/slurm.conf") + "plaintext: true\n")  # the rest, as left
    config = load_controller_config(path, {})
    assert config.actuator == "slurm" and config.slurm.conf == Path("/etc/slurm/slurm.conf")
    assert config.slurm.read_drains_s == 30 and config.slurm.rest is None and config.urgent_port == 7071
    path.write_text(block_with("yaml", "urgent_controller:") + "plaintext: true\n")  # every node's agent.yaml
    agent = load_agent_config(path, {})
    assert (agent.controller, agent.urgent_controller) == (
        "vigil-controller.example:7070", "vigil-controller.example:7071")  # fmt: skip
    path.write_text(block_with("yaml", "rest:") + "plaintext: true\n")  # slurmrestd instead of the commands
    rest = load_controller_config(path, {}).slurm.rest
    assert rest is not None and (rest.url, rest.token_file, rest.user) == (
        "http://slurmrestd.slurm:6820", Path("/var/run/secrets/slurm/token"), "vigil")  # fmt: skip


def test_vigil_certs_as_the_readme_shows(tmp_path: Path) -> None:
    done = shell(block_with("sh", "vigil certs ./certs --controller-name vigil-controller.vigil.svc --nodes"), tmp_path)
    assert done.returncode == 0, done.stderr
    assert {p.name for p in (tmp_path / "certs").iterdir()} >= {"ca", "controller", "node-gpu-001", "admin-alice"}


def test_the_relays_certificate_as_the_readme_shows(tmp_path: Path) -> None:
    """Its certificate line makes a relay certificate that serves agents under its name and is a
    client of the controller; its ``vigil relay`` line takes those arguments (checked, not run: it
    would listen on 7070 and dial a Service that is not here)."""
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    certs_line, relay_command = block_with("sh", "vigil relay").split("\n", 1)
    done = shell(certs_line, tmp_path)
    assert done.returncode == 0, done.stderr
    directory = tmp_path / "certs" / "relay-vigil-relay.vigil.svc"
    cert = x509.load_pem_x509_certificate((directory / "tls.crt").read_bytes())
    assert cert.subject.rfc4514_string() == "CN=relay:vigil-relay.vigil.svc"
    assert cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    ) == ["vigil-relay.vigil.svc"]
    usage = set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    assert usage == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    wrong = shell(relay_command.replace("--tls-dir", "--plaintext --tls-dir"), tmp_path)
    assert wrong.returncode == 2 and "not both" in wrong.stderr  # the arguments were read, the transport judged


def test_the_first_plan_example_runs(tmp_path: Path) -> None:
    first = block_with("sh", "vigil plan --gpus 3072").splitlines()[0]
    done = shell(first, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "ETTR" in done.stdout and (tmp_path / "plan.png").read_bytes()[:4] == b"\x89PNG"


def test_the_bundled_jobs_cpu_example_trains(tmp_path: Path) -> None:
    """The first torchrun line (the debug preset, two ranks on CPU); the other two want GPUs."""
    first = block_with("sh", "torchrun --nproc-per-node 2").splitlines()[0]
    done = shell(first, tmp_path, timeout=170)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "runs" / "debug").is_dir()


@pytest.mark.timeout(480)  # 70 s alone; each check is a process importing torch: 150-180 s on two loaded cores
def test_the_sweep_examples_and_the_plan_from_history(tmp_path: Path) -> None:
    """Each line of the sweeps block against gpu-017 and gpu-018 (labelled pool=h100, running the
    Job moe-pretrain's pods in namespace train), then ``vigil plan --from-history`` on that fleet
    (the controller's address in place of the cluster's Service name).
    The controller's own defaults for the checks' sizes are small (the README's ``-p`` still wins)."""
    nodes = ("gpu-017", "gpu-018")
    quick = {"matmul": {"size": "256", "seconds": "0.5"}, "membw": {"mib": "16"}, "allreduce": {"sizes": "1048576"}}
    with KubeApiServer() as kube:
        for node in nodes:
            kube.add_node(node, labels={"pool": "h100"})
            labels = {"batch.kubernetes.io/job-name": "moe-pretrain"}
            kube.add_pod("train", f"moe-pretrain-{node}", node, owner_kind="Job", labels=labels)
        kubernetes = {"kubeconfig": str(kube.kubeconfig(tmp_path / "kubeconfig"))}
        sweep = {"params": quick, "pair_port_base": free_port()}
        with controller_on_7070(tmp_path, nodes, actuator="kubernetes", kubernetes=kubernetes, sweep=sweep):
            for line in block_with("sh", "vigil sweep --selector").splitlines():
                done = shell(line, tmp_path, timeout=300)
                said = done.stdout + done.stderr
                assert done.returncode == 0 and "Traceback" not in said, f"{line}\n{said[-3000:]}"
                assert all(node in done.stdout for node in nodes), f"{line}\n{said[-3000:]}"
                if "--json" in line:
                    summary = json.loads(done.stdout)
                    assert summary["verdict"] == "OK" and {r["check"] for r in summary["rows"]} == {"pairs"}
            assert kube.node("gpu-017")["spec"].get("unschedulable") is not True  # nothing failed
            plan = block_with("sh", "vigil plan --gpus 3072").splitlines()[1]
            done = shell(plan.replace("vigil-controller:7070", "127.0.0.1:7070"), tmp_path)
            # A fleet watched for a minute: too little to fit a rate, said in one line as the README says.
            assert done.returncode == 2 and not done.stdout, done.stdout + done.stderr
            assert done.stderr.strip() == (
                "error: --from-history: 0.0 h of history: too little to fit a failure rate (a day at least)"
            )


def test_the_launch_example_trains_under_the_controller(tmp_path: Path) -> None:
    """``vigil launch``'s example: two simulated nodes of two ranks each, reporting to the controller
    at 127.0.0.1:7070, which shows the job finished at the step the line asks for."""
    line = block_with("sh", "vigil launch --job-id moe").replace("\\\n", " ")
    steps = int(re.search(r"--steps (\d+)", line).group(1))  # type: ignore[union-attr]
    with controller_on_7070(tmp_path):
        done = shell(line, tmp_path, timeout=170)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        jobs = json.loads(shell("vigil jobs --json", tmp_path).stdout)
    (job,) = jobs
    assert (job["job_id"], job["state"], job["step"]) == ("moe", "finished", steps), job


def test_the_scenario_example_is_a_valid_scenario(tmp_path: Path) -> None:
    """The scenario file format's example loads with the benchmark's own loader (every key it
    shows is one the loader knows; it is a tour of the keys, not a scenario to run)."""
    from bench.scenarios.spec import load_scenario

    path = tmp_path / "example.yaml"
    example = block_with("yaml", "family: xid-catalog")
    path.write_text(example)
    scenario = load_scenario(path)
    assert scenario.family == "xid-catalog" and len(scenario.events) == len(yaml.safe_load(example)["events"])
