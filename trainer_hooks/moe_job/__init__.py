"""The bundled training job: a small, real Mixture-of-Experts transformer trained with FSDP2 and
checkpointed with torch.distributed.checkpoint, resumable at the exact next sample.

    torchrun --nproc-per-node 2 -m trainer_hooks.moe_job.train --model debug --out runs/debug
"""
