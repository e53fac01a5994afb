"""The bundled job across real processes (gloo on CPU): it learns, it stops on SIGTERM with a
committed checkpoint and its exit code, and it resumes at exactly the next sample, with the same or
another number of ranks."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the training job needs torch (make test installs the CPU build)")

from tests.helpers import free_port, poll_until  # noqa: E402
from tests.training.launch import events, launch, losses, run  # noqa: E402
from trainer_hooks.moe_job.checkpoint import resume_point, step_dir  # noqa: E402
from trainer_hooks.moe_job.config import PRESETS  # noqa: E402
from trainer_hooks.moe_job.flops import flops_per_token  # noqa: E402
from trainer_hooks.protocol import CHECKPOINTED_EXIT_CODE  # noqa: E402

# Each run starts two processes that import torch and its checkpointing (8 s of CPU each); on two
# loaded cores a test with the module's first run before it takes two minutes.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

GOLDEN = json.loads((Path(__file__).parent / "golden" / "moe_debug_loss.json").read_text())
ARGS = ("--steps", "30", "--global-batch", "6", "--checkpoint-every", "10", "--peak-tflops", "1")


@pytest.fixture(scope="module")
def uninterrupted_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted")
    assert run(2, out, *ARGS) == [0, 0], (out / "rank0.log").read_text()[-2000:]
    assert (out / "checkpoints" / "latest").read_text().strip() == "step-00000030"
    return out


@pytest.fixture(scope="module")
def uninterrupted(uninterrupted_run: Path) -> dict[int, float]:
    return losses(uninterrupted_run)


def test_the_loss_goes_down_along_the_golden_curve(uninterrupted: dict[int, float]) -> None:
    curve = [uninterrupted[s] for s in range(1, 31)]
    assert curve[-1] < curve[0] - 0.7  # from ln(512) = 6.24 towards the corpus's entropy
    # Exact on this machine (the next test relies on that); another CPU's float kernels may round
    # differently, hence the tolerance against the recorded curve.
    assert curve == pytest.approx(GOLDEN["losses"], rel=2e-3, abs=2e-3)


def interrupt(out: Path, world: int, after_step: int) -> int:
    """Start the job, SIGTERM one rank once it logged ``after_step``; returns the step it stopped at."""
    procs = launch(world, out, *ARGS)
    poll_until(lambda: any(e["step"] >= after_step for e in events(out, "step")), timeout=120, what="training")
    procs[-1].send_signal(signal.SIGTERM)  # one rank is told; the all-reduced flag stops them all
    codes = [p.wait(120) for p in procs]
    assert codes == [CHECKPOINTED_EXIT_CODE] * world, (out / "rank0.log").read_text()[-2000:]
    (stopped,) = events(out, "checkpointed_and_exiting")
    return int(stopped["step"])


def test_sigterm_checkpoints_and_the_resumed_run_repeats_the_curve_exactly(
    tmp_path: Path, uninterrupted: dict[int, float]
) -> None:
    k = interrupt(tmp_path, 2, after_step=7)
    assert k < 30 and resume_point(tmp_path / "checkpoints") == step_dir(tmp_path / "checkpoints", k)
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == f"step-{k:08d}"

    assert run(2, tmp_path, *ARGS) == [0, 0]
    start = events(tmp_path, "start")[-1]
    assert (start["step"], start["consumed"]) == (k, 6 * k)  # at exactly the next sample
    # Same world size, same data, restored optimizer state: the same floating-point operations.
    assert losses(tmp_path) == uninterrupted


def test_a_run_resumes_with_another_number_of_ranks(tmp_path: Path, uninterrupted: dict[int, float]) -> None:
    k = interrupt(tmp_path, 2, after_step=12)
    assert run(3, tmp_path, *ARGS) == [0, 0, 0]  # DCP reshards the 2-rank checkpoint over 3
    start = events(tmp_path, "start")[-1]
    assert (start["step"], start["world_size"], start["consumed"]) == (k, 3, 6 * k)
    resumed = losses(tmp_path)
    assert [resumed[s] for s in range(1, k + 1)] == [uninterrupted[s] for s in range(1, k + 1)]
    # Three ranks reduce the gradients in another order, and each rank's balancing loss sees its own
    # two sequences instead of three: the first step after the resume matches exactly, the curve then
    # drifts by rounding (3.2e-4 at most by step 30 when measured).
    later = range(k + 1, 31)
    assert resumed[k + 1] == pytest.approx(uninterrupted[k + 1], abs=1e-6)
    assert [resumed[s] for s in later] == pytest.approx([uninterrupted[s] for s in later], abs=2e-3)


def test_after_a_crash_the_run_resumes_from_the_asynchronous_checkpoint_exactly(
    tmp_path: Path, uninterrupted: dict[int, float]
) -> None:
    """An asynchronous save copied the state while the next step ran: what it wrote must be its own
    step's state, not a mix with later updates, or the resumed curve would differ."""
    procs = launch(2, tmp_path, *ARGS)
    latest = tmp_path / "checkpoints" / "latest"

    def past_a_commit() -> bool:
        if not latest.exists():
            return False
        committed = int(latest.read_text().strip().removeprefix("step-"))
        return any(e["step"] >= committed + 2 for e in events(tmp_path, "step"))

    poll_until(past_a_commit, timeout=120, what="a committed asynchronous checkpoint, training past it")
    for p in procs:
        p.send_signal(signal.SIGKILL)  # a node died: no checkpoint on the way out
    for p in procs:
        p.wait(30)
    committed = int(latest.read_text().strip().removeprefix("step-"))
    trained = max(e["step"] for e in events(tmp_path, "step"))
    assert committed in (10, 20) and trained > committed

    assert run(2, tmp_path, *ARGS) == [0, 0]
    assert events(tmp_path, "start")[-1]["step"] == committed
    assert losses(tmp_path) == uninterrupted  # the steps after it trained again, to the same values


def test_a_half_written_checkpoint_is_never_resumed_from(tmp_path: Path) -> None:
    assert run(2, tmp_path, "--steps", "10", "--global-batch", "6", "--checkpoint-every", "5") == [0, 0]
    root = tmp_path / "checkpoints"
    torn = step_dir(root, 15)  # a save that died: shards, no .metadata
    torn.mkdir()
    (torn / "__0_0.distcp").write_bytes(b"\0" * 1000)
    (root / "latest").write_text("step-00000015\n")  # even if the pointer were wrong
    time.sleep(0.01)
    assert resume_point(root) == step_dir(root, 10)
    assert run(2, tmp_path, "--steps", "12", "--global-batch", "6", "--checkpoint-every", "5") == [0, 0]
    assert events(tmp_path, "start")[-1]["step"] == 10


def test_mfu_is_logged_against_a_given_peak_and_a_finished_run_is_not_rewritten(uninterrupted_run: Path) -> None:
    """On the module's run (its --peak-tflops 1), then that finished run started again."""
    steps = events(uninterrupted_run, "step")
    tokens_per_s = steps[-1]["tokens_per_s"]
    per_device_flops = tokens_per_s / 2 * flops_per_token(PRESETS["debug"])
    assert steps[-1]["mfu"] == pytest.approx(per_device_flops / 1e12, rel=1e-3)
    metadata = step_dir(uninterrupted_run / "checkpoints", 30) / ".metadata"
    written = metadata.stat().st_mtime_ns
    assert run(2, uninterrupted_run, *ARGS) == [0, 0]  # nothing left to train: the committed step stays
    assert metadata.stat().st_mtime_ns == written and events(uninterrupted_run, "start")[-1]["step"] == 30


def test_an_unreachable_controller_leaves_training_unharmed(
    tmp_path: Path, uninterrupted: dict[int, float], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VIGIL_CONTROLLER", f"127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("VIGIL_WINDOW_STEPS", "2")
    assert run(2, tmp_path, *ARGS) == [0, 0]
    assert losses(tmp_path) == uninterrupted  # the same curve, bit for bit
    rank0 = (tmp_path / "rank0.log").read_text()
    assert rank0.count("vigil_controller_unreachable") == 1  # said once per outage, not per window


def test_the_speed_options_on_follow_the_same_loss_curve(tmp_path: Path, uninterrupted: dict[int, float]) -> None:
    """torch.compile per block, RoPE without the float stack, the cross-entropy in chunks and full
    activation checkpointing, all on (they are off on CPU by default), across two FSDP2 ranks: the
    same losses as the plain run, step for step, and the run says what it ran with."""
    fast = ("--compile", "on", "--fused-rope", "on", "--ce-chunk-tokens", "100", "--activation-checkpointing", "full")
    assert run(2, tmp_path, *ARGS, *fast) == [0, 0], (tmp_path / "rank0.log").read_text()[-3000:]
    got = losses(tmp_path)
    assert [got[s] for s in range(1, 31)] == pytest.approx([uninterrupted[s] for s in range(1, 31)], abs=1e-5)
    (start,) = events(tmp_path, "start")
    assert start["compiled"] and start["speed"] == {
        "fused_rope": True, "ce_chunk_tokens": 100, "checkpoint": "full", "checkpoint_layers": None}  # fmt: skip


def test_the_speed_options_are_checked_and_resolved_per_device() -> None:
    from trainer_hooks.moe_job.config import TrainConfig

    plain, compiled = TrainConfig().speed(on_gpu=False)
    assert (plain.fused_rope, plain.ce_chunk_tokens, plain.checkpoint, compiled) == (False, 0, "none", False)
    gpu, compiled = TrainConfig(preset="h100").speed(on_gpu=True)
    assert (gpu.fused_rope, gpu.ce_chunk_tokens, gpu.checkpoint, compiled) == (True, 8192, "full", True)
    assert TrainConfig(preset="1b").speed(on_gpu=True)[0].checkpoint == "none"
    ranged, _ = TrainConfig(activation_checkpointing="experts", checkpoint_layers="2-5").speed(on_gpu=False)
    assert ranged.checkpoints(3, "experts") and not ranged.checkpoints(6, "experts")
    assert not ranged.checkpoints(3, "attention")
    with pytest.raises(ValueError, match="checkpoint_layers is FIRST-LAST"):
        TrainConfig(checkpoint_layers="5-2")
