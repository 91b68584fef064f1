"""The GPUs of this machine as nvidia-smi lists them, without a CUDA context (the launcher and the run record ask
before any process touches a GPU). No torch import."""

from __future__ import annotations

import shutil
import subprocess


def query(fields: tuple[str, ...], *, units: bool = True) -> list[list[str]]:
    """One row per GPU with the `--query-gpu` fields asked for (`units=False`: numbers without their units); [] where
    nvidia-smi is missing, fails or hangs."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    fmt = "csv,noheader" if units else "csv,noheader,nounits"
    try:
        res = subprocess.run(
            [smi, f"--query-gpu={','.join(fields)}", f"--format={fmt}"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    if res.returncode != 0:
        return []
    return [[c.strip() for c in line.split(",")] for line in res.stdout.strip().splitlines() if line.strip()]
