"""Start N gloo ranks (forked from a forkserver; FileStore) and run one worker function on each.

Workers are module-level functions `fn(rank, world_size, *args)`; an exception on any rank fails the test with that
rank's traceback. A rank started fresh imports torch, and torch._dynamo (which the first optimizer's
`add_param_group` pulls in), before any check: more than the checks cost. So ranks are forked from a forkserver
that imported those and the SUITE modules once (it starts single-threaded, so forking it is safe), and
`run_suite` runs the workers of every module in SUITE in one launch per world size, once per pytest run; each
module's test asserts that the shared run passed.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(
    rank: int, fn: Callable[..., None], world_size: int, store_path: str, args: tuple[Any, ...]
) -> None:
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    try:
        fn(rank, world_size, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # A rank that passed leaves without the interpreter's shutdown: gloo's threads can still be torn down there, and a
    # rank once aborted in it ("terminate called without an active exception", SIGABRT) after its checks had passed.
    # A failing rank raised above; spawn reports its traceback.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn(fn: Callable[..., None], world_size: int, *args: Any) -> None:
    """Run `fn(rank, world_size, *args)` on `world_size` gloo ranks; raises if any rank fails."""
    # Takes effect when the forkserver starts (the first call); an import that fails there fails again in the rank.
    mp.get_context("forkserver").set_forkserver_preload(list(PRELOAD))
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(
            _entry,
            args=(fn, world_size, os.path.join(tmp, "store"), args),
            nprocs=world_size,
            join=True,
            start_method="forkserver",
        )


def subgroups(world_size: int, size: int) -> tuple[list[dist.ProcessGroup], int]:
    """Partition ranks into consecutive groups of `size` (every rank must call this); returns (groups, my index)."""
    groups = [dist.new_group(list(range(i, i + size))) for i in range(0, world_size, size)]
    return groups, dist.get_rank() // size


def context(text: str) -> Callable[[str], str]:
    """`assert_close(..., msg=context("..."))`: keep the default message and append `text`."""
    return lambda default: f"{default}\n{text}"


# One spawn per world size for all of this area's gloo checks (spawning costs more than the checks).
SUITE: tuple[tuple[str, str], ...] = (
    ("test_tp_orthogonalize", "tp_worker"),
    ("test_layerwise", "layerwise_worker"),
    ("test_muon_tp", "muon_tp_worker"),
)
PRELOAD: tuple[str, ...] = (
    "torch",
    "torch._dynamo",
    "transformers.models.qwen3_moe.modeling_qwen3_moe",  # test_layerwise's tiny model
    __name__,
    *(module for module, _ in SUITE),
)
"""Imported once by the forkserver the ranks fork from."""
XDIST_GROUP = "gloo_suite"
"""The tests reading `run_suite` share one pytest-xdist worker (`xdist_group`), so the spawns happen once."""
_RESULTS: dict[int, str | None] = {}


def _suite_entry(rank: int, world_size: int, tmp: str, suite: tuple[tuple[str, str], ...]) -> None:
    import importlib

    for module, name in suite:
        getattr(importlib.import_module(module), name)(rank, world_size, tmp)


def run_suite(world_size: int) -> str | None:
    """Run every SUITE worker in one spawn of `world_size` ranks (once per pytest run); None, or the failure text
    (the failing rank's traceback names the worker). A failure stops the spawn, so later workers did not run."""
    if world_size not in _RESULTS:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                spawn(_suite_entry, world_size, tmp, SUITE)
                _RESULTS[world_size] = None
            except Exception as exc:  # noqa: BLE001 - reported by every test of the suite
                _RESULTS[world_size] = f"{type(exc).__name__}: {exc}"
    return _RESULTS[world_size]
