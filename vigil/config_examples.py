"""``deploy/controller.example.yaml`` and ``deploy/agent.example.yaml``, written from the
configuration models (``vigil_core.config_example``): every setting each accepts, its default and
its description, and the few example values a cluster install sets.

    python -m vigil.config_examples            # write both (make config-examples)
    python -m vigil.config_examples --check    # exit 1 if either is out of date
"""

from __future__ import annotations

import sys
from pathlib import Path

from agent.config import AgentConfig
from controller.config import ControllerConfig
from vigil_core.config_example import Example, example_yaml

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"

CONTROLLER_HEADER = """
vigil controller configuration, written from the configuration model (python -m vigil.config_examples):
every key it accepts, at its default unless marked "example value". Every key is optional except
where marked required. `vigil controller --config controller.yaml`; command-line flags override it.
"""

CONTROLLER = {
    "listen": Example("0.0.0.0", "example value: every address"),
    "tls_dir": Example("/etc/vigil/tls", "example value; required unless plaintext"),
    "database": Example("/var/lib/vigil/controller.db", "example value (the Deployment's volume)"),
    "metrics_port": Example(9403, "example value (null: no /metrics)"),
    "actuator": Example("kubernetes", "example value (local: the demo's, no cluster)"),
    "pager": Example("slack", "example value (console, none, slack, webhook)"),
    "slack": Example({"channel": "C0123456789"}, "example section, needed for pager: slack"),
    "leader_election.enabled": Example(True, "example value (false: a single replica)"),
}

AGENT_HEADER = """
vigil agent configuration, written from the configuration model (python -m vigil.config_examples):
every key it accepts, at its default unless marked "example value". Every key is optional.
`vigil agent --config agent.yaml`; command-line flags override it.
"""

AGENT = {
    "node": Example("gpu-node-17", "example value", default="$NODE_NAME (the downward API), else the host name"),
    "controller": Example("vigil-controller.vigil.svc:7070", "example value"),
    "tls_dir": Example("/etc/vigil/tls", "example value; required unless plaintext"),
    "dcgm_exporter_url": Example("http://127.0.0.1:9400/metrics", "example value (null: not scraped)"),
    "checkpoint_path": Example("/checkpoints", "example value (null: no disk check)"),
    "progress_dir": Example("/run/vigil/progress", "example value (the ranks' VIGIL_PROGRESS_DIR)"),
}


def examples() -> dict[Path, str]:
    return {
        DEPLOY / "controller.example.yaml": example_yaml(ControllerConfig, CONTROLLER_HEADER, CONTROLLER),
        DEPLOY / "agent.example.yaml": example_yaml(AgentConfig, AGENT_HEADER, AGENT),
    }


def main(argv: list[str] | None = None) -> int:
    check = "--check" in (sys.argv[1:] if argv is None else argv)
    stale = []
    for path, text in examples().items():
        if not check:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
        elif not path.exists() or path.read_text(encoding="utf-8") != text:
            stale.append(str(path))
    if stale:
        print(f"out of date: {', '.join(stale)} (make config-examples)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
