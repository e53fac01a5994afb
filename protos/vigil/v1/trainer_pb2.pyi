from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RankStepTime(_message.Message):
    __slots__ = ("rank", "node", "step_time_s")
    RANK_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    rank: int
    node: str
    step_time_s: float
    def __init__(self, rank: _Optional[int] = ..., node: _Optional[str] = ..., step_time_s: _Optional[float] = ...) -> None: ...

class CommandAck(_message.Message):
    __slots__ = ("id", "checkpoint_step", "detail")
    ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_STEP_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    id: str
    checkpoint_step: int
    detail: str
    def __init__(self, id: _Optional[str] = ..., checkpoint_step: _Optional[int] = ..., detail: _Optional[str] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ("job_id", "step", "restart_count", "window_start", "window_end", "tokens", "mfu", "loss", "step_times", "nodes", "world_size", "committed_step", "acks", "event", "checkpoint_s", "tokens_per_s", "restore_s", "pause")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    RESTART_COUNT_FIELD_NUMBER: _ClassVar[int]
    WINDOW_START_FIELD_NUMBER: _ClassVar[int]
    WINDOW_END_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    MFU_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    STEP_TIMES_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_STEP_FIELD_NUMBER: _ClassVar[int]
    ACKS_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_S_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    RESTORE_S_FIELD_NUMBER: _ClassVar[int]
    PAUSE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    step: int
    restart_count: int
    window_start: float
    window_end: float
    tokens: int
    mfu: float
    loss: float
    step_times: _containers.RepeatedCompositeFieldContainer[RankStepTime]
    nodes: _containers.RepeatedScalarFieldContainer[str]
    world_size: int
    committed_step: int
    acks: _containers.RepeatedCompositeFieldContainer[CommandAck]
    event: str
    checkpoint_s: float
    tokens_per_s: float
    restore_s: float
    pause: str
    def __init__(self, job_id: _Optional[str] = ..., step: _Optional[int] = ..., restart_count: _Optional[int] = ..., window_start: _Optional[float] = ..., window_end: _Optional[float] = ..., tokens: _Optional[int] = ..., mfu: _Optional[float] = ..., loss: _Optional[float] = ..., step_times: _Optional[_Iterable[_Union[RankStepTime, _Mapping]]] = ..., nodes: _Optional[_Iterable[str]] = ..., world_size: _Optional[int] = ..., committed_step: _Optional[int] = ..., acks: _Optional[_Iterable[_Union[CommandAck, _Mapping]]] = ..., event: _Optional[str] = ..., checkpoint_s: _Optional[float] = ..., tokens_per_s: _Optional[float] = ..., restore_s: _Optional[float] = ..., pause: _Optional[str] = ...) -> None: ...

class CheckpointAndRestart(_message.Message):
    __slots__ = ("id", "reason", "exclude_nodes", "deadline")
    ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_NODES_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    id: str
    reason: str
    exclude_nodes: _containers.RepeatedScalarFieldContainer[str]
    deadline: float
    def __init__(self, id: _Optional[str] = ..., reason: _Optional[str] = ..., exclude_nodes: _Optional[_Iterable[str]] = ..., deadline: _Optional[float] = ...) -> None: ...

class CheckpointNow(_message.Message):
    __slots__ = ("id", "reason")
    ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    id: str
    reason: str
    def __init__(self, id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class JobCommand(_message.Message):
    __slots__ = ("checkpoint_and_restart", "checkpoint_now")
    CHECKPOINT_AND_RESTART_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_NOW_FIELD_NUMBER: _ClassVar[int]
    checkpoint_and_restart: CheckpointAndRestart
    checkpoint_now: CheckpointNow
    def __init__(self, checkpoint_and_restart: _Optional[_Union[CheckpointAndRestart, _Mapping]] = ..., checkpoint_now: _Optional[_Union[CheckpointNow, _Mapping]] = ...) -> None: ...

class ReportReply(_message.Message):
    __slots__ = ("commands", "recommended_checkpoint_s")
    COMMANDS_FIELD_NUMBER: _ClassVar[int]
    RECOMMENDED_CHECKPOINT_S_FIELD_NUMBER: _ClassVar[int]
    commands: _containers.RepeatedCompositeFieldContainer[JobCommand]
    recommended_checkpoint_s: float
    def __init__(self, commands: _Optional[_Iterable[_Union[JobCommand, _Mapping]]] = ..., recommended_checkpoint_s: _Optional[float] = ...) -> None: ...

class PlanRequest(_message.Message):
    __slots__ = ("job_id", "nodes", "stopped", "stacks")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    STOPPED_FIELD_NUMBER: _ClassVar[int]
    STACKS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    nodes: _containers.RepeatedScalarFieldContainer[str]
    stopped: bool
    stacks: _containers.RepeatedCompositeFieldContainer[RankStacks]
    def __init__(self, job_id: _Optional[str] = ..., nodes: _Optional[_Iterable[str]] = ..., stopped: _Optional[bool] = ..., stacks: _Optional[_Iterable[_Union[RankStacks, _Mapping]]] = ...) -> None: ...

class RankStacks(_message.Message):
    __slots__ = ("rank", "node", "answered", "text", "state", "kernel_wait", "collectives")
    RANK_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    KERNEL_WAIT_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVES_FIELD_NUMBER: _ClassVar[int]
    rank: int
    node: str
    answered: bool
    text: str
    state: str
    kernel_wait: str
    collectives: _containers.RepeatedCompositeFieldContainer[Collective]
    def __init__(self, rank: _Optional[int] = ..., node: _Optional[str] = ..., answered: _Optional[bool] = ..., text: _Optional[str] = ..., state: _Optional[str] = ..., kernel_wait: _Optional[str] = ..., collectives: _Optional[_Iterable[_Union[Collective, _Mapping]]] = ...) -> None: ...

class Collective(_message.Message):
    __slots__ = ("group", "seq", "op", "completed")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    group: str
    seq: int
    op: str
    completed: bool
    def __init__(self, group: _Optional[str] = ..., seq: _Optional[int] = ..., op: _Optional[str] = ..., completed: _Optional[bool] = ...) -> None: ...

class PlanReply(_message.Message):
    __slots__ = ("commands", "exclude_nodes", "ready", "detail", "want_stacks")
    COMMANDS_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_NODES_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    WANT_STACKS_FIELD_NUMBER: _ClassVar[int]
    commands: _containers.RepeatedCompositeFieldContainer[JobCommand]
    exclude_nodes: _containers.RepeatedScalarFieldContainer[str]
    ready: bool
    detail: str
    want_stacks: bool
    def __init__(self, commands: _Optional[_Iterable[_Union[JobCommand, _Mapping]]] = ..., exclude_nodes: _Optional[_Iterable[str]] = ..., ready: _Optional[bool] = ..., detail: _Optional[str] = ..., want_stacks: _Optional[bool] = ...) -> None: ...
