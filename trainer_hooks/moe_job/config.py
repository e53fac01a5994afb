"""The job's configuration: the model's shape and the run's settings, validated, with named presets.

``debug`` is CPU-sized (tests, the demo); ``small`` fits a laptop GPU; ``1b`` is about a billion
parameters (a quarter of them active per token); ``h100`` about 2.2 billion (0.89 active), sized for
one H100/H200 at full speed.

The speed options (``compile``, ``fused_rope``, ``ce_chunk_tokens``, ``activation_checkpointing``)
change speed and memory, never the math; ``auto`` turns each on for a GPU and off on a CPU, so the
CPU tests and the golden loss run the plain path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from trainer_hooks.inject import HangHow
from vigil_core.config_file import ConfigModel


class ModelConfig(ConfigModel):
    vocab_size: int = Field(default=512, ge=2)
    dim: int = Field(default=64, ge=8)
    n_layers: int = Field(default=2, ge=1)
    n_heads: int = Field(default=4, ge=1)
    n_experts: int = Field(default=4, ge=1)
    top_k: int = Field(default=2, ge=1)
    n_shared_experts: int = Field(default=0, ge=0, le=1, description="a dense expert every token also goes through")
    expert_dim: int = Field(default=128, ge=8, description="hidden size of each expert's SwiGLU")
    seq_len: int = Field(default=64, ge=2)
    rope_theta: float = Field(default=10000.0, gt=0)
    aux_loss_coef: float = Field(default=0.01, ge=0, description="load-balancing loss weight (Switch Transformer)")

    @model_validator(mode="after")
    def _shapes(self) -> ModelConfig:
        if self.dim % self.n_heads or (self.dim // self.n_heads) % 2:
            raise ValueError(f"dim {self.dim} must split into {self.n_heads} heads of an even size (RoPE)")
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k {self.top_k} cannot exceed n_experts {self.n_experts}")
        return self

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


PRESETS: dict[str, ModelConfig] = {
    "debug": ModelConfig(),
    "small": ModelConfig(
        vocab_size=32768, dim=512, n_layers=8, n_heads=8, n_experts=8, top_k=2, expert_dim=1024, seq_len=1024
    ),
    # 2.2 B parameters, 0.89 B active per token: sized for one H100/H200 (80 GB) with activation
    # checkpointing and a per-GPU batch of 16 (on GPU its options default to compile, fused RoPE,
    # chunked cross-entropy and full activation checkpointing).
    "h100": ModelConfig(
        vocab_size=32768,
        dim=2048,
        n_layers=12,
        n_heads=16,
        n_experts=8,
        top_k=2,
        n_shared_experts=1,
        expert_dim=2816,
        seq_len=2048,
    ),
    # 1.03 B parameters, 0.31 B active per token (see flops.py); small: 143 M, 50 M active.
    "1b": ModelConfig(
        vocab_size=32768,
        dim=1024,
        n_layers=16,
        n_heads=16,
        n_experts=12,
        top_k=2,
        n_shared_experts=1,
        expert_dim=1408,
        seq_len=2048,
    ),
}


AC_ON_GPU = frozenset({"h100"})  # presets whose activations need checkpointing to fit their batch


@dataclass(frozen=True, slots=True)
class Speed:
    """What changes the model's speed and memory, never its math (``model.py`` applies it)."""

    fused_rope: bool = False
    ce_chunk_tokens: int = 0  # 0: the whole batch's logits at once
    checkpoint: str = "none"  # activation checkpointing: none, full, attention, experts
    checkpoint_layers: tuple[int, int] | None = None  # [first, last] layers it applies to; None: all

    def checkpoints(self, layer: int, part: str) -> bool:
        if self.checkpoint == "none" or (self.checkpoint != "full" and self.checkpoint != part):
            return False
        first, last = self.checkpoint_layers or (0, 1 << 30)
        return first <= layer <= last


PLAIN = Speed()  # every option off: the CPU path, the golden loss


class TrainConfig(ConfigModel):
    preset: str = "debug"
    out: Path = Path("runs/debug")
    data: Path | None = Field(default=None, description="a folder of *.bin token shards (uint16); default: synthetic")
    synthetic_tokens: int = Field(default=1 << 20, ge=1024, description="size of the synthetic corpus")
    steps: int = Field(default=100, ge=1)
    global_batch: int = Field(default=8, ge=1, description="sequences per step, across all ranks")
    lr: float = Field(default=3e-3, gt=0)
    warmup_steps: int = Field(default=10, ge=0)
    weight_decay: float = Field(default=0.1, ge=0)
    seed: int = 1234
    checkpoint_every: int | Literal["auto"] = Field(
        default=20,
        description="steps between saves, or auto: as often as Vigil recommends for this job (vigil plan)",
    )
    keep_checkpoints: int = Field(default=3, ge=1)
    async_checkpoint: bool = True
    log_every: int = Field(default=1, ge=1)
    dtype: Literal["auto", "float32", "bfloat16"] = Field(default="auto", description="auto: bf16 on GPU, fp32 on CPU")
    compile: Literal["auto", "on", "off"] = Field(default="auto", description="torch.compile each block (auto: GPU)")
    fused_rope: Literal["auto", "on", "off"] = Field(default="auto", description="RoPE in bf16, no stack (auto: GPU)")
    ce_chunk_tokens: int | Literal["auto"] = Field(
        default="auto", description="cross-entropy in chunks of this many tokens, 0: off (auto: 8192 on GPU)"
    )
    activation_checkpointing: Literal["auto", "none", "full", "attention", "experts"] = Field(
        default="auto", description="recompute in the backward (auto: full for the h100 preset on GPU, else none)"
    )
    checkpoint_layers: str = Field(default="", description="FIRST-LAST: the layers activation checkpointing covers")
    peak_tflops: float | None = Field(default=None, gt=0, description="override the GPU's dense bf16 peak for MFU")
    # Fault injection, for the tests and the demo: the ranks on one node turn slow, or stop.
    slow_node: str | None = Field(default=None, description="inject: the ranks on this node (VIGIL_NODE) turn slow")
    slow_s: float = Field(default=0.0, ge=0, description="inject: seconds added to each of their steps")
    slow_from_step: int = Field(default=0, ge=0, description="inject: from this step on")
    step_floor_s: float = Field(
        default=0.0,
        ge=0,
        le=60,
        description="every step lasts at least this long, as a larger model's would: a reporting window (at least"
        " 10 steps and 0.5 s) then holds the same steps on a fast machine as on a slow one",
    )
    hang_node: str | None = Field(default=None, description="inject: the ranks on this node stop stepping (a hang)")
    hang_at_step: int = Field(default=0, ge=0, description="inject: at this step, before its collectives")
    slow_save_s: float = Field(default=0.0, ge=0, description="inject: seconds added to each scheduled save")
    hang_how: HangHow = Field(
        default="sleep",
        description="inject: how they stop (trainer_hooks.inject): sleep (the job's own code), collective (a "
        "receive nobody sends, as on a broken link), read (a FIFO nobody writes, as a dead mount), host (SIGSTOP)",
    )

    @field_validator("checkpoint_layers")
    @classmethod
    def _layer_range(cls, value: str) -> str:
        if value:
            first, dash, last = value.partition("-")
            if not (dash and first.isdigit() and last.isdigit() and int(first) <= int(last)):
                raise ValueError(f"checkpoint_layers is FIRST-LAST (layers, from 0), not {value!r}")
        return value

    @field_validator("ce_chunk_tokens")
    @classmethod
    def _chunk(cls, value: int | str) -> int | str:
        if value != "auto" and int(value) < 0:
            raise ValueError(f"ce_chunk_tokens is 0 (off), a number of tokens or auto, not {value}")
        return value

    def speed(self, on_gpu: bool) -> tuple[Speed, bool]:
        """The model's speed options and whether to compile each block, ``auto`` resolved for the device."""
        ac = self.activation_checkpointing
        if ac == "auto":
            ac = "full" if on_gpu and self.preset in AC_ON_GPU else "none"
        chunk = (8192 if on_gpu else 0) if self.ce_chunk_tokens == "auto" else int(self.ce_chunk_tokens)
        layers = tuple(int(x) for x in self.checkpoint_layers.split("-")) if self.checkpoint_layers else None
        speed = Speed(
            fused_rope=self.fused_rope == "on" or (self.fused_rope == "auto" and on_gpu),
            ce_chunk_tokens=chunk,
            checkpoint=ac,
            checkpoint_layers=(layers[0], layers[1]) if layers else None,
        )
        return speed, self.compile == "on" or (self.compile == "auto" and on_gpu)

    @field_validator("checkpoint_every")
    @classmethod
    def _every(cls, value: int | str) -> int | str:
        if value != "auto" and int(value) < 1:
            raise ValueError(f"checkpoint_every is a number of steps (1 or more) or auto, not {value}")
        return value

    @model_validator(mode="after")
    def _known_preset(self) -> TrainConfig:
        if self.preset not in PRESETS:
            raise ValueError(f"no model preset {self.preset!r}; presets: {', '.join(PRESETS)}")
        return self

    @property
    def architecture(self) -> ModelConfig:
        return PRESETS[self.preset]
