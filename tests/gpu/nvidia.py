"""How many NVIDIA GPUs this machine has, as nvidia-smi lists them (0 where there is none)."""

from __future__ import annotations

import shutil
import subprocess


def gpus() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return len(out.stdout.splitlines()) if out.returncode == 0 else 0
