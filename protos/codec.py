"""Conversion between Vigil's domain types and their protobuf messages (the edge of the wire)."""

from __future__ import annotations

import math

from protos.vigil.v1 import common_pb2 as pb
from vigil.signals import GpuRef, Signal, SignalKind

MAX_MESSAGE_CHARS = 4096  # a kernel-log line is at most about 1 KiB
MAX_GPU_INDEX = 1023


def gpu_to_proto(gpu: GpuRef) -> pb.GpuRef:
    return pb.GpuRef(index=gpu.index, uuid=gpu.uuid, pci_bus_id=gpu.pci_bus_id)


def gpu_from_proto(msg: pb.GpuRef) -> GpuRef:
    return GpuRef(index=msg.index, uuid=msg.uuid, pci_bus_id=msg.pci_bus_id)


def signal_to_proto(signal: Signal) -> pb.Signal:
    """The agent's side keeps within what the controller takes (``signal_from_proto``): a signal the
    controller refused would be sent again and again and hold up every signal after it."""
    return pb.Signal(
        node=signal.node,
        gpu=gpu_to_proto(signal.gpu),
        kind=signal.kind.value,  # enum fields take the value's name
        code=signal.code,
        value=signal.value if math.isfinite(signal.value) else 0.0,
        message=signal.message[:MAX_MESSAGE_CHARS],
        source=signal.source[:64],
        observed_at=signal.observed_at,
        seq=signal.seq,
    )


class BadSignal(ValueError):
    """A signal message that cannot be turned into a domain Signal; the text names the field."""


def signal_from_proto(msg: pb.Signal) -> Signal:
    if msg.kind == pb.SIGNAL_KIND_UNSPECIFIED or msg.kind not in pb.SignalKind.values():
        raise BadSignal(f"signal seq={msg.seq}: field 'kind' is unset or unknown ({msg.kind})")
    if msg.seq <= 0:
        raise BadSignal(f"signal seq={msg.seq}: field 'seq' must be positive")
    if not (math.isfinite(msg.value) and math.isfinite(msg.observed_at)) or msg.observed_at < 0:
        raise BadSignal(f"signal seq={msg.seq}: field 'value' or 'observed_at' is not a finite time or figure")
    if len(msg.message) > MAX_MESSAGE_CHARS or len(msg.source) > 64:
        raise BadSignal(f"signal seq={msg.seq}: field 'message' (max {MAX_MESSAGE_CHARS}) or 'source' is too long")
    if msg.HasField("gpu") and (not -1 <= msg.gpu.index <= MAX_GPU_INDEX or len(msg.gpu.uuid) > 96
                                or len(msg.gpu.pci_bus_id) > 32):  # fmt: skip
        raise BadSignal(f"signal seq={msg.seq}: field 'gpu' names no possible GPU")
    return Signal(
        node=msg.node,
        gpu=gpu_from_proto(msg.gpu) if msg.HasField("gpu") else GpuRef(),
        kind=SignalKind(pb.SignalKind.Name(msg.kind)),
        code=msg.code,
        value=msg.value,
        message=msg.message,
        source=msg.source,
        observed_at=msg.observed_at,
        seq=msg.seq,
    )
