"""The MoE model on CPU: routing, the two expert paths, parameter counts and the FLOP formula."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the training job needs torch (make test installs the CPU build)")

import torch.nn.functional as F  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from trainer_hooks.moe_job.config import PRESETS, ModelConfig, Speed  # noqa: E402
from trainer_hooks.moe_job.flops import active_params, flops_per_token, peak_flops, total_params  # noqa: E402
from trainer_hooks.moe_job.model import (  # noqa: E402
    MoETransformer,
    apply_fused_rope,
    apply_rope,
    fused_rope_tables,
    loss_fn,
    rope_tables,
)

DEBUG = PRESETS["debug"]


def tokens(cfg: ModelConfig, batch: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len + 1), generator=torch.Generator().manual_seed(seed))


def test_the_model_predicts_every_position_and_balances_its_experts() -> None:
    torch.manual_seed(0)
    model = MoETransformer(DEBUG)
    logits, aux = model(tokens(DEBUG)[:, :-1])
    assert logits.shape == (3, DEBUG.seq_len, DEBUG.vocab_size)
    assert 0.9 < aux.item() < 1.5  # 1.0 when the load is even; a fresh router is nearly even
    ce, total = loss_fn(model, tokens(DEBUG))
    assert abs(ce.item() - torch.log(torch.tensor(DEBUG.vocab_size)).item()) < 0.2  # untrained: uniform
    assert total.item() == pytest.approx(ce.item() + DEBUG.aux_loss_coef * aux.item(), rel=1e-5)


def test_grouped_matmul_and_the_expert_loop_agree_forward_and_backward() -> None:
    cfg = DEBUG.model_copy(update={"n_shared_experts": 1})
    torch.manual_seed(0)
    grouped, looped = MoETransformer(cfg), MoETransformer(cfg)
    looped.load_state_dict(grouped.state_dict())
    for block in looped.blocks:
        block.moe.use_grouped_mm = False
    assert_same_loss_and_gradients(grouped, looped, tokens(cfg))


def assert_same_loss_and_gradients(a: MoETransformer, b: MoETransformer, batch: torch.Tensor) -> None:
    losses = [loss_fn(m, batch)[1] for m in (a, b)]
    for loss in losses:
        loss.backward()
    assert losses[1].item() == pytest.approx(losses[0].item(), rel=1e-5)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert pa.grad is not None and pb.grad is not None
        assert torch.allclose(pa.grad, pb.grad, rtol=1e-4, atol=1e-6), name


def test_parameter_counts_match_the_model() -> None:
    for name in ("debug", "small", "h100"):  # on the meta device: no memory
        cfg = PRESETS[name]
        with torch.device("meta"):
            model = MoETransformer(cfg)
        assert sum(p.numel() for p in model.parameters()) == total_params(cfg), name
    big = PRESETS["1b"]
    assert 1.0e9 < total_params(big) < 1.15e9 and 0.25e9 < active_params(big) < 0.35e9
    h100 = PRESETS["h100"]  # "around 2-4 B total parameters", sized for one 80 GB GPU
    assert 2.0e9 < total_params(h100) < 2.4e9 and 0.85e9 < active_params(h100) < 0.95e9


def test_the_flop_formula_matches_what_torch_counts() -> None:
    """FlopCounterMode counts matrix products. On this CPU build it has no formula for grouped_mm
    nor for the fused attention kernel, so the experts run as their loop and attention as plain
    matrix products (not causal: the formula counts full attention, as PaLM does). What it leaves
    out, the formula leaves out too (norms, softmax, the embedding lookup): they agree exactly. On a GPU
    the causal kernel does about half the attention FLOPs the formula counts (that term is 9% of the
    debug model's count, 18% of the 1b model's)."""
    cfg = DEBUG
    model = MoETransformer(cfg)
    for block in model.blocks:
        block.moe.use_grouped_mm = False

    def plain_attention(q, k, v, is_causal=False, **_):  # type: ignore[no-untyped-def]
        return torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1) @ v

    batch = tokens(cfg, batch=4)
    original = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = plain_attention
    try:
        with FlopCounterMode(display=False) as counter:
            loss_fn(model, batch)[1].backward()
    finally:
        F.scaled_dot_product_attention = original
    counted = counter.get_total_flops()
    expected = flops_per_token(cfg) * batch.shape[0] * cfg.seq_len
    assert counted == pytest.approx(expected, rel=1e-9), (counted, expected)


def test_peaks_by_gpu_model_with_an_override() -> None:
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops("NVIDIA H100 PCIe") == 756e12
    assert peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_flops("cpu") is None
    assert peak_flops("NVIDIA H100 80GB HBM3", override_tflops=500) == 500e12


def test_bad_shapes_are_named() -> None:
    with pytest.raises(ValueError, match="heads of an even size"):
        ModelConfig(dim=64, n_heads=3)
    with pytest.raises(ValueError, match="top_k 5 cannot exceed n_experts 4"):
        ModelConfig(top_k=5)


@pytest.mark.parametrize(
    "speed",
    [
        Speed(fused_rope=True),
        Speed(ce_chunk_tokens=50),  # 3 x 64 tokens: four chunks, the last short
        Speed(checkpoint="full"),
        Speed(checkpoint="attention", checkpoint_layers=(1, 1)),
        Speed(checkpoint="experts", checkpoint_layers=(0, 0)),
        Speed(fused_rope=True, ce_chunk_tokens=64, checkpoint="full"),
    ],
    ids=["fused-rope", "chunked-ce", "ac-full", "ac-attention-layer-1", "ac-experts-layer-0", "all"],
)
def test_each_speed_option_leaves_the_loss_and_the_gradients_as_they_were(speed: Speed) -> None:
    cfg = DEBUG.model_copy(update={"n_shared_experts": 1})
    torch.manual_seed(0)
    plain, fast = MoETransformer(cfg), MoETransformer(cfg, speed)
    fast.load_state_dict(plain.state_dict())
    assert_same_loss_and_gradients(plain, fast, tokens(cfg))


def test_the_fused_rope_is_the_same_rotation_in_bf16() -> None:
    cos, sin = rope_tables(16, 8, 10000.0)
    x = torch.randn(2, 3, 16, 8)
    exact = apply_rope(x, cos, sin)
    assert torch.allclose(apply_fused_rope(x, *fused_rope_tables(cos, sin)), exact, atol=1e-6)
    in_bf16 = apply_fused_rope(x.bfloat16(), *fused_rope_tables(cos, sin))
    assert in_bf16.dtype == torch.bfloat16 and torch.allclose(in_bf16.float(), exact, atol=0.05)


def test_the_expert_counts_need_no_host_sync_and_match_bincount() -> None:
    experts = torch.tensor([3, 0, 3, 1, 3])
    counts = torch.zeros(5, dtype=torch.long).index_add_(0, experts, torch.ones_like(experts))
    assert counts.tolist() == torch.bincount(experts, minlength=5).tolist() == [1, 1, 0, 3, 0]
