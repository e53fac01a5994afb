"""Bad configuration gets an error that names the file and the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.config import load_agent_config
from controller.config import load_controller_config
from controller.vocab.policy import Severity, load_policy
from vigil_core.config_file import ConfigError
from vigil_core.signals import SignalKind


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("xid:\n  13: {action: explode}\n", "xid.13.action"),
        ("xid:\n  13: {action: suspect, threshold: 0}\n", "xid.13.threshold"),
        ("xid:\n  thirteen: {action: suspect}\n", "xid.thirteen"),
        ("fold_window_s: -1\n", "fold_window_s"),
        ("kinds:\n  GPU_ON_FIRE: {action: quarantine}\n", "kinds.GPU_ON_FIRE"),
        ("heartbeat_timout_s: 10\n", "heartbeat_timout_s"),
        ("- just\n- a list\n", "mapping"),
        ("xid: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_policy_names_the_problem(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_policy(write(tmp_path, text))
    assert expected in str(err.value) and str(tmp_path) in str(err.value)


def test_good_policy_overrides_defaults(tmp_path: Path) -> None:
    policy = load_policy(write(tmp_path, "xid:\n  13: {action: quarantine, threshold: 2}\nfold_window_s: 60\n"))
    assert policy.xid[13].action is Severity.QUARANTINE and policy.xid[13].threshold == 2
    assert policy.xid[79].action is Severity.QUARANTINE and policy.fold_window_s == 60


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_policy(tmp_path / "nope.yaml")


def test_agent_config_validation_and_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "gpu-node-17")
    path = write(tmp_path, "simulated_gpus: 4\nplaintext: true\n")
    cfg = load_agent_config(path, {"controller": "ctl:7070", "spool": None})
    assert (cfg.node, cfg.simulated_gpus, cfg.controller) == ("gpu-node-17", 4, "ctl:7070")
    with pytest.raises(ConfigError, match="controller"):
        load_agent_config(None, {"controller": "no-port"})
    with pytest.raises(ConfigError, match="node"):
        load_agent_config(None, {"node": "Bad_Name!"})
    with pytest.raises(ConfigError, match="gpu_poll_s"):
        load_agent_config(write(tmp_path, "gpu_poll_s: 0\n"), {})


@pytest.mark.parametrize("load", [load_agent_config, load_controller_config])
@pytest.mark.parametrize("text", ["metrics_port: 0\n", "tls_dir: /etc/vigil/tls\nplaintext: true\n"])
def test_plaintext_is_never_the_default_and_never_beside_tls(load: Any, tmp_path: Path, text: str) -> None:
    """Neither TLS nor plaintext asked for, or both: refused, naming the two choices."""
    with pytest.raises(ConfigError, match="give tls_dir .* or plaintext: true"):
        load(write(tmp_path, text), {})


@pytest.mark.parametrize(
    ("load", "text", "problem"),
    [
        (load_agent_config, "plaintext: true\ntoken_file: /var/run/secrets/vigil/token\n", "token_file needs tls_dir"),
        (load_controller_config, "plaintext: true\nagent_tokens: {enabled: true}\n", "agent_tokens needs tls_dir"),
        (load_controller_config, "tls_dir: /t\nagent_tokens: {service_account: vigil-agent}\n", "service_account"),
    ],
)
def test_tokens_are_only_taken_over_tls(load: Any, tmp_path: Path, text: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        load(write(tmp_path, text), {})


def test_controller_config_rejects_unknown_keys(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="pagr"):
        load_controller_config(write(tmp_path, "pagr: console\n"), {})


def test_the_example_agent_config_loads() -> None:
    from agent.config import AgentConfig, load_agent_config

    example = Path(__file__).parents[2] / "deploy" / "agent.example.yaml"
    cfg = load_agent_config(example, {"node": "gpu-node-17"})
    assert cfg.dcgm_exporter_url == "http://127.0.0.1:9400/metrics" and cfg.checkpoint_path == Path("/checkpoints")
    # Every default the file states is the model's default.
    defaults = AgentConfig(node="gpu-node-17", plaintext=True)
    for key in (
        "gpu_poll_s",
        "kernel_log_poll_s",
        "spool_max_signals",
        "metrics_port",
        "collector_deadline_s",
        "remedies",
        "heartbeat_s",
        "idle_heartbeat_s",
    ):
        assert getattr(cfg, key) == getattr(defaults, key), key


def test_the_example_controller_config_loads() -> None:
    from controller.config import ControllerConfig, load_controller_config

    example = Path(__file__).parents[2] / "deploy" / "controller.example.yaml"
    cfg = load_controller_config(example, {})
    assert (cfg.actuator, cfg.pager, cfg.leader_election.enabled) == ("kubernetes", "slack", True)
    assert cfg.slack is not None and cfg.slack.channel == "C0123456789"
    # Every default the file states is the model's default.
    defaults = ControllerConfig(plaintext=True)
    assert cfg.fold_report_s == defaults.fold_report_s
    for section in ("guardrails", "recovery", "remediation", "kubernetes", "sweep", "limits", "agent_tokens"):
        assert getattr(cfg, section) == getattr(defaults, section), section
    for key in ("lease_duration_s", "renew_deadline_s", "retry_period_s", "namespace", "lease_name"):
        assert getattr(cfg.leader_election, key) == getattr(defaults.leader_election, key), key


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("kernel_log_source: file\n", "kernel_log"),
        ("dcgm_exporter_url: localhost:9400\n", "dcgm_exporter_url"),
        ("disk_used_max: 2\n", "disk_used_max"),
        ("gpu_backend: amd\n", "gpu_backend"),
    ],
)
def test_bad_agent_config_names_the_key(tmp_path: Path, text: str, expected: str) -> None:
    from agent.config import load_agent_config
    from vigil_core.config_file import ConfigError

    path = tmp_path / "agent.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=expected):
        load_agent_config(path, {"node": "n1", "plaintext": True})


def test_the_readmes_policy_example_loads(tmp_path: Path) -> None:
    import re

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    example = re.search(r"A policy file overrides the defaults rule by rule, e.g.:\n\n```yaml\n(.*?)```", readme, re.S)
    assert example is not None
    path = tmp_path / "policy.yaml"
    path.write_text(example[1])
    policy = load_policy(path)
    assert policy.kinds[SignalKind.THROTTLE].min_value == 60 and policy.xid[13].threshold == 3


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("port: true\nplaintext: true\n", "port: must be a number, not true"),
        ("metrics_port: false\nplaintext: true\n", "metrics_port: must be a number, not false"),
        ("guardrails: {breaker_max_fraction: true}\nplaintext: true\n", "guardrails.breaker_max_fraction"),
        ("pager: webhook\nwebhook: {url: 'ftp://example.com/hook'}\nplaintext: true\n", "webhook.url"),
        ("pager: webhook\nwebhook: {url: 'hooks.example.com'}\nplaintext: true\n", "is not an http(s) URL"),
        ("pager: slack\nslack: {channel: C1, base_url: 'file:///etc'}\nplaintext: true\n", "slack.base_url"),
        ("database: '{file}/controller.db'\nplaintext: true\n", "is a file, not a directory"),
        ("database: '{dir}'\nplaintext: true\n", "is a directory; name a file in it"),
        ("42\n", "expected a mapping at the top level, got int"),
    ],
)
def test_a_controller_configuration_cannot_be_half_right(tmp_path: Path, text: str, expected: str) -> None:
    """Each refused with the file and the key named, never silently coerced (``port: true`` is not port 1)."""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    path = write(tmp_path, text.replace("{file}", str(a_file)).replace("{dir}", str(tmp_path)))
    with pytest.raises(ConfigError) as err:
        load_controller_config(path, {})
    assert expected in str(err.value) and str(path) in str(err.value)


def test_a_file_that_is_not_utf8_text_is_named(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(b"port: 7070\n\xff\xfe\x00binary")
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte 11\)"):
        load_controller_config(path, {})
    path.write_bytes(b"port: 7070\n\x00\x01binary")  # UTF-8, but not YAML's printable text
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_controller_config(path, {})


@pytest.mark.parametrize("code", ["-5", "0", "70000"])
def test_a_policy_xid_must_be_an_xid_number(tmp_path: Path, code: str) -> None:
    with pytest.raises(ConfigError, match=f"xid.{code}"):
        load_policy(write(tmp_path, f"xid:\n  {code}: {{action: quarantine}}\n"))


def test_an_agent_spool_under_a_file_and_a_bool_for_a_number_are_refused(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    with pytest.raises(ConfigError, match="spool: .*is a file, not a directory"):
        load_agent_config(write(tmp_path, f"spool: {a_file}/spool.db\nplaintext: true\n"), {})
    with pytest.raises(ConfigError, match="gpu_poll_s: .*must be a number, not true"):
        load_agent_config(write(tmp_path, "gpu_poll_s: true\nplaintext: true\n"), {})
    cfg = load_agent_config(write(tmp_path, "plaintext: true\n"), {"spool": tmp_path / "new" / "spool.db"})
    assert cfg.spool == tmp_path / "new" / "spool.db"  # a directory still to be made is fine


def test_the_example_files_are_what_the_models_write_and_hold_every_key() -> None:
    """``deploy/*.example.yaml`` are written from the models (make config-examples): up to date,
    every key of every section there, and each loads as it stands."""
    import yaml
    from pydantic import BaseModel

    from agent.config import AgentConfig, load_agent_config
    from controller.config import ControllerConfig
    from vigil.config_examples import DEPLOY, main

    assert main(["--check"]) == 0, "deploy/*.example.yaml are out of date: make config-examples"

    def keys(model: type[BaseModel], found: dict[str, object], prefix: str = "") -> list[str]:
        missing = []
        for name, info in model.model_fields.items():
            if name not in found:
                missing.append(prefix + name)
            sub = found.get(name)
            annotation = info.annotation
            if isinstance(sub, dict) and isinstance(annotation, type) and issubclass(annotation, BaseModel):
                missing += keys(annotation, sub, f"{prefix}{name}.")
        return missing

    for model, name in ((ControllerConfig, "controller"), (AgentConfig, "agent")):
        found = yaml.safe_load((DEPLOY / f"{name}.example.yaml").read_text())
        assert keys(model, found) == [], name
    controller = load_controller_config(DEPLOY / "controller.example.yaml", {})
    assert controller.actuator == "kubernetes" and controller.slack is not None
    assert load_agent_config(DEPLOY / "agent.example.yaml", {}).node == "gpu-node-17"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("actuator: slurm\nslurm: {node_names: {a: gpu-01, b: gpu-01}}\n", "Slurm node 'gpu-01' is named for two"),
        ("actuator: slurm\nslurm: {timeout_s: 0}\n", "slurm.timeout_s"),
        ("actuator: slurm\nslurm: {partition: gpu}\n", "slurm.partition"),
        ("actuator: pbs\n", "actuator"),
        ("actuator: slurm\nslurm: {rest: {url: slurmrestd:6820, token_file: /t}}\n", "slurm.rest.url"),
        ("actuator: slurm\nslurm: {rest: {url: 'http://r:6820'}}\n", "slurm.rest.token_file"),
        (
            "actuator: slurm\nslurm: {rest: {url: 'http://r:6820', token_file: /t, api_version: v0.0.38}}\n",
            "slurm.rest.api_version",
        ),
    ],
)
def test_the_slurm_actuators_settings_name_the_bad_key(tmp_path: Path, text: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        load_controller_config(write(tmp_path, "plaintext: true\n" + text), {})


def test_a_slurm_controller_loads_with_its_name_map(tmp_path: Path) -> None:
    text = "plaintext: true\nactuator: slurm\nslurm: {conf: /etc/slurm/slurm.conf, node_names: {node-a: gpu-01}}\n"
    config = load_controller_config(write(tmp_path, text), {})
    assert config.actuator == "slurm" and config.slurm.node_names == {"node-a": "gpu-01"}
    assert config.slurm.rest is None
    rest = "plaintext: true\nactuator: slurm\nslurm: {rest: {url: 'http://slurmrestd:6820', token_file: /jwt}}\n"
    reached = load_controller_config(write(tmp_path, rest), {}).slurm.rest
    assert reached is not None and (reached.url, reached.api_version, reached.user) == (
        "http://slurmrestd:6820", "v0.0.41", "root")  # fmt: skip
