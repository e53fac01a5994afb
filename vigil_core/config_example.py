"""A configuration model written out as the example file a person edits: every key the model
accepts, at its default, with its description; an optional section (null by default) shown with
its keys commented out; a few keys set to example values, each said so. Pure.

``python -m vigil.config_examples`` writes ``deploy/controller.example.yaml`` and
``deploy/agent.example.yaml`` with it (``make config-examples``); a test holds the files to what it
writes, so a setting added to a model is in its example the same day.
"""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

COMMENT_AT = 40  # the column descriptions start at


@dataclass(frozen=True, slots=True)
class Example:
    """A key set to an example value in the file (dotted path), and why."""

    value: Any
    note: str = "example value"
    default: str | None = None  # the default in words, where it depends on the machine (a host name)


def example_yaml(model: type[BaseModel], header: str, examples: Mapping[str, Example]) -> str:
    lines = [f"# {line}".rstrip() for line in header.strip().splitlines()]
    _section(model, None, "", 0, examples, lines, commented=False)
    unused = set(examples) - _paths(model, "")
    if unused:
        raise ValueError(f"examples for keys the model does not have: {', '.join(sorted(unused))}")
    return "\n".join(lines) + "\n"


def _paths(model: type[BaseModel], prefix: str) -> set[str]:
    found = set()
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        found.add(path)
        if (sub := _submodel(info)) is not None:
            found |= _paths(sub, f"{path}.")
    return found


def _section(
    model: type[BaseModel],
    instance: BaseModel | None,
    prefix: str,
    indent: int,
    examples: Mapping[str, Example],
    lines: list[str],
    commented: bool,
) -> None:
    pad = "  " * indent
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        about = " ".join((info.description or "").split())
        sub = _submodel(info)
        if path in examples:
            example = examples[path]
            if sub is not None and isinstance(example.value, Mapping):
                lines.append(_line(f"{pad}{name}:", f"{example.note}; {about}" if about else example.note, commented))
                _section(sub, sub.model_validate(example.value), f"{path}.", indent + 1, examples, lines, commented)
                continue
            default = example.default or _default_text(info, instance, name)
            note = f"{example.note} (default: {default})" + (f"; {about}" if about else "")
            lines.append(_line(f"{pad}{name}: {_text(example.value)}", note, commented))
            continue
        value = getattr(instance, name) if instance is not None else _default(info)
        if sub is not None and isinstance(value, BaseModel):
            lines.append(_line(f"{pad}{name}:", about, commented))
            _section(sub, value, f"{path}.", indent + 1, examples, lines, commented)
        elif sub is not None:  # an optional section, absent by default: its keys, commented out
            lines.append(_line(f"{pad}{name}: null", f"a section, off by default; {about}" if about else "", commented))
            lines.append(_line(f"{pad}# {name}:", "", commented))
            _section(sub, None, f"{path}.", indent + 1, examples, lines, commented=True)
        elif info.is_required() and instance is None:
            lines.append(_line(f"{pad}{name}: ...", f"required; {about}" if about else "required", commented))
        else:
            lines.append(_line(f"{pad}{name}: {_text(value)}", about, commented))


def _line(text: str, comment: str, commented: bool) -> str:
    text = f"# {text}" if commented and not text.lstrip().startswith("#") else text
    if commented:  # keep the key's indentation after the comment mark
        stripped = text.lstrip()
        text = " " * (len(text) - len(stripped)) + stripped
    if not comment:
        return text
    return f"{text.ljust(COMMENT_AT - 1)} # {comment}"


def _submodel(info: FieldInfo) -> type[BaseModel] | None:
    """The section's model, for a field that is one (or one or None)."""
    annotation = info.annotation
    options = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else ()
    for candidate in (annotation, *options):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _default(info: FieldInfo) -> Any:
    return None if info.is_required() else info.get_default(call_default_factory=True)


def _default_text(info: FieldInfo, instance: BaseModel | None, name: str) -> str:
    if instance is not None:
        return _text(getattr(instance, name))
    return "required" if info.is_required() else _text(_default(info))


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return {k: _plain(v) for k, v in value.model_dump().items()}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, frozenset, set)):
        items = [_plain(v) for v in value]
        return sorted(items) if isinstance(value, (frozenset, set)) else items
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def _text(value: Any) -> str:
    dumped = yaml.safe_dump(_plain(value), default_flow_style=True, width=10_000, sort_keys=False)
    return dumped.removesuffix("\n...\n").strip()
