"""SOAP / REKLS against emerging-optimizers 0.3.0 `REKLS` and `SOAP`, a hand-checkable limit (no preconditioned
side == AdamW), and the usual optimizer properties.

Tolerances and why:
- The Adam direction m / (sqrt(v) + eps) has slope 1/eps near 0. On the first step a non-square gradient leaves
  the larger Kronecker factor rank-deficient, and the rotated gradient has rounding-noise entries (~1e-7) in
  its null space, which eps = 1e-8 maps to arbitrary +-1 in both implementations. The parameter comparison
  therefore uses eps = 0.5 (same code paths, well-conditioned) and agrees to 5e-5 of the update; with all
  defaults (square matrices) the factors agree to 1e-5 and the per-step updates from step 2 on to 1e-3.
- EO's Adam update is wrapped in torch.compile; the fixture below runs it eagerly (same Python, 17 s faster).
- KL-Shampoo statistics depend on eigh's null-space basis of a rank-deficient factor; our KL products use EO's
  association so the rounding, and hence that basis, agrees.
"""

from __future__ import annotations

import pytest
import torch

from optim.configs import SOAPConfig
from optim.optimizers import NonFiniteError
from optim.optimizers.soap import SOAP
from tests.unit._optim_fixtures import one_thread  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")

SHAPES = [(8, 8), (12, 20), (20, 12)]


@pytest.fixture(autouse=True)
def _eager_eo(monkeypatch: pytest.MonkeyPatch) -> None:
    """EO wraps its Adam update and RMS clip in torch.compile; run the same Python eagerly (fast, and the oracle's
    rounding is then that of the eager ops rather than of an inductor kernel)."""
    from emerging_optimizers.scalar_optimizers import update_functions
    from emerging_optimizers.soap import soap as eo_soap

    for mod, name in ((eo_soap, "_clip_update_rms_in_place"), (update_functions, "calculate_adam_update")):
        fn = getattr(mod, name)
        monkeypatch.setattr(mod, name, getattr(fn, "_torchdynamo_orig_callable", fn))


def _pair(ours_cfg: SOAPConfig, eo_factory, steps: int, shapes=SHAPES):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(0)
    init = [torch.randn(s, generator=gen) for s in shapes]
    a = [t.clone().requires_grad_() for t in init]
    b = [t.clone().requires_grad_() for t in init]
    oa, ob = SOAP(a, ours_cfg), eo_factory(b)
    for _ in range(steps):
        for x, y in zip(a, b, strict=True):
            g = torch.randn(x.shape, generator=gen)
            x.grad, y.grad = g.clone(), g.clone()
        oa.step()
        ob.step()
    return a, b, init, oa, ob


@pytest.mark.parametrize("variant", ["rekls", "soap", "soap_kl"])
def test_matches_eo_parameters(variant: str) -> None:
    """Localises a wrong factor EMA, KL statistic, basis refresh/sort or rotated Adam vs EO 0.3.0."""
    from emerging_optimizers.soap.rekls import REKLS
    from emerging_optimizers.soap.soap import SOAP as EOSOAP

    kw = {"lr": 0.01, "eps": 0.5}
    if variant == "rekls":
        cfg, eo = SOAPConfig(eps_eigenvalue=0.5, **kw), lambda p: REKLS(p, **kw)
    else:
        kl = variant == "soap_kl"
        cfg = SOAPConfig(eps_eigenvalue=0.5, use_eigh=False, use_kl_shampoo=kl, **kw)
        eo = lambda p: EOSOAP(p, use_kl_shampoo=kl, **kw)
    a, b, init, _, _ = _pair(cfg, eo, 5)
    for x, y, p0 in zip(a, b, init, strict=True):
        torch.testing.assert_close(x.detach(), y.detach(), atol=5e-5 * (y - p0).abs().max().item(), rtol=1e-6)


def test_matches_eo_default_settings_square() -> None:
    """REKLS with every default on square (full-rank) matrices: factors and per-step updates follow EO's.

    Step 1 is excluded from the update comparison: its bases are the singular vectors of G, so the rotated
    gradient is diagonal plus rounding noise, and eps = 1e-8 turns that noise into +-1 entries in both codes.
    Non-square shapes are left out on purpose: the long side's factor is rank-deficient after step 1, KL-Shampoo
    then divides by null-space eigenvalue estimates that are rounding noise clamped at eps, and both
    implementations become chaotic (a property of the method at these settings, not of either code).
    """
    from emerging_optimizers.soap.rekls import REKLS

    gen = torch.Generator().manual_seed(0)
    init = [torch.randn(s, generator=gen) for s in ((8, 8), (10, 10))]
    a = [t.clone().requires_grad_() for t in init]
    b = [t.clone().requires_grad_() for t in init]
    oa, ob = SOAP(a, SOAPConfig(lr=0.01)), REKLS(b, lr=0.01)
    for step in range(1, 6):
        before = [(x.detach().clone(), y.detach().clone()) for x, y in zip(a, b, strict=True)]
        for x, y in zip(a, b, strict=True):
            g = torch.randn(x.shape, generator=gen)
            x.grad, y.grad = g.clone(), g.clone()
        oa.step()
        ob.step()
        if step == 1:
            continue
        for x, y, (x0, y0) in zip(a, b, before, strict=True):
            ref = y.detach() - y0
            torch.testing.assert_close(x.detach() - x0, ref, atol=1e-3 * ref.abs().max().item(), rtol=0)
    for pa, pb in zip(a, b, strict=True):
        for key in ("L", "R"):
            ref = ob.state[pb][key]
            torch.testing.assert_close(oa.state[pa][key], ref, atol=1e-5 * ref.abs().max().item(), rtol=0)


def test_no_preconditioned_side_is_adamw() -> None:
    """max_precond_dim below both sides: SOAP must reduce to torch.optim.AdamW exactly up to rounding."""
    gen = torch.Generator().manual_seed(0)
    w0 = torch.randn(6, 10, generator=gen)
    a, b = w0.clone().requires_grad_(), w0.clone().requires_grad_()
    oa = SOAP([a], SOAPConfig(lr=0.01, max_precond_dim=4, weight_decay=0.1))
    ob = torch.optim.AdamW([b], lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for _ in range(4):
        g = torch.randn(6, 10, generator=gen)
        a.grad, b.grad = g.clone(), g.clone()
        oa.step()
        ob.step()
    assert "L" not in oa.state[a] and "Q_R" not in oa.state[a]
    torch.testing.assert_close(a.detach(), b.detach(), atol=1e-6, rtol=1e-6)


def test_one_sided_and_amortised_refresh_run() -> None:
    """Cap on one side only (KL falls back to lam = 1) and precondition_frequency = 3 stay finite and move."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(6, 40, generator=gen).requires_grad_()
    opt = SOAP([w], SOAPConfig(lr=0.01, max_precond_dim=16, use_eigh=False, precondition_frequency=3))
    q_hist = []
    for _ in range(5):
        w.grad = torch.randn(6, 40, generator=gen)
        opt.step()
        q_hist.append(opt.state[w]["Q_L"].clone())
    assert "Q_R" not in opt.state[w] and torch.isfinite(w).all()
    assert torch.equal(q_hist[0], q_hist[2]) and not torch.equal(q_hist[2], q_hist[3])  # refresh at t = 1, 4


def test_3d_stack_matches_per_expert() -> None:
    """Batched factors/eigh over experts == separate 2-D parameters."""
    gen = torch.Generator().manual_seed(0)
    w, gs = torch.randn(3, 6, 10, generator=gen), [torch.randn(3, 6, 10, generator=gen) for _ in range(3)]
    stack = w.clone().requires_grad_()
    singles = [w[i].clone().requires_grad_() for i in range(3)]
    cfg = SOAPConfig(lr=0.01, eps=0.5, eps_eigenvalue=0.5)
    o1, o2 = SOAP([stack], cfg), SOAP(singles, cfg)
    for g in gs:
        stack.grad = g.clone()
        for i, s in enumerate(singles):
            s.grad = g[i].clone()
        o1.step()
        o2.step()
    torch.testing.assert_close(
        stack.detach(), torch.stack([s.detach() for s in singles]), atol=1e-5, rtol=1e-5
    )


def test_converges_on_quadratic() -> None:
    """Ill-conditioned least squares: REKLS must cut the loss by 100x in 100 steps."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(16, 16, generator=gen) * torch.logspace(0, -1, 16).unsqueeze(0)
    target = a @ torch.randn(16, 12, generator=gen)
    w = torch.zeros(16, 12, requires_grad=True)
    opt = SOAP([w], SOAPConfig(lr=0.05, weight_decay=0.0))
    first = None
    for _ in range(100):
        loss = ((a @ w - target) ** 2).sum()
        first = loss.item() if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < first / 100


def test_deterministic_state_dict_and_nan() -> None:
    """Bitwise repeatable; resume == uninterrupted; NaN grad raises (policy raise) without touching weights."""

    def run(steps_before: int, resume: bool) -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(0)
        ps = [torch.randn(s, generator=gen).to(torch.bfloat16).requires_grad_() for s in SHAPES]
        grads = [[torch.randn(s, generator=gen).to(torch.bfloat16) for s in SHAPES] for _ in range(4)]
        opt = SOAP(ps, SOAPConfig(lr=0.01))
        for i, gl in enumerate(grads):
            if resume and i == steps_before:
                sd = opt.state_dict()
                opt = SOAP(ps, SOAPConfig(lr=0.01))
                opt.load_state_dict(sd)
                assert opt.state[ps[0]]["Q_L"].dtype == torch.float32
            for p, g in zip(ps, gl, strict=True):
                p.grad = g
            opt.step()
        return [p.detach() for p in ps]

    r1, r2, r3 = run(2, False), run(2, False), run(2, True)
    assert all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(r1, r2, r3, strict=True))
    w = torch.nn.Parameter(torch.ones(4, 6))
    opt = SOAP([("mlp.w", w)], SOAPConfig(nonfinite_policy="raise"))
    w.grad = torch.ones(4, 6)
    w.grad[0, 0] = float("inf")
    with pytest.raises(NonFiniteError, match=r"mlp\.w \(grad, step 1\)"):
        opt.step()
    assert torch.equal(w.detach(), torch.ones(4, 6)) and not opt.state[w]["L"].any()


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="precondition_frequency=0"):
        SOAPConfig(precondition_frequency=0)
    with pytest.raises(ValueError, match="shampoo_beta=1.5"):
        SOAPConfig(shampoo_beta=1.5)


def _sym_stack(*lead: int, k: int, seed: int = 0) -> torch.Tensor:
    g = torch.randn(*lead, k, k, generator=torch.Generator().manual_seed(seed))
    return g @ g.mT / k


@pytest.mark.parametrize("streams", [1, 2, 3, 7, 20])
def test_eigh_chunks_equal_the_single_call(streams: int) -> None:
    """Localises a chunk split that drops, repeats or reorders matrices, a chunk start off the single call's
    alignment (k = 9: LAPACK's last bits depend on it), or chunk math that differs from the single call. With
    `streams` given, a host stack runs the chunk path from plain threads."""
    from optim.functional.soap_math import approx_eigvals, eigh_descending

    for f in (_sym_stack(10, k=32), _sym_stack(2, 9, k=16, seed=1), _sym_stack(300, k=9, seed=2)):
        ref = eigh_descending(f)
        out = eigh_descending(f, streams=streams)
        assert out.shape == f.shape and out.dtype == f.dtype
        assert torch.equal(out, ref)
        vals = torch.linalg.eigvalsh(f).flip(-1)
        torch.testing.assert_close(approx_eigvals(f, out), vals, atol=1e-5, rtol=1e-5)


def test_eigh_chunk_fp64_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Localises a lost fp64 retry in the chunk path: the failing chunk alone is recomputed in fp64 and cast back,
    and an error of the fp64 retry reaches the caller.

    No input makes LAPACK fail in fp32 only, or in both precisions, reliably (a NaN fails at k = 12, not at
    k = 32), so the call fails where a matrix carries a marker in its corner: 123 fails in fp32, -7 in both; every
    other call is the real eigh."""
    from optim.functional import soap_math

    real = torch.linalg.eigh
    calls: list[tuple[torch.dtype, int]] = []

    def eigh(a: torch.Tensor) -> torch.return_types.linalg_eigh:
        calls.append((a.dtype, a.shape[0]))
        if (a[:, 0, 0] == -7.0).any() or (a.dtype == torch.float32 and (a[:, 0, 0] == 123.0).any()):
            raise torch.linalg.LinAlgError("injected failure")
        return real(a)

    f = _sym_stack(12, k=32)
    f[9, 0, 0] = 123.0
    monkeypatch.setattr(torch.linalg, "eigh", eigh)
    out = soap_math.eigh_descending(f, streams=3)  # chunks [0, 4), [4, 8), [8, 12)
    assert sorted(calls, key=str) == sorted([(torch.float32, 4)] * 3 + [(torch.float64, 4)], key=str)
    bad = _sym_stack(12, k=32)
    bad[5, 0, 0] = -7.0
    with pytest.raises(torch.linalg.LinAlgError, match="injected failure"):
        soap_math.eigh_descending(bad, streams=3)
    monkeypatch.setattr(torch.linalg, "eigh", real)
    assert torch.equal(out[:8], real(f[:8]).eigenvectors.flip(-1))
    assert torch.equal(out[8:], real(f[8:].double()).eigenvectors.float().flip(-1))


@pytest.mark.parametrize("streams", [0, -2, 2.5, True, "4"])
def test_eigh_streams_validation(streams: object) -> None:
    from optim.functional.soap_math import eigh_descending

    with pytest.raises(ValueError, match=r"streams=.*; allowed: None \(automatic\) or an int >= 1"):
        eigh_descending(_sym_stack(4, k=6), streams=streams)  # type: ignore[arg-type]


def test_soap_steps_unchanged_by_eigh_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Localises an optimizer-visible difference of the chunked refresh: REKLS on an expert stack, with every
    eigh run in up to 3 chunks from threads, steps bitwise like the single call."""
    from functools import partial

    from optim.functional import soap_math

    def run() -> torch.Tensor:
        gen = torch.Generator().manual_seed(0)
        w = torch.randn(8, 32, 64, generator=gen).requires_grad_()
        opt = SOAP([w], SOAPConfig(lr=0.01))
        for _ in range(3):
            w.grad = torch.randn(8, 32, 64, generator=gen)
            opt.step()
        return w.detach()

    ref = run()
    monkeypatch.setattr(soap_math, "eigh_descending", partial(soap_math.eigh_descending, streams=3))
    out = run()
    assert not torch.equal(out, torch.randn(8, 32, 64, generator=torch.Generator().manual_seed(0)))
    assert torch.equal(out, ref)
