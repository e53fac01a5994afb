"""A decoder-only Mixture-of-Experts transformer, in plain ``nn`` code.

Each block: RMSNorm → causal self-attention with rotary position embeddings → RMSNorm → a MoE
feed-forward layer. The MoE layer routes every token to its ``top_k`` experts (softmax router,
the chosen weights renormalised), runs each expert's SwiGLU on its tokens, and adds an optional
shared expert that every token goes through. Load balancing is the Switch Transformer auxiliary
loss, ``E · Σ_e f_e · P_e`` (f: the share of routed tokens that expert e received, P: its mean
router probability), which is 1 when the load is even.

The experts run as grouped matrix products (``torch.nn.functional.grouped_mm``: one kernel for all
experts, tokens sorted by expert) where the torch build has it and the shapes meet its 16-byte
alignment; elsewhere a loop over the experts computes the same thing.

Tensor names carry their shapes. Legend:
    B batch   S sequence   D model dim   H heads   K head dim   V vocab
    E experts   F expert hidden dim   A top_k   T tokens (B·S)   R routed tokens (T·A)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from trainer_hooks.moe_job.config import ModelConfig


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


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim, bias=False)
        self.out = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x_BSD: torch.Tensor, cos_SK2: torch.Tensor, sin_SK2: torch.Tensor) -> torch.Tensor:
        B, S, D = x_BSD.shape
        q_BHSK, k_BHSK, v_BHSK = self.qkv(x_BSD).view(B, S, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q_BHSK, k_BHSK = apply_rope(q_BHSK, cos_SK2, sin_SK2), apply_rope(k_BHSK, cos_SK2, sin_SK2)
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
    bf16 operands (its kernels need SM 80 or newer)."""
    if not hasattr(F, "grouped_mm"):
        return False
    x = tensors[0]
    if x.is_cuda and (x.dtype != torch.bfloat16 or torch.cuda.get_device_capability(x.device) < (8, 0)):
        return False
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
        counts_E = torch.bincount(experts_R, minlength=self.n_experts)
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
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.dim)
        self.attn = Attention(cfg)
        self.moe_norm = nn.RMSNorm(cfg.dim)
        self.moe = MoE(cfg)

    def forward(
        self, x_BSD: torch.Tensor, cos_SK2: torch.Tensor, sin_SK2: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x_BSD = x_BSD + self.attn(self.attn_norm(x_BSD), cos_SK2, sin_SK2)
        moe_BSD, aux_loss = self.moe(self.moe_norm(x_BSD))
        return x_BSD + moe_BSD, aux_loss


class MoETransformer(nn.Module):
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.dim)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        cos, sin = rope_tables(cfg.seq_len, cfg.head_dim, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

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
        cos, sin = rope_tables(self.cfg.seq_len, self.cfg.head_dim, self.cfg.rope_theta)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)

    def forward(self, tokens_BS: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (B, S, V) and the mean load-balancing loss of the MoE layers."""
        S = tokens_BS.shape[1]
        x_BSD = self.embed(tokens_BS)
        cos_SK2, sin_SK2 = self.rope_cos[:S], self.rope_sin[:S]
        aux = torch.zeros((), device=x_BSD.device)
        for block in self.blocks:
            x_BSD, block_aux = block(x_BSD, cos_SK2, sin_SK2)
            aux = aux + block_aux
        logits_BSV: torch.Tensor = self.lm_head(self.norm(x_BSD))
        return logits_BSV, aux / len(self.blocks)


def loss_fn(model: MoETransformer, tokens_BS1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token cross-entropy over (B, S+1) tokens, and the total loss with the balancing term."""
    logits_BSV, aux = model(tokens_BS1[:, :-1])
    ce = F.cross_entropy(logits_BSV.flatten(0, 1).float(), tokens_BS1[:, 1:].flatten())
    return ce, ce + model.cfg.aux_loss_coef * aux
