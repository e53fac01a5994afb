from protos.vigil.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Hello(_message.Message):
    __slots__ = ("node", "agent_version", "gpus", "gpu_backend", "last_acked_seq", "spool_id", "address", "idle_heartbeat_s", "jobs", "resumable", "booted_at", "waits_for_kept_hello", "urgent_waiting")
    NODE_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    GPU_BACKEND_FIELD_NUMBER: _ClassVar[int]
    LAST_ACKED_SEQ_FIELD_NUMBER: _ClassVar[int]
    SPOOL_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    IDLE_HEARTBEAT_S_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    RESUMABLE_FIELD_NUMBER: _ClassVar[int]
    BOOTED_AT_FIELD_NUMBER: _ClassVar[int]
    WAITS_FOR_KEPT_HELLO_FIELD_NUMBER: _ClassVar[int]
    URGENT_WAITING_FIELD_NUMBER: _ClassVar[int]
    node: str
    agent_version: str
    gpus: _containers.RepeatedCompositeFieldContainer[_common_pb2.GpuRef]
    gpu_backend: str
    last_acked_seq: int
    spool_id: str
    address: str
    idle_heartbeat_s: float
    jobs: _containers.RepeatedScalarFieldContainer[str]
    resumable: bool
    booted_at: float
    waits_for_kept_hello: bool
    urgent_waiting: int
    def __init__(self, node: _Optional[str] = ..., agent_version: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[_common_pb2.GpuRef, _Mapping]]] = ..., gpu_backend: _Optional[str] = ..., last_acked_seq: _Optional[int] = ..., spool_id: _Optional[str] = ..., address: _Optional[str] = ..., idle_heartbeat_s: _Optional[float] = ..., jobs: _Optional[_Iterable[str]] = ..., resumable: _Optional[bool] = ..., booted_at: _Optional[float] = ..., waits_for_kept_hello: _Optional[bool] = ..., urgent_waiting: _Optional[int] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("sent_at", "spooled", "dropped_faults", "jobs", "unparsed_lines", "unparsed_total", "ranks")
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    SPOOLED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FAULTS_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    UNPARSED_LINES_FIELD_NUMBER: _ClassVar[int]
    UNPARSED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    sent_at: float
    spooled: int
    dropped_faults: int
    jobs: _containers.RepeatedScalarFieldContainer[str]
    unparsed_lines: _containers.RepeatedScalarFieldContainer[str]
    unparsed_total: int
    ranks: _containers.RepeatedCompositeFieldContainer[RankProgress]
    def __init__(self, sent_at: _Optional[float] = ..., spooled: _Optional[int] = ..., dropped_faults: _Optional[int] = ..., jobs: _Optional[_Iterable[str]] = ..., unparsed_lines: _Optional[_Iterable[str]] = ..., unparsed_total: _Optional[int] = ..., ranks: _Optional[_Iterable[_Union[RankProgress, _Mapping]]] = ...) -> None: ...

class RankProgress(_message.Message):
    __slots__ = ("job_id", "rank", "step", "phase", "at")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    rank: int
    step: int
    phase: str
    at: float
    def __init__(self, job_id: _Optional[str] = ..., rank: _Optional[int] = ..., step: _Optional[int] = ..., phase: _Optional[str] = ..., at: _Optional[float] = ...) -> None: ...

class SignalBatch(_message.Message):
    __slots__ = ("signals",)
    SIGNALS_FIELD_NUMBER: _ClassVar[int]
    signals: _containers.RepeatedCompositeFieldContainer[_common_pb2.Signal]
    def __init__(self, signals: _Optional[_Iterable[_Union[_common_pb2.Signal, _Mapping]]] = ...) -> None: ...

class AgentMessage(_message.Message):
    __slots__ = ("hello", "heartbeat", "signals", "check_result")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    SIGNALS_FIELD_NUMBER: _ClassVar[int]
    CHECK_RESULT_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    heartbeat: Heartbeat
    signals: SignalBatch
    check_result: _common_pb2.CheckResult
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., signals: _Optional[_Union[SignalBatch, _Mapping]] = ..., check_result: _Optional[_Union[_common_pb2.CheckResult, _Mapping]] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("acked_seq",)
    ACKED_SEQ_FIELD_NUMBER: _ClassVar[int]
    acked_seq: int
    def __init__(self, acked_seq: _Optional[int] = ...) -> None: ...

class RunCheck(_message.Message):
    __slots__ = ("request_id", "check", "params", "deadline_s")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CHECK_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    check: str
    params: _containers.ScalarMap[str, str]
    deadline_s: float
    def __init__(self, request_id: _Optional[str] = ..., check: _Optional[str] = ..., params: _Optional[_Mapping[str, str]] = ..., deadline_s: _Optional[float] = ...) -> None: ...

class RunRemedy(_message.Message):
    __slots__ = ("request_id", "remedy", "pci_bus_ids", "deadline_s")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    REMEDY_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_IDS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    remedy: str
    pci_bus_ids: _containers.RepeatedScalarFieldContainer[str]
    deadline_s: float
    def __init__(self, request_id: _Optional[str] = ..., remedy: _Optional[str] = ..., pci_bus_ids: _Optional[_Iterable[str]] = ..., deadline_s: _Optional[float] = ...) -> None: ...

class StopCheck(_message.Message):
    __slots__ = ("request_id", "why")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    WHY_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    why: str
    def __init__(self, request_id: _Optional[str] = ..., why: _Optional[str] = ...) -> None: ...

class HelloAgain(_message.Message):
    __slots__ = ("after_ms", "wait", "kept", "takes_urgent_hello", "takes_hello")
    AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    KEPT_FIELD_NUMBER: _ClassVar[int]
    TAKES_URGENT_HELLO_FIELD_NUMBER: _ClassVar[int]
    TAKES_HELLO_FIELD_NUMBER: _ClassVar[int]
    after_ms: int
    wait: bool
    kept: bool
    takes_urgent_hello: bool
    takes_hello: bool
    def __init__(self, after_ms: _Optional[int] = ..., wait: _Optional[bool] = ..., kept: _Optional[bool] = ..., takes_urgent_hello: _Optional[bool] = ..., takes_hello: _Optional[bool] = ...) -> None: ...

class ControllerMessage(_message.Message):
    __slots__ = ("ack", "run_check", "run_remedy", "stop_check", "hello_again")
    ACK_FIELD_NUMBER: _ClassVar[int]
    RUN_CHECK_FIELD_NUMBER: _ClassVar[int]
    RUN_REMEDY_FIELD_NUMBER: _ClassVar[int]
    STOP_CHECK_FIELD_NUMBER: _ClassVar[int]
    HELLO_AGAIN_FIELD_NUMBER: _ClassVar[int]
    ack: Ack
    run_check: RunCheck
    run_remedy: RunRemedy
    stop_check: StopCheck
    hello_again: HelloAgain
    def __init__(self, ack: _Optional[_Union[Ack, _Mapping]] = ..., run_check: _Optional[_Union[RunCheck, _Mapping]] = ..., run_remedy: _Optional[_Union[RunRemedy, _Mapping]] = ..., stop_check: _Optional[_Union[StopCheck, _Mapping]] = ..., hello_again: _Optional[_Union[HelloAgain, _Mapping]] = ...) -> None: ...
