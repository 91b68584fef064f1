"""Sharded, reshardable, atomic checkpoints of a `LayerWiseDistributedOptimizer`'s state.

Each rank writes one file with the inner-optimizer state of the pieces it owns, keyed by (parameter name, dim-0
start, stop). Loading maps saved pieces onto the current owner layout, so a run saved at one data-parallel size
resumes at another: a new piece is either a saved piece as it was, or cut and concatenated from overlapping saved
pieces along dim 0 (momentum, Adam moments and any per-row or per-expert state follow dim 0 of the parameter;
0-d values such as step counters are taken from the first overlapping piece). Every rank reads every file
(`mmap`), so this suits optimizer state sizes that fit the local file system, not multi-terabyte states.

Atomicity: files go to `<name>.tmp.<pid>` first, are fsynced and then `os.replace`d, and the manifest
(`latest.json`, naming the tag and files) is replaced last, after all ranks finished writing. An interrupted save
leaves the previous manifest and the files it names intact, so loading never sees a truncated file.
The model parameters are saved separately by the caller (all ranks hold them after `finish_param_sync()`), and so
are the inner optimizer's hyperparameters (lr, betas: restore the LR scheduler); only per-parameter state is here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from optim.distributed.layerwise import LayerWiseDistributedOptimizer

MANIFEST = "latest.json"


def _atomic_write(path: Path, write: Any) -> None:
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _flat_states(inner: torch.optim.Optimizer) -> tuple[dict[str, Any], list[tuple[dict[str, Any], Any]]]:
    """The inner state_dict and, in parameter order, (torch-style sub-state-dict, index) of every parameter.

    Works for a torch.optim.Optimizer and for a container whose state_dict nests several of them (HybridOptimizer):
    the nested dicts appear in the order of `inner.param_groups`.
    """
    sd = inner.state_dict()
    slots: list[tuple[dict[str, Any], Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict) and "state" in node and "param_groups" in node:
            for g in node["param_groups"]:
                slots.extend((node, idx) for idx in g["params"])
        elif isinstance(node, dict):
            for v in node.values():
                walk(v)

    walk(sd)
    return sd, slots


def _param_order(inner: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for g in inner.param_groups for p in g["params"]]


def save_sharded(
    opt: LayerWiseDistributedOptimizer,
    directory: str | Path,
    *,
    tag: str,
    group: dist.ProcessGroup | None = None,
) -> None:
    """Write this rank's owned state as `<tag>.rank<r>.pt` and, after a barrier on `group`, the manifest (rank 0).

    `group` spans all ranks that save into `directory` (default: the whole world when initialised).
    """
    opt.finish_param_sync()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rank, size = (dist.get_rank(group), dist.get_world_size(group)) if dist.is_initialized() else (0, 1)
    pieces: dict[str, Any] = {}
    if opt.inner is not None:
        _, slots = _flat_states(opt.inner)
        by_id = {id(p): i for i, p in enumerate(_param_order(opt.inner))}
        for name, start, stop, view in opt.owned():
            node, idx = slots[by_id[id(view)]]
            pieces[f"{name}|{start}|{stop}"] = node["state"].get(idx, {})
    payload = {"format": 1, "tag": tag, "rank": rank, "num_ranks": size, "pieces": pieces}
    _atomic_write(directory / f"{tag}.rank{rank:05d}.pt", lambda f: torch.save(payload, f))
    if dist.is_initialized():
        dist.barrier(group)
    if rank == 0:
        manifest = {"tag": tag, "num_ranks": size, "files": [f"{tag}.rank{r:05d}.pt" for r in range(size)]}
        _atomic_write(directory / MANIFEST, lambda f: f.write(json.dumps(manifest).encode()))
    if dist.is_initialized():
        dist.barrier(group)


def load_sharded(opt: LayerWiseDistributedOptimizer, directory: str | Path) -> str:
    """Load the state named by the manifest into `opt` (any DP size); returns the tag.

    Call after the model parameters were restored: the owned master pieces are re-read from the model.
    """
    directory = Path(directory)
    manifest_path = directory / MANIFEST
    if not manifest_path.exists():
        raise ValueError(f"{directory}: no {MANIFEST}; not a complete checkpoint")
    manifest = json.loads(manifest_path.read_text())
    saved: dict[str, list[tuple[int, int, dict[str, Any]]]] = {}
    for fname in manifest["files"]:
        payload = torch.load(directory / fname, map_location="cpu", mmap=True, weights_only=True)
        if payload.get("tag") != manifest["tag"]:
            raise ValueError(
                f"{directory / fname}: tag {payload.get('tag')!r} != manifest {manifest['tag']!r}"
            )
        for key, state in payload["pieces"].items():
            name, start, stop = key.rsplit("|", 2)
            saved.setdefault(name, []).append((int(start), int(stop), state))
    for d in opt.domains:
        d.copy_model_to_shards()
    if opt.inner is None:
        return str(manifest["tag"])
    sd, slots = _flat_states(opt.inner)
    by_id = {id(p): i for i, p in enumerate(_param_order(opt.inner))}
    for name, start, stop, view in opt.owned():
        if name not in saved:
            raise ValueError(f"checkpoint {directory} has no state for parameter {name!r}")
        node, idx = slots[by_id[id(view)]]
        state = _assemble(saved[name], start, stop, name)
        if state:
            node["state"][idx] = state
    opt.inner.load_state_dict(sd)
    return str(manifest["tag"])


def _assemble(
    parts: list[tuple[int, int, dict[str, Any]]], start: int, stop: int, name: str
) -> dict[str, Any]:
    """State of rows [start, stop) from saved (start, stop, state) pieces of one parameter."""
    for a, b, st in parts:
        if (a, b) == (start, stop):
            return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in st.items()}
    covering = sorted((p for p in parts if p[0] < stop and p[1] > start), key=lambda p: p[0])
    if not covering or covering[0][0] > start or max(p[1] for p in covering) < stop:
        raise ValueError(f"checkpoint does not cover rows [{start}, {stop}) of {name!r}")
    out: dict[str, Any] = {}
    for key, first in covering[0][2].items():
        if (
            isinstance(first, torch.Tensor)
            and first.ndim >= 1
            and first.size(0) == covering[0][1] - covering[0][0]
        ):
            chunks = [st[key][max(start, a) - a : min(stop, b) - a] for a, b, st in covering]
            out[key] = torch.cat(chunks).clone()
        else:
            out[key] = first.clone() if isinstance(first, torch.Tensor) else first
    return out
