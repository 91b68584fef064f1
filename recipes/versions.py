"""The software stack: what the recipes are checked against, what a run actually imports, what an image holds.

`check_imported_stack()` runs on the compute node before Bridge builds anything: it records the version and file path
of every stack module the process imports and stops, naming them, when Megatron-Bridge or Megatron-Core is not the
release the recipes are written for (`CHECKED`). `python -m recipes.versions OUT.json` writes the stack of a built
image, once, at `docker build`.

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
from typing import Any

CHECKED: dict[str, str] = {"megatron.bridge": "0.6.2", "megatron.core": "0.19.2"}
"""Module -> the release whose source `recipes/` is written and tested against (tests/unit/test_recipes_live.py)."""

STACK_MODULES = ("torch", "transformer_engine", "megatron.core", "megatron.bridge", "emerging_optimizers")


def _module_version(module: Any) -> str | None:
    version = getattr(module, "__version__", None)
    if version is None:
        package = module.__name__.replace(".", "-").replace("_", "-")
        try:
            version = metadata.version(package)
        except metadata.PackageNotFoundError:
            return None
    return str(version)


def imported_stack(modules: tuple[str, ...] = STACK_MODULES) -> dict[str, dict[str, str | None]]:
    """Module -> {"version", "path"} as this process imports it (None for modules that do not import)."""
    import importlib

    out: dict[str, dict[str, str | None]] = {}
    for name in modules:
        try:
            module = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - recorded as absent, whatever the import error
            out[name] = {"version": None, "path": None}
            continue
        out[name] = {"version": _module_version(module), "path": getattr(module, "__file__", None)}
    return out


def check_imported_stack(checked: dict[str, str] | None = None) -> dict[str, dict[str, str | None]]:
    """`imported_stack()`, after checking the modules of `checked` (default `CHECKED`) import at those versions.

    Raises:
        RuntimeError: naming each module's wanted and imported version and where it was imported from.
    """
    checked = CHECKED if checked is None else checked
    stack = imported_stack(tuple(dict.fromkeys((*STACK_MODULES, *checked))))
    bad = [
        f"{name} {stack[name]['version']} from {stack[name]['path']} (recipes are checked against {want})"
        for name, want in checked.items()
        if stack[name]["version"] is None or stack[name]["version"].split("+")[0] != want
    ]
    if bad:
        raise RuntimeError(
            "the imported stack is not the one the recipes are written for: "
            + "; ".join(bad)
            + ". Build the image with the checked versions (make docker-build pins them) or install them "
            "(pip install megatron-core==0.19.2 megatron-bridge==0.6.2)."
        )
    return stack


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
