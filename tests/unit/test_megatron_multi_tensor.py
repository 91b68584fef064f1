"""optim.megatron.multi_tensor: foreach replacements of Megatron's per-tensor multi-tensor fallbacks."""

from __future__ import annotations

import importlib
import math

import pytest
import torch

from optim.megatron import multi_tensor as mt

mcore_utils = pytest.importorskip("megatron.core.utils")


def _tensors(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(*s, generator=g).to(dtype) for s in ((7, 5), (3,), (128, 64), (1, 1))]


def test_l2_norm_is_the_global_fp32_norm_without_host_lists():
    ts = _tensors()
    total, per = mt.l2_norm(2048 * 32, torch.zeros(1, dtype=torch.int), [ts], False)
    want = torch.cat([t.flatten() for t in ts]).double().norm()
    assert total.shape == (1,) and total.dtype == torch.float32 and per is None
    assert abs(float(total) - float(want)) < 1e-5 * float(want)
    _, per = mt.l2_norm(0, torch.zeros(1), [ts], True)
    assert per is not None and torch.allclose(per, torch.stack([t.norm() for t in ts]))
    # bf16 inputs are accumulated in fp32 (Apex's contract), not rounded to bf16 per tensor
    tb = _tensors(torch.bfloat16)
    total_b, _ = mt.l2_norm(0, torch.zeros(1), [tb], False)
    assert total_b.dtype == torch.float32
    assert abs(float(total_b) - float(torch.cat([t.float().flatten() for t in tb]).norm())) < 1e-4
    assert float(mt.l2_norm(0, torch.zeros(1), [[]], False)[0]) == 0.0


def test_scale_copies_with_dtype_conversion_and_scales_in_place():
    src = _tensors()
    dst = [torch.empty_like(t, dtype=torch.bfloat16) for t in src]
    mt.scale(0, torch.zeros(1), [src, dst], 1.0)
    assert all(torch.equal(d, s.to(torch.bfloat16)) for s, d in zip(src, dst, strict=True))
    mt.scale(0, torch.zeros(1), [src, dst], 0.5)
    assert all(torch.equal(d, (s * 0.5).to(torch.bfloat16)) for s, d in zip(src, dst, strict=True))
    before = [t.clone() for t in src]
    mt.scale(0, torch.zeros(1), [src, src], 0.25)  # Megatron's clip: [grads, grads]
    assert all(torch.equal(a, b * 0.25) for a, b in zip(src, before, strict=True))
    with pytest.raises(ValueError, match="3 sources vs 4 destinations"):
        mt.scale(0, torch.zeros(1), [src[:3], dst], 1.0)


def test_install_swaps_only_the_local_fallbacks_and_is_idempotent(monkeypatch):
    clip = importlib.import_module("megatron.core.optimizer.clip_grads")
    opt = importlib.import_module("megatron.core.optimizer.optimizer")
    # this machine has neither TE nor Apex: Megatron bound its local fallbacks
    monkeypatch.setattr(clip, "l2_norm_impl", mcore_utils.local_multi_tensor_l2_norm)
    monkeypatch.setattr(clip, "multi_tensor_scale_impl", mcore_utils.local_multi_tensor_scale)
    monkeypatch.setattr(opt, "multi_tensor_scale_impl", mcore_utils.local_multi_tensor_scale)
    key = "megatron.core.optimizer.optimizer._multi_tensor_copy_this_to_that"
    original_copy = mt.ORIGINALS.get(
        key, opt._multi_tensor_copy_this_to_that
    )  # Megatron's own, if swapped already
    assert original_copy is not mt.copy_this_to_that
    monkeypatch.setattr(opt, "_multi_tensor_copy_this_to_that", original_copy)
    assert not mt.installed()
    replaced = mt.install()
    assert sorted(replaced) == sorted(
        [f"{m}.{a}" for m, a, _ in mt._SITES]
        + ["megatron.core.optimizer.optimizer._multi_tensor_copy_this_to_that"]
    )
    assert opt._multi_tensor_copy_this_to_that is mt.copy_this_to_that
    assert clip.l2_norm_impl is mt.l2_norm and opt.multi_tensor_scale_impl is mt.scale and mt.installed()
    assert mt.install() == []
    # a fast implementation (TE / Apex) is left alone
    fast = object()
    monkeypatch.setattr(clip, "l2_norm_impl", fast)
    monkeypatch.setattr(opt, "multi_tensor_scale_impl", mcore_utils.local_multi_tensor_scale)
    assert mt.install() == ["megatron.core.optimizer.optimizer.multi_tensor_scale_impl"]
    assert clip.l2_norm_impl is fast


def test_copy_this_to_that_matches_megatrons_loop_in_bf16_and_fp32_modes():
    src = _tensors()
    for buf in (
        None,
        torch.ones(1, dtype=torch.int),
    ):  # bf16 runs pass no overflow buffer, fp16/fp32 runs one
        dst = [torch.zeros_like(t, dtype=torch.bfloat16) for t in src]
        mt.copy_this_to_that(src, dst, buf)
        assert all(torch.equal(d, s.to(torch.bfloat16)) for s, d in zip(src, dst, strict=True))
        assert buf is None or int(buf) == 0
    with pytest.raises(ValueError, match="2 sources vs 4 destinations"):
        mt.copy_this_to_that(src[:2], dst)


def test_finite_global_norm_lets_the_fused_step_skip_its_grad_screen(monkeypatch):
    """build_ours' chain passes a finite Megatron grad norm to our matrix optimizer (assume_finite_grads); the
    fused step then skips its gradient screen (`fused_step.nonfinite`), once; NaN / inf / tensor norms vouch for
    nothing."""
    from megatron.core.optimizer import ChainedOptimizer

    from optim.configs import MuonConfig
    from optim.megatron.builders import finite_norm_chain, vouch_finite
    from optim.optimizers.muon import Muon

    ps = [torch.randn(8, 12, requires_grad=True), torch.randn(12, 8, requires_grad=True)]
    monkeypatch.setattr(Muon, "_fused_available", lambda self: True)  # chosen at construction
    muon = Muon(ps, MuonConfig(ns_precision="fp32"))
    for bad in (float("nan"), float("inf"), torch.tensor(1.0)):
        assert not vouch_finite(bad, [muon]) and not muon.fused.grads_known_finite
    norms = iter([0.5, float("nan")])
    monkeypatch.setattr(ChainedOptimizer, "get_grad_norm", lambda self: next(norms))
    monkeypatch.setattr(ChainedOptimizer, "__init__", lambda self, parts: None)
    chain = finite_norm_chain([], [muon])
    assert isinstance(chain, ChainedOptimizer)
    from optim.kernels import fused_step

    screened = []
    real_screen = fused_step.nonfinite
    monkeypatch.setattr(
        fused_step, "nonfinite", lambda ts, **k: screened.append(len(ts)) or real_screen(ts, **k)
    )
    for p in ps:
        p.grad = torch.randn_like(p)
    assert chain.get_grad_norm() == 0.5 and muon.fused.grads_known_finite
    muon.step()
    assert not muon.fused.grads_known_finite and screened == []  # no gradient screen
    assert math.isnan(chain.get_grad_norm()) and not muon.fused.grads_known_finite
    muon.step()
    assert screened == [
        1,
        1,
    ]  # the NaN norm vouched for nothing: the gradient screen is back (one per bucket)
