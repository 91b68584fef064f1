"""MOP against emerging-optimizers 0.3.0 `MOP`, the Polar Express path against the exact one, and the usual
optimizer properties.

Tolerances: polar_method="svd" runs the same batched fp32 SVD as EO (EO: one SVD per parameter at "highest"),
so parameters agree to 1e-5 relative to the update after 4 steps. The nuclear-norm scale makes the update as
large as sum(S) (tens here), hence small learning rates in these tests.
"""

from __future__ import annotations

import pytest
import torch

from optim.configs import MOPConfig
from optim.optimizers import NonFiniteWarning
from optim.optimizers.mop import MOP
from tests.unit._optim_fixtures import one_thread  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")

SHAPES = [(16, 24), (24, 16), (16, 24), (2, 8, 12)]


def _run(factory, shapes, steps: int, seed: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(seed)
    init = [torch.randn(s, generator=gen) for s in shapes]
    params = [t.clone().requires_grad_() for t in init]
    opt = factory(params)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
    return [p.detach() for p in params], init


@pytest.mark.parametrize("scale_mode", ["nuclear_norm", "spectral", "unit_rms_norm"])
@pytest.mark.parametrize("nesterov", [False, True])
def test_matches_eo(scale_mode: str, nesterov: bool) -> None:
    """Localises a wrong polar factor, nuclear-norm scale or momentum vs EO 0.3.0 (2-D params only: EO is 2-D)."""
    from emerging_optimizers.orthogonalized_optimizers.mop import MOP as EOMOP

    shapes = SHAPES[:3]
    kw = {"lr": 1e-3, "scale_mode": scale_mode, "nesterov": nesterov, "weight_decay": 0.1}
    ours, init = _run(lambda p: MOP(p, MOPConfig(**kw)), shapes, 4)  # type: ignore[arg-type]
    ref, _ = _run(lambda p: EOMOP(p, **kw), shapes, 4)
    for a, b, p0 in zip(ours, ref, init, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5 * (b - p0).abs().max().item(), rtol=1e-6)


def test_polar_express_close_to_svd() -> None:
    """NS path: polar factor within Polar Express accuracy, nuclear norm as <O, M> within 1%."""
    cfg = {"lr": 1e-3, "weight_decay": 0.0}
    svd, init = _run(lambda p: MOP(p, MOPConfig(**cfg)), SHAPES, 2)  # type: ignore[arg-type]
    pe, _ = _run(lambda p: MOP(p, MOPConfig(polar_method="polar_express", **cfg)), SHAPES, 2)  # type: ignore[arg-type]
    for a, b, p0 in zip(pe, svd, init, strict=True):
        assert ((a - b).norm() / (b - p0).norm()).item() < 1e-2


def test_3d_stack_matches_per_expert() -> None:
    """One batched SVD over the experts == separate 2-D parameters (each expert has its own nuclear norm)."""
    gen = torch.Generator().manual_seed(0)
    w, g = torch.randn(3, 8, 12, generator=gen), torch.randn(3, 8, 12, generator=gen)
    stack = w.clone().requires_grad_()
    singles = [w[i].clone().requires_grad_() for i in range(3)]
    stack.grad = g.clone()
    for i, s in enumerate(singles):
        s.grad = g[i].clone()
    MOP([stack], MOPConfig(lr=1e-3)).step()
    MOP(singles, MOPConfig(lr=1e-3)).step()
    torch.testing.assert_close(
        stack.detach(), torch.stack([s.detach() for s in singles]), atol=1e-6, rtol=1e-6
    )


def test_converges_on_quadratic() -> None:
    """min ||W - C||^2 with the nuclear-norm step: loss must fall by 100x (sign/scale bugs fail)."""
    gen = torch.Generator().manual_seed(0)
    target = torch.randn(16, 24, generator=gen)
    w = torch.zeros(16, 24, requires_grad=True)
    opt = MOP([w], MOPConfig(lr=0.02, momentum=0.5, weight_decay=0.0))
    first = None
    for _ in range(60):
        loss = ((w - target) ** 2).sum()
        first = loss.item() if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < first / 100


def test_deterministic_state_dict_and_nan() -> None:
    """Bitwise repeatable; resume from state_dict == uninterrupted; a NaN grad is skipped and named."""
    r1, _ = _run(lambda p: MOP(p, MOPConfig(lr=1e-3)), SHAPES, 3)
    r2, _ = _run(lambda p: MOP(p, MOPConfig(lr=1e-3)), SHAPES, 3)
    assert all(torch.equal(a, b) for a, b in zip(r1, r2, strict=True))

    w = torch.nn.Parameter(torch.ones(6, 10))
    opt = MOP([("blk.w", w)], MOPConfig(lr=1e-3))
    w.grad = torch.randn(6, 10)
    opt.step()
    sd = opt.state_dict()
    before = w.detach().clone()
    w.grad = torch.full((6, 10), float("nan"))
    with pytest.warns(NonFiniteWarning, match=r"blk\.w at step 2"):
        opt.step()
    assert torch.equal(w.detach(), before)
    opt2 = MOP([("blk.w", torch.nn.Parameter(before.clone()))], MOPConfig(lr=1e-3))
    opt2.load_state_dict(sd)
    assert torch.equal(opt2.state_dict()["state"][0]["momentum_buffer"], sd["state"][0]["momentum_buffer"])


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="polar_method='newton'"):
        MOPConfig(polar_method="newton")
    with pytest.raises(ValueError, match="momentum=1.0"):
        MOPConfig(momentum=1.0)
