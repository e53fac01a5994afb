"""Model FLOPs per token and MFU, counting only the experts a token is routed to. Pure.

    flops/token = 6·N_active + 12·L·H·K·S
    N_active    = L·[attention + router + (top_k + shared)·expert] + lm_head

6·N: each weight is used in one multiply-add forward (2 FLOPs) and two backward (input and weight
gradients). 12·L·H·K·S: the attention scores and the weighted sum, forward and backward, counted
as if not causal (as PaLM, torchtitan and llm-foundry count it; a causal kernel does about half).
The embedding lookup and the norms are not counted.
"""

from __future__ import annotations

from checks.devices import peaks_for
from trainer_hooks.moe_job.config import ModelConfig


def active_params(cfg: ModelConfig) -> int:
    attention = 4 * cfg.dim * cfg.dim  # qkv and out
    router = cfg.dim * cfg.n_experts
    expert = 3 * cfg.dim * cfg.expert_dim  # SwiGLU: w1, w3, w2
    per_layer = attention + router + (cfg.top_k + cfg.n_shared_experts) * expert
    return cfg.n_layers * per_layer + cfg.dim * cfg.vocab_size


def total_params(cfg: ModelConfig) -> int:
    expert = 3 * cfg.dim * cfg.expert_dim
    per_layer = 4 * cfg.dim * cfg.dim + cfg.dim * cfg.n_experts + (cfg.n_experts + cfg.n_shared_experts) * expert
    norms = (2 * cfg.n_layers + 1) * cfg.dim
    return cfg.n_layers * per_layer + 2 * cfg.dim * cfg.vocab_size + norms


def flops_per_token(cfg: ModelConfig) -> float:
    attention = 12 * cfg.n_layers * cfg.n_heads * cfg.head_dim * cfg.seq_len
    return 6.0 * active_params(cfg) + attention


def peak_flops(device_name: str, override_tflops: float | None = None) -> float | None:
    """Dense bf16 peak FLOP/s of one device; None when unknown (a CPU, an unlisted GPU)."""
    if override_tflops is not None:
        return override_tflops * 1e12
    peaks = peaks_for(device_name)
    return peaks[0] * 1e12 if peaks else None


def mfu(tokens_per_s_per_device: float, cfg: ModelConfig, peak: float) -> float:
    return tokens_per_s_per_device * flops_per_token(cfg) / peak
