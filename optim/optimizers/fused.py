"""Fused CUDA step of Muon: whole fp32 2-D matrices stepped by `optim.kernels.fused_step`.

`FusedStep`, built by Muon when `fused_step` is set and the kernels are available (bf16 or fp16 NS), owns the
path's caches, side streams, fold-failure flag and speculation (`optim.optimizers.speculative`). Its `step`: whole fp32 2-D matrices (not TP-sharded; split only into
equal contiguous row blocks of a wide matrix, e.g. gate / up, whose pieces are a view of the packed stack) are
stepped one (group, shape, split) bucket at a time: momentum update in place plus the bf16 NS input in one pass,
one batched orthogonalize, decay and scaled update in one pass. Where a bucket's parameters are runs of one buffer
(the layer-wise distributed optimizer's shard buffers) and the planned NS ends in QuACK's general product (bf16
iterate), the last NS product writes the update into them instead (`_fold_targets`, `_update_bucket`: 8 bytes per element instead of
14). It differs from the reference step (`OrthogonalizedOptimizer.step`) by rounding: the NS input is rounded to
bf16 before the Frobenius normalization, decay and update are one multiply-add, and a folded update rounds
a + P_ii to bf16 instead of the last iterate. Its non-finite check screens the gradients first (see `step`).
Tested against the reference in tests/unit/test_muon_fused.py and tests/gpu/test_kernels_gpu.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from optim.optimizers.base import NonFiniteError, host_flags, param_names
from optim.optimizers.protocols import MuonView
from optim.optimizers.speculative import Speculation, _Speculation

if TYPE_CHECKING:
    from optim.kernels.ns_batched import LastProduct


# A bucket's NS result: the orthogonalized stack and its per-matrix scale (or None), or the NS stopped before its last
# product (`optim.kernels.ns_batched.LastProduct`), which then writes the update.
type _Orthogonalized = tuple[torch.Tensor, torch.Tensor | None] | LastProduct

# A bucket's update is written by its last NS product (`_fold_targets`) only where its parameters are this few runs
# of one buffer (at least this many matrices per run on average) or one run: a product per run, each large enough
# that its launch does not stall the GPU.
MIN_FOLD_RUN = 4


@dataclass(slots=True)
class _FusedBucket:
    """Parameters of one (group, shape, split pieces, device) stepped together by the fused path (in memory order),
    their momentum buffers, and `targets`: the parameters as a few strided views in the NS orientation, in order
    (`_fold_targets`), or None."""

    group: dict[str, Any]
    params: list[torch.Tensor]
    bufs: list[torch.Tensor]
    targets: list[torch.Tensor] | None = None


class FusedStep:
    """The fused CUDA step of one Muon (`opt`): which parameters it takes, their cached buckets, its side streams,
    the fold-failure flag and the speculation. It reads the optimizer's groups, state, config, splits and TP
    sharding, and calls its `_orthogonalize` (and `_ns_deferred`) for each bucket, so that instrumentation sees
    every NS call."""

    def __init__(self, opt: MuonView) -> None:
        self.opt = opt
        self.speculation = Speculation(self)
        self.packed_sumsq: torch.Tensor | None = None
        """Squared Frobenius norms of the stack the step passes to the `_orthogonalize` call it is making
        (`fused_step.momentum_pack_with_norms`), None at any other time; the orthogonalize may use them to skip
        its norm pass."""
        self.grads_known_finite = False
        """Set by `Muon.assume_finite_grads`: the next step skips its gradient screen (one-shot)."""
        self.fold_failure: str | None = None
        """The error of a last product that failed to write its update; later steps take the ordinary update."""
        # Host-side structures rebuilt only when the parameter set or the state changes: (ids of the statically
        # eligible parameters, that list, their groups) and (ids of the stepped parameters, buckets): per-parameter
        # Python at every step would leave the GPU idle (docs/ns_kernels_h200.md, the fused step's host time).
        self._static: tuple[tuple[int, ...], list[torch.Tensor], dict[int, dict[str, Any]]] | None = None
        self._buckets: tuple[tuple[int, ...], list[_FusedBucket]] | None = None
        # (shape, pieces) already orthogonalized (their NS plans are measured), and the side streams.
        self._seen: set[tuple[tuple[int, ...], int]] = set()
        self.streams: dict[torch.device, torch.cuda.Stream] = {}

    def forget_buckets(self) -> None:
        """Drop the cached buckets (the momentum buffers are new tensors after `load_state_dict`)."""
        self._buckets = None

    def params(self) -> list[torch.Tensor]:
        """Parameters the fused path steps: fp32 contiguous 2-D matrices with an fp32 contiguous gradient, not
        TP-sharded, not split (or split as `pieces` allows), in a group with decoupled (or no) weight decay.
        (`optim.kernels.fused_step` runs its Triton kernels on CUDA tensors and its torch reference otherwise.) The
        parameter-side conditions are evaluated once per parameter set (and group weight decays); the gradient-side
        ones every step."""
        fp32 = torch.float32
        return [
            p
            for p in self.static_params()
            if (g := p.grad) is not None and g.dtype == fp32 and g.layout == torch.strided and g.is_contiguous()
        ]

    def static_params(self) -> list[torch.Tensor]:
        """The parameter-side conditions of `params`, cached per parameter set (and group weight decays)."""
        cfg = self.opt.config
        key = tuple(
            id(x)
            for group in self.opt.param_groups
            for x in (group["weight_decay"] != 0 and cfg.weight_decay_method != "decoupled", *group["params"])
        )
        if self._static is None or self._static[0] != key:
            static = {
                id(p): (p, group)
                for group in self.opt.param_groups
                if not (group["weight_decay"] != 0 and cfg.weight_decay_method != "decoupled")
                for p in group["params"]
                if p.ndim == 2
                and p.dtype == torch.float32
                and p.is_contiguous()
                and (id(p) not in self.opt.splits or self.pieces(p) > 1)
                and not (self.opt.sharding is not None and self.opt.sharding.owns(p))
            }
            self._static = (
                key,
                [p for p, _ in static.values()],
                {i: g for i, (_, g) in static.items()},
            )
        return self._static[1]

    def groups(self) -> dict[int, dict[str, Any]]:
        """id -> param group of every parameter the fused path may take (`static_params`)."""
        self.static_params()
        assert self._static is not None
        return self._static[2]

    def pieces(self, p: torch.Tensor) -> int:
        """How many NS matrices the fused path makes of `p`: 1, or k for a split into k equal contiguous row blocks
        (`num_groups == 1`, e.g. gate / up of a fused fc1) of a wide matrix (rows <= cols), whose pieces are a free
        view (k, rows / k, cols) of the packed NS input; 0 for any other split (not fused: its pieces are not
        contiguous, or a tall matrix's wide orientation interleaves them)."""
        split = self.opt.splits.get(id(p))
        if split is None:
            return 1
        uniform = split.num_groups == 1 and len(set(split.sizes)) == 1 and len(split.sizes) > 1
        return len(split.sizes) if uniform and p.size(0) <= p.size(1) else 0

    def _buckets_of(self, params: list[torch.Tensor], skipped: set[int]) -> list[_FusedBucket]:
        """(group, shape, split pieces, device) buckets of `params` less `skipped` ids, largest first, momentum state
        created where missing; cached for the common case (nothing skipped) until the parameter list or the state
        changes (a new state dict, entries added or removed; `load_state_dict` drops the cache itself)."""
        from optim.kernels import fused_step as fs

        key = (*map(id, params), id(self.opt.state), len(self.opt.state))
        if not skipped and self._buckets is not None and self._buckets[0] == key:
            return self._buckets[1]
        ids = set(key) - skipped
        buckets: dict[tuple[int, tuple[int, ...], int, torch.device], _FusedBucket] = {}
        for group in self.opt.param_groups:
            for p in group["params"]:
                if id(p) not in ids:
                    continue
                st = self.opt.state[p]
                if not st:
                    st["step"] = 0
                    st["momentum_buffer"] = torch.zeros_like(p)
                bkey = (id(group), tuple(p.shape), self.pieces(p), p.device)
                b = buckets.get(bkey)
                if b is None:
                    b = buckets[bkey] = _FusedBucket(group, [], [])
                b.params.append(p)
                b.bufs.append(st["momentum_buffer"])
        for b in buckets.values():  # memory order: matrices of one buffer form runs (`_fold_targets`)
            order = fs.storage_order(b.params)
            b.params, b.bufs = [b.params[i] for i in order], [b.bufs[i] for i in order]
            b.targets = self._fold_targets(b.params)
        # Largest first: each step launches its element-wise passes and NS bucket by bucket, and while the GPU works
        # through the largest bucket the host launches the small ones (small first, the GPU waited on each launch:
        # docs/ns_kernels_h200.md#kernel-design-numbers).
        out = sorted(buckets.values(), key=lambda b: -len(b.params) * b.params[0].numel())
        # the fused kernels' contract, checked once per build instead of per tensor every step
        for b in out:
            if not all(t.dtype == torch.float32 and t.is_contiguous() for t in b.bufs):
                raise ValueError(
                    f"momentum buffers of the fused Muon path must be contiguous fp32 (shape {tuple(b.params[0].shape)})"
                )
        if not skipped:
            self._buckets = (key, out)
        return out

    def _screen(
        self, params: list[torch.Tensor], every: list[_FusedBucket], grads: dict[int, list[torch.Tensor]]
    ) -> set[int]:
        """Ids of `params` with a NaN/Inf gradient (one launch per bucket, one host sync), reported to the
        optimizer's non-finite policy (which raises under `raise`)."""
        from optim.kernels import fused_step as fs

        flags = torch.zeros(sum(len(b.params) for b in every), dtype=torch.int32, device=params[0].device)
        at = 0
        for b in every:
            fs.nonfinite(grads[id(b)], checked=True, out=flags[at : at + len(b.params)])
            at += len(b.params)
        bad = flags.tolist()  # one host sync
        ordered = [p for b in every for p in b.params]
        skipped = {id(p) for p, f in zip(ordered, bad, strict=True) if f}
        events = []
        if skipped:
            names = param_names(self.opt.param_groups)  # only events need names
            events = [
                (names[id(p)], self.opt.state[p].get("step", 0) + 1, "grad") for p in params if id(p) in skipped
            ]
        self.opt._report_nonfinite(events)
        return skipped

    def step(self, params: list[torch.Tensor]) -> None:
        """Step `params` (`params()`; confirmed speculative results used where still valid) with the fused kernels of `optim.kernels.fused_step`, one bucket per (group, shape):

        momentum update in place + bf16 NS input + each NS matrix's squared norm in one pass
        (`momentum_pack_with_norms`), one `_orthogonalize` call on the (B, r, c) bf16 stack (stored (B, c, r) for
        tall matrices: the NS runs on the short side without transpose copies), normalized with those norms (no
        norm pass), then p <- p (1 - lr wd) - lr scale O in one pass (`apply_update`), or by the NS's last product
        where the bucket has fold targets (`_ns_of_bucket`, `_update_bucket`). ~24 bytes per element
        instead of ~70 through separate foreach, stack, cast, scale and update kernels. Differences from the
        unfused path: the NS input is rounded to bf16 before the Frobenius normalization (the bf16 NS rounds it
        after), and decay and update are one multiply-add (fp32 rounding).

        Non-finite handling as the unfused path: gradients are screened first (`fused_step.nonfinite`, one launch
        per bucket and one host sync); a parameter with a NaN/Inf gradient keeps its weight and momentum (skip) or
        raises; no screen when the caller vouched for the gradients (`assume_finite_grads`). The momentum is
        updated in place, so a momentum that overflows fp32 from finite gradients cannot be rolled back: that
        raises `NonFiniteError` whatever the policy, before any weight is written. Its screen is the pack's norms
        (a NaN/Inf makes a norm non-finite); the host reads it once the largest bucket's NS is queued, waiting for
        the packs only (an event after a copy to pinned memory), so the GPU never waits on the host between the
        pack and the NS, and each bucket's update is queued right behind its NS: the step returns while its NS
        still runs.

        Launch order: buckets largest first (the host launches the others while the GPU runs the largest), and
        the buckets holding at most 1/16 of the step's elements (`_side_buckets`: single attention matrices beside
        expert stacks) pack, orthogonalize and update on a side stream, beside the large buckets' memory-bound
        packs; the current stream waits for the side stream's packs before the momentum screen and for all of its
        work before the step returns. Results do not depend on the order or the stream."""

        spec = self.speculation.take()
        grads_known_finite, self.grads_known_finite = self.grads_known_finite, False
        if not params:
            self.speculation.stats["discarded"] += sum(len(sp.params) for sp in spec)
            return
        # Host work that does not depend on the screen is done before its sync: the buckets (cached), the state.
        every = self._buckets_of(params, set())
        # every parameter of the fused path has a gradient (`params`)
        grads: dict[int, list[torch.Tensor]] = {id(b): [p.grad for p in b.params] for b in every}  # type: ignore[misc]
        skipped = set() if grads_known_finite else self._screen(params, every, grads)
        usable = self.speculation.usable(params, skipped, spec)
        done = {id(p) for sp in usable for p in sp.params}
        buckets = (
            every
            if not (done or skipped)
            else self._buckets_of([p for p in params if id(p) not in done], skipped)
        )
        # Buckets too small to fill the GPU with their NS run on a side stream, beside the large buckets' packs.
        side_bs = self._side_buckets(buckets) if not usable else []
        side_ids = {id(b) for b in side_bs}
        main_bs = [b for b in buckets if id(b) not in side_ids]
        side = self._side_stream(params[0].device) if side_bs else None
        main = torch.cuda.current_stream(side.device) if side is not None else None
        if side is not None and main is not None:
            side.wait_stream(main)  # the gradients, the screen
        # The largest bucket's pack is launched first; the host launches the rest while the GPU runs it.
        packed = [self._pack_bucket(b, grads.get(id(b))) for b in main_bs[:1]]
        side_packed: list[tuple[_FusedBucket, torch.Tensor, torch.Tensor]] = []
        side_orths: list[tuple[_FusedBucket, _Orthogonalized]] = []
        if side is not None:
            with torch.cuda.stream(side):
                side_packed = [self._pack_bucket(b, grads.get(id(b))) for b in side_bs]
                side_norms = side.record_event()
                side_orths = [(b, self._ns_of_bucket(b, x, s)) for b, x, s in side_packed]
        packed += [self._pack_bucket(b, grads.get(id(b))) for b in main_bs[1:]]
        if not packed and not usable and not side_packed:
            return
        screens = [sp.amax for sp in usable] + [s for _, _, s in packed]
        if side is not None and main is not None:
            main.wait_event(side_norms)
            for _, _, s in side_packed:
                s.record_stream(main)  # made on the side stream, read on this one
                screens.append(s)
        momentum_finite = self._queue_finite_check(screens)
        packed.reverse()
        largest = []
        if packed:  # queued before the host waits for the screen: the GPU runs it meanwhile
            b, x, sumsq = packed.pop()
            largest.append((b, self._ns_of_bucket(b, x, sumsq)))
            del x
        # host work while the GPU runs
        for p in params:
            self.opt.state[p]["step"] += 1  # `_buckets_of(params, ...)` created every missing state
        self._seen.update((tuple(b.params[0].shape), self.pieces(b.params[0])) for b in buckets)
        if not momentum_finite():  # waits for the packs only, not for the NS
            self._raise_if_momentum_nonfinite(usable, buckets)
        # No weight is written before this point. Each bucket's update follows its NS on its stream.
        self.speculation.apply(usable)
        if side is not None:
            with torch.cuda.stream(side):
                for b, done_ns in side_orths:
                    self._update_bucket(b, done_ns)
        for b, done_ns in largest:
            self._update_bucket(b, done_ns)
        while packed:  # pop, so that each bf16 stack is freed once its bucket is orthogonalized
            b, x, sumsq = packed.pop()
            done_ns = self._ns_of_bucket(b, x, sumsq)
            del x
            self._update_bucket(b, done_ns)
        if side is not None and main is not None:
            main.wait_stream(side)  # the step's work is on the current stream when it returns

    def _queue_finite_check(self, screens: list[torch.Tensor]) -> Callable[[], bool]:
        """Queue "every screen value is finite" and return a call that waits for that result alone (on CUDA: a
        copy to pinned host memory and an event, so the host does not wait for work queued after it)."""
        ok = torch.isfinite(torch.cat([s.reshape(-1) for s in screens])).all()
        if not ok.is_cuda:
            return lambda: bool(ok)
        host = torch.empty((), dtype=torch.bool, pin_memory=True)
        host.copy_(ok, non_blocking=True)
        done = torch.cuda.current_stream(ok.device).record_event()

        def read() -> bool:
            done.synchronize()
            return bool(host)

        return read

    def _pack_bucket(
        self, b: _FusedBucket, grads: list[torch.Tensor] | None
    ) -> tuple[_FusedBucket, torch.Tensor, torch.Tensor]:
        """Momentum update in place, the bucket's bf16 NS input and its squared norms (`momentum_pack_with_norms`)."""
        from optim.kernels import fused_step as fs

        p0 = b.params[0]
        x, sumsq = fs.momentum_pack_with_norms(
            grads or [p.grad for p in b.params],  # type: ignore[misc]
            b.bufs,
            beta=b.group["momentum"],
            nesterov=self.opt.config.nesterov,
            transpose=p0.size(0) > p0.size(1),  # NS input in its wide orientation
            pieces=self.pieces(p0),
            checked=True,
        )
        return b, x, sumsq

    def _orthogonalize_packed(
        self, b: _FusedBucket, x: torch.Tensor, sumsq: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`_orthogonalize` of a packed stack, told its norms (`packed_sumsq`)."""
        self.packed_sumsq = sumsq
        try:
            return self.opt._orthogonalize(self.as_pieces(b.params[0], x))
        finally:
            self.packed_sumsq = None

    def _ns_of_bucket(self, b: _FusedBucket, x: torch.Tensor, sumsq: torch.Tensor) -> _Orthogonalized:
        """The bucket's NS: stopped before its last product where the bucket has fold targets and the NS allows
        it (`_ns_deferred`), the update then written by that product (`_update_bucket`); else the whole NS."""
        if b.targets is not None and self.fold_failure is None:
            last = self.opt._ns_deferred(self.as_pieces(b.params[0], x), sumsq)
            if last is not None:
                return last
        return self._orthogonalize_packed(b, x, sumsq)

    def _update_bucket(self, b: _FusedBucket, done_ns: _Orthogonalized) -> None:
        """p <- p (1 - lr wd) - lr scale O for the bucket: through `apply_update`, or, for a deferred NS, by its
        last product accumulating into the bucket's `targets` (one GEMM per run of parameters)."""
        from optim.kernels.ns_batched import LastProduct

        if not isinstance(done_ns, LastProduct):
            self.apply_update(b.group, b.params, *done_ns)
            return
        assert b.targets is not None
        lr, (rows, cols) = b.group["lr"], b.params[0].shape
        k = self.pieces(b.params[0])
        wd = b.group["weight_decay"] if self.opt.config.weight_decay_method == "decoupled" else 0.0
        alpha, beta = -lr * self.opt._shape_scale(rows // k, cols), 1.0 - lr * wd
        at = 0
        for view in b.targets:
            try:
                done_ns.into(view, alpha=alpha, beta=beta, start=at)
            except Exception as e:  # noqa: BLE001 - raised before its GEMM ran (compile, launch): recorded, and
                # this bucket's remaining matrices and later steps take the ordinary update
                self.fold_failure = f"{type(e).__name__}: {str(e)[:300]}"
                self.apply_update(b.group, b.params[at // k :], done_ns.result(at), None)
                return
            at += view.size(0)

    def _fold_targets(self, params: list[torch.Tensor]) -> list[torch.Tensor] | None:
        """A bucket's parameters (memory order) as views in the NS orientation that its last NS product can
        accumulate into: one (n k, r / k, c) view per run of parameters laid out at one stride in one buffer
        (`fused_step.stacked_runs`; (n, c, r) through a transpose for tall matrices; split pieces of a run only where
        its matrices are back to back), or None where the runs are too short (`MIN_FOLD_RUN`) or not CUDA."""
        from optim.kernels import fused_step as fs

        if not params[0].is_cuda:
            return None
        runs = fs.stacked_runs(params)
        if len(runs) > 1 and len(params) < MIN_FOLD_RUN * len(runs):
            return None
        k = self.pieces(params[0])
        rows, cols = params[0].shape
        views = []
        for v in runs:
            # TMA: a 16-byte aligned base and 16-byte multiples for every stride but the unit one
            if v.data_ptr() % 16 or any(st % 4 for st in v.stride() if st != 1):
                return None
            if k > 1:
                if len(v) > 1 and v.stride(0) != rows * cols:
                    return None
                v = v.as_strided((len(v) * k, rows // k, cols), ((rows // k) * cols, cols, 1))
            views.append(v.mT if rows > cols else v)
        return views

    def _side_buckets(self, buckets: list[_FusedBucket]) -> list[_FusedBucket]:
        """The buckets whose pack and NS run on a side stream, beside the other buckets' packs: those holding at
        most 1/16 of the step's elements (single attention matrices next to the expert stacks: their NS GEMMs
        leave most of the GPU idle, the packs are memory-bound), once every bucket's shape was orthogonalized by
        an earlier step (its NS plan is then measured, not measured while another stream runs). None on CPU, or
        when no bucket is large."""
        if not buckets or not buckets[0].params[0].is_cuda:
            return []
        if any(
            (tuple(b.params[0].shape), self.pieces(b.params[0])) not in self._seen
            for b in buckets
        ):
            return []
        sizes = [len(b.params) * b.params[0].numel() for b in buckets]
        total = sum(sizes)
        small = [b for b, n in zip(buckets, sizes, strict=True) if 16 * n <= total]
        return small if len(small) < len(buckets) else []

    def _side_stream(self, device: torch.device) -> torch.cuda.Stream:
        stream = self.streams.get(device)
        if stream is None:
            stream = self.streams[device] = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]
        return stream

    def _raise_if_momentum_nonfinite(self, usable: list[_Speculation], buckets: list[_FusedBucket]) -> None:
        """The momentum screen failed: raise `NonFiniteError` if a momentum buffer of the step holds a NaN/Inf, or
        a speculative NS input did (its momentum is written only after this check); otherwise a norm overflowed
        fp32 from finite values larger than ~1e19, and the step goes on."""
        bufs = [buf for b in buckets for buf in b.bufs]
        checks = [torch.isfinite(a) for a in torch._foreach_norm(bufs, float("inf"))] if bufs else []
        checks += [torch.isfinite(sp.amax) for sp in usable]
        if not all(host_flags(checks)):
            names = param_names(self.opt.param_groups)
            every = [p for b in buckets for p in b.params] + [p for sp in usable for p in sp.params]
            raise NonFiniteError([(names[id(p)], self.opt.state[p]["step"], "momentum") for p in every])

    def as_pieces(self, p: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The packed (B, rows, cols) NS input of a bucket of parameters shaped like `p`, as (B k, rows / k, cols)
        for a split into k equal row blocks (`pieces`; a view, nothing copied)."""
        k = self.pieces(p)
        return x if k == 1 else x.view(-1, x.size(1) // k, x.size(2))

    def apply_update(
        self, group: dict[str, Any], ps: list[torch.Tensor], orth: torch.Tensor, mscale: torch.Tensor | None
    ) -> None:
        """p <- p (1 - lr wd) - lr scale (mscale) O for one same-shape bucket (`fused_step.apply_update`)."""
        from optim.kernels import fused_step as fs

        if mscale is not None:
            orth = orth * mscale.to(orth.dtype).view(-1, 1, 1)
        rows, cols = ps[0].shape
        k = self.pieces(ps[0])
        wd = group["weight_decay"] if self.opt.config.weight_decay_method == "decoupled" else 0.0
        fs.apply_update(
            ps,
            orth.reshape(len(ps), rows, cols) if k > 1 else orth,
            lr=group["lr"],
            weight_decay=wd,
            scale=self.opt._shape_scale(rows // k, cols),  # a split's pieces are scaled by their own shape
            transposed=ps[0].size(0) > ps[0].size(1),
            checked=True,
        )
