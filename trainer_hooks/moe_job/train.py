"""Train the bundled MoE model under torchrun; resume from the last committed checkpoint on start.

    torchrun --nproc-per-node 2 -m trainer_hooks.moe_job.train --preset debug --out runs/debug --steps 100

Each step: the next ``global_batch`` samples (this rank's slice), forward, backward, clip, AdamW,
an all-reduce of the loss (for the log), then Vigil's hook (``trainer_hooks.hook``): it agrees on
the stop flag across ranks and reports to the controller. SIGTERM only sets that flag (no collective
ever runs in a signal handler), and so does the controller's CHECKPOINT_AND_RESTART; at the step
boundary where the agreed flag is set, every rank stops at the same step, the job saves a
checkpoint synchronously, commits it, acknowledges, and exits with ``CHECKPOINTED_EXIT_CODE``.
Whoever launched the job starts it again, and it resumes at exactly the next sample, with any
number of ranks.

Rank 0 appends one JSON line per logged step to ``<out>/metrics.jsonl``: step, loss, tokens/s and,
on a GPU with a known peak, MFU.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import time
from dataclasses import asdict
from types import FrameType

import torch
import torch.distributed as dist

from trainer_hooks.hook import HookConfig, HookConfigError, VigilHook
from trainer_hooks.inject import stop_here
from trainer_hooks.moe_job.checkpoint import Checkpointer, TrainState
from trainer_hooks.moe_job.config import TrainConfig
from trainer_hooks.moe_job.data import Sampler, load_shards, synthetic_corpus
from trainer_hooks.moe_job.flops import flops_per_token, peak_flops
from trainer_hooks.moe_job.metrics_log import FILE, MetricsLog
from trainer_hooks.moe_job.model import MoETransformer, loss_fn
from trainer_hooks.moe_job.parallel import shard
from trainer_hooks.protocol import CHECKPOINTED_EXIT_CODE
from vigil_core.logs import configure_logging


def learning_rate(cfg: TrainConfig, step: int) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    parser = argparse.ArgumentParser(prog="python -m trainer_hooks.moe_job.train", description=__doc__)
    for name, field in TrainConfig.model_fields.items():
        flag = "--" + name.replace("_", "-")
        if field.annotation is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=field.description)
        else:
            parser.add_argument(flag, default=None, help=field.description)
    given = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}
    try:
        return TrainConfig(**given)
    except ValueError as exc:  # pydantic names the bad argument
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    configure_logging("auto")  # the hook's own lines: JSON on stderr unless on a terminal
    on_gpu = torch.cuda.is_available()
    dist.init_process_group("cpu:gloo,cuda:nccl" if on_gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if on_gpu else "cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    bf16 = cfg.dtype == "bfloat16" or (cfg.dtype == "auto" and on_gpu)
    arch = cfg.architecture
    peak = peak_flops(torch.cuda.get_device_name(device) if on_gpu else "cpu", cfg.peak_tflops)
    try:
        auto = cfg.checkpoint_every == "auto"
        hook = VigilHook(
            HookConfig.from_env(flops_per_token=flops_per_token(arch), peak_flops=peak or 0.0, auto_checkpoint=auto)
        )
    except HookConfigError as exc:
        print(exc, file=sys.stderr)
        dist.destroy_process_group()
        return 2

    def on_sigterm(signum: int, _frame: FrameType | None) -> None:
        hook.request_stop(signal.Signals(signum).name)  # only sets a flag: the step boundary acts on it

    signal.signal(signal.SIGTERM, on_sigterm)

    torch.manual_seed(cfg.seed)  # the same initial weights on every rank, before sharding
    speed, compiled = cfg.speed(on_gpu)
    model = MoETransformer(arch, speed).to(device)
    if compiled:
        for block in model.blocks:
            block.compile()  # before sharding, so each block's own FSDP hooks run around its graph
    model = shard(model, bf16)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay, eps=1e-8
    )
    state = TrainState(model, optimizer)
    checkpointer = Checkpointer(cfg.out / "checkpoints", rank, cfg.keep_checkpoints)
    resumed = checkpointer.load(state)
    shards = load_shards(cfg.data) if cfg.data else [synthetic_corpus(arch.vocab_size, cfg.synthetic_tokens, cfg.seed)]
    sampler = Sampler(shards, arch.seq_len, cfg.seed)
    log = MetricsLog(cfg.out / FILE, rank == 0)
    log.event("start", step=state.step, consumed=state.consumed, world_size=world, resumed_from=str(resumed or ""),
              node=hook.config.node, restart=hook.config.restart_count, compiled=compiled,
              speed=asdict(speed))  # fmt: skip
    hook.start(state.step, max(checkpointer.last_committed, 0))  # restore: the time since the process started
    slow = cfg.slow_s if cfg.slow_node == hook.config.node else 0.0
    hang = cfg.hang_node == hook.config.node

    tokens_per_step = cfg.global_batch * arch.seq_len
    trained_s = 0.0
    while state.step < cfg.steps:
        if hang and state.step >= cfg.hang_at_step:
            print(f"injected: rank {rank} hangs at step {state.step} ({cfg.hang_how})", file=sys.stderr, flush=True)
            stop_here(cfg.hang_how, rank, world, cfg.out)
        started = time.perf_counter()
        batch = torch.from_numpy(sampler.batch(state.consumed, cfg.global_batch, rank, world)).to(device)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(cfg, state.step)
        ce, loss = loss_fn(model, batch)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if (waited := checkpointer.before_update()) > 0.001:  # a save in flight still copies the state
            log.event("checkpoint_staging_wait", step=state.step, waited_s=round(waited, 4))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        state.step += 1
        state.consumed += cfg.global_batch

        mean = ce.detach().float()
        dist.all_reduce(mean)
        mean_loss = mean.item() / world
        if slow and state.step > cfg.slow_from_step:
            time.sleep(slow)  # injected: this node's ranks are slow
        if (short := cfg.step_floor_s - (time.perf_counter() - started)) > 0:
            time.sleep(short)
        seconds = time.perf_counter() - started
        trained_s += seconds
        stopping = hook.step_end(state.step, tokens_per_step, seconds, mean_loss)
        if state.step % cfg.log_every == 0 or stopping:
            tokens_per_s = tokens_per_step / seconds
            mfu = tokens_per_s / world * flops_per_token(arch) / peak if peak else None
            peak_gib = torch.cuda.max_memory_allocated(device) / 2**30 if on_gpu else None
            log.event("step", step=state.step, loss=mean_loss, lr=learning_rate(cfg, state.step - 1),
                      tokens_per_s=round(tokens_per_s, 1), step_s=round(seconds, 4), mfu=mfu,
                      peak_gib=peak_gib)  # fmt: skip

        checkpointer.poll()
        if stopping:
            blocked = checkpointer.save(state, asynchronous=False)
            acked = hook.end(checkpoint_step=state.step, checkpoint_s=blocked)
            log.event("checkpointed_and_exiting", step=state.step, why=hook.stop_reason, blocked_s=blocked,
                      acknowledged=acked)  # fmt: skip
            dist.destroy_process_group()
            return CHECKPOINTED_EXIT_CODE
        on_schedule = cfg.checkpoint_every != "auto" and state.step % int(cfg.checkpoint_every) == 0
        asked = hook.save_due  # Vigil asks for a save now (the same on every rank at this step)
        if (on_schedule or asked) and state.step < cfg.steps:
            hook.pause("checkpoint")  # a long save is not a hang (the next step_end ends the pause)
            if cfg.slow_save_s:
                time.sleep(cfg.slow_save_s)  # injected: a save slower than the job's steps would allow
            blocked = checkpointer.save(state, asynchronous=cfg.async_checkpoint)
            hook.checkpoint_saved(blocked, checkpointer.last_committed, saved_step=state.step)
            log.event("checkpoint", step=state.step, asynchronous=cfg.async_checkpoint, blocked_s=round(blocked, 4),
                      asked_by_vigil=asked)  # fmt: skip

    blocked = checkpointer.save(state, asynchronous=False)
    hook.end(checkpoint_s=blocked)
    log.event("finished", step=state.step, trained_s=round(trained_s, 4), hook_s=round(hook.overhead_s, 4))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
