"""Muon against emerging-optimizers 0.3.0 and torch.optim.Muon, plus grouping, splits, NaN handling, state_dict.

Tolerances: with ns_precision="fp32" vs EO fp32_matmul_prec="highest" the math is the same op sequence, so
parameters agree to 1e-6 after 5 steps. With bf16 ("medium") both iterate in bf16; ours normalizes in fp32 before
the cast, as EO does, so they agree to bf16 rounding of the update (atol lr * 2e-2 * scale). torch.optim.Muon
normalizes after the bf16 cast, a deliberate difference bounded the same way.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from optim.configs import MuonConfig
from optim.functional.newton_schulz import newton_schulz
from optim.functional.split import RowSplit
from optim.optimizers import NonFiniteError, NonFiniteWarning
from optim.optimizers import muon as muon_mod
from optim.optimizers.muon import Muon
from tests.unit._optim_fixtures import one_thread  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")

SHAPES = [(16, 24), (24, 16), (16, 24), (8, 8)]


def _run(opt_factory, shapes, steps: int, seed: int = 0, dtype=torch.float32) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(seed)
    params = [torch.randn(s, generator=gen).to(dtype).requires_grad_() for s in shapes]
    opt = opt_factory(params)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).to(dtype)
        opt.step()
    return [p.detach() for p in params]


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("scale_mode", ["spectral", "shape_scaling", "unit_rms_norm"])
def test_matches_eo_fp32(nesterov: bool, scale_mode: str) -> None:
    """Localises a wrong momentum, Nesterov, weight-decay order or scale formula vs EO 0.3.0."""
    from emerging_optimizers.orthogonalized_optimizers.muon import Muon as EOMuon

    kw = {
        "nesterov": nesterov,
        "scale_mode": scale_mode,
        "extra_scale_factor": 0.5,
        "weight_decay": 0.1,
        "lr": 0.02,
    }
    ours = _run(lambda p: Muon(p, MuonConfig(ns_precision="fp32", **kw)), SHAPES, 5)  # type: ignore[arg-type]
    ref = _run(lambda p: EOMuon(p, fp32_matmul_prec="highest", **kw), SHAPES, 5)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("coefficient_type", ["quintic", "polar_express"])
def test_matches_eo_bf16(coefficient_type: str) -> None:
    """bf16 iterate (EO "medium"): agreement to bf16 rounding of the update."""
    from emerging_optimizers.orthogonalized_optimizers.muon import Muon as EOMuon

    kw = {"coefficient_type": coefficient_type, "lr": 0.01}
    ours = _run(lambda p: Muon(p, MuonConfig(**kw)), SHAPES, 3)  # type: ignore[arg-type]
    ref = _run(lambda p: EOMuon(p, fp32_matmul_prec="medium", **kw), SHAPES, 3)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, atol=0.01 * 2e-2 * 5 * 3, rtol=0)


def test_matches_torch_muon() -> None:
    """torch.optim.Muon == ours with simple coefficients, Nesterov, shape_scaling, bf16 (its definitions)."""
    kw = {"lr": 0.01, "weight_decay": 0.1, "momentum": 0.95}
    ours = _run(
        lambda p: Muon(
            p, MuonConfig(coefficient_type="simple", nesterov=True, scale_mode="shape_scaling", **kw)
        ),
        SHAPES,
        3,
    )
    ref = _run(lambda p: torch.optim.Muon(p, nesterov=True, adjust_lr_fn="original", **kw), SHAPES, 3)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, atol=0.01 * 3e-2 * 2 * 3, rtol=0)


def test_converges_on_quadratic() -> None:
    """min ||A W B - C||^2: loss must drop by 100x in 150 steps (a sign or scale bug fails this)."""
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(32, 32, generator=gen) / 6, torch.randn(24, 24, generator=gen) / 5
    target = a @ torch.randn(32, 24, generator=gen) @ b
    w = torch.zeros(32, 24, requires_grad=True)
    opt = Muon([w], MuonConfig(lr=0.02, weight_decay=0.0, nesterov=True, ns_precision="fp32"))
    first = None
    for i in range(150):
        loss = ((a @ w @ b - target) ** 2).sum()
        first = loss.item() if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i > 100:
            for g in opt.param_groups:
                g["lr"] = 0.004
    assert loss.item() < first / 100


def test_bitwise_deterministic() -> None:
    shapes = [*SHAPES, (3, 16, 24)]
    r1 = _run(lambda p: Muon(p, MuonConfig(use_gram_ns=True)), shapes, 3)
    r2 = _run(lambda p: Muon(p, MuonConfig(use_gram_ns=True)), shapes, 3)
    assert all(torch.equal(a, b) for a, b in zip(r1, r2, strict=True))


def test_equal_shapes_are_one_batched_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mandatory grouping: 6 expert matrices, a 3-D stack and a transposed twin -> one NS call on 11 matrices."""
    calls: list[tuple[int, ...]] = []

    def spy(x: torch.Tensor, **kw: object) -> torch.Tensor:
        calls.append(tuple(x.shape))
        return newton_schulz(x, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(muon_mod, "newton_schulz", spy)
    shapes = [(16, 32)] * 6 + [(4, 16, 32), (32, 16), (8, 8)]
    _run(lambda p: Muon(p, MuonConfig()), shapes, 1)
    assert sorted(calls) == [(1, 8, 8), (11, 16, 32)]


def test_3d_stack_is_per_expert_and_matches_2d() -> None:
    """A (E, out, in) stack must give exactly the updates of E separate 2-D parameters."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(3, 12, 20, generator=gen)
    g = torch.randn(3, 12, 20, generator=gen)
    stack = w.clone().requires_grad_()
    singles = [w[i].clone().requires_grad_() for i in range(3)]
    stack.grad = g.clone()
    for i, s in enumerate(singles):
        s.grad = g[i].clone()
    cfg = MuonConfig(ns_precision="fp32")
    Muon([stack], cfg).step()
    Muon(singles, cfg).step()
    torch.testing.assert_close(
        stack.detach(), torch.stack([s.detach() for s in singles]), atol=1e-7, rtol=1e-7
    )


def test_split_qkv_pieces_get_own_orthogonalization_and_scale() -> None:
    """Localises a wrong interleave: split Q, K, V (2 query groups, 2 heads per group, d = 4) by hand."""
    split = RowSplit(num_groups=2, sizes=(8, 4, 4), labels=("q", "k", "v"))
    gen = torch.Generator().manual_seed(0)
    w = torch.zeros(32, 24, requires_grad=True)
    g = torch.randn(32, 24, generator=gen)
    w.grad = g.clone()
    cfg = MuonConfig(ns_precision="fp32", weight_decay=0.0, lr=1.0, momentum=0.0)
    Muon([w], cfg, splits={w: split}).step()
    view = g.view(2, 16, 24)
    expect = []
    for lo, hi in ((0, 8), (8, 12), (12, 16)):
        piece = view[:, lo:hi].reshape(-1, 24)
        expect.append(
            (newton_schulz(piece, compute_dtype=torch.float32) * max(piece.shape) ** 0.5).view(2, -1, 24)
        )
    torch.testing.assert_close(-w.detach(), torch.cat(expect, dim=1).reshape(32, 24), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("where", ["grad", "momentum"])
def test_nonfinite_skip_and_raise(where: str) -> None:
    """A NaN/Inf never reaches the weights; the report names the parameter and the step."""
    a = torch.nn.Parameter(torch.ones(8, 12))
    b = torch.nn.Parameter(torch.ones(8, 12))
    opt = Muon([("layer.a", a), ("layer.b", b)], MuonConfig(nonfinite_policy="skip"))
    a.grad, b.grad = torch.ones(8, 12), torch.ones(8, 12)
    opt.step()
    buf_before = opt.state[a]["momentum_buffer"].clone()
    a_before, b_before = a.detach().clone(), b.detach().clone()
    if where == "grad":
        a.grad = torch.ones(8, 12)
        a.grad[1, 2] = float("nan")
    else:
        a.grad = torch.full((8, 12), 3e38)
        opt.state[a]["momentum_buffer"].fill_(-3e38)  # finite, but the EMA difference overflows
        buf_before = opt.state[a]["momentum_buffer"].clone()
    b.grad = torch.ones(8, 12)
    with pytest.warns(NonFiniteWarning, match=r"layer\.a at step 2"):
        opt.step()
    assert torch.equal(a.detach(), a_before) and not torch.equal(b.detach(), b_before)
    assert torch.equal(opt.state[a]["momentum_buffer"], buf_before)
    assert opt.nonfinite_events == [("layer.a", 2, where)]
    opt_raise = Muon([("layer.a", a)], MuonConfig(nonfinite_policy="raise"))
    a.grad = torch.full((8, 12), float("inf"))
    with pytest.raises(NonFiniteError, match=r"layer\.a \(grad, step 1\)"):
        opt_raise.step()
    assert torch.equal(a.detach(), a_before)


def test_state_dict_round_trip_keeps_fp32_momentum_for_bf16() -> None:
    """Resume == uninterrupted, bitwise; torch's load would cast fp32 momentum to bf16 unless we undo it."""
    gen = torch.Generator().manual_seed(0)
    init = [torch.randn(s, generator=gen) for s in SHAPES]
    grads = [[torch.randn(s, generator=gen) for s in SHAPES] for _ in range(4)]

    def make() -> tuple[list[torch.Tensor], Muon]:
        ps = [t.clone().to(torch.bfloat16).requires_grad_() for t in init]
        return ps, Muon(ps, MuonConfig(nesterov=True))

    def run(ps: list[torch.Tensor], opt: Muon, gs: list[list[torch.Tensor]]) -> None:
        for step_grads in gs:
            for p, g in zip(ps, step_grads, strict=True):
                p.grad = g.to(torch.bfloat16)
            opt.step()

    p1, o1 = make()
    run(p1, o1, grads)
    p2, o2 = make()
    run(p2, o2, grads[:2])
    sd = o2.state_dict()
    p3, o3 = make()
    with torch.no_grad():
        for a, b in zip(p3, p2, strict=True):
            a.copy_(b)
    o3.load_state_dict(sd)
    assert o3.state[p3[0]]["momentum_buffer"].dtype == torch.float32
    run(p3, o3, grads[2:])
    assert all(torch.equal(a, b) for a, b in zip(p1, p3, strict=True))


def test_rejects_1d_and_bad_config() -> None:
    with pytest.raises(ValueError, match="route it to AdamW"):
        Muon([torch.zeros(4, requires_grad=True)])
    with pytest.raises(ValueError, match="scale_mode='rms'"):
        MuonConfig(scale_mode="rms")
    with pytest.raises(ValueError, match="custom_coefficients"):
        MuonConfig(coefficient_type="custom")
    with pytest.raises(ValueError, match="gram_restart_iterations"):
        MuonConfig(use_gram_ns=True, num_ns_steps=2)
    MuonConfig(num_ns_steps=2)  # restarts only matter for Gram-NS
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        MuonConfig(coefficient_type="custom", custom_coefficients=((2.0, -1.5, 0.5),))


def test_fp16_iterate_is_closer_to_fp32_than_bf16() -> None:
    """ns_precision="fp16" (ours only): after 3 steps the parameters sit closer to the fp32-iterate run than the
    bf16 run's do (EO fp32 "highest" is the oracle through test_matches_eo_fp32)."""
    kw = {"lr": 0.01}
    ref = _run(lambda p: Muon(p, MuonConfig(ns_precision="fp32", **kw)), SHAPES, 3)  # type: ignore[arg-type]
    out = {
        prec: _run(lambda p, prec=prec: Muon(p, MuonConfig(ns_precision=prec, **kw)), SHAPES, 3)  # type: ignore[arg-type]
        for prec in ("bf16", "fp16")
    }

    def dist(ps: list[torch.Tensor]) -> float:
        return sum(float((a - b).norm()) for a, b in zip(ps, ref, strict=True))

    assert dist(out["fp16"]) < 0.5 * dist(out["bf16"]), (dist(out["fp16"]), dist(out["bf16"]))
