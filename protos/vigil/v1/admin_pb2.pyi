from protos.vigil.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ("node", "health", "last_heartbeat", "last_seq", "gpus", "open_incident")
    NODE_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    OPEN_INCIDENT_FIELD_NUMBER: _ClassVar[int]
    node: str
    health: str
    last_heartbeat: float
    last_seq: int
    gpus: int
    open_incident: str
    def __init__(self, node: _Optional[str] = ..., health: _Optional[str] = ..., last_heartbeat: _Optional[float] = ..., last_seq: _Optional[int] = ..., gpus: _Optional[int] = ..., open_incident: _Optional[str] = ...) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("nodes", "now", "automation", "held_nodes", "replica", "leader", "problems")
    NODES_FIELD_NUMBER: _ClassVar[int]
    NOW_FIELD_NUMBER: _ClassVar[int]
    AUTOMATION_FIELD_NUMBER: _ClassVar[int]
    HELD_NODES_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeStatus]
    now: float
    automation: str
    held_nodes: _containers.RepeatedScalarFieldContainer[str]
    replica: str
    leader: bool
    problems: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeStatus, _Mapping]]] = ..., now: _Optional[float] = ..., automation: _Optional[str] = ..., held_nodes: _Optional[_Iterable[str]] = ..., replica: _Optional[str] = ..., leader: _Optional[bool] = ..., problems: _Optional[_Iterable[str]] = ...) -> None: ...

class IncidentsRequest(_message.Message):
    __slots__ = ("open_only", "node", "limit")
    OPEN_ONLY_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    open_only: bool
    node: str
    limit: int
    def __init__(self, open_only: _Optional[bool] = ..., node: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ActionRecord(_message.Message):
    __slots__ = ("kind", "status", "requested_at", "done_at", "detail")
    KIND_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_AT_FIELD_NUMBER: _ClassVar[int]
    DONE_AT_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    kind: str
    status: str
    requested_at: float
    done_at: float
    detail: str
    def __init__(self, kind: _Optional[str] = ..., status: _Optional[str] = ..., requested_at: _Optional[float] = ..., done_at: _Optional[float] = ..., detail: _Optional[str] = ...) -> None: ...

class Incident(_message.Message):
    __slots__ = ("id", "node", "gpu", "kind", "code", "reason", "status", "signal_count", "first_observed_at", "received_at", "opened_at", "actions", "remedy", "first_message")
    ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_COUNT_FIELD_NUMBER: _ClassVar[int]
    FIRST_OBSERVED_AT_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_AT_FIELD_NUMBER: _ClassVar[int]
    OPENED_AT_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    REMEDY_FIELD_NUMBER: _ClassVar[int]
    FIRST_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    id: str
    node: str
    gpu: _common_pb2.GpuRef
    kind: _common_pb2.SignalKind
    code: int
    reason: str
    status: str
    signal_count: int
    first_observed_at: float
    received_at: float
    opened_at: float
    actions: _containers.RepeatedCompositeFieldContainer[ActionRecord]
    remedy: str
    first_message: str
    def __init__(self, id: _Optional[str] = ..., node: _Optional[str] = ..., gpu: _Optional[_Union[_common_pb2.GpuRef, _Mapping]] = ..., kind: _Optional[_Union[_common_pb2.SignalKind, str]] = ..., code: _Optional[int] = ..., reason: _Optional[str] = ..., status: _Optional[str] = ..., signal_count: _Optional[int] = ..., first_observed_at: _Optional[float] = ..., received_at: _Optional[float] = ..., opened_at: _Optional[float] = ..., actions: _Optional[_Iterable[_Union[ActionRecord, _Mapping]]] = ..., remedy: _Optional[str] = ..., first_message: _Optional[str] = ...) -> None: ...

class IncidentsReply(_message.Message):
    __slots__ = ("incidents",)
    INCIDENTS_FIELD_NUMBER: _ClassVar[int]
    incidents: _containers.RepeatedCompositeFieldContainer[Incident]
    def __init__(self, incidents: _Optional[_Iterable[_Union[Incident, _Mapping]]] = ...) -> None: ...

class UncordonRequest(_message.Message):
    __slots__ = ("node", "requested_by", "reason", "verdict")
    NODE_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_BY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    node: str
    requested_by: str
    reason: str
    verdict: str
    def __init__(self, node: _Optional[str] = ..., requested_by: _Optional[str] = ..., reason: _Optional[str] = ..., verdict: _Optional[str] = ...) -> None: ...

class UncordonReply(_message.Message):
    __slots__ = ("node", "health", "detail")
    NODE_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    node: str
    health: str
    detail: str
    def __init__(self, node: _Optional[str] = ..., health: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class ResolveRequest(_message.Message):
    __slots__ = ("incident_id", "requested_by", "note")
    INCIDENT_ID_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_BY_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    incident_id: str
    requested_by: str
    note: str
    def __init__(self, incident_id: _Optional[str] = ..., requested_by: _Optional[str] = ..., note: _Optional[str] = ...) -> None: ...

class ResolveReply(_message.Message):
    __slots__ = ("incident_id", "node", "health", "detail")
    INCIDENT_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    incident_id: str
    node: str
    health: str
    detail: str
    def __init__(self, incident_id: _Optional[str] = ..., node: _Optional[str] = ..., health: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class RulesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RuleStats(_message.Message):
    __slots__ = ("rule", "quarantines", "pages", "undone", "resolved_by_hand", "precision", "repaired")
    RULE_FIELD_NUMBER: _ClassVar[int]
    QUARANTINES_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    UNDONE_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_BY_HAND_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    REPAIRED_FIELD_NUMBER: _ClassVar[int]
    rule: str
    quarantines: int
    pages: int
    undone: int
    resolved_by_hand: int
    precision: float
    repaired: int
    def __init__(self, rule: _Optional[str] = ..., quarantines: _Optional[int] = ..., pages: _Optional[int] = ..., undone: _Optional[int] = ..., resolved_by_hand: _Optional[int] = ..., precision: _Optional[float] = ..., repaired: _Optional[int] = ...) -> None: ...

class RulesReply(_message.Message):
    __slots__ = ("rules", "undo_window_s")
    RULES_FIELD_NUMBER: _ClassVar[int]
    UNDO_WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    rules: _containers.RepeatedCompositeFieldContainer[RuleStats]
    undo_window_s: float
    def __init__(self, rules: _Optional[_Iterable[_Union[RuleStats, _Mapping]]] = ..., undo_window_s: _Optional[float] = ...) -> None: ...

class ResumeRequest(_message.Message):
    __slots__ = ("requested_by", "reason", "apply_held")
    REQUESTED_BY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    APPLY_HELD_FIELD_NUMBER: _ClassVar[int]
    requested_by: str
    reason: str
    apply_held: bool
    def __init__(self, requested_by: _Optional[str] = ..., reason: _Optional[str] = ..., apply_held: _Optional[bool] = ...) -> None: ...

class ResumeReply(_message.Message):
    __slots__ = ("automation", "applied", "dropped", "nodes")
    AUTOMATION_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    automation: str
    applied: int
    dropped: int
    nodes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, automation: _Optional[str] = ..., applied: _Optional[int] = ..., dropped: _Optional[int] = ..., nodes: _Optional[_Iterable[str]] = ...) -> None: ...

class SweepRequest(_message.Message):
    __slots__ = ("nodes", "checks", "quarantine", "selector", "job", "namespace", "requested_by", "params", "min_busbw_gbps")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODES_FIELD_NUMBER: _ClassVar[int]
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    QUARANTINE_FIELD_NUMBER: _ClassVar[int]
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_BY_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    MIN_BUSBW_GBPS_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedScalarFieldContainer[str]
    checks: _containers.RepeatedScalarFieldContainer[str]
    quarantine: bool
    selector: str
    job: str
    namespace: str
    requested_by: str
    params: _containers.ScalarMap[str, str]
    min_busbw_gbps: float
    def __init__(self, nodes: _Optional[_Iterable[str]] = ..., checks: _Optional[_Iterable[str]] = ..., quarantine: _Optional[bool] = ..., selector: _Optional[str] = ..., job: _Optional[str] = ..., namespace: _Optional[str] = ..., requested_by: _Optional[str] = ..., params: _Optional[_Mapping[str, str]] = ..., min_busbw_gbps: _Optional[float] = ...) -> None: ...

class SweepUpdate(_message.Message):
    __slots__ = ("result", "done", "total", "phase", "summary", "error")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    result: _common_pb2.CheckResult
    done: int
    total: int
    phase: str
    summary: SweepSummary
    error: str
    def __init__(self, result: _Optional[_Union[_common_pb2.CheckResult, _Mapping]] = ..., done: _Optional[int] = ..., total: _Optional[int] = ..., phase: _Optional[str] = ..., summary: _Optional[_Union[SweepSummary, _Mapping]] = ..., error: _Optional[str] = ...) -> None: ...

class SweepRow(_message.Message):
    __slots__ = ("node", "check", "verdict", "figure", "reason")
    NODE_FIELD_NUMBER: _ClassVar[int]
    CHECK_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    FIGURE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    node: str
    check: str
    verdict: _common_pb2.Verdict
    figure: str
    reason: str
    def __init__(self, node: _Optional[str] = ..., check: _Optional[str] = ..., verdict: _Optional[_Union[_common_pb2.Verdict, str]] = ..., figure: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class SweepFinding(_message.Message):
    __slots__ = ("node", "reason", "kind", "nodes")
    NODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    node: str
    reason: str
    kind: str
    nodes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node: _Optional[str] = ..., reason: _Optional[str] = ..., kind: _Optional[str] = ..., nodes: _Optional[_Iterable[str]] = ...) -> None: ...

class SweepSummary(_message.Message):
    __slots__ = ("sweep_id", "rows", "findings", "nodes", "failed_nodes", "unknown_nodes", "rounds", "pairs", "wall_s", "quarantine", "verdict")
    class QuarantineEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SWEEP_ID_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    FINDINGS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    FAILED_NODES_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_NODES_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    PAIRS_FIELD_NUMBER: _ClassVar[int]
    WALL_S_FIELD_NUMBER: _ClassVar[int]
    QUARANTINE_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    sweep_id: str
    rows: _containers.RepeatedCompositeFieldContainer[SweepRow]
    findings: _containers.RepeatedCompositeFieldContainer[SweepFinding]
    nodes: int
    failed_nodes: int
    unknown_nodes: int
    rounds: int
    pairs: int
    wall_s: float
    quarantine: _containers.ScalarMap[str, str]
    verdict: _common_pb2.Verdict
    def __init__(self, sweep_id: _Optional[str] = ..., rows: _Optional[_Iterable[_Union[SweepRow, _Mapping]]] = ..., findings: _Optional[_Iterable[_Union[SweepFinding, _Mapping]]] = ..., nodes: _Optional[int] = ..., failed_nodes: _Optional[int] = ..., unknown_nodes: _Optional[int] = ..., rounds: _Optional[int] = ..., pairs: _Optional[int] = ..., wall_s: _Optional[float] = ..., quarantine: _Optional[_Mapping[str, str]] = ..., verdict: _Optional[_Union[_common_pb2.Verdict, str]] = ...) -> None: ...

class JobsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class JobStatus(_message.Message):
    __slots__ = ("job_id", "state", "nodes", "step", "committed_step", "restart_count", "excluded", "productive_s", "checkpoint_s", "restore_s", "wasted_s", "recovery_s", "goodput", "drops", "baseline_mfu", "last_mfu", "baseline_tokens_per_s", "last_tokens_per_s", "gpus", "planned_ettr", "recommended_checkpoint_s", "planned_save_s", "hung_s", "pause")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_STEP_FIELD_NUMBER: _ClassVar[int]
    RESTART_COUNT_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_FIELD_NUMBER: _ClassVar[int]
    PRODUCTIVE_S_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_S_FIELD_NUMBER: _ClassVar[int]
    RESTORE_S_FIELD_NUMBER: _ClassVar[int]
    WASTED_S_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_S_FIELD_NUMBER: _ClassVar[int]
    GOODPUT_FIELD_NUMBER: _ClassVar[int]
    DROPS_FIELD_NUMBER: _ClassVar[int]
    BASELINE_MFU_FIELD_NUMBER: _ClassVar[int]
    LAST_MFU_FIELD_NUMBER: _ClassVar[int]
    BASELINE_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    LAST_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    PLANNED_ETTR_FIELD_NUMBER: _ClassVar[int]
    RECOMMENDED_CHECKPOINT_S_FIELD_NUMBER: _ClassVar[int]
    PLANNED_SAVE_S_FIELD_NUMBER: _ClassVar[int]
    HUNG_S_FIELD_NUMBER: _ClassVar[int]
    PAUSE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    state: str
    nodes: _containers.RepeatedScalarFieldContainer[str]
    step: int
    committed_step: int
    restart_count: int
    excluded: _containers.RepeatedScalarFieldContainer[str]
    productive_s: float
    checkpoint_s: float
    restore_s: float
    wasted_s: float
    recovery_s: float
    goodput: float
    drops: int
    baseline_mfu: float
    last_mfu: float
    baseline_tokens_per_s: float
    last_tokens_per_s: float
    gpus: int
    planned_ettr: float
    recommended_checkpoint_s: float
    planned_save_s: float
    hung_s: float
    pause: str
    def __init__(self, job_id: _Optional[str] = ..., state: _Optional[str] = ..., nodes: _Optional[_Iterable[str]] = ..., step: _Optional[int] = ..., committed_step: _Optional[int] = ..., restart_count: _Optional[int] = ..., excluded: _Optional[_Iterable[str]] = ..., productive_s: _Optional[float] = ..., checkpoint_s: _Optional[float] = ..., restore_s: _Optional[float] = ..., wasted_s: _Optional[float] = ..., recovery_s: _Optional[float] = ..., goodput: _Optional[float] = ..., drops: _Optional[int] = ..., baseline_mfu: _Optional[float] = ..., last_mfu: _Optional[float] = ..., baseline_tokens_per_s: _Optional[float] = ..., last_tokens_per_s: _Optional[float] = ..., gpus: _Optional[int] = ..., planned_ettr: _Optional[float] = ..., recommended_checkpoint_s: _Optional[float] = ..., planned_save_s: _Optional[float] = ..., hung_s: _Optional[float] = ..., pause: _Optional[str] = ...) -> None: ...

class JobsReply(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobStatus]
    def __init__(self, jobs: _Optional[_Iterable[_Union[JobStatus, _Mapping]]] = ...) -> None: ...

class RepairsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RepairStatus(_message.Message):
    __slots__ = ("node", "incident_id", "phase", "step", "ladder", "waiting_for", "tried", "opened_at", "since")
    NODE_FIELD_NUMBER: _ClassVar[int]
    INCIDENT_ID_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    LADDER_FIELD_NUMBER: _ClassVar[int]
    WAITING_FOR_FIELD_NUMBER: _ClassVar[int]
    TRIED_FIELD_NUMBER: _ClassVar[int]
    OPENED_AT_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    node: str
    incident_id: str
    phase: str
    step: str
    ladder: _containers.RepeatedScalarFieldContainer[str]
    waiting_for: str
    tried: _containers.RepeatedScalarFieldContainer[str]
    opened_at: float
    since: float
    def __init__(self, node: _Optional[str] = ..., incident_id: _Optional[str] = ..., phase: _Optional[str] = ..., step: _Optional[str] = ..., ladder: _Optional[_Iterable[str]] = ..., waiting_for: _Optional[str] = ..., tried: _Optional[_Iterable[str]] = ..., opened_at: _Optional[float] = ..., since: _Optional[float] = ...) -> None: ...

class RepairsReply(_message.Message):
    __slots__ = ("enabled", "repairs", "released", "hands")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    REPAIRS_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    HANDS_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    repairs: _containers.RepeatedCompositeFieldContainer[RepairStatus]
    released: int
    hands: int
    def __init__(self, enabled: _Optional[bool] = ..., repairs: _Optional[_Iterable[_Union[RepairStatus, _Mapping]]] = ..., released: _Optional[int] = ..., hands: _Optional[int] = ...) -> None: ...
