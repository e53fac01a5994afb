"""A fake ``nvidia-smi`` for a simulated node: the commands the agent's remedies use, answered as
the real one answers them, acting on the node's simulated GPUs through their fault file.

    python -m tests.fakes.nvidia_smi --node N --gpus 8 --faults F --state S [--sysfs D] -- NVIDIA-SMI-ARGS

``S`` (JSON, written by the test or the scenario; missing: all defaults) says how the node behaves:
``{"processes": [{"gpu": 2, "pid": 4242, "name": "python"}], "persistence": [2], "reset_fails": [2],
"gone_after_reset": [3], "reset_s": 4}`` (a reset that takes 4 s). Every call is appended to
``S.calls`` (one JSON list per line), so a test sees the order of what was asked. A reset that
works appends ``{"gpu": i, "reset": true}`` to the
fault file (the simulated GPU is healthy again); a bus reset asked through ``D`` (the ``reset`` file
the agent wrote under the device's sysfs directory) takes effect at the next query, as a real one
does once the kernel has reset the bus.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from gpus.simulated import simulated_gpus


def _state(path: Path) -> dict[str, Any]:
    try:
        loaded = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _smi_bus(bus: str) -> str:
    return f"0000{bus}.0"  # nvidia-smi's 8-digit domain: 00000000:18:00.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--node", required=True)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--faults", type=Path, required=True)
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--sysfs", type=Path)
    ours, _, smi = " ".join(argv if argv is not None else sys.argv[1:]).partition(" -- ")
    opts = parser.parse_args(ours.split())
    args = smi.split()
    state = _state(opts.state)
    with open(f"{opts.state}.calls", "a") as f:
        f.write(json.dumps(args) + "\n")
    buses = [g.pci_bus_id for g in simulated_gpus(opts.node, opts.gpus)]
    gone = set(state.get("gone", []))

    def index_of(bus_arg: str) -> int:
        short = bus_arg.lower().removesuffix(".0")
        short = short[4:] if short.count(":") == 2 and len(short.split(":")[0]) == 8 else short
        return buses.index(short) if short in buses else -1

    target = index_of(args[args.index("-i") + 1]) if "-i" in args else None
    if target == -1 or (target is not None and target in gone):
        print(f"No devices were found matching {args[args.index('-i') + 1]}", file=sys.stderr)
        return 6
    if opts.sysfs is not None:  # a bus reset the kernel was asked for: the GPU is reset now
        for i, bus in enumerate(buses):
            asked = opts.sysfs / f"{bus}.0" / "reset"
            if asked.exists():
                asked.unlink()
                _reset(opts, state, i)
                gone = set(_state(opts.state).get("gone", []))
    if any(a.startswith("--query-compute-apps") for a in args):
        for p in state.get("processes", []):
            print(f"{_smi_bus(buses[p['gpu']])}, {p['pid']}, {p.get('name', 'python')}")
        return 0
    if "--query-gpu=persistence_mode" in args:
        print("Enabled" if target in state.get("persistence", []) else "Disabled")
        return 0
    if "--query-gpu=pci.bus_id" in args:
        for i, bus in enumerate(buses):
            if i not in gone:
                print(_smi_bus(bus))
        return 0
    if "-pm" in args:
        on = args[args.index("-pm") + 1] == "1"
        persistence = set(state.get("persistence", []))
        persistence = persistence | {target} if on else persistence - {target}
        _save(opts.state, state | {"persistence": sorted(persistence)})
        print(f"{'Enabled' if on else 'Disabled'} persistence mode for GPU {_smi_bus(buses[target or 0])}.")
        return 0
    if "-r" in args or "--gpu-reset" in args:
        assert target is not None
        if target in state.get("persistence", []) or any(p["gpu"] == target for p in state.get("processes", [])):
            print("The following GPUs could not be reset:", file=sys.stderr)
            print(f"  GPU {_smi_bus(buses[target])}: In use by another client", file=sys.stderr)
            return 255
        time.sleep(float(state.get("reset_s", 0)))  # a reset that takes a while
        if target in state.get("reset_fails", []):
            print(f"GPU {_smi_bus(buses[target])}: the reset did not complete (simulated)", file=sys.stderr)
            return 3
        _reset(opts, state, target)
        print(f"GPU {_smi_bus(buses[target])} was successfully reset.")
        return 0
    if "-q" in args:
        time.sleep(float(state.get("query_s", 0)))  # a sick GPU's query that takes a while
        print(f"==============NVSMI LOG==============\nAttached GPUs : {opts.gpus}\nGPU {_smi_bus(buses[target or 0])}")
        print("    Product Name : NVIDIA H100 80GB HBM3 (simulated)\n    Persistence Mode : (see state)")
        return 0
    print(f"fake nvidia-smi: {args} is not something the remedies ask", file=sys.stderr)
    return 2


def _reset(opts: argparse.Namespace, state: dict[str, Any], index: int) -> None:
    if index in state.get("reset_fails", []):
        return
    with open(opts.faults, "a") as f:
        f.write(json.dumps({"gpu": index, "reset": True}) + "\n")
    if index in state.get("gone_after_reset", []):
        _save(opts.state, state | {"gone": sorted({*state.get("gone", []), index})})


def _save(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    tmp.replace(path)


if __name__ == "__main__":
    sys.exit(main())
