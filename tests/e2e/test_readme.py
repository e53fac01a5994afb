"""The README's commands and snippets, run as written: the by-hand recipe (a controller, two
agents, an XID, ``vigil status``), the policy snippet through the policy loader, ``vigil certs``, and
``vigil plan``'s first example. The ``vigil`` on the PATH is this checkout's; each runs in a
directory of its own (the recipe's ``/tmp/vigil`` becomes one)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from controller.vocab.policy import load_policy

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


def test_the_by_hand_recipe_quarantines_node_2(tmp_path: Path) -> None:
    recipe = block_with("sh", "vigil controller --plaintext --port 7070")
    done = shell(recipe.replace("/tmp/vigil", str(tmp_path / "vigil")), tmp_path)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    quarantined = [line for line in done.stdout.splitlines() if "node-2" in line and "QUARANTINED" in line]
    assert quarantined and "XID 79" in done.stdout and "Traceback" not in said, said[-3000:]


def test_the_policy_snippet_loads_as_the_policy_file(tmp_path: Path) -> None:
    snippet = block_with("yaml", "heartbeat_timeout_s")
    path = tmp_path / "policy.yaml"
    path.write_text(snippet)
    policy = load_policy(path)
    assert policy.heartbeat_timeout_s == 30 and yaml.safe_load(snippet)["xid"][13]["threshold"] == 3


def test_vigil_certs_as_the_readme_shows(tmp_path: Path) -> None:
    done = shell(block_with("sh", "vigil certs ./certs"), tmp_path)
    assert done.returncode == 0, done.stderr
    assert {p.name for p in (tmp_path / "certs").iterdir()} >= {"ca", "controller", "node-gpu-001", "admin-alice"}


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
