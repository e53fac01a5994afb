"""Conversion between Vigil's domain types and their protobuf messages (the edge of the wire)."""

from __future__ import annotations

from protos.vigil.v1 import common_pb2 as pb
from vigil.signals import GpuRef, Signal, SignalKind


def gpu_to_proto(gpu: GpuRef) -> pb.GpuRef:
    return pb.GpuRef(index=gpu.index, uuid=gpu.uuid, pci_bus_id=gpu.pci_bus_id)


def gpu_from_proto(msg: pb.GpuRef) -> GpuRef:
    return GpuRef(index=msg.index, uuid=msg.uuid, pci_bus_id=msg.pci_bus_id)


def signal_to_proto(signal: Signal) -> pb.Signal:
    return pb.Signal(
        node=signal.node,
        gpu=gpu_to_proto(signal.gpu),
        kind=signal.kind.value,  # enum fields take the value's name
        code=signal.code,
        value=signal.value,
        message=signal.message,
        source=signal.source,
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
