"""Muon / MOP on tensor-parallel shards (TPSpec) at gloo world sizes 2 and 4 equal the single-process optimizer.

Every rank builds the same full matrices and gradients (one seed), keeps its shard (uneven splits, dims 0 and 1, a
3-D expert stack, a fused gate/up split of a row-sharded matrix, and a short-dim-sharded matrix for which the
distributed mode falls back to duplicated), runs 3 steps of the TP optimizer in fp32 NS and compares its shards
with 3 steps of the single-process optimizer on the full matrices.

Tolerances (fp32): duplicated gathers the same matrix but batches it differently from the single-process step, and
the distributed modes sum partial Grams in another order: parameters within atol 2e-5 / rtol 1e-5 of the
reference (updates are O(lr) = 2e-2 per step, NS rounding ~1e-6 relative). Blockwise equals Muon run on the local
shards alone (scaled by the shard's shape) within 1e-6.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from dist_harness import XDIST_GROUP, context, run_suite
from torch.testing import assert_close

from optim import Muon
from optim.configs import MOPConfig, MuonConfig
from optim.distributed.comm import split_sizes
from optim.functional.split import RowSplit
from optim.optimizers.mop import MOP
from optim.optimizers.tp import TPSpec

STEPS = 3
LR = 0.02
# name -> (full shape, partition_dim); "gu" is a fused gate/up matrix (local blocks of GATE, UP rows per rank).
MATS = {"a": ((21, 16), 0), "b": ((16, 21), 1), "c": ((13, 19), 0), "e": ((2, 11, 17), -1)}
GATE, UP, GU_COLS = 4, 3, 10


def _full_params(ws: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    out = {n: torch.randn(shape, generator=gen) for n, (shape, _) in MATS.items()}
    # Reference layout of the fused gate/up matrix: [gate of all ranks; up of all ranks].
    out["gu"] = torch.randn((GATE + UP) * ws, GU_COLS, generator=gen)
    return out


def _grads(ws: int, step: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    out = {n: torch.randn(shape, generator=gen) for n, (shape, _) in MATS.items()}
    out["gu"] = torch.randn((GATE + UP) * ws, GU_COLS, generator=gen)
    return out


def _shard(name: str, full: torch.Tensor, rank: int, ws: int) -> torch.Tensor:
    # Rank r holds [gate_r; up_r] of "gu", Megatron's per-rank layout of a fused column-parallel weight.
    if name == "gu":
        gate, up = full[: GATE * ws], full[GATE * ws :]
        return torch.cat(
            [gate[rank * GATE : (rank + 1) * GATE], up[rank * UP : (rank + 1) * UP]]
        ).contiguous()
    pdim = MATS[name][1]
    return torch.tensor_split(full, ws, dim=pdim - 2 if pdim >= 0 else pdim)[rank].contiguous()


def _specs(params: dict[str, torch.Tensor], ws: int, mode: str) -> dict[torch.Tensor, TPSpec]:
    specs = {}
    for n, p in params.items():
        if n == "gu":
            specs[p] = TPSpec(partition_dim=0, group=dist.group.WORLD, mode=mode)
            continue
        shape, pdim = MATS[n]
        sizes = split_sizes(shape[pdim], ws)
        specs[p] = TPSpec(partition_dim=pdim, group=dist.group.WORLD, mode=mode, shard_sizes=tuple(sizes))
    return specs


def _run(make, params: dict[str, torch.Tensor], grads_of, **kw) -> tuple[dict[str, torch.Tensor], object]:  # type: ignore[no-untyped-def]
    params = {n: p.clone() for n, p in params.items()}
    opt = make(list(params.items()), params, **kw)
    for step in range(STEPS):
        for n, g in grads_of(step).items():
            params[n].grad = g
        opt.step()
    return params, opt


def _check(rank: int, ws: int, kind: str) -> None:
    full = _full_params(ws)
    local = {n: _shard(n, t, rank, ws) for n, t in full.items()}
    full_grads = lambda s: _grads(ws, s)
    local_grads = lambda s: {n: _shard(n, g, rank, ws) for n, g in _grads(ws, s).items()}
    if kind == "muon":
        cfg = MuonConfig(lr=LR, ns_precision="fp32", weight_decay=0.01)

        def make(named, ps, *, ref_sizes=None, **kw):  # type: ignore[no-untyped-def]
            sizes = ref_sizes or (GATE, UP)
            return Muon(named, cfg, splits={ps["gu"]: RowSplit(num_groups=1, sizes=sizes)}, **kw)
    else:
        cfg = MOPConfig(lr=LR, polar_method="polar_express", ns_precision="fp32")

        def make(named, ps, *, ref_sizes=None, **kw):  # type: ignore[no-untyped-def]
            sizes = ref_sizes or (GATE, UP)
            return MOP(named, cfg, splits={ps["gu"]: RowSplit(num_groups=1, sizes=sizes)}, **kw)

    ref, _ = _run(make, full, full_grads, ref_sizes=(GATE * ws, UP * ws))
    calls: list[tuple[int, int, int, int]] = []

    def pick(rows: int, cols: int, tp: int, pdim: int) -> str:
        calls.append((rows, cols, tp, pdim))
        return "distributed" if rows > cols else "duplicated"

    for mode in ("duplicated", "distributed", "distributed_gram", "auto"):
        if kind == "mop" and mode == "distributed_gram":
            continue
        got, opt = _run(
            lambda named, ps, mode=mode: make(named, ps, tp=_specs(ps, ws, mode), tp_mode_fn=pick),
            local,
            local_grads,
        )
        for n, p in got.items():
            assert_close(
                p,
                _shard(n, ref[n], rank, ws),
                rtol=1e-5,
                atol=2e-5,
                msg=context(f"{kind} mode={mode} param={n} rank={rank}/{ws}"),
            )
        if mode == "auto":
            assert len(calls) == len(local), calls  # resolved once per parameter, not per step
            modes = opt.tp_modes  # type: ignore[attr-defined]
            assert modes == {
                "a": "distributed",
                "b": "duplicated",
                "c": "duplicated",
                "e": "duplicated",
                "gu": "distributed",
            }, modes
            assert (
                (21, 16, ws, 0) in calls
                and (16, 21, ws, 1) in calls
                and ((GATE + UP) * ws, GU_COLS, ws, 0) in calls
            )
        else:  # "c" shards its short dim: the distributed modes run (and record) duplicated there
            fallback = "duplicated" if mode.startswith("distributed") else mode
            expected = {n: fallback if n == "c" else mode for n in local}
            assert opt.tp_modes == expected, opt.tp_modes  # type: ignore[attr-defined]
    # Blockwise: each shard alone, scaled by its own shape == the optimizer on the local shards without TP.
    blk, _ = _run(lambda named, ps: make(named, ps, tp=_specs(ps, ws, "blockwise")), local, local_grads)
    alone, _ = _run(make, local, local_grads)
    for n in local:
        assert_close(
            blk[n], alone[n], rtol=1e-6, atol=1e-6, msg=context(f"{kind} blockwise {n} rank={rank}/{ws}")
        )
    if ws > 1:
        assert not torch.equal(blk["a"], got["a"])  # blockwise really differs from the whole-matrix modes


def _check_modes(rank: int, ws: int) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the distributed -> duplicated fallback of "c" warns once by design
        _check(rank, ws, "muon")
        _check(rank, ws, "mop")


def muon_tp_worker(rank: int, ws: int, tmp: str) -> None:
    """This module's checks on one rank (run by `dist_harness.run_suite`, one spawn per world size); TP needs 2+."""
    if ws > 1:
        _check_modes(rank, ws)
        _check_nonfinite_shard(rank, ws)


@pytest.mark.dist
@pytest.mark.xdist_group(XDIST_GROUP)
@pytest.mark.parametrize("world_size", [2, 4])
def test_muon_tp_modes_match_single_process(world_size: int) -> None:
    """Localises a local-shape scale, wrong uneven shard sizes, a split of a sharded QKV/gate-up taken whole, a mode
    re-resolved every step, MOP's nuclear norm not summed over the TP group, and a one-rank skip of a sharded
    matrix with a non-finite gradient (a hang or a mismatched NS collective in the peers)."""
    failure = run_suite(world_size)
    assert failure is None, failure


def test_tp_spec_validation_and_single_process_spec() -> None:
    """Bad specs raise ValueError naming the field; a spec without a group is plain Muon on the whole matrix."""
    with pytest.raises(ValueError, match="partition_dim=2"):
        TPSpec(partition_dim=2)
    with pytest.raises(ValueError, match="mode='sideways'"):
        TPSpec(partition_dim=0, mode="sideways")
    p = torch.randn(9, 14)
    with pytest.raises(ValueError, match="tp_mode_fn"):
        Muon([p], MuonConfig(), tp={p: TPSpec(partition_dim=0, mode="auto")})
    with pytest.raises(ValueError, match="shard_sizes"):
        Muon([p], MuonConfig(), tp={p: TPSpec(partition_dim=0, shard_sizes=(5, 4))})
    with pytest.raises(ValueError, match="polar_method='svd'"):
        MOP([p], MOPConfig(), tp={p: TPSpec(partition_dim=1)})
    cfg = MuonConfig(lr=LR, ns_precision="fp32")
    a, b = p.clone(), p.clone()
    opt_a, opt_b = Muon([a], cfg), Muon([b], cfg, tp={b: TPSpec(partition_dim=1, mode="distributed")})
    for s in range(STEPS):
        g = torch.randn(9, 14, generator=torch.Generator().manual_seed(s))
        a.grad, b.grad = g, g.clone()
        opt_a.step()
        opt_b.step()
    assert_close(b, a, rtol=1e-6, atol=1e-6)
    assert opt_b.tp_modes == {"group0.param0": "distributed"}


class _FakeGroup:
    def __init__(self, n: int) -> None:
        self.n = n

    def size(self) -> int:
        return self.n


def test_megatron_tp_specs_from_routes_and_auto_fn() -> None:
    """optim.megatron.tp_specs: specs for TP-sharded matrices only, the expert-TP group for routed experts, none
    for blockwise or a group of one; the engine's auto picker is the performance model's choice."""
    from types import SimpleNamespace

    from optim.megatron import ParamRoute, tp_specs

    def route(
        name: str, *, optimizer: str = "matrix", pdim: int | None = 0, expert: bool = False
    ) -> ParamRoute:
        return ParamRoute(
            name=name,
            role="other",
            optimizer=optimizer,
            shape=(8, 4),
            is_expert=expert,
            expert_parallel=expert,
            partition_dim=pdim,
            split=None,
            weight_decay=True,
        )

    ps = [torch.zeros(8, 4) for _ in range(4)]
    routed = [
        (ps[0], route("dense")),
        (ps[1], route("expert", pdim=1, expert=True)),
        (ps[2], route("replicated", pdim=None)),
        (ps[3], route("embedding", optimizer="adamw")),
    ]
    tp, etp = _FakeGroup(2), _FakeGroup(4)
    specs = tp_specs(routed, {"tp": tp, "expt_tp": etp}, "auto")
    assert set(map(id, specs)) == {id(ps[0]), id(ps[1])}
    assert specs[ps[0]].group is tp and specs[ps[0]].dim == -2 and specs[ps[0]].mode == "auto"
    assert specs[ps[1]].group is etp and specs[ps[1]].dim == -1
    assert tp_specs(routed, {"tp": tp, "expt_tp": etp}, "blockwise") == {}
    assert tp_specs(routed, {"tp": _FakeGroup(1), "expt_tp": _FakeGroup(1)}, "duplicated") == {}
    with pytest.raises(ValueError, match="tp_mode='sideways'"):
        tp_specs(routed, {"tp": tp, "expt_tp": etp}, "sideways")

    from bench.engines.megatron_optim import tp_mode_fn
    from bench.tools.perfmodel import choose_tp_mode
    from bench.tools.perfmodel.nscost import load_hardware

    hw = load_hardware("h200")
    pick = tp_mode_fn(SimpleNamespace(hardware=hw))  # type: ignore[arg-type]
    cases = [
        (r, c, t, d) for r, c in ((4096, 4096), (16384, 4096), (512, 256)) for t in (2, 8) for d in (0, 1)
    ]
    got = [pick(*case) for case in cases]
    assert got == [choose_tp_mode(r, c, t, hw, partition_dim=d) for r, c, t, d in cases]
    assert set(got) == {"duplicated", "distributed"}


def _check_nonfinite_shard(rank: int, ws: int) -> None:
    """Rank ws-1 gets a NaN in its shard of "a" at step 2: every rank skips "a" (weight and momentum of step 1
    kept, kind "tp_peer" on the ranks whose shard was finite), "b" and the unsharded "u" step normally, and step 3
    runs in sync (no rank left waiting in a collective)."""
    import warnings

    from optim.optimizers import NonFiniteWarning

    full = _full_params(ws)
    params = {n: _shard(n, full[n], rank, ws).clone() for n in ("a", "b")}
    params["u"] = torch.randn(6, 9, generator=torch.Generator().manual_seed(5))
    specs = _specs({n: params[n] for n in ("a", "b")}, ws, "distributed")
    opt = Muon(list(params.items()), MuonConfig(lr=LR, ns_precision="fp32"), tp=specs)

    def set_grads(step: int) -> None:
        g = _grads(ws, step)
        for n in ("a", "b"):
            params[n].grad = _shard(n, g[n], rank, ws).clone()
        params["u"].grad = torch.randn(6, 9, generator=torch.Generator().manual_seed(50 + step))
        if step == 1 and rank == ws - 1:
            params["a"].grad[0, 0] = float("nan")

    set_grads(0)
    opt.step()
    snap = {n: p.detach().clone() for n, p in params.items()}
    buf_a = opt.state[params["a"]]["momentum_buffer"].clone()
    set_grads(1)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        opt.step()
    assert torch.equal(params["a"], snap["a"]), context(f"rank {rank}: 'a' moved")("")
    assert torch.equal(opt.state[params["a"]]["momentum_buffer"], buf_a)
    assert not torch.equal(params["b"], snap["b"]) and not torch.equal(params["u"], snap["u"])
    kind = "grad" if rank == ws - 1 else "tp_peer"
    assert opt.nonfinite_events == [("a", 2, kind)], (rank, opt.nonfinite_events)
    assert any(issubclass(x.category, NonFiniteWarning) for x in w)
    set_grads(2)
    opt.step()
    # == the single-process optimizer on the full matrices, whose "a" had that NaN at step 2 (and was skipped)
    ref = {n: full[n].clone() for n in ("a", "b")}
    ref["u"] = torch.randn(6, 9, generator=torch.Generator().manual_seed(5))
    ref_opt = Muon(list(ref.items()), MuonConfig(lr=LR, ns_precision="fp32"))
    row = sum(split_sizes(MATS["a"][0][0], ws)[: ws - 1])
    for step in range(3):
        g = _grads(ws, step)
        ref["a"].grad, ref["b"].grad = g["a"].clone(), g["b"].clone()
        ref["u"].grad = torch.randn(6, 9, generator=torch.Generator().manual_seed(50 + step))
        if step == 1:
            ref["a"].grad[row, 0] = float("nan")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref_opt.step()
    for n in ("a", "b"):
        assert_close(
            params[n], _shard(n, ref[n], rank, ws), rtol=1e-5, atol=2e-5, msg=context(f"{n} rank={rank}")
        )
    assert_close(params["u"], ref["u"], rtol=1e-6, atol=1e-6)

