"""Tensor-parallel sharding of Muon / MOP: parameters with a `TPSpec` are shards of a larger matrix.

Their pieces are orthogonalized by `tp_newton_schulz` in the spec's mode (one batched call per equal local shape,
dim, group, shard sizes and mode), scaled by the FULL piece shape (blockwise: the shard's own shape, so that it
equals per-shard Muon, as MCore's blockwise). A fused split (QKV, gate/up) of a row-sharded parameter is taken as
per-rank blocks of equal size (Megatron's layout). Every rank of a TP group must step the same sharded parameters
in the same order, so non-finite skips of sharded parameters are agreed over each TP group (a 1-element all-reduce
per group and step). The reference is the single-process step (`tp_group=None`): tests/dist/test_muon_tp.py.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

import torch

from optim.distributed.tp_orthogonalize import TPMode, tp_newton_schulz
from optim.optimizers.base import Entry as _Entry
from optim.optimizers.base import param_names
from optim.optimizers.tp import TPModeFn, TPSpec, resolve_mode

if TYPE_CHECKING:
    from optim.functional.split import RowSplit


def _all_reduce_min(t: torch.Tensor, group: Any) -> None:
    import torch.distributed as dist

    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)


def _all_ranks_true(flag: bool, group: Any, device: torch.device) -> bool:
    """True when `flag` is True on every rank of `group` (a 1-element MIN all-reduce)."""
    t = torch.tensor([float(flag)], device=device)
    _all_reduce_min(t, group)
    return bool(t.item() == 1.0)


class TPShardedMixin(torch.optim.Optimizer):
    """The TP-shard part of `OrthogonalizedOptimizer` (its `__init__` sets the attributes declared here)."""

    if TYPE_CHECKING:
        config: Any
        splits: dict[int, RowSplit]
        tp: dict[int, TPSpec]
        tp_mode_fn: TPModeFn | None
        tp_modes: dict[str, str]
        _tp_mode: dict[int, TPMode]

        def _shape_scale(self, rows: int, cols: int) -> float: ...

    def _tp_ns_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `tp_newton_schulz` besides mode, dim, group and shard sizes."""
        raise NotImplementedError(f"{type(self).__name__} does not support tensor-parallel parameters")

    def _orthogonalize_tp(
        self, x: torch.Tensor, *, mode: TPMode, spec: TPSpec, shard_sizes: tuple[int, ...] | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, r, c) shards (any orientation, sharded along spec.dim) -> (orthogonalized shards, optional scale)."""
        out = tp_newton_schulz(
            x,
            mode=mode,
            partition_dim=spec.dim,
            tp_group=spec.group,
            shard_sizes=shard_sizes,
            **self._tp_ns_kwargs(),
        )
        return out, None

    def _check_tp(self) -> None:
        if not self.tp:
            return
        names = param_names(self.param_groups)
        known = {id(p): p for g in self.param_groups for p in g["params"]}
        for pid, spec in self.tp.items():
            if pid not in known:
                raise ValueError(
                    "tp: a TPSpec is keyed by a tensor that is not one of the optimizer's parameters"
                )
            p = known[pid]
            spec.check(p, names[pid])
            split = self.splits.get(pid)
            if split is not None and spec.dim == -2 and spec.shard_sizes is not None:
                raise ValueError(
                    f"{names[pid]}: a row split of a row-sharded parameter needs shard_sizes=None "
                    "(equal per-rank blocks)"
                )
            if spec.mode == "auto" and self.tp_mode_fn is None:
                raise ValueError(f"{names[pid]}: TPSpec mode='auto' needs tp_mode_fn")
            if spec.mode != "auto":
                self._tp_mode[pid] = resolve_mode(spec, p, None, names[pid])
                self.tp_modes[names[pid]] = self._tp_mode[pid].value

    def _tp_groups(self, entries: list[_Entry]) -> list[Any]:
        """The distinct process groups (size > 1) of the TP-sharded entries, in first-seen order."""
        out: list[Any] = []
        for e in entries:
            spec = self.tp.get(id(e.p))
            if (
                spec is not None
                and spec.group is not None
                and spec.size() > 1
                and all(spec.group is not g for g in out)
            ):
                out.append(spec.group)
        return out

    def _tp_mode_of(self, p: torch.Tensor) -> TPMode:
        mode = self._tp_mode.get(id(p))
        if mode is None:
            name = param_names(self.param_groups)[id(p)]
            mode = resolve_mode(self.tp[id(p)], p, self.tp_mode_fn, name)
            self._tp_mode[id(p)] = mode
            self.tp_modes[name] = mode.value
        return mode

    def _orthogonalize_sharded(self, items: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
        """TP shards: split, one `_orthogonalize_tp` call per (local shape, spec, mode), full-shape scale, merge.

        Every rank of a TP group must step the same sharded parameters in the same order (collectives)."""
        pieces: list[list[torch.Tensor]] = []
        buckets: dict[Hashable, list[tuple[int, int]]] = {}
        for i, (p, m) in enumerate(items):
            spec, mode = self.tp[id(p)], self._tp_mode_of(p)
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
            parts = [pieces[i][j] for i, j in idxs]
            spec, mode = self.tp[id(items[idxs[0][0]][0])], self._tp_mode[id(items[idxs[0][0]][0])]
            views = [part.reshape(-1, *part.shape[-2:]) for part in parts]
            x = (views[0] if len(views) == 1 else torch.cat(views)).contiguous()
            # A split part of a row-sharded parameter is sharded in equal per-rank blocks (checked at construction).
            sizes = (
                spec.shard_sizes
                if self.splits.get(id(items[idxs[0][0]][0])) is None or spec.dim == -1
                else None
            )
            orth, mscale = self._orthogonalize_tp(x, mode=mode, spec=spec, shard_sizes=sizes)
            # Blockwise: the shard is the matrix (equals per-shard Muon, as MCore's blockwise).
            rows, cols = x.shape[-2:]
            if mode == TPMode.BLOCKWISE:
                pass
            elif spec.dim == -2:
                rows = sum(sizes) if sizes is not None else rows * spec.size()
            else:
                cols = sum(sizes) if sizes is not None else cols * spec.size()
            orth = orth * self._shape_scale(rows, cols)
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
