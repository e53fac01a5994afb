"""The hook's and the adapters' docstring snippets run as written: each one's first code block, after a prelude that
gives it what it calls the job's own (``model``, ``data``, ``n_params``, the Trainer's ``options``:
a tiny model on CPU), on two gloo ranks under ``vigil launch --controller none``, from a first
start (no output directory yet: the case a rank must not crash on)."""

from __future__ import annotations

import ast
import contextlib
import importlib
import resource
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

PRELUDES = {
    "trainer_hooks.adapters.huggingface": """
from trainer_hooks.examples.hf_lm import CONFIG, RandomTokens
from transformers import GPT2LMHeadModel

model = GPT2LMHeadModel(CONFIG)
data = RandomTokens(256)
n_params = model.num_parameters()
options = dict(max_steps=6, per_device_train_batch_size=4, save_steps=3, report_to="none", use_cpu=True,
               ddp_backend="gloo", disable_tqdm=True, dataloader_num_workers=0)
""",
    "trainer_hooks.adapters.lightning": """
import os
import torch
from torch.utils.data import DataLoader, TensorDataset
from trainer_hooks.examples.lightning_lm import SEQ, VOCAB, TinyLM

model = TinyLM()
data = DataLoader(TensorDataset(torch.randint(0, VOCAB, (256, SEQ))), batch_size=4)
n_params = sum(p.numel() for p in model.parameters())
world = int(os.environ["WORLD_SIZE"])
options = dict(accelerator="cpu", devices=1, num_nodes=world, strategy="ddp", max_steps=6, logger=False,
               enable_progress_bar=False, enable_model_summary=False)
""",
    "trainer_hooks.hook": """
import time

flops_per_token, peak_flops, start_step, last_step = 6.0e6, 0.0, 0, 30


def train_step(step):
    began = time.perf_counter()
    time.sleep(0.01)
    return 512, time.perf_counter() - began, 1.0 / step


def save_checkpoint(step):
    raise AssertionError("nobody asked this run to stop")
""",
}
LIBRARY = {
    "trainer_hooks.adapters.huggingface": "transformers",
    "trainer_hooks.adapters.lightning": "lightning",
    "trainer_hooks.hook": "torch",
}
NODES = {"trainer_hooks.hook": "node-a"}  # the plain hook's snippet makes no process group: one rank


@contextlib.contextmanager
def cores_allowed() -> Iterator[None]:
    """While the launcher starts (its ranks inherit it): a rank that aborts leaves a core for
    ``backtraces``. Raised in this process and put back after, not in a ``preexec_fn``: that makes
    Python fork this process, gRPC and all (other tests in it use gRPC), and gRPC's threads restarted
    in the child can abort it before it execs (seen in CI: "epoll_wait error: Bad file descriptor")."""
    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_CORE, (soft, hard))


def backtraces(where: Path) -> str:
    """The threads, and the stack of the one that died, in each core a rank left in ``where`` (where the
    kernel writes cores there and gdb is installed): a rank that aborted at its exit says what did it."""
    gdb = shutil.which("gdb")
    found = [] if gdb is None else sorted(where.glob("core*"))
    stacks = [
        subprocess.run([gdb, "-batch", "-ex", "info threads", "-ex", "bt 40", sys.executable, str(core)],
                       capture_output=True, text=True, timeout=120).stdout[-6000:]
        for core in found[:2]
    ]  # fmt: skip
    return "".join(f"\n--- {core.name} ---\n{stack}" for core, stack in zip(found, stacks, strict=False))


def first_snippet(docstring: str) -> str:
    """The docstring's first indented block (blank lines inside it kept), dedented."""
    lines = docstring.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("    "))
    block = []
    for line in lines[start:]:
        if line and not line.startswith("    "):
            break
        block.append(line)
    return textwrap.dedent("\n".join(block)).strip() + "\n"


@pytest.mark.parametrize("module", sorted(PRELUDES))
def test_the_adapters_snippet_runs_as_written_on_two_ranks(tmp_path: Path, module: str) -> None:
    pytest.importorskip(LIBRARY[module], reason=f"the snippet needs {LIBRARY[module]} (make test installs it)")
    doc = importlib.import_module(module).__doc__ or ""
    snippet = first_snippet(doc)
    ast.parse(snippet)  # valid Python as it stands, no "..." standing for code
    script = tmp_path / "snippet.py"
    script.write_text(PRELUDES[module] + "\n# --- the docstring's snippet, as written ---\n" + snippet)
    command = [
        sys.executable, "-m", "vigil", "launch", "--job-id", "snippet", "--nodes", NODES.get(module, "node-a,node-b"),
        "--controller", "none", "--max-failures", "0", "--log-dir", str(tmp_path / "ranks"), "--",
        sys.executable, str(script),
    ]  # fmt: skip
    with cores_allowed():
        done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=280)
    logs = "\n".join(p.read_text()[-2000:] for p in sorted((tmp_path / "ranks").glob("*.log")))
    assert done.returncode == 0, done.stderr[-2000:] + logs + backtraces(tmp_path)
    assert "Traceback" not in logs, logs
