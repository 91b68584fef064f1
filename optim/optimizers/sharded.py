"""Tensor-parallel sharding of Muon / MOP: parameters with a `TPSpec` are shards of a larger matrix.

`TPSharding` owns the specs, the resolved TP modes and the TP-group agreement on skips. Its pieces are
orthogonalized by the optimizer's `_orthogonalize_tp` (`tp_newton_schulz` in the spec's mode; one batched call per
equal local shape, dim, group, shard sizes and mode), scaled by the FULL piece shape (blockwise: the shard's own
shape, so that it equals per-shard Muon, as MCore's blockwise). A fused split (QKV, gate/up) of a row-sharded
parameter is taken as per-rank blocks of equal size (Megatron's layout). Every rank of a TP group must step the
same sharded parameters in the same order, so non-finite skips of sharded parameters are agreed over each TP group
(a 1-element all-reduce per group and step). The reference is the single-process step (`tp_group=None`):
tests/dist/test_muon_tp.py.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import torch

from optim.configs import TPMode
from optim.functional.split import RowSplit
from optim.optimizers.base import param_names
from optim.optimizers.tp import TPModeFn, TPSpec, resolve_mode

# (B, r, c) shards, keyword mode, spec and shard sizes -> (orthogonalized shards, optional per-matrix scale)
type TPOrthogonalize = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


def _all_reduce_min(t: torch.Tensor, group: Any) -> None:
    import torch.distributed as dist

    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)


class TPSharding:
    """The TP-sharded parameters of one optimizer: their specs, modes, skip agreement and orthogonalization.

    Args:
        param_groups: the optimizer's groups (for names and to check that every spec keys one of its parameters).
        specs: parameter -> its TPSpec.
        splits: id(parameter) -> RowSplit, the optimizer's (shared, read at each step).
        mode_fn: picks the mode of `mode="auto"` specs, `(rows, cols, tp, partition_dim) -> mode`.
    """

    def __init__(
        self,
        param_groups: list[dict[str, Any]],
        specs: dict[torch.Tensor, TPSpec],
        splits: dict[int, RowSplit],
        mode_fn: TPModeFn | None,
    ) -> None:
        self.param_groups = param_groups
        self.specs: dict[int, TPSpec] = {id(p): s for p, s in specs.items()}
        self.splits = splits
        self.mode_fn = mode_fn
        self.modes: dict[str, str] = {}
        """Parameter name -> the TP mode it runs (fixed modes at construction, "auto" ones after the first step)."""
        self._mode: dict[int, TPMode] = {}
        names = param_names(param_groups)
        known = {id(p): p for g in param_groups for p in g["params"]}
        for pid, spec in self.specs.items():
            if pid not in known:
                raise ValueError("tp: a TPSpec is keyed by a tensor that is not one of the optimizer's parameters")
            p = known[pid]
            spec.check(p, names[pid])
            if pid in splits and spec.dim == -2 and spec.shard_sizes is not None:
                raise ValueError(
                    f"{names[pid]}: a row split of a row-sharded parameter needs shard_sizes=None "
                    "(equal per-rank blocks)"
                )
            if spec.mode == "auto" and mode_fn is None:
                raise ValueError(f"{names[pid]}: TPSpec mode='auto' needs tp_mode_fn")
            if spec.mode != "auto":
                self._mode[pid] = resolve_mode(spec, p, None, names[pid])
                self.modes[names[pid]] = self._mode[pid].value

    def owns(self, p: torch.Tensor) -> bool:
        return id(p) in self.specs

    def rekey(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Move specs and modes from each old tensor to its new one (Megatron's fp32 copies of bf16 parameters)."""
        _rekey(self.specs, pairs)
        _rekey(self._mode, pairs)

    def failed_groups(self, params: list[torch.Tensor], local_ok: bool) -> list[Any]:
        """The TP groups (size > 1, first-seen order) of the sharded `params` in which some rank's non-finite
        screen failed (`local_ok` is this rank's): one 1-element all-reduce per group."""
        device = params[0].device
        groups: list[Any] = []
        for p in params:
            spec = self.specs.get(id(p))
            if (
                spec is not None
                and spec.group is not None
                and spec.size() > 1
                and all(spec.group is not g for g in groups)
            ):
                groups.append(spec.group)
        failed = []
        for grp in groups:
            flag = torch.tensor([float(local_ok)], device=device)
            _all_reduce_min(flag, grp)
            if flag.item() != 1.0:
                failed.append(grp)
        return failed

    def agree(self, params: list[torch.Tensor], ok: list[bool], failed: list[Any]) -> list[bool]:
        """`ok` (this rank's finite flag per parameter) with each sharded parameter of a `failed` group False on
        every rank of it when any rank's shard failed (a per-parameter all-reduce per group), so that the group's
        NS collectives stay matched."""
        out = list(ok)
        for grp in failed:
            idx = [i for i, p in enumerate(params) if id(p) in self.specs and self.specs[id(p)].group is grp]
            mine = torch.tensor([float(ok[i]) for i in idx], device=params[0].device)
            _all_reduce_min(mine, grp)
            for i, good in zip(idx, mine.tolist(), strict=True):
                out[i] = out[i] and bool(good)
        return out

    def mode_of(self, p: torch.Tensor) -> TPMode:
        mode = self._mode.get(id(p))
        if mode is None:
            name = param_names(self.param_groups)[id(p)]
            mode = resolve_mode(self.specs[id(p)], p, self.mode_fn, name)
            self._mode[id(p)] = mode
            self.modes[name] = mode.value
        return mode

    def orthogonalize(
        self,
        items: list[tuple[torch.Tensor, torch.Tensor]],
        ns: TPOrthogonalize,
        scale: Callable[[int, int], float],
    ) -> list[torch.Tensor]:
        """(parameter, momentum) of TP shards -> scaled updates: split, one `ns` call per (local shape, spec, mode),
        full-shape `scale`, merge. Every rank of a TP group must step the same sharded parameters in order."""
        pieces: list[list[torch.Tensor]] = []
        buckets: dict[Hashable, list[tuple[int, int]]] = {}
        for i, (p, m) in enumerate(items):
            spec, mode = self.specs[id(p)], self.mode_of(p)
            split = self.splits.get(id(p))
            parts = split.split(m) if split is not None else [m]
            pieces.append(parts)
            for j, part in enumerate(parts):
                key = (
                    tuple(part.shape[-2:]),
                    spec.dim,
                    id(spec.group),
                    spec.shard_sizes,
                    mode,
                    part.dtype,
                    part.device,
                    split is None,
                )
                buckets.setdefault(key, []).append((i, j))
        for idxs in buckets.values():
            p0 = items[idxs[0][0]][0]
            parts = [pieces[i][j] for i, j in idxs]
            spec, mode = self.specs[id(p0)], self._mode[id(p0)]
            views = [part.reshape(-1, *part.shape[-2:]) for part in parts]
            x = (views[0] if len(views) == 1 else torch.cat(views)).contiguous()
            # A split part of a row-sharded parameter is sharded in equal per-rank blocks (checked at construction).
            sizes = spec.shard_sizes if self.splits.get(id(p0)) is None or spec.dim == -1 else None
            orth, mscale = ns(x, mode=mode, spec=spec, shard_sizes=sizes)
            # Blockwise: the shard is the matrix (equals per-shard Muon, as MCore's blockwise).
            rows, cols = x.shape[-2:]
            if mode == TPMode.BLOCKWISE:
                pass
            elif spec.dim == -2:
                rows = sum(sizes) if sizes is not None else rows * spec.size()
            else:
                cols = sum(sizes) if sizes is not None else cols * spec.size()
            orth = orth * scale(rows, cols)
            if mscale is not None:
                orth.mul_(mscale.view(-1, 1, 1))
            outs = torch.split(orth, [v.size(0) for v in views])
            for (i, j), o, part in zip(idxs, outs, parts, strict=True):
                pieces[i][j] = o.reshape(part.shape)
        result = []
        for (p, _), parts_out in zip(items, pieces, strict=True):
            split = self.splits.get(id(p))
            result.append(split.merge(parts_out) if split is not None else parts_out[0])
        return result


def _rekey[V](table: dict[int, V], pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """`table` keyed by the ids of each pair's new tensor instead of its old one (entries of other ids dropped)."""
    moved = {id(new): table[id(old)] for old, new in pairs if id(old) in table}
    table.clear()
    table.update(moved)
