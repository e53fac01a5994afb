"""The bundled MoE job's speed, side by side for each preset and option set, in one run.

    python -m bench.gpu_train [--presets 1b,h100] [--sets plain,auto] [--steps 60] [--batch 8] [--ranks 1]

Each run is the job itself (``trainer_hooks.moe_job.train``: the hook, the data loader and the
logging included), started as ``--ranks`` processes on this machine, one per GPU. After the first
``--warmup`` steps (compilation, allocator warm-up) it reports the median MFU (model FLOPs, as
``flops.py`` counts them) and tokens/s, the peak memory, and the step-time jitter (p90 over p50 of
the step time). Option sets:

- ``plain``: every speed option off (the CPU path);
- ``auto``: the job's defaults for the device (on a GPU: compile, fused RoPE, chunked
  cross-entropy, and activation checkpointing where the preset needs it);
- ``compile``, ``ac``: one option on top of ``plain``.

Recorded in bench/results/gpu_train.jsonl with the device's name, its driver and the torch version.
On a machine without a GPU it runs as well (the debug preset is the one that fits), for a check of
the bench itself: the figures are then a CPU's and say so.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from bench.record import append_result, header, percentile
from tests.training.launch import events, run

_OFF = {"--compile": "off", "--fused-rope": "off", "--ce-chunk-tokens": "0", "--activation-checkpointing": "none"}
SETS: dict[str, dict[str, str]] = {
    "plain": _OFF,
    "auto": {},
    "compile": _OFF | {"--compile": "on"},
    "ac": _OFF | {"--activation-checkpointing": "full"},
}


def device() -> dict[str, Any]:
    if not torch.cuda.is_available():
        return {"device": "cpu", "torch": torch.__version__}
    driver = subprocess.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
    ).stdout.strip()
    return {
        "device": torch.cuda.get_device_name(0),
        "driver": driver.splitlines()[0] if driver else "",
        "torch": torch.__version__,
    }


def one(preset: str, name: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    command = (
        "--preset", preset, "--steps", str(args.steps), "--global-batch", str(args.batch * args.ranks),
        "--checkpoint-every", str(args.steps + 1), "--log-every", "1",
        *(word for option in SETS[name].items() for word in option),
    )  # fmt: skip
    codes = run(args.ranks, out, *command, timeout=3600)
    if codes != [0] * args.ranks:
        return {"preset": preset, "set": name, "error": (out / "rank0.log").read_text()[-1500:]}
    steps = events(out, "step")[args.warmup :]
    mfus = [e["mfu"] for e in steps if e.get("mfu") is not None]
    step_s = [e["step_s"] for e in steps]
    peaks = [e["peak_gib"] for e in steps if e.get("peak_gib") is not None]
    return {
        "preset": preset,
        "set": name,
        "speed": events(out, "start")[0].get("speed"),
        "compiled": events(out, "start")[0].get("compiled"),
        "mfu": round(statistics.median(mfus), 4) if mfus else None,
        "tokens_per_s": round(statistics.median(e["tokens_per_s"] for e in steps), 1),
        "peak_gib": round(max(peaks), 2) if peaks else None,
        "step_jitter_p90_over_p50": round(percentile(step_s, 0.9) / statistics.median(step_s), 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    on_gpu = torch.cuda.is_available()
    parser.add_argument("--presets", default="1b,h100" if on_gpu else "debug")
    parser.add_argument("--sets", default="plain,auto")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=15, help="steps left out: compilation, warm-up")
    parser.add_argument("--batch", type=int, default=8, help="sequences per rank")
    parser.add_argument("--ranks", type=int, default=max(1, torch.cuda.device_count()))
    args = parser.parse_args()
    if unknown := [s for s in args.sets.split(",") if s not in SETS]:
        parser.error(f"no option set {unknown}; sets: {', '.join(SETS)}")
    if args.warmup >= args.steps:
        parser.error("--warmup must leave steps to measure")
    runs = []
    with tempfile.TemporaryDirectory(prefix="vigil-gpu-train-") as tmp:
        for preset in args.presets.split(","):
            for name in args.sets.split(","):
                runs.append(one(preset, name, args, Path(tmp) / f"{preset}-{name}"))
                r = runs[-1]
                if "error" in r:
                    print(f"{preset:6} {name:8}: failed\n{r['error']}", file=sys.stderr)
                    continue
                mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "-"
                print(
                    f"{preset:6} {name:8}: MFU {mfu}, {r['tokens_per_s']:.0f} tokens/s, "
                    f"peak {r['peak_gib'] or '-'} GiB, step jitter p90/p50 {r['step_jitter_p90_over_p50']}"
                )
    append_result("gpu_train", {**header("gpu_train", **device()), "steps": args.steps, "batch": args.batch,
                                "ranks": args.ranks, "runs": runs})  # fmt: skip
    return 1 if any("error" in r for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
