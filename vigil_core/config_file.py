"""Loading YAML into validated, frozen pydantic models, with errors that name the bad key.

A configuration cannot be half-right: every model is frozen and refuses unknown keys, and
``true``/``false`` is never taken for a number (``port: true`` is not port 1).
"""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Annotated, Any, TypeVar
from urllib.parse import urlsplit

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    ValidationError,
    ValidationInfo,
    field_validator,
)

M = TypeVar("M", bound=BaseModel)


class ConfigError(Exception):
    """A configuration that cannot be used; the message names the file and the key."""


class ConfigModel(BaseModel):
    """The base of every configuration section."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name is not None:
            annotation = cls.model_fields[info.field_name].annotation
            if _numeric(annotation):
                raise ValueError(f"must be a number, not {str(value).lower()}")
        return value


def _numeric(annotation: Any) -> bool:
    """Whether a field takes a number and not a boolean (``int``, ``float | None`` ...)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        options = typing.get_args(annotation)
        return bool not in options and any(_numeric(a) for a in options)
    return annotation in (int, float)


def _http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{value!r} is not an http(s) URL")
    return value


def _file_path(value: Path) -> Path:
    """A file to create or open: every existing ancestor must be a directory."""
    for parent in value.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"{parent} is a file, not a directory: {value} cannot be made under it")
            break
    if value.is_dir():
        raise ValueError(f"{value} is a directory; name a file in it")
    return value


def _file_or_postgres(value: object) -> object:
    if isinstance(value, str) and value.startswith(("postgresql://", "postgres://")):
        if not urlsplit(value).hostname and "host=" not in value:
            raise ValueError("a postgresql:// DSN needs a host (postgresql://USER@HOST:PORT/DATABASE)")
        return value
    return _file_path(Path(value)) if isinstance(value, str | Path) else value


HttpUrl = Annotated[str, AfterValidator(_http_url)]  # an http(s) URL with a host, kept as text
FilePath = Annotated[Path, AfterValidator(_file_path)]  # a file that is, or can be made, there
# A database: a file (SQLite) that is, or can be made, there; or a postgresql:// DSN, kept as text.
DatabaseTarget = Annotated[Path | str, BeforeValidator(_file_or_postgres)]


def load_yaml_model(model: type[M], path: Path | None, overrides: dict[str, Any] | None = None) -> M:
    data: dict[str, Any] = {}
    where = str(path) if path else "command line"
    if path is not None:
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}): is it the right file?") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from None
        if raw is not None and not isinstance(raw, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level, got {type(raw).__name__}")
        data = raw or {}
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{where}: " + describe_validation_error(exc)) from None


def describe_validation_error(exc: ValidationError) -> str:
    problems = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        problems.append(f"{key}: {err['msg'].removeprefix('Value error, ')}")
    return "; ".join(problems)
