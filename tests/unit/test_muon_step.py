"""The multi-tensor step of Muon/MOP (optim/optimizers/orthogonalized.py): equal to a per-parameter loop, bitwise.

The reference below is the documented step written one parameter at a time with plain ops (the implementation
before the foreach rewrite). Orthogonalization is replaced in both by an element-wise stand-in (tanh, plus a
per-matrix factor for the MOP-like case) so that batching cannot change a bit and the test pins the momentum,
Nesterov, weight decay, grouping, orientation, scale and update plumbing.
"""

from __future__ import annotations

import types
import warnings

import pytest
import torch

from optim.configs import MuonConfig
from optim.functional.split import RowSplit
from optim.kernels import orthogonalize as kernels_orthogonalize
from optim.optimizers import NonFiniteWarning
from optim.optimizers import muon as muon_mod
from optim.optimizers import orthogonalized as orth_mod
from optim.optimizers.muon import Muon
from optim.optimizers.orthogonalized import shape_scale
from tests.unit._optim_fixtures import one_thread  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")

# Tall and wide pieces of one oriented shape with 3-D stacks, the same with 2-D matrices only (stacked path), a
# split fused matrix and a lone square.
SHAPES = [
    (16, 24),
    (24, 16),
    (16, 24),
    (3, 16, 24),
    (2, 24, 16),
    (32, 24),
    (8, 8),
    (12, 20),
    (20, 12),
    (12, 20),
]
SPLIT = RowSplit(num_groups=2, sizes=(8, 4, 4))


def fake_orth(x: torch.Tensor, with_scale: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Stand-in for NS: element-wise and max (order-free), so stacked and per-matrix calls agree bitwise."""
    return torch.tanh(x), (x.abs().amax(dim=(-2, -1)) if with_scale else None)


def reference_step(
    params: list[torch.Tensor], state: dict[int, torch.Tensor], cfg: MuonConfig, **kw: float
) -> None:
    """The step for one param group, one parameter at a time (see the module docstring of orthogonalized.py)."""
    lr, beta, wd, with_scale = kw["lr"], kw["momentum"], kw["weight_decay"], bool(kw["with_scale"])
    for p in params:
        buf = state.setdefault(
            id(p), torch.zeros_like(p, dtype=torch.float32 if p.dtype == torch.bfloat16 else p.dtype)
        )
        g = p.grad.to(buf.dtype)  # type: ignore[union-attr]
        if cfg.weight_decay_method == "l2" and wd != 0:
            g = g.add(p.to(buf.dtype), alpha=wd)
        new_buf = torch.lerp(buf, g, 1 - beta)
        m = g.lerp(new_buf, beta) if cfg.nesterov else new_buf
        state[id(p)] = new_buf
        parts = SPLIT.split(m) if p.size(-2) == SPLIT.rows else [m]
        outs = []
        for part in parts:
            rows, cols = part.shape[-2:]
            x = part.reshape(-1, rows, cols)
            x = x.mT if rows > cols else x
            o, ms = fake_orth(x, with_scale)
            o = o.mT if rows > cols else o
            o = o * (shape_scale(rows, cols, cfg.scale_mode) * cfg.extra_scale_factor)
            if ms is not None:
                o = o * ms.view(-1, 1, 1)
            outs.append(o.reshape(part.shape))
        u = SPLIT.merge(outs) if len(outs) > 1 else outs[0]
        if wd != 0 and cfg.weight_decay_method == "decoupled":
            p.add_(p, alpha=-lr * wd)
        elif wd != 0 and cfg.weight_decay_method == "independent":
            p.add_(p, alpha=-wd)
        p.add_(u, alpha=-lr)


def _params(dtype: torch.dtype, seed: int = 0) -> tuple[list[torch.Tensor], torch.Generator]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen).to(dtype) for s in SHAPES], gen


@pytest.mark.parametrize(
    ("nesterov", "scale_mode", "wd_method", "dtype", "with_scale"),
    [
        (False, "spectral", "decoupled", torch.float32, False),
        (True, "shape_scaling", "independent", torch.float32, True),
        (True, "unit_rms_norm", "l2", torch.float32, False),
        (False, "shape_scaling", "decoupled", torch.bfloat16, True),
        (True, "spectral", "l2", torch.bfloat16, False),
    ],
)
def test_foreach_step_equals_per_parameter_loop_bitwise(
    nesterov: bool, scale_mode: str, wd_method: str, dtype: torch.dtype, with_scale: bool
) -> None:
    """Localises an op-order or grouping change in the foreach step (two param groups with their own lr/wd/beta)."""
    cfg = MuonConfig(
        nesterov=nesterov,
        scale_mode=scale_mode,
        weight_decay_method=wd_method,  # type: ignore[arg-type]
        extra_scale_factor=0.7,
        weight_decay=0.1,
        lr=0.02,
    )
    init, gen = _params(dtype)
    ours = [t.clone().requires_grad_() for t in init]
    ref = [t.clone() for t in init]
    groups = [{"params": ours[:3], "lr": 0.05, "weight_decay": 0.2, "momentum": 0.9}, {"params": ours[3:]}]
    opt = Muon(groups, cfg, splits={ours[5]: SPLIT})  # rows 32: the only split one
    opt._orthogonalize = lambda x: fake_orth(x, with_scale)  # type: ignore[method-assign]
    state: dict[int, torch.Tensor] = {}
    for _ in range(3):
        for a, b in zip(ours, ref, strict=True):
            a.grad = torch.randn(a.shape, generator=gen).to(dtype)
            b.grad = a.grad.clone()
        opt.step()
        reference_step(ref[:3], state, cfg, lr=0.05, weight_decay=0.2, momentum=0.9, with_scale=with_scale)
        reference_step(ref[3:], state, cfg, lr=0.02, weight_decay=0.1, momentum=0.95, with_scale=with_scale)
    for a, b in zip(ours, ref, strict=True):
        assert torch.equal(a.detach(), b), (tuple(a.shape), float((a.detach() - b).abs().max()))
        assert torch.equal(opt.state[a]["momentum_buffer"], state[id(b)])
        assert opt.state[a]["momentum_buffer"].dtype == state[id(b)].dtype


def test_kernels_path_calls_orthogonalize_once_per_shape_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the CUDA path (dispatch predicate forced true), optim.kernels.orthogonalize runs once per oriented
    shape, on the stack of all its matrices, never per parameter."""
    calls: list[tuple[int, ...]] = []

    def spy(x: torch.Tensor, **kw: object) -> torch.Tensor:
        calls.append(tuple(x.shape))
        return kernels_orthogonalize(x, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(muon_mod, "_kernels", types.SimpleNamespace(orthogonalize=spy))
    monkeypatch.setattr(Muon, "_use_kernels", lambda self, x: True)
    # A scaled-down Qwen3-30B-A3B layer: q (tall), k, v, o (wide twin of q^T), 8 fc1 and 8 fc2 experts.
    shapes = [(64, 32), (8, 32), (8, 32), (32, 64)] + [(24, 32)] * 8 + [(32, 12)] * 8
    gen = torch.Generator().manual_seed(0)
    ps = [torch.randn(s, generator=gen).requires_grad_() for s in shapes]
    before = [p.detach().clone() for p in ps]
    for p in ps:
        p.grad = torch.randn(p.shape, generator=gen)
    # the multi-tensor path (the fused one, tests/unit/test_muon_fused.py, buckets by (group, shape) instead)
    Muon(ps, MuonConfig(fused_step=False)).step()
    assert sorted(calls) == [(2, 8, 32), (2, 32, 64), (8, 12, 32), (8, 24, 32)]
    assert all(not torch.equal(p.detach(), b) for p, b in zip(ps, before, strict=True))


def test_one_host_sync_per_step_and_exact_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Finite steps sync once; a finite but huge momentum (L1 norm overflows fp32) takes the exact per-parameter
    check and is NOT skipped; a NaN is skipped with the same event as the per-parameter check."""
    syncs: list[int] = []
    real = orth_mod.host_flags

    def counting(flags: list[torch.Tensor]) -> list[bool]:
        syncs.append(len(flags))
        return real(flags)

    monkeypatch.setattr(orth_mod, "host_flags", counting)
    a = torch.nn.Parameter(torch.ones(8, 12))
    b = torch.nn.Parameter(torch.ones(12, 8))
    opt = Muon([("a", a), ("b", b)], MuonConfig(momentum=0.0))
    a.grad, b.grad = torch.ones(8, 12), torch.ones(12, 8)
    opt.step()
    assert len(syncs) == 1
    a.grad = torch.full((8, 12), 3e37)  # |m| sums to ~2.9e39 > fp32 max, every element finite
    a_before = a.detach().clone()
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonFiniteWarning)
        opt.step()
    assert len(syncs) == 3 and opt.nonfinite_events == []
    assert torch.equal(opt.state[a]["momentum_buffer"], a.grad) and not torch.equal(a.detach(), a_before)
    b.grad = torch.ones(12, 8)
    b.grad[3, 4] = float("inf")
    b_before = b.detach().clone()
    with pytest.warns(NonFiniteWarning, match="non-finite grad in b at step 3"):
        opt.step()
    assert torch.equal(b.detach(), b_before) and opt.nonfinite_events == [("b", 3, "grad")]


def test_bench_optim_step_cpu_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    """bench.tools.optim_step (the script the GPU runs unchanged) works end to end on CPU."""
    import json

    from bench.tools import optim_step

    assert (
        optim_step.main(
            [
                "scale=0.004",
                "repeats=2",
                "format=json",
                "impls=adamw_foreach,optim_muon_split,optim_muon_no_ns",
            ]
        )
        == 0
    )
    res = json.loads(capsys.readouterr().out)
    assert res["num_params"] == 260 and [r["impl"] for r in res["rows"]] == [
        "adamw_foreach",
        "optim_muon_split",
        "optim_muon_no_ns",
    ]
    assert all(r["median_ms"] > 0 and len(r["times_ms"]) == 2 for r in res["rows"])
    assert res["warmup"] == 1
    # user errors are one line naming the argument and exit 2, not a traceback
    for arg, message in {
        "device=tpu": "device='tpu' is not one of ('cpu', 'cuda')",
        "warmup=-1": "warmup=-1: the number of untimed steps must be >= 0",
        "impls=bogus": "impls=['bogus'] not among ('adamw_foreach',",
        "layout=flat": "layout='flat' is not one of",
        "repeats=many": "repeats='many': not a int",
        "fast": "['fast']: arguments are key=value",
    }.items():
        assert optim_step.main([arg]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {message}") and err.count("\n") == 1, err


def test_optim_step_bucket_layout_views_flat_buffers() -> None:
    """layout=buckets: the same values and gradients, as views of flat buffers of at most bucket_numel elements,
    consecutive in model order (what the layer-wise optimizer holds), so the matrices form few stacked runs."""
    from bench.tools.ns_kernels_measure import make_params
    from bench.tools.optim_step import lay_out
    from optim.kernels.fused_step import stacked_runs

    ps = make_params([(4, 6, 7), (6, 4, 3)], "cpu")
    laid = lay_out(ps, "buckets", bucket_numel=5 * 24)
    assert lay_out(ps, "separate") is ps
    assert all(torch.equal(a, b) and a.grad is b.grad for a, b in zip(ps, laid, strict=True))
    storages = [q.untyped_storage().data_ptr() for q in laid]
    assert len(set(storages)) == 2  # 7 x 24 + 3 x 24 elements in buffers of at most 120
    assert [len(r) for r in stacked_runs(laid[:7])] == [5, 2]


def test_optim_step_harness_runs_warmup_then_repeats() -> None:
    """bench.tools.optim_step.time_step: `warmup` untimed steps, then `repeats` timed ones, all real updates."""
    from bench.tools.optim_step import time_step

    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.ones(3)
    opt = torch.optim.Adam([p], lr=0.1)
    wall, cpu = time_step(opt, "cpu", repeats=3, warmup=2)
    assert len(wall) == len(cpu) == 3 and opt.state[p]["step"] == 5
