"""The fused path of Muon's step (`optim.optimizers.fused.FusedStep`), on CPU through the torch reference of
`optim.kernels.fused_step` (the Triton kernels are checked against that reference in tests/gpu).

On CUDA the path is taken by default (`MuonConfig.fused_step`); here `_fused_available` is forced on so that the
bucketing, non-finite handling, state, weight decay and scale plumbing are exercised without a GPU.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from optim.configs import MuonConfig
from optim.functional.split import RowSplit
from optim.optimizers import NonFiniteWarning
from optim.optimizers.base import NonFiniteError
from optim.optimizers.fused import FusedStep
from optim.optimizers.muon import Muon
from tests.unit._optim_fixtures import one_thread  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")

SHAPES = [(16, 24), (24, 16), (16, 24), (8, 8), (32, 12)]


def _params(shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g) * 0.1 for s in shapes]


def _rel_update(got, ref, init):
    """||(got - init) - (ref - init)|| / ||ref - init||: the two runs' total updates compared."""
    return float((got.detach() - ref.detach()).norm() / (ref.detach() - init).norm())


def _grads(shapes, step, seed=1):
    g = torch.Generator().manual_seed(seed * 1000 + step)
    return [torch.randn(*s, generator=g) for s in shapes]


def _run(monkeypatch, fused: bool, cfg: MuonConfig, shapes=SHAPES, steps=3, splits=None, grads_fn=_grads):
    monkeypatch.setattr(Muon, "_fused_available", lambda self: fused)
    ps = [p.clone().requires_grad_(True) for p in _params(shapes)]
    opt = Muon(
        [{"params": ps[:2], "lr": 0.02}, {"params": ps[2:], "lr": 0.01, "weight_decay": 0.0}],
        cfg,
        splits={ps[i]: s for i, s in (splits or {}).items()},
    )
    calls = []
    orig = opt._orthogonalize

    def spy(x):
        calls.append(tuple(x.shape))
        return orig(x)

    opt._orthogonalize = spy
    for k in range(steps):
        for p, g in zip(ps, grads_fn(shapes, k), strict=True):
            p.grad = g
        opt.step()
    return ps, opt, calls


@pytest.mark.parametrize("nesterov", [True, False])
def test_fused_matches_unfused(monkeypatch, nesterov):
    cfg = MuonConfig(lr=0.02, momentum=0.9, nesterov=nesterov, weight_decay=0.1)
    ref, ref_opt, _ = _run(monkeypatch, False, cfg)
    got, opt, calls = _run(monkeypatch, True, cfg)
    inits = _params(SHAPES)
    # one bf16 NS call per (group, shape) bucket: group 0 {16x24, 24x16}, group 1 {16x24, 8x8, 32x12}; tall
    # matrices arrive in their wide orientation (momentum_pack(transpose=True))
    assert sorted(calls[:5]) == sorted([(1, 16, 24), (1, 16, 24), (1, 16, 24), (1, 8, 8), (1, 12, 32)])
    for init, p0, p1, q0, q1 in zip(
        inits,
        ref,
        got,
        ref_opt.param_groups[0]["params"] + ref_opt.param_groups[1]["params"],
        opt.param_groups[0]["params"] + opt.param_groups[1]["params"],
        strict=True,
    ):
        # the only difference: the NS input is rounded to bf16 before normalization (bf16 NS either way)
        assert _rel_update(p1, p0, init) < 2e-2
        # momentum: the same lerps in fp32
        torch.testing.assert_close(opt.state[q1]["momentum_buffer"], ref_opt.state[q0]["momentum_buffer"])
        assert opt.state[q1]["step"] == ref_opt.state[q0]["step"] == 3


def test_fused_update_formula(monkeypatch):
    """One step from zero momentum, identity-free check: p1 = p0 (1 - lr wd) - lr scale NS(bf16(m))."""
    monkeypatch.setattr(Muon, "_fused_available", lambda self: True)
    cfg = MuonConfig(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.2)
    p = torch.randn(16, 40).requires_grad_(True)
    p0 = p.detach().clone()
    g = torch.randn(16, 40)
    opt = Muon([p], cfg)
    p.grad = g
    opt.step()
    buf = 0.2 * g  # lerp(0, g, 1 - beta)
    m = g + 0.8 * (buf - g)
    x = m.to(torch.bfloat16).unsqueeze(0)
    orth, _ = Muon([torch.zeros(16, 40)], cfg)._orthogonalize(x)
    want = p0 * (1 - 0.05 * 0.2) - 0.05 * (40**0.5) * orth[0].float()
    torch.testing.assert_close(p.detach(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(opt.state[p]["momentum_buffer"], buf)


def test_split_and_3d_and_bf16_params_take_the_unfused_path(monkeypatch):
    """A split fused matrix, a 3-D expert stack and a bf16 matrix are stepped by the multi-tensor path; the rest
    fused; the result equals the all-unfused run for the unfused ones bitwise."""
    shapes = [(16, 24), (12, 20), (3, 16, 24), (16, 24)]
    split = {1: RowSplit(num_groups=2, sizes=(2, 2, 2))}
    cfg = MuonConfig(lr=0.02, momentum=0.9, nesterov=True, weight_decay=0.1)
    ref, _, _ = _run(monkeypatch, False, cfg, shapes=shapes, splits=split)
    got, _, calls = _run(monkeypatch, True, cfg, shapes=shapes, splits=split)
    torch.testing.assert_close(got[1], ref[1], rtol=0, atol=0)  # split: unfused in both
    torch.testing.assert_close(got[2], ref[2], rtol=0, atol=0)  # 3-D stack: unfused in both
    inits = _params(shapes)
    for i in (0, 3):
        assert _rel_update(got[i], ref[i], inits[i]) < 2e-2
    # step 1: fused buckets (group 0: p0; group 1: p3) are bf16 stacks, unfused ones fp32
    assert any(len(c) == 3 and c[0] == 1 for c in calls)


def test_equal_contiguous_split_is_fused_as_pieces(monkeypatch):
    """gate / up of a wide fused fc1 (one group, equal blocks) takes the fused path as a view: each piece is its own
    NS matrix, scaled by its own shape, and the steps agree with the unfused split path up to the bf16 input
    rounding; a joint (unsplit) matrix of the same shape is a separate bucket with a different update."""
    shapes = [(16, 24), (16, 24), (16, 24)]
    halves = RowSplit(num_groups=1, sizes=(8, 8), labels=("gate", "up"))
    split = {0: halves, 1: halves}
    cfg = MuonConfig(lr=0.02, momentum=0.9, nesterov=True, weight_decay=0.1)
    ref, ref_opt, _ = _run(monkeypatch, False, cfg, shapes=shapes, splits=split)
    got, opt, calls = _run(monkeypatch, True, cfg, shapes=shapes, splits=split)
    # step 1: group 0 holds both split matrices -> 4 pieces of 8 x 24 in one call; group 1 the joint 16 x 24
    assert sorted(calls[:2]) == [(1, 16, 24), (4, 8, 24)]
    inits = _params(shapes)
    for i in range(3):
        assert _rel_update(got[i], ref[i], inits[i]) < 2e-2
    for q0, q1 in zip(ref_opt.param_groups[0]["params"], opt.param_groups[0]["params"], strict=True):
        torch.testing.assert_close(opt.state[q1]["momentum_buffer"], ref_opt.state[q0]["momentum_buffer"])
    # the split really changes the update: the joint run differs by far more than the rounding above
    joint, _, _ = _run(monkeypatch, True, cfg, shapes=shapes)
    assert _rel_update(got[0], joint[0], inits[0]) > 0.1


def test_split_pieces_formula_and_tall_or_uneven_splits_stay_unfused(monkeypatch):
    """One fused step of a split matrix: each half is NS(bf16(m_half)) scaled by the half's sqrt(rows / cols), not
    the whole matrix's; a tall matrix's split and an uneven split take the unfused path."""
    monkeypatch.setattr(Muon, "_fused_available", lambda self: True)
    cfg = MuonConfig(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.0, scale_mode="unit_rms_norm")
    p = torch.randn(48, 20).requires_grad_(True)  # each half 24 x 20 is tall; the matrix is tall too
    wide = torch.randn(16, 40).requires_grad_(True)
    uneven = torch.randn(12, 40).requires_grad_(True)
    opt = Muon(
        [p, wide, uneven],
        cfg,
        splits={
            p: RowSplit(num_groups=1, sizes=(24, 24)),
            wide: RowSplit(num_groups=1, sizes=(8, 8)),
            uneven: RowSplit(num_groups=1, sizes=(4, 8)),
        },
    )
    assert opt.fused.params() == [] and opt.fused.static_params() == [wide]
    p0 = wide.detach().clone()
    g = torch.randn(16, 40)
    for q in (p, wide, uneven):
        q.grad = torch.randn(q.shape) if q is not wide else g
    opt.step()
    m = g + 0.8 * (0.2 * g - g)
    x = m.to(torch.bfloat16).view(2, 8, 40)
    orth, _ = Muon([torch.zeros(8, 40)], cfg)._orthogonalize(x)
    assert opt._shape_scale(8, 40) == pytest.approx(0.2**0.5)
    want = p0 - 0.05 * opt._shape_scale(8, 40) * orth.reshape(16, 40).float()
    torch.testing.assert_close(wide.detach(), want, rtol=1e-5, atol=1e-6)


def _nan_grads(shapes, step, seed=1):
    gs = _grads(shapes, step, seed)
    if step == 1:
        gs[3] = gs[3].clone()
        gs[3][0, 0] = float("nan")
    return gs


def test_nonfinite_grad_skips_that_matrix(monkeypatch):
    cfg = MuonConfig(lr=0.02, momentum=0.9, nesterov=True, weight_decay=0.1, nonfinite_policy="skip")
    ref, ref_opt, _ = _run(monkeypatch, False, cfg, steps=2, grads_fn=_nan_grads)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got, opt, _ = _run(monkeypatch, True, cfg, steps=2, grads_fn=_nan_grads)
    assert any(issubclass(x.category, NonFiniteWarning) for x in w)
    assert opt.nonfinite_events == ref_opt.nonfinite_events
    assert len(opt.nonfinite_events) == 1 and opt.nonfinite_events[0][1:] == (2, "grad")
    # the skipped matrix: weight and momentum of step 1 kept, as the unfused path
    q = opt.param_groups[1]["params"][1]
    q_ref = ref_opt.param_groups[1]["params"][1]
    assert _rel_update(got[3], ref[3], _params(SHAPES)[3]) < 2e-2
    torch.testing.assert_close(opt.state[q]["momentum_buffer"], ref_opt.state[q_ref]["momentum_buffer"])
    assert all(torch.isfinite(p).all() for p in got)


def test_nonfinite_grad_raise_leaves_everything(monkeypatch):
    monkeypatch.setattr(Muon, "_fused_available", lambda self: True)
    cfg = MuonConfig(nonfinite_policy="raise")
    ps = [torch.randn(8, 12).requires_grad_(True) for _ in range(2)]
    opt = Muon(ps, cfg)
    for p in ps:
        p.grad = torch.randn(8, 12)
    opt.step()
    before = [p.detach().clone() for p in ps]
    bufs = [opt.state[p]["momentum_buffer"].clone() for p in ps]
    ps[1].grad = torch.full((8, 12), float("inf"))
    ps[0].grad = torch.randn(8, 12)
    with pytest.raises(NonFiniteError, match="grad"):
        opt.step()
    for p, b, buf in zip(ps, before, bufs, strict=True):
        assert torch.equal(p.detach(), b)
        assert torch.equal(opt.state[p]["momentum_buffer"], buf)
        assert opt.state[p]["step"] == 1


def test_nonfinite_momentum_raises_before_any_weight_and_overflowing_norms_do_not(monkeypatch):
    """Gradients vouched finite (no gradient screen) but one is NaN: its momentum turns NaN, the pack's norm screen
    fails, and NonFiniteError ("momentum") is raised before any weight is written. Finite momentum whose squared
    norm overflows fp32 fails the same screen, but the step goes on (the exact check finds no NaN/Inf)."""
    monkeypatch.setattr(Muon, "_fused_available", lambda self: True)
    ps = [torch.randn(8, 12).requires_grad_(True) for _ in range(2)]
    opt = Muon(ps, MuonConfig(nonfinite_policy="skip"))
    ps[0].grad = torch.randn(8, 12)
    ps[1].grad = torch.randn(8, 12)
    ps[1].grad[2, 3] = float("nan")
    before = [p.detach().clone() for p in ps]
    opt.assume_finite_grads()
    with pytest.raises(NonFiniteError, match="momentum"):
        opt.step()
    assert all(torch.equal(p.detach(), b) for p, b in zip(ps, before, strict=True))
    qs = [torch.randn(8, 12).requires_grad_(True) for _ in range(2)]
    opt = Muon(qs, MuonConfig(nonfinite_policy="raise"))
    for q in qs:
        q.grad = torch.full((8, 12), 1e20)  # momentum 5e18 per element: finite, its squared norm is not
    exact_checks = []
    real = FusedStep._raise_if_momentum_nonfinite
    monkeypatch.setattr(
        FusedStep, "_raise_if_momentum_nonfinite", lambda self, *a: exact_checks.append(1) or real(self, *a)
    )
    opt.step()
    assert exact_checks == [1]  # the norm screen failed, the exact check passed
    assert opt.nonfinite_events == [] and all(torch.isfinite(q).all() for q in qs)


def test_fused_step_false_never_fuses(monkeypatch):
    """fused_step=False: the real `_fused_available` says no even where kernels exist."""
    monkeypatch.setattr("optim.optimizers.muon.kernels_available", lambda: True)
    assert Muon([torch.zeros(4, 4)], MuonConfig(fused_step=False))._fused_available() is False
    assert Muon([torch.zeros(4, 4)], MuonConfig(fused_step=True))._fused_available() is True
    assert Muon([torch.zeros(4, 4)], MuonConfig(ns_precision="fp32"))._fused_available() is False


@pytest.mark.parametrize("fused", [False, True])
def test_instrument_sees_every_orthogonalize_call(monkeypatch, fused):
    """The public timing hook wraps each batched call (unfused shape groups or fused buckets) and changes nothing."""
    cfg = MuonConfig(lr=0.02, momentum=0.9, nesterov=True, weight_decay=0.1)
    ref, _, _ = _run(monkeypatch, fused, cfg, steps=1)
    monkeypatch.setattr(Muon, "_fused_available", lambda self: fused)
    ps = [p.clone().requires_grad_(True) for p in _params(SHAPES)]
    opt = Muon([{"params": ps[:2], "lr": 0.02}, {"params": ps[2:], "lr": 0.01, "weight_decay": 0.0}], cfg)
    seen: list[tuple[str, tuple[int, ...]]] = []

    def wrap(fn, phase):
        def call(x, *a, **k):
            seen.append((phase, tuple(x.shape)))
            return fn(x, *a, **k)

        return call

    opt.instrument(wrap)
    for p, g in zip(ps, _grads(SHAPES, 0), strict=True):
        p.grad = g
    opt.step()
    # unfused: one call per oriented shape over both groups (16x24 x3 incl. the transposed 24x16; 8x8; 12x32);
    # fused: one per (group, shape) bucket
    want = 5 if fused else 3
    assert len(seen) == want and {ph for ph, _ in seen} == {"ns"}, seen
    for p, r in zip(ps, ref, strict=True):
        torch.testing.assert_close(p, r, rtol=0, atol=0)


def test_cached_buckets_follow_loaded_state_and_new_parameters(monkeypatch):
    """The fused path keeps its buckets (and parameter screening) between steps; loading a state dict (new momentum
    tensors) and adding a parameter group must both be seen: each step equals a fresh optimizer's on the same state."""
    monkeypatch.setattr(Muon, "_fused_available", lambda self: True)
    cfg = MuonConfig(lr=0.02, momentum=0.9, weight_decay=0.1)

    def fresh_like(opt, params):
        twin = Muon([q.detach().clone().requires_grad_(True) for q in params], cfg)
        twin.load_state_dict(opt.state_dict())
        return twin

    ps = [p.requires_grad_(True) for p in _params(SHAPES)]
    opt = Muon(ps, cfg)
    for k in range(2):
        for p, g in zip(ps, _grads(SHAPES, k), strict=True):
            p.grad = g
        opt.step()
    sd = opt.state_dict()
    for st in sd["state"].values():
        st["momentum_buffer"] = st["momentum_buffer"] * 3.0  # new tensors, different values
    opt.load_state_dict(sd)
    twin = fresh_like(opt, ps)
    grads = _grads(SHAPES, 7)
    for p, q, g in zip(ps, twin.param_groups[0]["params"], grads, strict=True):
        p.grad, q.grad = g, g.clone()
    opt.step()
    twin.step()
    for p, q in zip(ps, twin.param_groups[0]["params"], strict=True):
        torch.testing.assert_close(p.detach(), q.detach())
        torch.testing.assert_close(opt.state[p]["momentum_buffer"], twin.state[q]["momentum_buffer"])
    # a parameter group added after the structures were built is stepped too
    extra = (torch.randn(16, 24) * 0.1).requires_grad_(True)
    before = extra.detach().clone()
    opt.add_param_group({"params": [extra]})
    for p, g in zip([*ps, extra], [*_grads(SHAPES, 8), torch.randn(16, 24)], strict=True):
        p.grad = g
    opt.step()
    assert opt.state[extra]["step"] == 1 and not torch.equal(extra.detach(), before)
    assert all(opt.state[p]["step"] == 4 for p in ps)


def test_cached_buckets_follow_a_cleared_state(monkeypatch):
    """State dropped from outside (`opt.state.clear()`, e.g. to restart the momentum) is re-created, not bypassed by
    the cached buckets: the next step equals a fresh optimizer's first step."""
    monkeypatch.setattr(Muon, "_fused_available", lambda self: True)
    cfg = MuonConfig(lr=0.02, momentum=0.9, weight_decay=0.1)
    ps = [p.requires_grad_(True) for p in _params(SHAPES)]
    twins = [p.detach().clone().requires_grad_(True) for p in ps]
    opt, fresh = Muon(ps, cfg), Muon(twins, cfg)
    for k in range(2):
        for p, g in zip(ps, _grads(SHAPES, k), strict=True):
            p.grad = g
        opt.step()
    with torch.no_grad():
        for p, q in zip(ps, twins, strict=True):
            q.copy_(p)
    opt.state.clear()
    grads = _grads(SHAPES, 5)
    for p, q, g in zip(ps, twins, grads, strict=True):
        p.grad, q.grad = g, g.clone()
    opt.step()
    fresh.step()
    for p, q in zip(ps, twins, strict=True):
        torch.testing.assert_close(p.detach(), q.detach())
        assert opt.state[p]["step"] == 1


# ------------------------------------------------------------------------------ speculative NS (speculate)
def _spec_pair(monkeypatch, cfg=None, split_third=False):
    """Two identical fused Muons over SHAPES (group 0: 16x24, 24x16; group 1: 16x24, 8x8, 32x12); with
    `split_third`, group 1's 16x24 is split into two 8x24 halves (gate / up)."""
    monkeypatch.setattr(Muon, "_fused_available", lambda self: True)
    cfg = cfg or MuonConfig(lr=0.02, momentum=0.9, nesterov=True, weight_decay=0.1)
    out = []
    for _ in range(2):
        ps = [p.clone().requires_grad_(True) for p in _params(SHAPES)]
        groups = [{"params": ps[:2], "lr": 0.02}, {"params": ps[2:], "lr": 0.01, "weight_decay": 0.0}]
        splits = {ps[2]: RowSplit(num_groups=1, sizes=(8, 8))} if split_third else None
        out.append((ps, Muon(groups, cfg, splits=splits)))
    return out


def _same(a, b):
    for p, q in zip(a, b, strict=True):
        assert torch.equal(p.detach(), q.detach())


@pytest.mark.parametrize(("nesterov", "split"), [(True, False), (False, False), (True, True)])
def test_speculated_steps_equal_plain_steps(monkeypatch, nesterov, split):
    """NS computed ahead (speculate, per (group, shape) unit, transposed and gate / up split ones included),
    confirmed, then step(): weights, momentum and step counts bitwise equal to plain steps, over three steps; the
    speculation itself leaves the optimizer state untouched."""
    cfg = MuonConfig(lr=0.02, momentum=0.9, nesterov=nesterov, weight_decay=0.1)
    (ref, ref_opt), (ps, opt) = _spec_pair(monkeypatch, cfg, split_third=split)
    for k in range(3):
        grads = _grads(SHAPES, k)
        for p, q, g in zip(ref, ps, grads, strict=True):
            p.grad, q.grad = g.clone(), g.clone()
        ref_opt.step()
        bufs_before = {id(p): opt.state[p]["momentum_buffer"].clone() for p in ps if opt.state[p]}
        # units: (group 0, 16x24), (group 0, 24x16: tall), (group 1, 16x24), (group 1, 8x8); 32x12 left to the step
        for idx in ([0], [1], [2], [3]):
            opt.speculate([ps[i] for i in idx], [ps[i].grad for i in idx])
        for p in ps:
            if id(p) in bufs_before:
                assert torch.equal(opt.state[p]["momentum_buffer"], bufs_before[id(p)])
        opt.confirm_speculation()
        opt.step()
        assert opt.spec_stats == {"used": 4, "discarded": 0}
        _same(ps, ref)
        for p, q in zip(ref, ps, strict=True):
            assert torch.equal(opt.state[q]["momentum_buffer"], ref_opt.state[p]["momentum_buffer"])
            assert opt.state[q]["step"] == ref_opt.state[p]["step"] == k + 1


def test_unconfirmed_or_changed_speculation_is_recomputed(monkeypatch):
    """Not confirmed (e.g. the gradients were clipped after the speculation), a gradient that is another tensor at
    the step, or a momentum buffer replaced since: those results are thrown away and the step computes the NS
    input again from what is there, equal to a plain step on the same gradients."""
    (ref, ref_opt), (ps, opt) = _spec_pair(monkeypatch)
    grads = _grads(SHAPES, 0)
    for p, q, g in zip(ref, ps, grads, strict=True):
        p.grad, q.grad = g * 0.5, g.clone()  # the reference sees the clipped gradients
    opt.speculate(ps[:1], [ps[0].grad])
    for q in ps:
        q.grad.mul_(0.5)  # clipped in place after the speculation: not confirmed
    ref_opt.step()
    opt.step()
    assert opt.spec_stats == {"used": 0, "discarded": 1}
    _same(ps, ref)
    # confirmed, but one gradient is a new tensor and one momentum buffer was replaced
    grads = _grads(SHAPES, 1)
    for p, q, g in zip(ref, ps, grads, strict=True):
        p.grad, q.grad = g.clone(), g.clone()
    opt.speculate(ps[:1], [ps[0].grad])
    opt.speculate([ps[2]], [ps[2].grad])
    opt.speculate([ps[3]], [ps[3].grad])
    ps[0].grad = ps[0].grad.clone()
    opt.state[ps[2]]["momentum_buffer"] = opt.state[ps[2]]["momentum_buffer"].clone()
    opt.confirm_speculation()
    ref_opt.step()
    opt.step()
    assert opt.spec_stats == {"used": 1, "discarded": 2}
    _same(ps, ref)


def test_discard_speculation_and_nonfinite_gradient(monkeypatch):
    """discard_speculation() drops pending results (counted; the next step is plain). A NaN gradient in a
    speculated unit: the parameter is skipped with a warning exactly as without speculation, the unit's other
    parameter is stepped by the ordinary path."""
    (ref, ref_opt), (ps, opt) = _spec_pair(monkeypatch)
    for p, q, g in zip(ref, ps, _grads(SHAPES, 0), strict=True):
        p.grad, q.grad = g.clone(), g.clone()
    opt.speculate([ps[0]], [ps[0].grad])
    opt.discard_speculation()
    assert opt.spec_stats["discarded"] == 1 and not opt.fused.speculation.pending
    opt.confirm_speculation()  # a confirmation with nothing pending is harmless
    ref_opt.step()
    opt.step()
    assert opt.spec_stats == {"used": 0, "discarded": 0}
    _same(ps, ref)
    grads = _grads(SHAPES, 1)
    grads[2][0, 0] = float("nan")
    for p, q, g in zip(ref, ps, grads, strict=True):
        p.grad, q.grad = g.clone(), g.clone()
    opt.speculate([ps[2]], [ps[2].grad])
    opt.speculate([ps[3]], [ps[3].grad])
    opt.confirm_speculation()
    with warnings.catch_warnings(record=True) as w_ref:
        warnings.simplefilter("always")
        ref_opt.step()
    with warnings.catch_warnings(record=True) as w_got:
        warnings.simplefilter("always")
        opt.step()
    assert len(w_ref) == len(w_got) == 1 and issubclass(w_got[0].category, NonFiniteWarning)
    assert opt.spec_stats == {"used": 1, "discarded": 1}
    _same(ps, ref)
    assert opt.nonfinite_events == ref_opt.nonfinite_events


def test_speculate_rejects_what_the_fused_step_does_not_take(monkeypatch):
    """Errors name the parameter and the reason: an interleaved split matrix, mixed shapes, mixed splits, mixed
    groups, a bf16 gradient, a second speculation of one parameter; and speculation needs the fused path."""
    monkeypatch.setattr(Muon, "_fused_available", lambda self: True)
    ps = [torch.randn(8, 12, requires_grad=True) for _ in range(3)] + [torch.randn(12, 8, requires_grad=True)]
    split = torch.randn(12, 8, requires_grad=True)
    halves = torch.randn(8, 12, requires_grad=True)
    other = torch.randn(8, 12, requires_grad=True)
    opt = Muon(
        [{"params": [*ps, split, halves]}, {"params": [other], "lr": 0.5}],
        MuonConfig(),
        splits={split: RowSplit(num_groups=2, sizes=(2, 2, 2)), halves: RowSplit(num_groups=1, sizes=(4, 4))},
    )
    g = torch.zeros(8, 12)
    with pytest.raises(ValueError, match=r"not a parameter of the fused step"):
        opt.speculate([split], [torch.zeros(12, 8)])
    with pytest.raises(
        ValueError, match=r"param5: params must share one param group, shape \(8, 12\) and split"
    ):
        opt.speculate([ps[0], halves], [g, g])
    with pytest.raises(ValueError, match=r"one param group, shape \(8, 12\) and split"):
        opt.speculate([ps[0], ps[3]], [g, torch.zeros(12, 8)])
    with pytest.raises(ValueError, match=r"one param group"):
        opt.speculate([ps[0], other], [g, g])
    with pytest.raises(ValueError, match=r"fp32 contiguous"):
        opt.speculate([ps[0]], [g.bfloat16()])
    opt.speculate([ps[0]], [g])
    with pytest.raises(ValueError, match=r"already speculated"):
        opt.speculate([ps[1], ps[0]], [g, g])
    monkeypatch.setattr(Muon, "_fused_available", lambda self: False)  # chosen at construction
    with pytest.raises(ValueError, match=r"not on its fused step"):
        Muon([ps[2]], MuonConfig()).speculate([ps[2]], [g])


def test_instrument_times_speculative_calls_apart(monkeypatch):
    """instrument(): the speculative orthogonalize calls go through wrap(fn, "ns_overlap"), the step's through
    wrap(fn, "ns")."""
    (_, _), (ps, opt) = _spec_pair(monkeypatch)
    seen = []
    opt.instrument(lambda fn, phase: lambda x: seen.append(phase) or fn(x))
    for q, g in zip(ps, _grads(SHAPES, 0), strict=True):
        q.grad = g
    opt.speculate(ps[:1], [ps[0].grad])
    opt.confirm_speculation()
    opt.step()
    assert seen == ["ns_overlap", "ns", "ns", "ns", "ns"]
