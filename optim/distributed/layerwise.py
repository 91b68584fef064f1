"""Layer-wise distributed optimizer: whole matrices owned by one data-parallel rank, which runs the optimizer.

Per step, for each domain (dense parameters over the DP group, expert parameters over the expert-DP group) and
each bucket of its `optim.distributed.layout`:

1. Gradient sync. `GradSync.REDUCE_SCATTER` (ours): local gradients are packed into the owner-aligned flat buffer
   and one `reduce_scatter_tensor` leaves each rank the summed gradients of exactly the pieces it owns
   ((N - 1) / N of the padded buffer sent per rank, AdamW's traffic). `GradSync.ALL_REDUCE` (the published
   Megatron-Core legacy path): the same buffer all-reduced (2 (N - 1) / N), each owner reads its pieces.
2. Optional global grad-norm clipping: owned squared norms summed over `norm_group` (pieces are disjoint).
3. The inner optimizer (Muon / MOP / SOAP + AdamW from a factory, e.g. `optim.build_optimizer`) steps only the
   owned pieces: `nn.Parameter` views into this rank's segment of a flat master buffer, named like the model
   parameters so routing, splits and per-group settings are unchanged.
4. Parameter all-gather (all_gatherv of the per-rank segments). `ShardCollective.PADDED`: segments padded to the
   largest and one `all_gather_into_tensor` (one launch, ring bandwidth, zero-copy from the segment buffer); wins
   whenever segments are close in size, which the layout's AdamW filling arranges. `ShardCollective.PER_OWNER`: one
   broadcast per owner of its exact bytes (N launches, no padding, each rank sends ~every byte once); wins when
   one rank holds a huge matrix (Kimi K2's dense fc1 is 4.3x the average segment of its stage) and the padding
   would multiply the bytes. `AUTO` picks PADDED when the padding is <= 25%, per bucket. Grouped send/recv (what
   NCCL does for a list all_gather, and MCore legacy) makes the owner of the largest share send it N - 1 times,
   as slow as PADDED on its slowest rank, with N - 1 times more launches. The reduce-scatter of step 1 uses the
   same choice: padded `reduce_scatter_tensor`, or one `reduce` per owner into its exact segment.
   With `overlap_param_gather`, gathers are left in flight (async work handles) and each bucket is waited for and
   copied into the model by a forward pre-hook of the first module that uses it (`register_forward_hooks`), or
   by `finish_param_sync()` (called at the start of `step` and before checkpoints). With `overlap_grad_reduce`,
   step 1 starts from post-accumulate-grad hooks: a bucket's collective is launched during backward as soon as
   its last gradient is accumulated, and `step` only waits (micro-batches before the last run under `no_sync()`).

Why the AdamW part is sharded element-wise (dim-0 cuts) rather than owned whole: an owner-per-tensor AdamW puts a
whole embedding (Kimi K2: 1.17 B elements, ~14 GB of fp32 state) on one rank and makes the padded gather useless;
cut element-wise it costs the same per element anywhere and levels the segments.

Assumptions: every trainable parameter gets a gradient each step (missing ones count as zeros, as in DDP), model
parameters are identical on all ranks at construction, and all parameters of a domain share one dtype.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from optim.distributed.assignment import CostModel, Strategy, canonical
from optim.distributed.comm import group_rank_size
from optim.distributed.layout import Bucket, Piece, build_layout

OptimizerFactory = Callable[[list[tuple[str, torch.Tensor]]], torch.optim.Optimizer]


class GradSync(StrEnum):
    REDUCE_SCATTER = "reduce_scatter"
    ALL_REDUCE = "all_reduce"


class ShardCollective(StrEnum):
    """How variable-size per-rank segments move (grads to owners, params from owners)."""

    AUTO = "auto"
    PADDED = "padded"
    PER_OWNER = "per_owner"


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerWiseConfig:
    """How matrices are placed and how gradients and parameters move."""

    strategy: Strategy = Strategy.LPT_COST
    """round_robin | ping_pong_numel | lpt_cost (see optim.distributed.assignment)."""
    grad_sync: GradSync = GradSync.REDUCE_SCATTER
    collective: ShardCollective = ShardCollective.AUTO
    """padded | per_owner | auto (padded when the bucket's padding is <= 25%), for both grads and params."""
    overlap_param_gather: bool = False
    """Leave the parameter all-gather in flight; complete it in forward pre-hooks."""
    overlap_grad_reduce: bool = False
    """Start a bucket's gradient collective from backward hooks as soon as all its gradients are accumulated
    (run all but the last micro-batch under `no_sync()`)."""
    bucket_numel: int = 40_000_000
    """Elements per bucket (model order; MCore's DDP default size); 0 = one bucket per domain. Each bucket is one
    all-gather that a forward pre-hook can wait for on its own."""
    average_grads: bool = True
    """Divide the summed gradients by the group size (each rank's loss is its local mean)."""
    max_grad_norm: float = 0.0
    """Clip the global gradient norm to this value; 0 = no clipping."""
    cost_model: CostModel | None = None
    """NS cost model or measured table for lpt_cost; None = analytic default."""

    def __post_init__(self) -> None:
        for name, enum in (("strategy", Strategy), ("grad_sync", GradSync), ("collective", ShardCollective)):
            value = getattr(self, name)
            if value not in {e.value for e in enum}:
                raise ValueError(
                    f"LayerWiseConfig.{name}={value!r}: must be one of {[e.value for e in enum]}"
                )
        if self.bucket_numel < 0 or self.max_grad_norm < 0:
            raise ValueError(
                f"LayerWiseConfig: bucket_numel={self.bucket_numel}, max_grad_norm="
                f"{self.max_grad_norm} must be >= 0"
            )


def default_is_expert(name: str) -> bool:
    """MCore rule: names with an `experts` part (not `shared_experts`) are expert weights."""
    return "experts" in name.split(".")


class _Domain:
    """One group and its parameters, layout, flat buffers and owned piece views."""

    def __init__(
        self,
        named: list[tuple[str, nn.Parameter]],
        is_matrix: Sequence[bool],
        group: dist.ProcessGroup | None,
        cfg: LayerWiseConfig,
        initial_loads: Sequence[float] | None = None,
    ) -> None:
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.group = group
        self.rank, self.size = group_rank_size(group)
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) > 1:
            raise ValueError(f"parameters of one domain must share a dtype, got {sorted(map(str, dtypes))}")
        self.is_matrix = list(is_matrix)
        layout = build_layout(
            [tuple(p.shape) for p in self.params],
            is_matrix,
            self.size,
            strategy=cfg.strategy,
            cost_model=cfg.cost_model,
            bucket_numel=cfg.bucket_numel,
            initial_loads=initial_loads,
        )
        self.buckets: list[Bucket] = layout.buckets
        dtype = self.params[0].dtype if self.params else torch.float32
        device = self.device = self.params[0].device if self.params else torch.device("cpu")
        self.shard_params = [torch.zeros(b.segment_numel, dtype=dtype, device=device) for b in self.buckets]
        self.shard_grads = [torch.zeros(b.segment_numel, dtype=dtype, device=device) for b in self.buckets]
        self.owned: list[tuple[str, nn.Parameter, int, int]] = []  # (name, view, bucket, piece index)
        for bi, b in enumerate(self.buckets):
            for k, pc in enumerate(b.pieces[self.rank]):
                view = self._piece_view(self.shard_params[bi], pc)
                self.owned.append((self.names[pc.index], nn.Parameter(view), bi, k))
        self.mode = [self._mode(b, ShardCollective(cfg.collective)) for b in self.buckets]
        self.pending: dict[int, tuple[list[Any], torch.Tensor]] = {}
        self.pending_grads: dict[int, tuple[list[Any], torch.Tensor]] = {}
        self.copy_model_to_shards()

    def _piece_view(self, flat: torch.Tensor, pc: Piece) -> torch.Tensor:
        p = self.params[pc.index]
        shape = (pc.stop - pc.start, *p.shape[1:]) if p.ndim else p.shape
        return flat[pc.offset : pc.offset + pc.numel].view(shape)

    def _model_slice(self, pc: Piece) -> torch.Tensor:
        data: torch.Tensor = self.params[pc.index].data
        return data[pc.start : pc.stop] if data.ndim else data

    @staticmethod
    def _mode(b: Bucket, mode: ShardCollective) -> ShardCollective:
        if mode != ShardCollective.AUTO:
            return mode
        return ShardCollective.PADDED if b.padding <= 0.25 else ShardCollective.PER_OWNER

    def copy_model_to_shards(self) -> None:
        for bi, b in enumerate(self.buckets):
            for pc in b.pieces[self.rank]:
                self._piece_view(self.shard_params[bi], pc).copy_(self._model_slice(pc))

    def launch_grad_sync(self, bi: int, grad_sync: GradSync) -> None:
        """Pack bucket `bi`'s local gradients into the owner-aligned buffer and start its collective (async)."""
        b, seg = self.buckets[bi], self.buckets[bi].segment_numel
        flat = self.shard_grads[bi].new_zeros(self.size * seg)
        for r, pieces in enumerate(b.pieces):
            for pc in pieces:
                g = self.params[pc.index].grad
                if g is not None:
                    dst = flat[r * seg + pc.offset : r * seg + pc.offset + pc.numel]
                    dst.copy_((g[pc.start : pc.stop] if g.ndim else g).reshape(-1))
        works: list[Any] = []
        if self.size == 1:
            pass
        elif grad_sync == GradSync.REDUCE_SCATTER and self.mode[bi] == ShardCollective.PADDED:
            works = [dist.reduce_scatter_tensor(self.shard_grads[bi], flat, group=self.group, async_op=True)]
        elif grad_sync == GradSync.REDUCE_SCATTER:
            sizes = b.sizes()
            works = [
                dist.reduce(
                    flat[r * seg : r * seg + sizes[r]], dst=self._global(r), group=self.group, async_op=True
                )
                for r in range(self.size)
                if sizes[r]
            ]
        else:
            works = [dist.all_reduce(flat, group=self.group, async_op=True)]
        self.pending_grads[bi] = (works, flat)

    def finish_grad_sync(self, bi: int, grad_sync: GradSync, average: bool) -> None:
        """Wait for bucket `bi`'s gradient collective; leave this rank's reduced segment in `shard_grads[bi]`."""
        works, flat = self.pending_grads.pop(bi)
        for w in works:
            w.wait()
        seg = self.buckets[bi].segment_numel
        padded_rs = (
            self.size > 1 and grad_sync == GradSync.REDUCE_SCATTER and self.mode[bi] == ShardCollective.PADDED
        )
        if not padded_rs:  # the padded reduce-scatter wrote shard_grads directly
            self.shard_grads[bi].copy_(flat[self.rank * seg : (self.rank + 1) * seg])
        if average and self.size > 1:
            self.shard_grads[bi].div_(self.size)

    def sync_grads(self, grad_sync: GradSync, average: bool) -> None:
        """Reduce every bucket to its owners (buckets already launched by backward hooks are only waited for)."""
        for bi in range(len(self.buckets)):
            if bi not in self.pending_grads:
                self.launch_grad_sync(bi, grad_sync)
            self.finish_grad_sync(bi, grad_sync, average)
        for _, view, bi, k in self.owned:
            view.grad = self._piece_view(self.shard_grads[bi], self.buckets[bi].pieces[self.rank][k])

    def start_gather(self, bi: int) -> None:
        b, seg = self.buckets[bi], self.buckets[bi].segment_numel
        full = self.shard_params[bi].new_empty(self.size * seg)
        if self.size == 1:
            full.copy_(self.shard_params[bi])
            self.pending[bi] = ([], full)
            return
        if self.mode[bi] == ShardCollective.PADDED:
            works = [
                dist.all_gather_into_tensor(full, self.shard_params[bi], group=self.group, async_op=True)
            ]
        else:
            sizes = b.sizes()
            full[self.rank * seg : self.rank * seg + sizes[self.rank]].copy_(
                self.shard_params[bi][: sizes[self.rank]]
            )
            works = [
                dist.broadcast(
                    full[r * seg : r * seg + sizes[r]], src=self._global(r), group=self.group, async_op=True
                )
                for r in range(self.size)
                if sizes[r]
            ]
        self.pending[bi] = (works, full)

    def _global(self, r: int) -> int:
        return dist.get_global_rank(self.group, r) if self.group is not None else r

    def finish_gather(self, bi: int) -> None:
        if bi not in self.pending:
            return
        works, full = self.pending.pop(bi)
        for w in works:
            w.wait()
        b, seg = self.buckets[bi], self.buckets[bi].segment_numel
        for r, pieces in enumerate(b.pieces):
            for pc in pieces:
                src = full[r * seg + pc.offset : r * seg + pc.offset + pc.numel]
                dst = self._model_slice(pc)
                dst.copy_(src.view(dst.shape))

    def ns_load_ms(self, cost_model: CostModel) -> float:
        """Modelled NS milliseconds of the matrices this rank owns (batched per shape)."""
        counts: dict[tuple[int, int], int] = {}
        for b in self.buckets:
            for pc in b.pieces[self.rank]:
                p = self.params[pc.index]
                if self.is_matrix[pc.index]:
                    key = canonical(p.shape)
                    counts[key] = counts.get(key, 0) + (pc.stop - pc.start if p.ndim == 3 else 1)
        return sum(cost_model.group_ms(k, c) for k, c in counts.items())

    def owned_sq_norm(self) -> torch.Tensor:
        return sum((g.float().square().sum() for g in self.shard_grads), torch.zeros((), device=self.device))


class LayerWiseDistributedOptimizer:
    """Owner-computes optimizer over a data-parallel group (see the module docstring).

    Args:
        named_params: model parameters in model order (e.g. `model.named_parameters()`); frozen ones are skipped.
        optimizer_factory: builds the inner optimizer from this rank's owned (name, tensor) pieces, e.g.
            `lambda named: build_optimizer(named, MuonConfig(...))`. Called once (not called if nothing is owned).
        is_matrix: (name, parameter) -> whether the matrix optimizer takes it whole (default: 2-D / 3-D parameters
            that `optim.routing` routes to the matrix optimizer, HF naming).
        dp_group: data-parallel group of dense parameters; None = single process.
        expert_dp_group: group of expert parameters; "dp" = the same as dp_group.
        is_expert: name -> expert parameter (default: an `experts` name part, as MCore).
        norm_group: group over which owned squared grad norms are summed for clipping; "dp" = dp_group.
        config: placement and communication settings.
    """

    def __init__(
        self,
        named_params: Iterable[tuple[str, nn.Parameter]],
        optimizer_factory: OptimizerFactory,
        *,
        is_matrix: Callable[[str, torch.Tensor], bool] | None = None,
        dp_group: dist.ProcessGroup | None = None,
        expert_dp_group: dist.ProcessGroup | None | str = "dp",
        is_expert: Callable[[str], bool] = default_is_expert,
        norm_group: dist.ProcessGroup | None | str = "dp",
        config: LayerWiseConfig | None = None,
    ) -> None:
        self.config = config or LayerWiseConfig()
        self.grad_norm: float | None = None
        """Global gradient norm of the last step (set where it clips: `max_grad_norm` > 0)."""
        named = [(n, p) for n, p in named_params if p.requires_grad]
        matrix = is_matrix or _routed_matrix(named)
        e_group = _resolve(expert_dp_group, dp_group, "expert_dp_group")
        self.norm_group = _resolve(norm_group, dp_group, "norm_group")
        self.domains: list[_Domain] = []
        experts = [(n, p) for n, p in named if is_expert(n)]
        dense = [(n, p) for n, p in named if not is_expert(n)]
        loads = None
        if experts:  # experts first; lpt_cost then places dense matrices on top of each rank's expert load
            self.domains.append(_Domain(experts, [matrix(n, p) for n, p in experts], e_group, self.config))
            loads = self._gather_loads(
                self.domains[0].ns_load_ms(self.config.cost_model or CostModel()),
                dp_group,
                self.domains[0].device,
            )
        if dense:
            self.domains.insert(
                0, _Domain(dense, [matrix(n, p) for n, p in dense], dp_group, self.config, loads)
            )
        owned: list[tuple[str, torch.Tensor]] = [
            (name, view) for d in self.domains for name, view, _, _ in d.owned
        ]
        self.inner: torch.optim.Optimizer | None = optimizer_factory(owned) if owned else None
        self._hooks: list[Any] = []
        self._sync_enabled = True
        self._remaining: dict[tuple[int, int], int] = {}
        if self.config.overlap_grad_reduce:
            self._register_grad_hooks()

    @staticmethod
    def _gather_loads(
        load: float, group: dist.ProcessGroup | None, device: torch.device
    ) -> list[float] | None:
        """Every DP rank's expert NS load (identical list on all ranks; on `device` so NCCL can move it)."""
        _, size = group_rank_size(group)
        if size == 1:
            return [load]
        out = torch.zeros(size, dtype=torch.float64, device=device)
        dist.all_gather_into_tensor(
            out, torch.tensor([load], dtype=torch.float64, device=device), group=group
        )
        return [float(x) for x in out]

    @property
    def num_skipped_updates(self) -> int:
        """Updates of this rank's pieces skipped for a NaN/Inf by the inner optimizer (`nonfinite_policy=skip`)."""
        return int(getattr(self.inner, "num_skipped_updates", 0)) if self.inner is not None else 0

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The inner optimizer's groups (this rank's pieces); LR schedulers edit these."""
        return self.inner.param_groups if self.inner is not None else []

    def owned(self) -> list[tuple[str, int, int, nn.Parameter]]:
        """(name, dim-0 start, stop, piece view) of every piece this rank owns."""
        out = []
        for d in self.domains:
            for name, view, bi, k in d.owned:
                pc = d.buckets[bi].pieces[d.rank][k]
                out.append((name, pc.start, pc.stop, view))
        return out

    def _bucket_sizes(self) -> dict[tuple[int, int], int]:
        return {
            (di, bi): len(b.params) for di, d in enumerate(self.domains) for bi, b in enumerate(d.buckets)
        }

    def _register_grad_hooks(self) -> None:
        """Post-accumulate-grad hooks: the last gradient of a bucket launches that bucket's collective."""
        self._remaining = self._bucket_sizes()
        for di, d in enumerate(self.domains):
            for bi, b in enumerate(d.buckets):
                for i in b.params:

                    def hook(_p: torch.Tensor, di: int = di, bi: int = bi) -> None:
                        if not self._sync_enabled:
                            return
                        self._remaining[(di, bi)] -= 1
                        if self._remaining[(di, bi)] == 0:
                            self.domains[di].launch_grad_sync(bi, GradSync(self.config.grad_sync))

                    self._hooks.append(d.params[i].register_post_accumulate_grad_hook(hook))  # type: ignore[no-untyped-call]

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally (no bucket launches from backward hooks), as DDP's `no_sync`."""
        self._sync_enabled = False
        try:
            yield
        finally:
            self._sync_enabled = True

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the model's gradients (and any gradient collective a backward hook started)."""
        self._remaining = self._bucket_sizes()
        for d in self.domains:
            for bi in list(d.pending_grads):
                for w in d.pending_grads.pop(bi)[0]:
                    w.wait()
        for d in self.domains:
            for p in d.params:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        """Sync gradients to owners, clip, step the owned pieces, start (or finish) the parameter all-gather."""
        self.finish_param_sync()
        for d in self.domains:
            d.sync_grads(GradSync(self.config.grad_sync), self.config.average_grads)
        self._remaining = self._bucket_sizes()
        if self.config.max_grad_norm > 0:
            self._clip()
        if self.inner is not None:
            self.inner.step()
        for d in self.domains:
            for bi in range(len(d.buckets)):
                d.start_gather(bi)
        if not self.config.overlap_param_gather:
            self.finish_param_sync()

    def instrument(self, wrap: Callable[[Callable[..., Any], str], Callable[..., Any]]) -> None:
        """Route this optimizer's phases through `wrap(fn, phase)` (a timer, a profiler range): gradient clipping
        as "clip", every domain's gradient sync and parameter all-gather (start and finish) as "comm". Once."""
        self._clip = wrap(self._clip, "clip")  # type: ignore[method-assign]
        for d in self.domains:
            for method in ("sync_grads", "start_gather", "finish_gather"):
                setattr(d, method, wrap(getattr(d, method), "comm"))

    def _clip(self) -> None:
        sq = sum((d.owned_sq_norm() for d in self.domains), torch.zeros((), device=self.domains[0].device))
        if self.norm_group is not None and dist.is_initialized():
            dist.all_reduce(sq, group=self.norm_group)
        self.grad_norm = sq.sqrt().item()
        scale = self.config.max_grad_norm / (self.grad_norm + 1e-6)
        if scale < 1.0:
            for d in self.domains:
                for g in d.shard_grads:
                    g.mul_(scale)

    def finish_param_sync(self) -> None:
        """Wait for every in-flight parameter all-gather and copy the results into the model."""
        for d in self.domains:
            for bi in list(d.pending):
                d.finish_gather(bi)

    def register_forward_hooks(self, model: nn.Module) -> None:
        """Forward pre-hooks that complete the in-flight all-gather of a module's buckets just before it runs."""
        where: dict[int, list[tuple[_Domain, int]]] = {}
        for d in self.domains:
            for bi, b in enumerate(d.buckets):
                for i in b.params:
                    where.setdefault(id(d.params[i]), []).append((d, bi))
        for module in model.modules():
            needs = {
                (id(d), bi): (d, bi)
                for p in module.parameters(recurse=False)
                for d, bi in where.get(id(p), [])
            }
            if needs:

                def hook(_m: nn.Module, _args: Any, needs: dict[Any, tuple[_Domain, int]] = needs) -> None:
                    for d, bi in needs.values():
                        d.finish_gather(bi)

                self._hooks.append(module.register_forward_pre_hook(hook))

    def remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()


def _resolve(
    group: dist.ProcessGroup | None | str, dp_group: dist.ProcessGroup | None, field: str
) -> dist.ProcessGroup | None:
    if isinstance(group, str):
        if group != "dp":
            raise ValueError(f"{field}={group!r}: must be a process group, None or 'dp'")
        return dp_group
    return group


def _routed_matrix(named: list[tuple[str, nn.Parameter]]) -> Callable[[str, torch.Tensor], bool]:
    from optim.routing import route_parameters

    matrix = {r.name for r in route_parameters(named) if r.optimizer == "matrix"}
    return lambda name, p: name in matrix and p.ndim in (2, 3)
