"""The resident agent's footprint: CPU (% of one core) and RSS while it polls 8 simulated GPUs.

    python -m bench.agent_footprint [--seconds 60] [--gpu-poll-s S]

Three processes are measured side by side over the same window, after a warm-up:

- the agent (`vigil agent --gpu-backend simulated --simulated-gpus 8`, defaults otherwise: GPUs
  polled every ``gpu_poll_s`` (the agent's default unless ``--gpu-poll-s``), host statistics
  every 5 s, the kernel log every 0.1 s, /metrics served), connected to a real controller and
  heartbeating;
- a baseline: an idle Python interpreter (`time.sleep`), the floor any Python daemon pays;
- the controller is started too but not measured (it is not resident on GPU nodes).

Targets (docs/design.md): at most 1% of one core and 80 MB RSS. The agent's memory map is also searched
for torch: the resident agent must never load it. Results are printed and appended as one JSON
line to bench/results/agent_footprint.jsonl with the command that produced them.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from agent.config import AgentConfig
from bench.record import append_result


def _cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def _wait_for(path: Path, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        if proc.poll() is not None:
            raise SystemExit(f"process exited early with code {proc.returncode}")
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--gpu-poll-s", type=float, default=AgentConfig.model_fields["gpu_poll_s"].default)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="vigil-footprint-"))
    vigil = [sys.executable, "-m", "vigil"]
    kernel_log = "kmsg" if os.access("/dev/kmsg", os.R_OK) else "none"
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    controller = subprocess.Popen(
        [
            *vigil,
            "controller",
            "--plaintext",
            "--port",
            "0",
            "--port-file",
            str(work / "port"),
            "--database",
            str(work / "c.db"),
        ],
        **quiet,  # type: ignore[call-overload]
    )
    port = _wait_for(work / "port", controller)
    agent_config = work / "agent.yaml"
    agent_config.write_text(f"gpu_poll_s: {args.gpu_poll_s}\n")
    agent_cmd = [
        *vigil, "agent", "--plaintext", "--gpu-backend", "simulated", "--simulated-gpus", "8", "--node", "bench-node",
        "--controller", f"127.0.0.1:{port}", "--kernel-log-source", kernel_log,
        "--spool", str(work / "spool.db"), "--metrics-port", "0", "--log-format", "json",
        "--config", str(agent_config),
    ]  # fmt: skip
    agent = subprocess.Popen(agent_cmd, **quiet)  # type: ignore[call-overload]
    baseline = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(100000)"], **quiet)  # type: ignore[call-overload]
    try:
        time.sleep(args.warmup)
        if agent.poll() is not None:
            raise SystemExit(f"the agent exited with code {agent.returncode}")
        procs = {"agent": psutil.Process(agent.pid), "idle_python": psutil.Process(baseline.pid)}
        start = {k: _cpu_seconds(p) for k, p in procs.items()}
        began = time.monotonic()
        peak_rss = dict.fromkeys(procs, 0)
        while time.monotonic() - began < args.seconds:
            for name, p in procs.items():
                peak_rss[name] = max(peak_rss[name], p.memory_info().rss)
            time.sleep(1.0)
        wall = time.monotonic() - began
        cpu = {k: 100.0 * (_cpu_seconds(p) - start[k]) / wall for k, p in procs.items()}
        torch_loaded = any("torch" in m.path for m in procs["agent"].memory_maps())
    finally:
        for proc in (agent, baseline, controller):
            proc.terminate()
            proc.wait(10)
    mb = {k: v / 1e6 for k, v in peak_rss.items()}
    result = {
        "bench": "agent_footprint",
        "command": "python -m bench.agent_footprint " + " ".join(sys.argv[1:]),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}",
        "seconds": round(wall, 1),
        "gpus": 8,
        "gpu_poll_s": args.gpu_poll_s,
        "kernel_log": kernel_log,
        "agent_cpu_pct_of_core": round(cpu["agent"], 3),
        "agent_peak_rss_mb": round(mb["agent"], 1),
        "idle_python_cpu_pct_of_core": round(cpu["idle_python"], 3),
        "idle_python_peak_rss_mb": round(mb["idle_python"], 1),
        "rss_ratio_vs_idle_python": round(mb["agent"] / mb["idle_python"], 2),
        "torch_loaded": torch_loaded,
        "targets_met": cpu["agent"] <= 1.0 and mb["agent"] <= 80.0 and not torch_loaded,
    }
    print(f"agent (8 simulated GPUs, polled every {args.gpu_poll_s:g} s, kernel log: {kernel_log}) over {wall:.0f} s:")
    print(f"  CPU  {cpu['agent']:.2f}% of one core   (idle Python: {cpu['idle_python']:.2f}%)   target <= 1%")
    ratio = result["rss_ratio_vs_idle_python"]
    print(f"  RSS  {mb['agent']:.1f} MB peak (idle Python: {mb['idle_python']:.1f} MB, ratio {ratio})  target <= 80 MB")
    print(f"  torch loaded: {torch_loaded}")
    append_result("agent_footprint", result)
    return 0 if result["targets_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
