"""FSDP2: each transformer block is sharded on its own, then the whole model (embedding, final norm,
output head), so a block's parameters are gathered just before it runs and freed after.

On GPUs the parameters are gathered and computed in bf16 and the gradients reduced in fp32; the
sharded master copy and the optimizer state stay fp32. On CPUs (gloo) everything is fp32.
"""

from __future__ import annotations

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from trainer_hooks.moe_job.model import MoETransformer


def shard(model: MoETransformer, bf16: bool) -> MoETransformer:
    if bf16:
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        policy = MixedPrecisionPolicy()  # computes in the parameters' own dtype
    for i, block in enumerate(model.blocks):
        # The last block's parameters are needed again at once by the backward pass: keep them.
        fully_shard(block, reshard_after_forward=i < len(model.blocks) - 1, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model
