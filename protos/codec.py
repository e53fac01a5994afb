"""Conversion between Vigil's domain types and their protobuf messages (the edge of the wire)."""

from __future__ import annotations

import math

from protos.vigil.v1 import common_pb2 as pb
from vigil_core.signals import GpuRef, Signal, SignalKind

MAX_MESSAGE_CHARS = 4096  # a kernel-log line is at most about 1 KiB
MAX_GPU_INDEX = 1023
INT64_MAX = 2**63 - 1
MAX_COUNT = 2**40  # observations one folded signal may stand for


def valid_text(text: str) -> str:
    """Text that protobuf can serialise: a lone surrogate (a journald JSON escape) becomes U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def signal_problem(signal: Signal) -> str:
    """Why a signal cannot go on the wire; "" when it can. Checked before the spool numbers it, so one
    odd signal is refused alone instead of failing its batch, again at every restart."""
    if not -(2**63) <= signal.code <= INT64_MAX:
        return f"code {str(signal.code)[:24]}... does not fit in 64 bits"
    if not 1 <= signal.count <= MAX_COUNT:
        return f"count {signal.count} is not between 1 and {MAX_COUNT}"
    if not (math.isfinite(signal.observed_at) and math.isfinite(signal.first_observed_at)):
        return "observed_at or first_observed_at is not a finite time"
    if signal.observed_at < 0 or signal.first_observed_at < 0:
        return "observed_at or first_observed_at is negative"
    if not -1 <= signal.gpu.index <= MAX_GPU_INDEX:
        return f"GPU index {signal.gpu.index} names no possible GPU"
    return ""


def gpu_to_proto(gpu: GpuRef) -> pb.GpuRef:
    return pb.GpuRef(index=gpu.index, uuid=valid_text(gpu.uuid[:96]), pci_bus_id=valid_text(gpu.pci_bus_id[:32]))


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
        message=valid_text(signal.message[:MAX_MESSAGE_CHARS]),
        source=valid_text(signal.source[:64]),
        observed_at=signal.observed_at,
        seq=signal.seq,
        count=signal.count,
        first_observed_at=signal.first_observed_at,
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
    count = msg.count or 1  # 0: an agent that does not fold storms
    if not 1 <= count <= MAX_COUNT or not math.isfinite(msg.first_observed_at) or msg.first_observed_at < 0:
        raise BadSignal(f"signal seq={msg.seq}: field 'count' or 'first_observed_at' is out of range")
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
        count=count,
        first_observed_at=min(msg.first_observed_at, msg.observed_at),
    )
