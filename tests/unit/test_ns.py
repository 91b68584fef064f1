"""Newton-Schulz and polar-factor math against fp64 SVD references and against emerging-optimizers 0.3.0."""

from __future__ import annotations

import pytest
import torch

from optim.functional.newton_schulz import COEFFICIENT_SETS, newton_schulz, ns_coefficients
from optim.functional.polar import polar_reference, polar_svd
from tests.unit._optim_fixtures import one_thread  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")

# Singular-value band of NS(X) on matrices with condition number 100 (s / ||X||_F >= ~3e-3).
# simple: Keller Jordan's note says S' ~ U(0.5, 1.5), measured (0.68, 1.15); quintic (leloykun): ~(0.97, 1.11);
# polar_express / deepseekv4 converge (paper: error < 1e-2 after 8 steps); cans: (0.88, 1.12);
# aol: its coefficients assume AOL pre-scaling (thib-s), plain NS gives (0.49, 1.09).
BANDS = {
    "simple": (5, 0.6, 1.2),
    "quintic": (5, 0.9, 1.15),
    "polar_express": (8, 0.99, 1.01),
    "cans": (5, 0.85, 1.15),
    "aol": (4, 0.45, 1.15),
    "deepseekv4": (10, 0.99, 1.01),
}


def _conditioned(m: int, n: int, cond_exp: float, gen: torch.Generator) -> torch.Tensor:
    u, _ = torch.linalg.qr(torch.randn(m, m, generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(n, m, generator=gen, dtype=torch.float64))
    s = torch.logspace(0, -cond_exp, m, dtype=torch.float64)
    return (u * s) @ v.T


@pytest.fixture
def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_coefficient_iteration_modes() -> None:
    """Localises a wrong repeat-last rule or wrong published values."""
    assert ns_coefficients("quintic", 7)[5:] == [(2.8366, -3.0525, 1.2012)] * 2
    assert ns_coefficients("polar_express", 10)[8:] == [(1.8750, -1.2500, 0.3750)] * 2
    assert ns_coefficients("cans", 6)[-1] == (2.2737, -1.6447, 0.4162)
    assert ns_coefficients("aol", 5)[-1] == (2.7215, -3.0494, 1.3169)
    assert ns_coefficients("custom", 3, custom=[(3.0, -3.0, 1.0), (1.5, -0.5, 0.0)])[2] == (1.5, -0.5, 0.0)
    assert ns_coefficients("deepseekv4", 10) == [(3.4445, -4.7750, 2.0315)] * 8 + [(2.0, -1.5, 0.5)] * 2
    assert ns_coefficients("custom", 3, custom=[(1.5, -0.5, 0.0)]) == [(1.5, -0.5, 0.0)] * 3
    with pytest.raises(ValueError, match="custom"):
        ns_coefficients("custom", 3)
    with pytest.raises(ValueError, match="not one of"):
        ns_coefficients("quartic", 3)
    with pytest.raises(ValueError, match="num_ns_steps"):
        ns_coefficients("simple", 0)


@pytest.mark.parametrize("name", sorted(BANDS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_singular_values_in_band(name: str, dtype: torch.dtype, gen: torch.Generator) -> None:
    """Localises wrong coefficients, a missing transpose or wrong normalization (bands per set above)."""
    steps, lo, hi = BANDS[name]
    x = torch.stack([_conditioned(24, 40, 2.0, gen) for _ in range(3)]).float()
    for inp in (x, x.mT):  # wide and tall
        s = torch.linalg.svdvals(
            newton_schulz(inp, num_ns_steps=steps, coefficients=name, compute_dtype=dtype).double()
        )
        slack = 0.01 if dtype == torch.bfloat16 else 0.0
        assert lo - slack <= s.min().item() and s.max().item() <= hi + slack, (name, s.min(), s.max())


# Singular-value band of fp64 NS at every allowed step count from the set's design count on (steps beyond a set's
# length repeat its last tuple), measured on `_conditioned(24, 40, 2.0)` matrices: (design steps, lo, hi).
# Before the design count the iterate may overshoot (Polar Express and CANS reach ~2) but never beyond 2.
STEP_BANDS = {
    "simple": (5, 0.68, 1.14),
    "quintic": (5, 0.977, 1.061),
    "polar_express": (8, 0.9999, 1.0001),
    "cans": (5, 0.886, 1.109),
    "aol": (4, 0.56, 1.085),
    "deepseekv4": (10, 0.9999, 1.0006),
}
MAX_NS_STEPS = 100  # MuonConfig's allowed num_ns_steps is [1, 100]


@pytest.mark.parametrize("name", sorted(STEP_BANDS))
def test_every_step_count_stays_in_band(name: str) -> None:
    """Localises steps beyond a set's length starting the set over (6 quintic steps gave singular values of
    0.06-0.17): the step-k coefficients are a prefix of the 100-step list, and the singular values of the fp64
    iterate after every k in [design, 100] lie in the set's band."""
    assert set(STEP_BANDS) == set(COEFFICIENT_SETS)
    design, lo, hi = STEP_BANDS[name]
    full = ns_coefficients(name, MAX_NS_STEPS)
    assert all(ns_coefficients(name, k) == full[:k] for k in range(1, MAX_NS_STEPS + 1))
    gen = torch.Generator().manual_seed(0)
    x0 = torch.stack([_conditioned(24, 40, 2.0, gen) for _ in range(3)])
    x = x0 / x0.norm(dim=(-2, -1), keepdim=True)
    for k, (a, b, c) in enumerate(full, start=1):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
        s = torch.linalg.svdvals(x)
        if k >= design:
            assert lo <= s.min().item() and s.max().item() <= hi, (name, k, s.min(), s.max())
        else:
            assert 0 < s.min().item() and s.max().item() <= 2.0, (name, k, s.min(), s.max())
    for k in (max(design, len(COEFFICIENT_SETS[name]) + 1), MAX_NS_STEPS):  # the function takes that path too
        out = newton_schulz(x0, num_ns_steps=k, coefficients=name, compute_dtype=torch.float64)
        s = torch.linalg.svdvals(out)
        assert lo <= s.min().item() and s.max().item() <= hi, (name, k, s.min(), s.max())


def test_converges_to_svd_polar_factor(gen: torch.Generator) -> None:
    """Polar Express in fp64 must reach the fp64 SVD polar factor on a well-conditioned matrix."""
    x = _conditioned(16, 24, 1.0, gen)
    out = newton_schulz(x, num_ns_steps=12, coefficients="polar_express", compute_dtype=torch.float64)
    torch.testing.assert_close(out, polar_reference(x), atol=1e-6, rtol=1e-6)
    u, s = polar_svd(x.float())
    torch.testing.assert_close(u.double(), polar_reference(x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s.sum().double(), torch.linalg.matrix_norm(x, "nuc"), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("use_gram", [False, True])
def test_batched_equals_per_slice(use_gram: bool, gen: torch.Generator) -> None:
    """Localises cross-talk between batch entries (e.g. a norm over the whole stack instead of per matrix)."""
    x = torch.randn(5, 12, 20, generator=gen) * torch.tensor([1e-3, 1.0, 10.0, 1e3, 0.0]).view(5, 1, 1)
    out = newton_schulz(x, compute_dtype=torch.float32, use_gram=use_gram)
    for i in range(5):
        torch.testing.assert_close(
            out[i], newton_schulz(x[i], compute_dtype=torch.float32, use_gram=use_gram)
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_zero_tiny_huge_inputs_are_finite(dtype: torch.dtype, gen: torch.Generator) -> None:
    """Localises a NaN from 0/0 or an fp32 under/overflow in the Frobenius norm."""
    z = newton_schulz(torch.zeros(3, 8, 6, dtype=dtype))
    assert z.dtype == dtype and torch.equal(z, torch.zeros_like(z))
    base = torch.randn(8, 6, generator=gen)
    for scale in (1e-45, 1e-30, 1e-20, 1e20, 1e30):
        out = newton_schulz((base * scale).to(dtype), compute_dtype=torch.float32)
        assert torch.isfinite(out).all(), scale
    # above eps^2 in squared norm the result is a proper orthogonalization even where x*x underflows fp32
    s = torch.linalg.svdvals(newton_schulz(base * 1e-6, compute_dtype=torch.float32))
    assert 0.9 < s.min() and s.max() < 1.15
    s = torch.linalg.svdvals(newton_schulz(base * 1e30, compute_dtype=torch.float32))
    assert 0.9 < s.min() and s.max() < 1.15


@pytest.mark.parametrize("name,steps", [("quintic", 5), ("polar_express", 8), ("simple", 6)])
def test_gram_ns_matches_plain(name: str, steps: int, gen: torch.Generator) -> None:
    """Gram-NS is an exact rewrite: in fp64/fp32 it must equal plain NS up to rounding; bf16 stays close."""
    x = torch.randn(3, 32, 80, generator=gen)
    for restarts in ((), (2,), (1, 3)):
        g64 = newton_schulz(
            x.double(),
            num_ns_steps=steps,
            coefficients=name,
            compute_dtype=torch.float64,
            use_gram=True,
            restart_iterations=restarts,
        )
        p64 = newton_schulz(x.double(), num_ns_steps=steps, coefficients=name, compute_dtype=torch.float64)
        torch.testing.assert_close(g64, p64, atol=1e-9, rtol=1e-9)
    g32 = newton_schulz(x, num_ns_steps=steps, coefficients=name, compute_dtype=torch.float32, use_gram=True)
    p32 = newton_schulz(x, num_ns_steps=steps, coefficients=name, compute_dtype=torch.float32)
    torch.testing.assert_close(g32, p32, atol=2e-4, rtol=2e-4)
    gbf = newton_schulz(x, num_ns_steps=steps, coefficients=name, use_gram=True)
    assert (gbf - p32).norm() / p32.norm() < 0.05


@pytest.mark.parametrize("name", ["quintic", "polar_express", "cans", "aol", "simple"])
def test_matches_emerging_optimizers(name: str, gen: torch.Generator) -> None:
    """Same math as EO 0.3.0: fp32 ("highest") to 1e-5; bf16 ("medium") within bf16 rounding."""
    from emerging_optimizers.orthogonalized_optimizers import muon_utils
    from emerging_optimizers.utils import fp32_matmul_precision

    # EO starts a set over after its last tuple (aol's 5th step is its 1st); ours repeats the last: compare aol
    # within its 4 tuples
    steps = 4 if name == "aol" else 5
    x = torch.randn(2, 40, 24, generator=gen)
    with fp32_matmul_precision("highest"):
        ref = muon_utils.newton_schulz(x, steps=steps, coefficient_type=name)
    torch.testing.assert_close(
        newton_schulz(x, num_ns_steps=steps, coefficients=name, compute_dtype=torch.float32),
        ref,
        atol=1e-5,
        rtol=1e-5,
    )
    with fp32_matmul_precision("medium"):
        ref_bf = muon_utils.newton_schulz(x[0], steps=steps, coefficient_type=name)
    ours_bf = newton_schulz(x[0], num_ns_steps=steps, coefficients=name)
    assert (ours_bf - ref_bf).norm() / ref_bf.norm() < 2e-2


def test_input_validation() -> None:
    with pytest.raises(ValueError, match="ndim"):
        newton_schulz(torch.zeros(2, 2, 2, 2))
    with pytest.raises(ValueError, match="compute_dtype"):
        newton_schulz(torch.zeros(2, 2), compute_dtype=torch.int32)
