"""`python -m recipes.versions OUT.json`: the software stack of a built image, written once at `docker build`.

Read from package metadata (nothing heavy is imported except torch for its CUDA version), plus the base image and
our git SHA passed as build arguments (`BASE_IMAGE`, `GIT_SHA` environment variables). Every run.json copies the
file named by `MUONBENCH_VERSIONS` (set in the Dockerfile).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from importlib import metadata
from pathlib import Path

PACKAGES = (
    "torch",
    "transformer-engine",
    "transformer_engine",
    "megatron-core",
    "megatron-bridge",
    "emerging-optimizers",
    "nvidia-nccl-cu12",
    "nvidia-nccl-cu13",
    "triton",
    "hydra-core",
    "omegaconf",
    "muonbench",
)


def stack() -> dict[str, object]:
    """Versions of the packages that decide a benchmark number (None where absent)."""
    out: dict[str, object] = {
        "python": platform.python_version(),
        "base_image": os.environ.get("BASE_IMAGE"),
        "muonbench_git_sha": os.environ.get("GIT_SHA") or None,
    }
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    try:
        import torch

        out["torch_cuda"] = torch.version.cuda
    except ImportError:
        out["torch_cuda"] = None
    return out


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m recipes.versions OUT.json")
    Path(args[0]).write_text(json.dumps(stack(), indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
