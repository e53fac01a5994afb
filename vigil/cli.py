"""``vigil``: one command line for every part. Each subcommand imports only what it needs, so the
resident agent never loads the controller, the training code or torch."""

from __future__ import annotations

import getpass
import os
import sqlite3
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from controller.relay.hello_room import WAIT_S as HELLO_WAIT_S  # the relay's default, shown in --help
from controller.relay.uplink import LINGER_MS
from vigil_core.config_file import ConfigError
from vigil_core.tls import TlsError, TlsFiles, from_env, transport_problem

app = typer.Typer(
    help="Vigil: GPU-cluster health checking and fault tolerance.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

ConfigOpt = Annotated[Optional[Path], typer.Option("--config", "-c", help="YAML configuration file")]
LogFormatOpt = Annotated[str, typer.Option("--log-format", help="auto, json or console")]
ControllerOpt = Annotated[str, typer.Option("--controller", help="controller address HOST:PORT")]
TlsDirOpt = Annotated[
    Optional[Path],
    typer.Option("--tls-dir", help="mutual TLS: a directory with ca.crt, tls.crt, tls.key (vigil certs)"),
]
PlaintextOpt = Annotated[bool, typer.Option("--plaintext", help="no TLS, no identities: local use only")]


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _client_tls() -> TlsFiles | None:
    """This client's certificates, from VIGIL_TLS_DIR; plaintext without it."""
    try:
        return from_env(os.environ)
    except TlsError as exc:
        _fail(f"VIGIL_TLS_DIR: {exc}")
    return None


def _setup_logs(fmt: str) -> None:
    from vigil_core.logs import configure_logging

    if fmt not in ("auto", "json", "console"):
        _fail(f"--log-format must be auto, json or console, not {fmt!r}")
    configure_logging(fmt)  # type: ignore[arg-type]


@app.command()
def agent(
    config: ConfigOpt = None,
    node: Annotated[Optional[str], typer.Option(help="node name (default: $NODE_NAME or host name)")] = None,
    controller: Annotated[Optional[str], typer.Option(help="controller address HOST:PORT")] = None,
    urgent_controller: Annotated[
        Optional[str], typer.Option(help="the controller's urgent port HOST:PORT, dialled while faults wait")
    ] = None,
    gpu_backend: Annotated[Optional[str], typer.Option(help="nvml (default) or simulated")] = None,
    kernel_log_source: Annotated[Optional[str], typer.Option(help="auto, kmsg, journald, file or none")] = None,
    kernel_log: Annotated[Optional[Path], typer.Option(help="kmsg-format file to tail")] = None,
    dcgm_exporter_url: Annotated[Optional[str], typer.Option(help="dcgm-exporter /metrics URL to scrape")] = None,
    checkpoint_path: Annotated[Optional[Path], typer.Option(help="filesystem to watch for free space")] = None,
    spool: Annotated[Optional[Path], typer.Option(help="spool database path")] = None,
    simulated_gpus: Annotated[Optional[int], typer.Option(help="GPUs of the simulated backend")] = None,
    simulated_faults: Annotated[
        Optional[Path], typer.Option(help="a JSON-lines fault file the simulated backend reads as it grows")
    ] = None,
    metrics_port: Annotated[Optional[int], typer.Option(help="port for /metrics (0: any free port)")] = None,
    progress_dir: Annotated[
        Optional[Path], typer.Option(help="where this node's training ranks keep their progress records")
    ] = None,
    tls_dir: TlsDirOpt = None,
    token_file: Annotated[
        Optional[Path], typer.Option(help="a service-account token that proves the node (with the agents certificate)")
    ] = None,
    plaintext: PlaintextOpt = False,
    log_format: LogFormatOpt = "auto",
) -> None:
    """Run the node agent: collect GPU, kernel-log and host faults, spool them, send them to the controller."""
    from agent.config import load_agent_config

    _setup_logs(log_format)
    overrides = {
        "node": node,
        "controller": controller,
        "urgent_controller": urgent_controller,
        "gpu_backend": gpu_backend,
        "kernel_log_source": kernel_log_source,
        "kernel_log": kernel_log,
        "dcgm_exporter_url": dcgm_exporter_url,
        "checkpoint_path": checkpoint_path,
        "spool": spool,
        "simulated_gpus": simulated_gpus,
        "simulated_faults": simulated_faults,
        "metrics_port": metrics_port,
        "progress_dir": progress_dir,
        "tls_dir": tls_dir,
        "token_file": token_file,
        "plaintext": plaintext or None,
    }
    try:
        cfg = load_agent_config(config, overrides)
    except ConfigError as exc:
        _fail(str(exc))
    from agent.daemon import AgentStartError, run_agent
    from gpus.backend import BackendUnavailable

    try:
        run_agent(cfg)
    except AgentStartError as exc:
        _fail(f"the agent cannot start: {exc}")
    except BackendUnavailable as exc:
        _fail(f"the agent cannot start: {exc} (on a machine without NVIDIA GPUs, use --gpu-backend simulated)")
    except (OSError, sqlite3.Error, ValueError) as exc:  # ValueError: unusable certificates
        _fail(f"the agent cannot start: {exc}")


@app.command()
def controller(
    config: ConfigOpt = None,
    port: Annotated[Optional[int], typer.Option(help="gRPC port (0: any free port)")] = None,
    port_file: Annotated[Optional[Path], typer.Option(help="write the bound port to this file")] = None,
    database: Annotated[
        Optional[str], typer.Option(help="incident store: an SQLite file, or a postgresql:// DSN (HA replicas)")
    ] = None,
    database_dsn_file: Annotated[
        Optional[Path], typer.Option(help="a file holding the postgresql:// DSN (a mounted Secret)")
    ] = None,
    policy: Annotated[Optional[Path], typer.Option(help="policy YAML file")] = None,
    pager: Annotated[Optional[str], typer.Option(help="console, none, slack or webhook")] = None,
    actuator: Annotated[Optional[str], typer.Option(help="local or kubernetes")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="decide and page, change nothing")] = False,
    tls_dir: TlsDirOpt = None,
    plaintext: PlaintextOpt = False,
    log_format: LogFormatOpt = "auto",
) -> None:
    """Run the controller: receive signals, decide, quarantine, page."""
    from controller.config import load_controller_config
    from controller.vocab.policy import load_policy

    _setup_logs(log_format)
    overrides = {
        "port": port,
        "port_file": port_file,
        "database": database,
        "database_dsn_file": database_dsn_file,
        "policy": policy,
        "pager": pager,
        "actuator": actuator,
        "tls_dir": tls_dir,
        "plaintext": plaintext or None,
    }
    try:
        cfg = load_controller_config(config, overrides)
        load_policy(cfg.policy)  # fail now, with the policy's own error, not inside the server
    except ConfigError as exc:
        _fail(str(exc))
    if dry_run:
        cfg = cfg.model_copy(update={"guardrails": cfg.guardrails.model_copy(update={"dry_run": True})})
    from controller.daemon import run_controller

    try:
        run_controller(cfg)
    except (OSError, sqlite3.Error, ValueError) as exc:  # ValueError: a missing token, bad credentials
        _fail(f"the controller cannot start: {exc}")


@app.command()
def relay(
    controller: Annotated[
        str, typer.Option(help="the controller's host:port (its Service): where the agents' streams go")
    ],
    listen: Annotated[str, typer.Option(help="host:port agents dial")] = "0.0.0.0:7070",
    port_file: Annotated[
        Optional[Path], typer.Option(help="write the bound port here once the controller answers")
    ] = None,
    urgent_listen: Annotated[
        Optional[str],
        typer.Option(
            help="host:port of an urgent port: agents with faults waiting only, their calls taken beside the main "
            "port's, not behind a fleet connecting at once (vigil_core.urgent_port)"
        ),
    ] = None,
    first_message_s: Annotated[
        float, typer.Option(min=0.1, max=600, help="an agent's stream with no Hello by then is closed")
    ] = 30.0,
    controller_wait_s: Annotated[
        float,
        typer.Option(
            min=1,
            max=3600,
            help="how long agents' calls wait here for the controller (a restart, a failover), from when "
            "they began to wait for it, before they are ended and the agents reconnect",
        ),
    ] = 120.0,
    hello_wait_s: Annotated[
        float,
        typer.Option(
            min=0,
            max=60,
            help="what an agent's Hello passed on should wait for the controller's answer: the relay sizes its "
            "room for Hellos at the controller by it and queues the other agents (0: every Hello at once)",
        ),
    ] = HELLO_WAIT_S,
    linger_ms: Annotated[
        float,
        typer.Option(
            min=0,
            max=100,
            help="how long what only waits to be recorded (heartbeats, record-only signals, a Hello with no "
            "fault behind it, a stream's end) may wait here for more before it goes to the controller, many "
            "agents' in one message (a signal that may act never waits)",
        ),
    ] = LINGER_MS,
    max_message_bytes: Annotated[
        int,
        typer.Option(min=64 << 10, max=64 << 20, help="one gRPC message (the controller's limits.max_message_bytes)"),
    ] = 4 << 20,
    metrics_port: Annotated[
        Optional[int], typer.Option(min=0, max=65535, help="serve /metrics and /readyz here (0: any free port)")
    ] = None,
    gc_freeze: Annotated[
        bool,
        typer.Option(
            help="experimental: freeze what survives each full garbage collection while the fleet is calm, "
            "thawing it once a quarter of the agents' streams ended (vigil_core.gc_keeper; docs/design.md)"
        ),
    ] = False,
    gc_young_objects: Annotated[
        int,
        typer.Option(
            min=0,
            max=10_000_000,
            help="the garbage collector's young collections every this many new objects (0: CPython's 700; "
            "vigil_core.gc_young)",
        ),
    ] = 50_000,
    tls_dir: TlsDirOpt = None,
    plaintext: PlaintextOpt = False,
    log_format: LogFormatOpt = "auto",
) -> None:
    """Hold agents' connections for the controller, carrying their streams to it on one."""
    from controller.relay.server import RelaySettings, run_relay
    from vigil_core.names import is_address

    _setup_logs(log_format)
    if problem := transport_problem(tls_dir, plaintext):
        _fail(problem)
    addresses = [*(("--controller", c) for c in controller.split(",")), ("--listen", listen)]
    if urgent_listen is not None:
        addresses.append(("--urgent-listen", urgent_listen))
    for name, value in addresses:
        host, _, port = value.strip().rpartition(":")
        if not (host.strip("[]") and is_address(host.strip("[]")) and port.isdigit() and 0 <= int(port) <= 65535):
            _fail(f"{name} must be host:port (the controller's: each replica's, separated by commas), not {value!r}")
    from vigil_core.cert_reload import CertificateSource

    try:
        tls = CertificateSource(tls_dir) if tls_dir is not None else None
    except TlsError as exc:
        _fail(f"--tls-dir: {exc}")
    settings = RelaySettings(
        controller,
        listen,
        tls,
        first_message_s=first_message_s,
        max_message_bytes=max_message_bytes,
        metrics_port=metrics_port,
        gc_freeze=gc_freeze,
        gc_young_objects=gc_young_objects,
        controller_wait_s=controller_wait_s,
        hello_wait_s=hello_wait_s,
        linger_ms=linger_ms,
        urgent_listen=urgent_listen,
    )
    if urgent_listen is not None and urgent_listen.rpartition(":")[2] == listen.rpartition(":")[2] != "0":
        _fail(f"--urgent-listen must be another port than --listen ({listen})")
    try:
        run_relay(settings, port_file)
    except OSError as exc:
        _fail(f"the relay cannot start: {exc}")


@app.command()
def certs(
    out: Annotated[Path, typer.Argument(help="directory to write (or add to): one subdirectory per party")],
    controller_name: Annotated[
        list[str], typer.Option("--controller-name", help="a DNS name or IP agents dial the controller by (repeat)")
    ],
    nodes: Annotated[str, typer.Option(help="node certificates: names separated by commas")] = "",
    admin: Annotated[list[str], typer.Option(help="an operator's admin certificate (repeat)")] = [],  # noqa: B006
    trainer: Annotated[list[str], typer.Option(help="a trainer certificate for jobs and launchers (repeat)")] = [],  # noqa: B006
    days: Annotated[int, typer.Option(min=1, max=3650, help="validity")] = 365,
    agents: Annotated[
        bool, typer.Option("--agents", help="the DaemonSet's shared agent certificate (its pods' tokens prove nodes)")
    ] = False,
    renew: Annotated[
        bool, typer.Option("--renew", help="issue the named parties' keys and certificates again (default: keep them)")
    ] = False,
    relay: Annotated[
        list[str], typer.Option(help="a relay's certificate, by the DNS name agents dial it (repeat)")
    ] = [],  # noqa: B006
) -> None:
    """Create the cluster's CA and certificates for mutual TLS (each directory: ca.crt, tls.crt, tls.key)."""
    from vigil.certs import CertsError, create

    try:
        written, kept = create(
            out, controller_name, [n for n in nodes.split(",") if n], admin, trainer, days, agents, renew, relay
        )
    except (CertsError, OSError) as exc:
        _fail(str(exc))
    for directory in written:
        typer.echo(str(directory))
    for directory in kept:
        typer.echo(f"{directory}: kept as it was (--renew to issue it again)")
    typer.echo(f"the CA's key is in {out / 'ca' / 'ca.key'}: keep it where certificates are issued, not on nodes")


@app.command()
def demo(
    nodes: Annotated[int, typer.Option(min=2, max=32, help="simulated nodes")] = 4,
    gpus: Annotated[int, typer.Option(min=1, max=16, help="simulated GPUs per node")] = 8,
    as_json: Annotated[bool, typer.Option("--json", help="print a machine-readable summary only")] = False,
    keep: Annotated[bool, typer.Option(help="keep the demo's working directory (logs, databases)")] = False,
    timeout: Annotated[float, typer.Option(help="seconds to wait for each phase")] = 30.0,
    with_training: Annotated[
        bool,
        typer.Option(
            "--with-training",
            help="instead: 3 nodes and the bundled MoE job on CPU, a GPU fault and a slow rank (needs torch)",
        ),
    ] = False,
) -> None:
    """Run a local cluster (controller + agents, simulated GPUs), inject an XID 79, watch Vigil act."""
    if with_training:
        from vigil.demo_training import run_training_demo

        raise typer.Exit(run_training_demo(as_json=as_json, keep=keep, timeout=max(timeout, 180.0)))
    from vigil.demo import run_demo

    raise typer.Exit(run_demo(nodes=nodes, gpus=gpus, as_json=as_json, keep=keep, timeout=timeout))


@app.command()
def status(
    controller: ControllerOpt = "127.0.0.1:7070", as_json: Annotated[bool, typer.Option("--json")] = False
) -> None:
    """Nodes by health, as the controller sees them."""
    from vigil.operator_views import print_status

    raise typer.Exit(print_status(controller, as_json))


@app.command()
def jobs(
    controller: ControllerOpt = "127.0.0.1:7070", as_json: Annotated[bool, typer.Option("--json")] = False
) -> None:
    """Training jobs reporting to the controller: state, MFU baseline, and goodput (where the time went)."""
    from vigil.operator_views import print_jobs

    raise typer.Exit(print_jobs(controller, as_json))


@app.command()
def repairs(
    controller: ControllerOpt = "127.0.0.1:7070", as_json: Annotated[bool, typer.Option("--json")] = False
) -> None:
    """Repairs of quarantined nodes (remediation): the rung each is on, what stops it, what was tried."""
    from vigil.operator_views import print_repairs

    raise typer.Exit(print_repairs(controller, as_json))


@app.command()
def rules(
    controller: ControllerOpt = "127.0.0.1:7070", as_json: Annotated[bool, typer.Option("--json")] = False
) -> None:
    """Each rule's quarantines and pages, and how often a person undid them soon after (its precision)."""
    from vigil.operator_views import print_rules

    raise typer.Exit(print_rules(controller, as_json))


@app.command()
def incidents(
    controller: ControllerOpt = "127.0.0.1:7070",
    open_only: Annotated[bool, typer.Option("--open", help="open incidents only")] = False,
    node: Annotated[str, typer.Option(help="only this node's")] = "",
    limit: Annotated[int, typer.Option(min=1, max=10000)] = 50,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Incident history with the actions taken."""
    from vigil.operator_views import print_incidents

    raise typer.Exit(print_incidents(controller, open_only, node, limit, as_json))


@app.command()
def uncordon(
    node: str,
    controller: ControllerOpt = "127.0.0.1:7070",
    reason: Annotated[str, typer.Option(help="why (recorded)")] = "",
    repaired: Annotated[
        bool, typer.Option("--repaired", help="the fault was real and is fixed: not held against the rule")
    ] = False,
    not_a_fault: Annotated[
        bool, typer.Option("--not-a-fault", help="the quarantine was wrong: counts against the rule (vigil rules)")
    ] = False,
) -> None:
    """Return a node that Vigil quarantined to service (recorded, through the controller). Unsaid,
    a release counts as a repair if a check of the node passed since its quarantine, else as undone."""
    from vigil.operator_views import request_uncordon

    if repaired and not_a_fault:
        _fail("--repaired or --not-a-fault, not both")
    verdict = "repaired" if repaired else "not-a-fault" if not_a_fault else ""
    raise typer.Exit(request_uncordon(controller, node, getpass.getuser(), reason, verdict))


@app.command()
def resolve(
    incident: Annotated[str, typer.Argument(help="the incident's id (vigil incidents)")],
    controller: ControllerOpt = "127.0.0.1:7070",
    note: Annotated[str, typer.Option(help="why: recorded, and said in the incident's thread")] = "",
) -> None:
    """Resolve an open incident of a node still in service (a SUSPECT explained away); a quarantined
    node comes back with vigil uncordon."""
    from vigil.operator_views import request_resolve

    raise typer.Exit(request_resolve(controller, incident, getpass.getuser(), note))


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
)
def check(
    ctx: typer.Context,
    name: Annotated[
        str, typer.Argument(help="gpu_health, matmul, membw or allreduce ('list' to list them)")
    ] = "--help",
    deadline: Annotated[float, typer.Option(help="seconds before the check counts as hung (UNKNOWN)")] = 600.0,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as one JSON line")] = False,
    slurm_drain: Annotated[
        bool,
        typer.Option(
            "--slurm-drain",
            help="as Slurm's HealthCheckProgram, prolog or epilog: a FAIL drains this node with its reason",
        ),
    ] = False,
    node: Annotated[str, typer.Option(help="with --slurm-drain: the Slurm node (default: $SLURMD_NODENAME)")] = "",
    strict: Annotated[bool, typer.Option(help="with --slurm-drain: UNKNOWN fails too (exit 2)")] = False,
) -> None:
    """Run one diagnostic check on this machine (extra arguments go to the check: vigil check matmul --seconds 5;
    vigil check matmul --help shows them).

    Exit code: 0 OK, 1 FAIL, 2 UNKNOWN (crashed, hung, or could not run). With --slurm-drain: 0 unless
    the check FAILed (then 1, the node drained), or with --strict could not judge (2)."""
    from checks.program import argument_problem, describe_result, parser_of
    from checks.runner import CHECKS, run_check

    if name in ("--help", "-h"):
        typer.echo(ctx.get_help())
        raise typer.Exit(0)
    if name == "list":
        for check_name, what in CHECKS.items():
            typer.echo(f"{check_name:12} {what}")
        raise typer.Exit(0)
    if name not in CHECKS:
        _fail(f"no check named {name!r}: {', '.join(CHECKS)} ('vigil check list' says what each does)")
    args = list(ctx.args)
    if "--help" in args or "-h" in args:
        typer.echo(parser_of(name, prog=f"vigil check {name}").format_help())
        raise typer.Exit(0)
    if not deadline > 0:
        _fail(f"--deadline must be above 0 seconds, not {deadline:g}")
    if problem := argument_problem(name, args):
        _fail(problem)
    result = run_check(name, args, deadline)
    typer.echo(result.to_json() if as_json else describe_result(result))
    if not slurm_drain:
        raise typer.Exit(result.verdict.exit_code)
    from checks.result import Verdict
    from vigil.slurm_check import drain_node, drain_reason, slurm_exit_code, this_node

    if result.verdict is Verdict.FAIL:
        target, reason = node or this_node(), drain_reason(result)
        problem = drain_node(target, reason)
        typer.echo(f"error: {problem}" if problem else f"drained {target} in Slurm: {reason}", err=True)
    raise typer.Exit(slurm_exit_code(result.verdict, strict))


@app.command()
def remedy(
    name: Annotated[str, typer.Argument(help="gpu_reset or bus_reset")],
    gpu: Annotated[
        Optional[list[str]], typer.Option("--gpu", help="a GPU's PCI bus id, repeated; default: every GPU listed")
    ] = None,
    nvidia_smi: Annotated[str, typer.Option(help="the nvidia-smi program and its first arguments")] = "nvidia-smi",
    pci_sysfs: Annotated[Path, typer.Option(help="where the kernel's PCI devices are")] = Path("/sys/bus/pci/devices"),
    deadline: Annotated[float, typer.Option(min=1.0, help="seconds for the whole remedy")] = 300.0,
    result_file: Annotated[
        Optional[Path], typer.Option(help="also write the JSON result here (a Job: /dev/termination-log)")
    ] = None,
) -> None:
    """Reset GPUs on this machine as the controller's repair asks: the evidence first, never while a
    process uses them, persistence mode off and back on, the reset, present again.

    Exit code: 0 done, 1 failed, 2 refused (a process uses a GPU) or could not run."""
    import asyncio
    import shlex

    from agent.remedies import REMEDIES, Remedies, RemediesConfig, exit_code, listed_gpus, result_json
    from protos.vigil.v1 import agent_pb2

    if name not in REMEDIES:
        _fail(f"no remedy named {name!r}: {', '.join(REMEDIES)}")
    smi = tuple(shlex.split(nvidia_smi))
    if not smi:
        _fail("--nvidia-smi is empty")
    config = RemediesConfig(enabled=True, nvidia_smi=smi, pci_sysfs=pci_sysfs)
    gpus = list(gpu or [])
    remedies = Remedies(os.environ.get("NODE_NAME", ""), config, lambda: gpus or listed_gpus(smi))
    request = agent_pb2.RunRemedy(request_id="cli", remedy=name, pci_bus_ids=gpus, deadline_s=deadline)
    result = asyncio.run(remedies.run(request))
    text = result_json(result)
    typer.echo(text)
    if result_file is not None:
        try:
            result_file.write_text(text)
        except OSError as exc:
            typer.echo(f"error: cannot write the result to {result_file}: {exc}", err=True)
    raise typer.Exit(exit_code(result))


@app.command()
def sweep(
    nodes: Annotated[Optional[list[str]], typer.Argument(help="nodes (default: every connected agent's)")] = None,
    controller: ControllerOpt = "127.0.0.1:7070",
    selector: Annotated[str, typer.Option("--selector", "-l", help="Kubernetes label selector on nodes")] = "",
    job: Annotated[str, typer.Option(help="the nodes of this Kubernetes Job's pods")] = "",
    namespace: Annotated[str, typer.Option(help="the Job's namespace")] = "default",
    partition: Annotated[str, typer.Option(help="the nodes of this Slurm partition (a Slurm controller)")] = "",
    slurm_job: Annotated[str, typer.Option(help="the nodes this Slurm job holds (a Slurm controller)")] = "",
    checks: Annotated[
        str, typer.Option(help="comma-separated, in order: gpu_health,matmul,membw,allreduce,pairs (default: all)")
    ] = "",
    param: Annotated[
        Optional[list[str]], typer.Option("--param", "-p", help="CHECK.ARG=VALUE for a check (repeatable)")
    ] = None,
    min_busbw_gbps: Annotated[float, typer.Option(min=0, help="pairs below this bus bandwidth are slow")] = 0.0,
    quarantine: Annotated[
        bool, typer.Option("--quarantine", help="quarantine failing nodes (through the guardrails)")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON, no progress bar")] = False,
    show_all: Annotated[bool, typer.Option("--all", help="list passing nodes too, however many")] = False,
) -> None:
    """Run checks on many nodes through their agents, then pairwise all-reduce to find a slow node or link.

    Exit code: 0 every node passed, 1 a node failed or a link is slow, 2 something could not be judged."""
    from protos.vigil.v1 import admin_pb2
    from vigil.sweep_view import run_sweep

    params = {}
    for item in param or []:
        key, eq, value = item.partition("=")
        if not eq or "." not in key:
            _fail(f"--param {item!r}: expected CHECK.ARG=VALUE, e.g. matmul.seconds=5")
        params[key] = value
    if sum(map(bool, (nodes, selector, job, partition, slurm_job))) > 1:
        _fail("choose nodes one way: names, --selector, --job, --partition or --slurm-job")
    if slurm_job and not slurm_job.isdigit():
        _fail(f"--slurm-job {slurm_job!r}: a Slurm job id is a number")
    if partition:  # the Slurm actuator's selector; a Kubernetes controller finds no such label
        selector = f"partition={partition}"
    job = job or slurm_job
    request = admin_pb2.SweepRequest(
        nodes=nodes or [],
        checks=[c.strip() for c in checks.split(",") if c.strip()],
        quarantine=quarantine,
        selector=selector,
        job=job,
        namespace=namespace,
        requested_by=getpass.getuser(),
        params=params,
        min_busbw_gbps=min_busbw_gbps,
    )
    raise typer.Exit(run_sweep(controller, request, as_json, show_all))


@app.command()
def plan(
    gpus: Annotated[int, typer.Option("--gpus", min=1, help="the job's GPUs")],
    failures_per_1000_gpu_days: Annotated[
        Optional[float],
        typer.Option("--gpu-rate", "--failures-per-1000-gpu-days", min=0.0, help="failures per 1,000 GPU-days"),
    ] = None,
    gpu_mtbf_hours: Annotated[Optional[float], typer.Option("--gpu-mtbf-hours", help="or one GPU's MTBF")] = None,
    failures_per_1000_node_days: Annotated[
        Optional[float],
        typer.Option("--node-rate", "--failures-per-1000-node-days", min=0.0, help="or per 1,000 node-days"),
    ] = None,
    gpus_per_node: Annotated[int, typer.Option("--gpus-per-node", min=1, max=1024)] = 8,
    from_history: Annotated[
        bool, typer.Option("--from-history", help="or fit it: the nodes the controller quarantined, per GPU-day")
    ] = False,
    history_days: Annotated[float, typer.Option("--history-days", min=1.0, help="the history to fit")] = 28.0,
    controller: ControllerOpt = "127.0.0.1:7070",
    save_s: Annotated[Optional[float], typer.Option("--save-s", help="a checkpoint blocks training (s)")] = None,
    restart_s: Annotated[
        Optional[float], typer.Option("--restart-s", help="told to stop -> training again (s)")
    ] = None,
    restore_s: Annotated[float, typer.Option("--restore-s", min=0.0, help="loading the checkpoint, if apart")] = 0.0,
    detect_s: Annotated[
        Optional[float], typer.Option("--detect-s", min=0.0, help="fault -> job told, with Vigil (every fault)")
    ] = None,
    days: Annotated[float, typer.Option("--days", min=0.01, help="the run's wall time")] = 30.0,
    stragglers: Annotated[
        float, typer.Option("--stragglers-per-1000-gpu-days", min=0.0, help="slow-node episodes")
    ] = 0.0,
    straggler_slowdown: Annotated[float, typer.Option("--straggler-slowdown", min=0.0, max=10.0)] = 0.3,
    watchdog_s: Annotated[float, typer.Option("--watchdog-s", min=0.0, help="without Vigil: NCCL's watchdog")] = 600.0,
    person_s: Annotated[
        float, typer.Option("--person-s", min=0.0, help="without Vigil: a person finds the node")
    ] = 1800.0,
    runs: Annotated[int, typer.Option("--runs", min=10, max=100_000, help="simulated runs")] = 200,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    plot: Annotated[
        Optional[Path], typer.Option("--plot", help="ETTR against the interval: .png, .svg or .pdf (vigil-gpu[plot])")
    ] = None,
) -> None:
    """How often to checkpoint, and what share of the run trains, with Vigil and without it."""
    from dataclasses import replace

    from controller.planning.model import Baseline
    from controller.planning.plan import HistoryError, PlanInputs, make_plan, never_trains
    from vigil.plan_view import PLOT_FORMATS, dumps, print_plan, write_plot

    if plot is not None and plot.suffix.lower().lstrip(".") not in PLOT_FORMATS:
        _fail(f"--plot {plot}: the name's suffix picks the format: {', '.join('.' + f for f in PLOT_FORMATS)}")

    rates = (failures_per_1000_gpu_days, failures_per_1000_node_days, gpu_mtbf_hours)
    given = [x for x in rates if x is not None] + ([1] if from_history else [])
    if len(given) != 1:
        _fail(
            "give one failure rate: --failures-per-1000-gpu-days, --failures-per-1000-node-days, "
            "--gpu-mtbf-hours or --from-history"
        )
    if gpus % gpus_per_node:
        _fail(f"--gpus {gpus} is not a whole number of nodes of --gpus-per-node {gpus_per_node}")
    if failures_per_1000_node_days is not None:
        rate = failures_per_1000_node_days / gpus_per_node
    elif gpu_mtbf_hours is not None:
        if gpu_mtbf_hours <= 0:
            _fail(f"--gpu-mtbf-hours must be above 0, not {gpu_mtbf_hours:g}")
        rate = 1000.0 * 24.0 / gpu_mtbf_hours
    elif from_history:
        from vigil.plan_history import fitted_rate

        try:
            rate = fitted_rate(controller, history_days)
        except HistoryError as exc:
            _fail(f"--from-history: {exc}")
    else:
        rate = float(failures_per_1000_gpu_days or 0.0)
    if rate <= 0:
        _fail("the failure rate must be above 0")
    for name, value in (("--save-s", save_s), ("--restart-s", restart_s)):
        if value is not None and value < 0:
            _fail(f"{name} must be 0 or more, not {value:g}")
    inputs = PlanInputs(gpus, rate, days=days, stragglers_per_1000_gpu_days=stragglers, runs=runs, seed=seed)
    inputs = replace(
        inputs,
        save_s=inputs.save_s if save_s is None else save_s,
        restart_s=inputs.restart_s if restart_s is None else restart_s,
        restore_s=restore_s,
        detect_s=detect_s,
        straggler_slowdown=straggler_slowdown,
        baseline=Baseline(watchdog_s=watchdog_s, person_s=person_s),
    )
    if why := never_trains(inputs):
        _fail(why)
    result = make_plan(inputs)
    if plot is not None:
        try:
            write_plot(result, plot)
        except ImportError:
            _fail("--plot needs matplotlib: pip install 'vigil-gpu[plot]'")
        except OSError as exc:
            _fail(f"--plot {plot}: {exc.strerror or exc}")
    if as_json:
        print(dumps(result))
    else:
        print_plan(result)


@app.command()
def resume(
    controller: ControllerOpt = "127.0.0.1:7070",
    reason: Annotated[str, typer.Option(help="why (recorded)")] = "",
    apply_held: Annotated[
        bool, typer.Option("--apply-held", help="carry out the quarantines the circuit breaker held back")
    ] = False,
) -> None:
    """Resume automation after the circuit breaker tripped (held quarantines are dropped unless --apply-held)."""
    from vigil.operator_views import request_resume

    raise typer.Exit(request_resume(controller, getpass.getuser(), reason, apply_held))


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def launch(
    ctx: typer.Context,
    nodes: Annotated[
        str, typer.Option(help="comma-separated node names the ranks run as (VIGIL_NODE); --slurm: the allocation's")
    ] = "",
    slurm: Annotated[
        bool, typer.Option("--slurm", help="inside a Slurm allocation: each start one srun step over the nodes left")
    ] = False,
    job_id: Annotated[str, typer.Option(help="the job's id, as the controller will know it")] = "job",
    nproc_per_node: Annotated[int, typer.Option(help="ranks per node")] = 1,
    controller: Annotated[
        str, typer.Option(help="controller HOST:PORT, as every command; 'none' to run with nothing watching")
    ] = "127.0.0.1:7070",
    max_failures: Annotated[int, typer.Option(help="restarts after failed starts before giving up")] = 3,
    log_dir: Annotated[Optional[Path], typer.Option(help="one log file per rank here (default: inherit)")] = None,
    stop_grace_s: Annotated[
        float, typer.Option(help="when the launcher is stopped: seconds its ranks have to save before SIGKILL")
    ] = 25.0,
    log_format: LogFormatOpt = "auto",
) -> None:
    """Run a training job's ranks here and start it again without the nodes Vigil took out:
    vigil launch --nodes node-1,node-2 -- python -m trainer_hooks.moe_job.train --preset debug"""
    from vigil.launch import LaunchConfig, Launcher
    from vigil_core.names import is_job_id, is_node_name

    _setup_logs(log_format)
    names = [n.strip() for n in nodes.split(",") if n.strip()]
    from vigil.launch_slurm import SlurmLaunchError, this_allocation
    from vigil_core.ports import NoFreePorts

    if slurm and not names:
        try:
            names = this_allocation()
        except SlurmLaunchError as exc:
            _fail(str(exc))
    bad = [n for n in names if not is_node_name(n)]
    if not names or bad:
        _fail(f"--nodes: {bad[0]!r} is not a node name" if bad else "--nodes names no node")
    if len(set(names)) != len(names):
        _fail("--nodes names a node twice")
    if not is_job_id(job_id):
        _fail(f"--job-id {job_id!r}: letters, digits and -_. only")
    if nproc_per_node < 1 or max_failures < 0:
        _fail("--nproc-per-node must be >= 1 and --max-failures >= 0")
    if not 0 <= stop_grace_s <= 3600:
        _fail(f"--stop-grace-s {stop_grace_s:g}: between 0 and 3600 seconds")
    if not ctx.args:
        _fail("no command to launch: put it after --, e.g. -- python -m trainer_hooks.moe_job.train")
    if controller.strip().lower() in ("", "none"):
        controller = ""
        typer.echo(
            "warning: --controller none: nothing watches this job (no hang or fault is noticed, no restart "
            "leaves a bad node out); it restarts only after its own failures",
            err=True,
        )
    config = LaunchConfig(
        job_id=job_id,
        nodes=tuple(names),
        command=tuple(ctx.args),
        nproc_per_node=nproc_per_node,
        controller=controller,
        max_failures=max_failures,
        log_dir=log_dir,
        stop_grace_s=stop_grace_s,
        tls=_client_tls(),
        slurm=slurm,
    )
    launcher = Launcher(config)
    try:
        code = launcher.run()
    except FileNotFoundError as exc:
        _fail(f"cannot start the command: {exc}")
    except NoFreePorts as exc:
        _fail(f"no rendezvous port for the ranks: {exc}")
    except SlurmLaunchError as exc:
        _fail(str(exc))
    finally:
        launcher.close()
    raise typer.Exit(code)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
