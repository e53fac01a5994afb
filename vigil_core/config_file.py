"""Loading YAML into validated, frozen pydantic models, with errors that name the bad key."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


class ConfigError(Exception):
    """A configuration that cannot be used; the message names the file and the key."""


def load_yaml_model(model: type[M], path: Path | None, overrides: dict[str, Any] | None = None) -> M:
    data: dict[str, Any] = {}
    where = str(path) if path else "command line"
    if path is not None:
        try:
            raw = yaml.safe_load(path.read_text())
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
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
        problems.append(f"{key}: {err['msg']}")
    return "; ".join(problems)
