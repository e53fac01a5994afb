"""The training hook's settings from the environment: a bad one is named, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the hook needs torch (make test installs the CPU build)")

from trainer_hooks.hook import HookConfig, HookConfigError, VigilHook  # noqa: E402


@pytest.mark.parametrize(
    ("env", "named"),
    [({"VIGIL_WINDOW_STEPS": "0"}, "VIGIL_WINDOW_STEPS"), ({"VIGIL_NODE": "Bad_Node"}, "VIGIL_NODE")],
)
def test_a_bad_variable_is_named(env: dict[str, str], named: str) -> None:
    with pytest.raises(HookConfigError, match=named):
        HookConfig.from_env(env)


def test_an_unreadable_certificate_directory_is_named_when_the_hook_is_made(tmp_path: Path) -> None:
    config = HookConfig.from_env({"VIGIL_TLS_DIR": str(tmp_path)})
    with pytest.raises(HookConfigError, match=r"VIGIL_TLS_DIR: cannot read .*ca\.crt"):
        VigilHook(config)
