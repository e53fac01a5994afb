from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SignalKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SIGNAL_KIND_UNSPECIFIED: _ClassVar[SignalKind]
    XID: _ClassVar[SignalKind]
    ECC_DBE: _ClassVar[SignalKind]
    ROW_REMAP_PENDING: _ClassVar[SignalKind]
    ROW_REMAP_FAILURE: _ClassVar[SignalKind]
    RETIRED_PAGES: _ClassVar[SignalKind]
    THROTTLE: _ClassVar[SignalKind]
    GPU_LOST: _ClassVar[SignalKind]
    NVLINK_ERRORS: _ClassVar[SignalKind]
    PCIE_REPLAY: _ClassVar[SignalKind]
    PCIE_LINK_DEGRADED: _ClassVar[SignalKind]
    COLLECTOR_HUNG: _ClassVar[SignalKind]
    CHECK_FAILED: _ClassVar[SignalKind]
    HOST_MEMORY_PRESSURE: _ClassVar[SignalKind]
    DISK_FULL: _ClassVar[SignalKind]
    NIC_ERRORS: _ClassVar[SignalKind]
    SPOOL_LOST: _ClassVar[SignalKind]
    SXID_FATAL: _ClassVar[SignalKind]
    SXID_NONFATAL: _ClassVar[SignalKind]
    IB_PORT_DOWN: _ClassVar[SignalKind]
    IB_PORT_FLAP: _ClassVar[SignalKind]
    IB_PORT_DEGRADED: _ClassVar[SignalKind]
    IB_PORT_ERRORS: _ClassVar[SignalKind]
    GPU_FABRIC_FAILED: _ClassVar[SignalKind]
    SCHEDULER_DRAIN: _ClassVar[SignalKind]

class Verdict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERDICT_UNSPECIFIED: _ClassVar[Verdict]
    OK: _ClassVar[Verdict]
    FAIL: _ClassVar[Verdict]
    UNKNOWN: _ClassVar[Verdict]
SIGNAL_KIND_UNSPECIFIED: SignalKind
XID: SignalKind
ECC_DBE: SignalKind
ROW_REMAP_PENDING: SignalKind
ROW_REMAP_FAILURE: SignalKind
RETIRED_PAGES: SignalKind
THROTTLE: SignalKind
GPU_LOST: SignalKind
NVLINK_ERRORS: SignalKind
PCIE_REPLAY: SignalKind
PCIE_LINK_DEGRADED: SignalKind
COLLECTOR_HUNG: SignalKind
CHECK_FAILED: SignalKind
HOST_MEMORY_PRESSURE: SignalKind
DISK_FULL: SignalKind
NIC_ERRORS: SignalKind
SPOOL_LOST: SignalKind
SXID_FATAL: SignalKind
SXID_NONFATAL: SignalKind
IB_PORT_DOWN: SignalKind
IB_PORT_FLAP: SignalKind
IB_PORT_DEGRADED: SignalKind
IB_PORT_ERRORS: SignalKind
GPU_FABRIC_FAILED: SignalKind
SCHEDULER_DRAIN: SignalKind
VERDICT_UNSPECIFIED: Verdict
OK: Verdict
FAIL: Verdict
UNKNOWN: Verdict

class GpuRef(_message.Message):
    __slots__ = ("index", "uuid", "pci_bus_id")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    pci_bus_id: str
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., pci_bus_id: _Optional[str] = ...) -> None: ...

class Signal(_message.Message):
    __slots__ = ("node", "gpu", "kind", "code", "value", "message", "source", "observed_at", "seq", "count", "first_observed_at")
    NODE_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_AT_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    FIRST_OBSERVED_AT_FIELD_NUMBER: _ClassVar[int]
    node: str
    gpu: GpuRef
    kind: SignalKind
    code: int
    value: float
    message: str
    source: str
    observed_at: float
    seq: int
    count: int
    first_observed_at: float
    def __init__(self, node: _Optional[str] = ..., gpu: _Optional[_Union[GpuRef, _Mapping]] = ..., kind: _Optional[_Union[SignalKind, str]] = ..., code: _Optional[int] = ..., value: _Optional[float] = ..., message: _Optional[str] = ..., source: _Optional[str] = ..., observed_at: _Optional[float] = ..., seq: _Optional[int] = ..., count: _Optional[int] = ..., first_observed_at: _Optional[float] = ...) -> None: ...

class CheckResult(_message.Message):
    __slots__ = ("request_id", "node", "check", "verdict", "reason", "figures", "started_at", "finished_at", "evidence", "not_run")
    class FiguresEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    CHECK_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FIGURES_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    NOT_RUN_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    node: str
    check: str
    verdict: Verdict
    reason: str
    figures: _containers.ScalarMap[str, float]
    started_at: float
    finished_at: float
    evidence: str
    not_run: str
    def __init__(self, request_id: _Optional[str] = ..., node: _Optional[str] = ..., check: _Optional[str] = ..., verdict: _Optional[_Union[Verdict, str]] = ..., reason: _Optional[str] = ..., figures: _Optional[_Mapping[str, float]] = ..., started_at: _Optional[float] = ..., finished_at: _Optional[float] = ..., evidence: _Optional[str] = ..., not_run: _Optional[str] = ...) -> None: ...
