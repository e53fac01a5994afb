from protos.vigil.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class UpItem(_message.Message):
    __slots__ = ("stream", "message", "end", "peer", "token")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    stream: int
    message: bytes
    end: StreamEnd
    peer: str
    token: str
    def __init__(self, stream: _Optional[int] = ..., message: _Optional[bytes] = ..., end: _Optional[_Union[StreamEnd, _Mapping]] = ..., peer: _Optional[str] = ..., token: _Optional[str] = ...) -> None: ...

class DownItem(_message.Message):
    __slots__ = ("stream", "message", "end")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    stream: int
    message: bytes
    end: StreamEnd
    def __init__(self, stream: _Optional[int] = ..., message: _Optional[bytes] = ..., end: _Optional[_Union[StreamEnd, _Mapping]] = ...) -> None: ...

class StreamEnd(_message.Message):
    __slots__ = ("code", "details", "retry_after_ms")
    CODE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    code: int
    details: str
    retry_after_ms: int
    def __init__(self, code: _Optional[int] = ..., details: _Optional[str] = ..., retry_after_ms: _Optional[int] = ...) -> None: ...

class RelayUp(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[UpItem]
    def __init__(self, items: _Optional[_Iterable[_Union[UpItem, _Mapping]]] = ...) -> None: ...

class RelayDown(_message.Message):
    __slots__ = ("items", "lanes")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    LANES_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[DownItem]
    lanes: Lanes
    def __init__(self, items: _Optional[_Iterable[_Union[DownItem, _Mapping]]] = ..., lanes: _Optional[_Union[Lanes, _Mapping]] = ...) -> None: ...

class Lanes(_message.Message):
    __slots__ = ("record_only_xids", "acting_xids", "record_only_kinds", "acting_kinds", "unlisted_record_only")
    RECORD_ONLY_XIDS_FIELD_NUMBER: _ClassVar[int]
    ACTING_XIDS_FIELD_NUMBER: _ClassVar[int]
    RECORD_ONLY_KINDS_FIELD_NUMBER: _ClassVar[int]
    ACTING_KINDS_FIELD_NUMBER: _ClassVar[int]
    UNLISTED_RECORD_ONLY_FIELD_NUMBER: _ClassVar[int]
    record_only_xids: _containers.RepeatedScalarFieldContainer[int]
    acting_xids: _containers.RepeatedScalarFieldContainer[int]
    record_only_kinds: _containers.RepeatedScalarFieldContainer[_common_pb2.SignalKind]
    acting_kinds: _containers.RepeatedScalarFieldContainer[_common_pb2.SignalKind]
    unlisted_record_only: bool
    def __init__(self, record_only_xids: _Optional[_Iterable[int]] = ..., acting_xids: _Optional[_Iterable[int]] = ..., record_only_kinds: _Optional[_Iterable[_Union[_common_pb2.SignalKind, str]]] = ..., acting_kinds: _Optional[_Iterable[_Union[_common_pb2.SignalKind, str]]] = ..., unlisted_record_only: _Optional[bool] = ...) -> None: ...
