"""Messages as the ``--json`` outputs print them: every field present (zeros and empty lists too),
64-bit integers as numbers, enums by name. A script reads what it gets without guessing. Pure.

Protocol Buffers' JSON mapping writes 64-bit integers as strings (for JavaScript) and leaves out
fields at their default; neither suits a shell script with jq.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

_INT64 = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def json_of(message: Message) -> dict[str, Any]:
    found = MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return _numbers(message.DESCRIPTOR, found)


def _numbers(descriptor: Any, found: dict[str, Any]) -> dict[str, Any]:
    for field in descriptor.fields:
        if field.name not in found:
            continue
        value = found[field.name]
        entry = field.message_type
        if entry is not None and entry.GetOptions().map_entry:
            found[field.name] = {k: _one(entry.fields_by_name["value"], v) for k, v in value.items()}
        elif _is_repeated(field):
            found[field.name] = [_one(field, v) for v in value]
        else:
            found[field.name] = _one(field, value)
    return found


def _is_repeated(field: FieldDescriptor) -> bool:
    return bool(field.is_repeated)


def _one(field: FieldDescriptor, value: Any) -> Any:
    if field.type in _INT64 and isinstance(value, str):
        return int(value)
    if field.message_type is not None and isinstance(value, dict) and not field.message_type.GetOptions().map_entry:
        if field.message_type.full_name.startswith("google.protobuf."):
            return value  # well-known types keep their own JSON form
        return _numbers(field.message_type, value)
    return value
