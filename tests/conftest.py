"""Shared fixtures: seeds, device, and the GPU marker's skip."""

from __future__ import annotations

import importlib.util
import os
import random
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HYDRA_FULL_ERROR", "1")
# predictions in tests rest on the shipped hardware profiles only, never on one `muonbench calibrate` wrote here
os.environ["MUONBENCH_HARDWARE_PROFILES"] = str(Path(tempfile.mkdtemp(prefix="muonbench_profiles_")))


def selects_gpu(markexpr: str) -> bool:
    """A `-m` expression that asks for the `gpu` marker (`gpu`, `gpu and slow`), not one that excludes it."""
    words = markexpr.replace("(", " ").replace(")", " ").split()
    return any(w == "gpu" and (i == 0 or words[i - 1] != "not") for i, w in enumerate(words))


class XdistGroups:
    """`--dist loadgroup` sends tests marked `xdist_group` to one worker by a `@group` suffix xdist 3.8 writes to
    `item._nodeid`; pytest 9 reads a node's id from `item._id`, so without this the suffix is lost and the group's
    tests spread over workers (the gloo suite then spawns its ranks once per worker, not once). Older pytest reads
    `_nodeid` itself and needs nothing."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        from _pytest.nodeid import coerce_node_id

        for item in items:
            tagged = getattr(item, "_nodeid", None)
            if isinstance(tagged, str) and tagged != item.nodeid:
                item._id = coerce_node_id(tagged)


def pytest_configure(config: pytest.Config) -> None:
    if importlib.util.find_spec("_pytest.nodeid") is not None:
        config.pluginmanager.register(XdistGroups(), "muonbench-xdist-groups")
    if importlib.util.find_spec("absl") is not None:
        # absl's handler (made on import, attached to no logger) keeps the sys.stderr of its import, which under
        # pytest is a capture buffer, and closes it when any later logging.config call (Hydra's, in-process)
        # shuts all handlers down unless it is the current sys.stderr: a later test's capture then fails. The
        # interpreter's own stream is one absl never closes.
        import sys

        from absl import logging as absl_logging

        absl_logging.get_absl_handler().python_handler.stream = sys.__stderr__


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `gpu` are skipped, with the reason, where CUDA is missing; selecting them with `-m gpu` there
    is a usage error (`make test-gpu` without CUDA would otherwise pass having run nothing)."""
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        has_cuda = False
    if has_cuda:
        return
    if selects_gpu(config.getoption("markexpr") or ""):
        raise pytest.UsageError(
            f"-m {config.getoption('markexpr')!r} selects the GPU tests and CUDA is not available here: every one "
            "would be skipped and the run would pass having checked nothing; run it on a GPU machine"
        )
    skip = pytest.mark.skip(reason="needs CUDA (run `make test-gpu` on a GPU machine)")
    for item in items:
        if (
            item.get_closest_marker("gpu") is not None
        ):  # the marker, not the keyword (which matches tests/gpu/)
            item.add_marker(skip)


@pytest.fixture
def seed() -> int:
    import numpy as np
    import torch

    random.seed(1234)
    np.random.seed(1234)
    torch.manual_seed(1234)
    return 1234


@pytest.fixture
def device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def small_disk(tmp_path):
    """Mounts a tmpfs of the given size (e.g. "256k") at a new folder and returns it: a real disk that fills up.
    Needs root (or CAP_SYS_ADMIN); skips with the reason where mounting is not permitted."""
    mounted: list[str] = []

    def mount(size: str) -> Path:
        disk = tmp_path / f"disk{len(mounted)}"
        disk.mkdir()
        if shutil.which("mount") is None:
            pytest.skip("no mount command: a real full disk cannot be made here")
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)],
                             capture_output=True, text=True, check=False)  # fmt: skip
        if res.returncode != 0:
            pytest.skip(f"mounting a small tmpfs is not permitted here: {res.stderr.strip() or res.returncode}")
        mounted.append(str(disk))
        return disk

    yield mount
    for disk in mounted:
        subprocess.run(["umount", "-l", disk], check=False)
