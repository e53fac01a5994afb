"""A decoder-only Mixture-of-Experts transformer, in plain ``nn`` code.

Each block: RMSNorm → causal self-attention with rotary position embeddings → RMSNorm → a MoE
feed-forward layer. The MoE layer routes every token to its ``top_k`` experts (softmax router,
the chosen weights renormalised), runs each expert's SwiGLU on its tokens, and adds an optional
shared expert that every token goes through. Load balancing is the Switch Transformer auxiliary
loss, ``E · Σ_e f_e · P_e`` (f: the share of routed tokens that expert e received, P: its mean
router probability), which is 1 when the load is even.

The experts run as grouped matrix products (``torch.nn.functional.grouped_mm``: one kernel for all
experts, tokens sorted by expert) where the torch build has it and the shapes meet its 16-byte
alignment; elsewhere a loop over the experts computes the same thing. The dispatch never waits on
the host in the grouped path (the counts per expert by ``index_add_``, no ``bincount``/``tolist``).

``Speed`` holds what changes the speed and memory, never the math (each off by default, as on CPU):
RoPE in the activations' dtype without a float stack (``fused_rope``), the cross-entropy in chunks
of tokens whose fp32 logits are recomputed in the backward instead of kept (``ce_chunk_tokens``),
and activation checkpointing of the attention, the experts or both, for a range of layers.
``torch.compile`` per block is applied by the job (``train.py``).

Tensor names carry their shapes. Legend:
    B batch   S sequence   D model dim   H heads   K head dim   V vocab
    E experts   F expert hidden dim   A top_k   T tokens (B·S)   R routed tokens (T·A)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainer_hooks.moe_job.config import PLAIN, ModelConfig, Speed


def rope_tables(seq_len: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of each position's rotation, (S, K/2) each."""
    freqs_K2 = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles_SK2 = torch.outer(torch.arange(seq_len, dtype=torch.float32), freqs_K2)
    return angles_SK2.cos(), angles_SK2.sin()


def apply_rope(x_BHSK: torch.Tensor, cos_SK2: torch.Tensor, sin_SK2: torch.Tensor) -> torch.Tensor:
    """Rotate each (even, odd) pair of a head's features by its position's angle."""
    x1, x2 = x_BHSK.float().view(*x_BHSK.shape[:-1], -1, 2).unbind(-1)
    out = torch.stack((x1 * cos_SK2 - x2 * sin_SK2, x1 * sin_SK2 + x2 * cos_SK2), dim=-1)
    return out.flatten(-2).type_as(x_BHSK)


def fused_rope_tables(cos_SK2: torch.Tensor, sin_SK2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same rotation as whole-width tables: cos repeated per pair, sin signed (-sin, +sin)."""
    cos_SK = cos_SK2.repeat_interleave(2, dim=-1)
    sin_SK = torch.stack((-sin_SK2, sin_SK2), dim=-1).flatten(-2)
    return cos_SK, sin_SK


def apply_fused_rope(x_BHSK: torch.Tensor, cos_SK: torch.Tensor, sin_SK: torch.Tensor) -> torch.Tensor:
    """``apply_rope`` in the activations' own dtype, without a float copy or a stack: x·cos + swap(x)·sin,
    where swap turns each (even, odd) pair into (odd, even) and the table carries the signs."""
    swapped = x_BHSK.view(*x_BHSK.shape[:-1], -1, 2).flip(-1).flatten(-2)
    out: torch.Tensor = x_BHSK * cos_SK.to(x_BHSK.dtype) + swapped * sin_SK.to(x_BHSK.dtype)
    return out


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim, bias=False)
        self.out = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x_BSD: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, fused: bool = False) -> torch.Tensor:
        """``cos``/``sin``: (S, K/2) tables, or (S, K) ones with ``fused`` (``fused_rope_tables``)."""
        B, S, D = x_BSD.shape
        q_BHSK, k_BHSK, v_BHSK = self.qkv(x_BSD).view(B, S, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        rope = apply_fused_rope if fused else apply_rope
        q_BHSK, k_BHSK = rope(q_BHSK, cos, sin), rope(k_BHSK, cos, sin)
        o_BHSK = F.scaled_dot_product_attention(q_BHSK, k_BHSK, v_BHSK, is_causal=True)
        out_BSD: torch.Tensor = self.out(o_BHSK.transpose(1, 2).reshape(B, S, D))
        return out_BSD


class SwiGLU(nn.Module):
    """The shared expert: a dense SwiGLU feed-forward layer."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.w2(F.silu(self.w1(x)) * self.w3(x))
        return out


def _grouped_mm_fits(*tensors: torch.Tensor) -> bool:
    """grouped_mm wants every row of every operand to start on a 16-byte boundary, and on a GPU
    (or compiled) bf16 operands (its kernels need SM 80 or newer)."""
    if not hasattr(F, "grouped_mm"):
        return False
    x = tensors[0]
    if x.is_cuda and (x.dtype != torch.bfloat16 or torch.cuda.get_device_capability(x.device) < (8, 0)):
        return False
    if torch.compiler.is_compiling() and x.dtype != torch.bfloat16:
        return False  # compiled, its shape checks want bf16 everywhere (eager takes fp32 on CPU)
    return all(t.shape[-1] * t.element_size() % 16 == 0 for t in tensors)


class MoE(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_experts, self.top_k = cfg.n_experts, cfg.top_k
        self.router = nn.Linear(cfg.dim, cfg.n_experts, bias=False)
        self.w1_EDF = nn.Parameter(torch.empty(cfg.n_experts, cfg.dim, cfg.expert_dim))
        self.w3_EDF = nn.Parameter(torch.empty(cfg.n_experts, cfg.dim, cfg.expert_dim))
        self.w2_EFD = nn.Parameter(torch.empty(cfg.n_experts, cfg.expert_dim, cfg.dim))
        self.shared = SwiGLU(cfg.dim, cfg.expert_dim) if cfg.n_shared_experts else None
        self.use_grouped_mm = True  # tests compare it with the loop

    def forward(self, x_BSD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's output, and its load-balancing loss."""
        B, S, D = x_BSD.shape
        x_TD = x_BSD.reshape(-1, D)
        probs_TE = F.softmax(self.router(x_TD).float(), dim=-1)
        weights_TA, experts_TA = probs_TE.topk(self.top_k, dim=-1)
        weights_TA = (weights_TA / weights_TA.sum(-1, keepdim=True)).type_as(x_TD)

        # Sort the (token, expert) assignments by expert, so each expert's tokens are contiguous.
        experts_R = experts_TA.flatten()
        order_R = experts_R.argsort(stable=True)
        tokens_R = order_R // self.top_k
        # Counted on the device: bincount would wait for the host to size its output.
        counts_E = torch.zeros(self.n_experts, dtype=torch.long, device=x_TD.device)
        counts_E.index_add_(0, experts_R, torch.ones_like(experts_R))
        y_RD = self._experts(x_TD[tokens_R], counts_E) * weights_TA.flatten()[order_R, None]
        out_TD = torch.zeros_like(x_TD).index_add_(0, tokens_R, y_RD)
        if self.shared is not None:
            out_TD = out_TD + self.shared(x_TD)

        routed_share_E = counts_E.float() / experts_R.numel()
        aux_loss = self.n_experts * (routed_share_E * probs_TE.mean(0)).sum()
        return out_TD.view(B, S, D), aux_loss

    def _experts(self, x_RD: torch.Tensor, counts_E: torch.Tensor) -> torch.Tensor:
        """Each expert's SwiGLU over its (contiguous) tokens."""
        w1, w3, w2 = self.w1_EDF.to(x_RD.dtype), self.w3_EDF.to(x_RD.dtype), self.w2_EFD.to(x_RD.dtype)
        if self.use_grouped_mm and _grouped_mm_fits(x_RD, w1, w2):
            ends_E = counts_E.cumsum(0).to(torch.int32)
            h_RF = F.silu(F.grouped_mm(x_RD, w1, offs=ends_E)) * F.grouped_mm(x_RD, w3, offs=ends_E)
            return F.grouped_mm(h_RF, w2, offs=ends_E)
        out, start = [], 0
        for e, count in enumerate(counts_E.tolist()):
            x_nD = x_RD[start : start + count]
            out.append((F.silu(x_nD @ w1[e]) * (x_nD @ w3[e])) @ w2[e])
            start += count
        return torch.cat(out)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int = 0, speed: Speed = PLAIN) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.dim)
        self.attn = Attention(cfg)
        self.moe_norm = nn.RMSNorm(cfg.dim)
        self.moe = MoE(cfg)
        self.layer, self.speed = layer, speed

    def forward(self, x_BSD: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        speed = self.speed
        if speed.checkpoints(self.layer, "attention"):
            attn_BSD = checkpoint(self._attention, x_BSD, cos, sin, use_reentrant=False)
        else:
            attn_BSD = self._attention(x_BSD, cos, sin)
        x_BSD = x_BSD + attn_BSD
        if speed.checkpoints(self.layer, "experts"):
            moe_BSD, aux_loss = checkpoint(self._experts, x_BSD, use_reentrant=False)
        else:
            moe_BSD, aux_loss = self._experts(x_BSD)
        return x_BSD + moe_BSD, aux_loss

    def _attention(self, x_BSD: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.attn(self.attn_norm(x_BSD), cos, sin, self.speed.fused_rope)
        return out

    def _experts(self, x_BSD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out: tuple[torch.Tensor, torch.Tensor] = self.moe(self.moe_norm(x_BSD))
        return out


class MoETransformer(nn.Module):
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(self, cfg: ModelConfig, speed: Speed = PLAIN) -> None:
        super().__init__()
        self.cfg, self.speed = cfg, speed
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg, i, speed) for i in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.dim)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        cos, sin = self._rope_tables()
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def _rope_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(S, K/2) tables, or the fused (S, K) ones: made once, not at every step."""
        cos, sin = rope_tables(self.cfg.seq_len, self.cfg.head_dim, self.cfg.rope_theta)
        return fused_rope_tables(cos, sin) if self.speed.fused_rope else (cos, sin)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Normal(0, 0.02) everywhere; the projections back into the residual stream scaled down by
        √(2·layers) (GPT-2), so the stream does not grow with depth."""
        std, out_std = 0.02, 0.02 / math.sqrt(2 * self.cfg.n_layers)
        for name, p in self.named_parameters():
            if p.dim() == 1:  # norm weights
                p.fill_(1.0)
            else:
                p.normal_(0.0, out_std if name.endswith(("out.weight", "w2_EFD", "w2.weight")) else std)
        cos, sin = self._rope_tables()
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)

    def forward(
        self, tokens_BS: torch.Tensor, targets_BS: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (B, S, V), or with ``targets`` the mean next-token cross-entropy; and the mean
        load-balancing loss of the MoE layers."""
        S = tokens_BS.shape[1]
        x_BSD = self.embed(tokens_BS)
        cos, sin = self.rope_cos[:S], self.rope_sin[:S]
        aux = torch.zeros((), device=x_BSD.device)
        for block in self.blocks:
            x_BSD, block_aux = block(x_BSD, cos, sin)
            aux = aux + block_aux
        h_BSD = self.norm(x_BSD)
        if targets_BS is None:
            logits_BSV: torch.Tensor = self.lm_head(h_BSD)
            return logits_BSV, aux / len(self.blocks)
        return self._cross_entropy(h_BSD.flatten(0, 1), targets_BS.flatten()), aux / len(self.blocks)

    def _cross_entropy(self, h_TD: torch.Tensor, targets_T: torch.Tensor) -> torch.Tensor:
        """The mean over tokens; in chunks whose fp32 logits the backward recomputes (``ce_chunk_tokens``)."""
        chunk = self.speed.ce_chunk_tokens
        if not chunk or chunk >= len(targets_T):
            return F.cross_entropy(self.lm_head(h_TD).float(), targets_T)
        total = torch.zeros((), device=h_TD.device)
        for h_cD, t_c in zip(torch.split(h_TD, chunk), torch.split(targets_T, chunk), strict=True):
            total = total + checkpoint(self._ce_sum, h_cD, t_c, use_reentrant=False)
        return total / len(targets_T)

    def _ce_sum(self, h_cD: torch.Tensor, targets_c: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.lm_head(h_cD).float(), targets_c, reduction="sum")


def loss_fn(model: MoETransformer, tokens_BS1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token cross-entropy over (B, S+1) tokens, and the total loss with the balancing term."""
    ce, aux = model(tokens_BS1[:, :-1], tokens_BS1[:, 1:])
    return ce, ce + model.cfg.aux_loss_coef * aux
