"""The fused Muon step's update written by the last NS product (CPU checks of its parts; the fused step itself and
QuACK's accumulating GEMM are tested on the GPU, tests/gpu/test_kernels_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from optim.functional.newton_schulz import ns_coefficients
from optim.kernels import orthogonalize, orthogonalize_deferred
from optim.kernels.fused_step import stacked_runs, storage_order
from optim.kernels.ns_batched import (
    LastProduct,
    TorchOps,
    orthogonalize_with,
    plain_iterations,
    plain_until_last,
)

COEFFS = ns_coefficients("quintic", 5)


def test_stacked_runs_of_one_buffer_gaps_and_separate_tensors() -> None:
    buf = torch.zeros(6 * 40)
    gapped = [buf[i * 40 : i * 40 + 24].view(4, 6) for i in range(6)]  # stride 40 >= 24
    (run,) = stacked_runs(gapped)
    assert run.shape == (6, 4, 6) and run.stride() == (40, 6, 1)
    run.fill_(1.0)  # writing the view writes the parameters, nothing between them
    assert all(bool((p == 1).all()) for p in gapped) and float(buf.sum()) == 6 * 24
    # a missing matrix breaks the stride: two runs; separate allocations: one view each
    assert [len(r) for r in stacked_runs([gapped[i] for i in (0, 1, 3, 4, 5)])] == [2, 3]
    assert [len(r) for r in stacked_runs([torch.zeros(4, 6) for _ in range(3)])] == [1, 1, 1]
    # another shape in the same buffer ends a run
    assert [len(r) for r in stacked_runs([gapped[0], buf[40:52].view(2, 6)])] == [1, 1]
    # memory order recovers one run from matrices listed backwards (Megatron's buffers hold them reversed)
    backwards = gapped[::-1]
    order = storage_order(backwards)
    assert [len(r) for r in stacked_runs([backwards[i] for i in order])] == [6]
    with pytest.raises(ValueError, match="stacked_runs"):
        stacked_runs([torch.zeros(4, 6).T])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tall", [False, True])
def test_last_product_into_parameters_matches_orthogonalize_then_update(
    dtype: torch.dtype, tall: bool
) -> None:
    """p <- beta p + alpha X_k through `LastProduct.into` on strided views (runs of one buffer, transposed for tall
    matrices) equals the update from the whole NS within the iterate's rounding."""
    torch.manual_seed(0)
    nb, r, c = 6, (48 if tall else 32), (32 if tall else 48)
    m, n = min(r, c), max(r, c)
    g = torch.randn(nb, m, n)
    sumsq = g.to(dtype).float().square().sum((-2, -1))
    x = g.to(torch.bfloat16)
    buf = torch.randn(nb * r * c + 100)
    params = [buf[i * r * c : (i + 1) * r * c].view(r, c) for i in range(nb)]
    before = [p.clone() for p in params]
    tail = buf[nb * r * c :].clone()
    alpha, beta = -0.02, 0.999
    whole = orthogonalize(x, coeffs=COEFFS, sumsq=sumsq, dtype=dtype).float()
    expect = [beta * p0 + alpha * (o.T if tall else o) for p0, o in zip(before, whole, strict=True)]
    last = orthogonalize_deferred(x, sumsq, coeffs=COEFFS, dtype=dtype)
    assert isinstance(last, LastProduct)
    runs = stacked_runs(params[:2]) + stacked_runs(params[2:])  # two runs: `start` addresses the batch
    at = 0
    for view in runs:
        last.into(view.mT if tall else view, alpha=alpha, beta=beta, start=at)
        at += len(view)
    step = torch.stack([e - p0 for e, p0 in zip(expect, before, strict=True)]).norm()
    diff = torch.stack([p - e for p, e in zip(params, expect, strict=True)]).norm()
    assert float(diff / step) < (2e-2 if dtype == torch.bfloat16 else 4e-3)
    assert torch.equal(buf[nb * r * c :], tail)  # nothing past the parameters is written


def test_plain_until_last_is_the_plain_iteration_less_its_last_product() -> None:
    torch.manual_seed(1)
    x = torch.randn(3, 16, 40)
    x = (x / x.norm(dim=(-2, -1), keepdim=True)).bfloat16()
    last = plain_until_last(x, COEFFS, TorchOps())
    full = orthogonalize_with(
        x, COEFFS, eps=1e-7, gram=False, restarts=frozenset(), ops=TorchOps(), normalized=True
    )
    out = torch.zeros(3, 16, 40)
    last.into(out, alpha=1.0, beta=0.0)
    assert float((out - full.float()).norm() / full.float().norm()) < 1e-2


def test_into_and_deferred_reject_bad_input() -> None:
    x = torch.randn(2, 8, 12).bfloat16()
    last = plain_until_last(x, COEFFS, TorchOps())
    with pytest.raises(ValueError, match="fp32"):
        last.into(torch.zeros(2, 8, 12, dtype=torch.bfloat16), alpha=1.0, beta=1.0)
    with pytest.raises(ValueError, match="within the batch"):
        last.into(torch.zeros(2, 8, 12), alpha=1.0, beta=1.0, start=1)
    with pytest.raises(ValueError, match="m <= n"):
        orthogonalize_deferred(torch.randn(2, 12, 8), torch.ones(2), coeffs=COEFFS)
    with pytest.raises(ValueError, match="sumsq"):
        orthogonalize_deferred(x, torch.ones(3), coeffs=COEFFS)
    assert orthogonalize_deferred(x, torch.ones(2), coeffs=COEFFS, use_gram=True) is None


def test_planner_defers_only_quack_general_bodies(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`Planner.deferred` hands back a body only for a planned method whose last product is QuACK's general GEMM
    (not a graph replay, Gram-NS, cuBLAS or Triton's), and memoizes the answer."""
    from optim.kernels import plan as plan_mod

    monkeypatch.setenv("MUONBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(plan_mod, "env_key", lambda device: "cpu-test")
    x = torch.randn(4, 16, 32)
    restarts = frozenset({2})
    key = plan_mod.plan_key("cpu-test", x, COEFFS, 1e-7, False, restarts, torch.bfloat16)
    expected = {
        "plain_quack_all": True,
        "plain_quack_all_sym128pp": True,
        "plain_quack_all+graph": False,
        "plain_quack_sym": False,
        "plain_torch": False,
        "plain_sym_tma128": False,
        "gram_quack_all": False,
    }
    for method, defers in expected.items():
        p = plan_mod.Planner()
        p.loaded = True
        p.choices[key] = {"method": method, "times_ms": {method: 1.0}}
        p.complete.add(key)
        fn = p.deferred(x, COEFFS, 1e-7, False, restarts)
        assert (fn is not None) is defers, method
        assert p.deferred(x, COEFFS, 1e-7, False, restarts) is fn  # memo
        assert plan_mod.deferrable(method) is defers
    # the fp16 iterate keeps the ordinary update
    key16 = plan_mod.plan_key("cpu-test", x, COEFFS, 1e-7, False, restarts, torch.float16)
    p = plan_mod.Planner()
    p.loaded = True
    p.choices[key16] = {"method": "plain_quack_all", "times_ms": {"plain_quack_all": 1.0}}
    p.complete.add(key16)
    assert p.deferred(x, COEFFS, 1e-7, False, restarts, torch.float16) is None


def _ns64(g: torch.Tensor) -> torch.Tensor:
    x = g.double() / g.double().norm(dim=(-2, -1), keepdim=True)
    for a, b, c in COEFFS:
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x


@pytest.mark.parametrize("seed", [0, 1])
def test_first_step_normalizes_inside_and_is_no_less_accurate(seed: int) -> None:
    """`plain_iterations(scale=...)` on the unnormalized bf16 iterate (the normalization in the first step's
    products, P' = s (a I + b A + c A^2) rounded to bf16) against the plain iteration on the normalized copy: both
    against fp64 NS, the folded first step no worse (it skips rounding s G to bf16)."""
    torch.manual_seed(seed)
    g = (torch.randn(6, 64, 96) * 3e-3).bfloat16()
    sumsq = g.float().square().sum((-2, -1))
    ref = _ns64(g.float())
    plain = orthogonalize_with(g, COEFFS, eps=1e-7, gram=False, restarts=frozenset(), ops=TorchOps())
    folded = plain_iterations(g, COEFFS, TorchOps(), scale=sumsq.rsqrt())
    err_plain = float((plain.double() - ref).norm() / ref.norm())
    err_folded = float((folded.double() - ref).norm() / ref.norm())
    assert folded.dtype == torch.bfloat16 and err_folded < 1.05 * err_plain, (err_folded, err_plain)
    # a one-step NS whose first step is its last still normalizes (a pass of its own)
    last = plain_until_last(g, COEFFS[:1], TorchOps(), sumsq.rsqrt())
    one = orthogonalize_with(g, COEFFS[:1], eps=1e-7, gram=False, restarts=frozenset(), ops=TorchOps())
    out = torch.zeros(6, 64, 96)
    last.into(out, alpha=1.0, beta=0.0)
    assert float((out - one.float()).norm() / one.float().norm()) < 1e-2


def test_planner_normalizes_inside_only_where_the_scaled_kernel_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """`Planner.prescaled`: a body for QuACK's general-product methods on the bf16 iterate where the per-matrix
    scaled symmetric kernel is usable (SM90), None otherwise (the caller then normalizes in a pass)."""
    from optim.kernels import plan as plan_mod
    from optim.kernels import sym_quack

    monkeypatch.setenv("MUONBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(plan_mod, "env_key", lambda device: "cpu-test")
    x = torch.randn(4, 16, 32)
    restarts = frozenset({2})
    for usable in (True, False):
        monkeypatch.setattr(sym_quack, "first_step_usable", lambda device, usable=usable: usable)
        for method, dtype, expect in (
            ("plain_quack_all", torch.bfloat16, usable),
            ("plain_quack_all_sym128pp", torch.bfloat16, usable),
            ("plain_quack_all", torch.float16, False),
            ("plain_quack_all+graph", torch.bfloat16, False),
            ("plain_sym_tma128", torch.bfloat16, False),
        ):
            key = plan_mod.plan_key("cpu-test", x, COEFFS, 1e-7, False, restarts, dtype)
            p = plan_mod.Planner()
            p.loaded = True
            p.choices[key] = {"method": method, "times_ms": {method: 1.0}}
            p.complete.add(key)
            assert (p.prescaled(x, COEFFS, 1e-7, False, restarts, dtype) is not None) is expect, (
                method,
                usable,
            )
