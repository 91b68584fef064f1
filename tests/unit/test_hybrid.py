"""build_optimizer / HybridOptimizer on a tiny transformers Qwen3-MoE, including the 30-step training loop of
every optimizer (the issue's definition of done)."""

from __future__ import annotations

import warnings

import pytest
import torch

import optim
from optim.routing import SplitLayout
from tests.unit._optim_fixtures import one_thread, tiny_qwen3_moe  # noqa: F401

CONFIGS = {
    "adamw": optim.AdamWConfig(lr=3e-3),
    "muon": optim.MuonConfig(lr=3e-3, ns_precision="fp32"),  # bf16 GEMMs are slow on CPU, not different
    "muon_gram_bf16": optim.MuonConfig(lr=3e-3, use_gram_ns=True, nesterov=True),
    "mop": optim.MOPConfig(lr=3e-3),
    "soap_rekls": optim.SOAPConfig(lr=3e-3),
}

pytestmark = pytest.mark.usefixtures("one_thread")


def _build(cfg, model, **kw):  # type: ignore[no-untyped-def]
    layout = SplitLayout.from_hf_config(model.config)
    return optim.build_optimizer(model.named_parameters(), cfg, naming="hf", layout=layout, **kw)


def _batch() -> torch.Tensor:
    return torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))


def _train(model, opt, steps: int, ids: torch.Tensor) -> list[float]:  # type: ignore[no-untyped-def]
    losses = []
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_routes_groups_and_splits() -> None:
    """Matrices (incl. router and 3-D experts) to Muon with the requested splits, the rest to AdamW groups."""
    torch.manual_seed(0)
    model = tiny_qwen3_moe()
    opt = _build(CONFIGS["muon"], model, routing=optim.RoutingConfig(split_gate_up=True))
    assert opt.summary() == {
        "adamw/embedding": 1,
        "adamw/output": 1,
        "adamw/norm": 9,
        "matrix/matrix": 11,
        "matrix/expert_stack": 2,
        "matrix/router": 1,
    }
    muon, adamw = opt.optimizers["matrix"], opt.optimizers["adamw"]
    assert isinstance(muon, optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    assert opt.param_groups == [*muon.param_groups, *adamw.param_groups]
    assert [g["weight_decay"] for g in adamw.param_groups] == [0.01, 0.0]  # embeddings/output vs norms
    gate_up = model.model.layers[1].mlp.experts.gate_up_proj
    assert muon.splits[id(gate_up)].sizes == (16, 16)
    base = _build(CONFIGS["adamw"], tiny_qwen3_moe())
    assert set(base.optimizers) == {"adamw"} and all(r.optimizer == "adamw" for r in base.routes)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_tiny_qwen3_moe_loss_falls(name: str) -> None:
    """Definition of done: 30 steps of a tiny Qwen3-MoE on CPU, loss falls by > 1.5x; matrices actually move."""
    torch.manual_seed(0)
    model = tiny_qwen3_moe()
    w0 = model.model.layers[1].mlp.experts.down_proj.detach().clone()
    opt = _build(CONFIGS[name], model, routing=optim.RoutingConfig(split_gate_up=True))
    losses = _train(model, opt, 30, _batch())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0] / 1.5, losses
    assert not torch.equal(model.model.layers[1].mlp.experts.down_proj.detach(), w0)


@pytest.mark.parametrize("name", ["muon", "soap_rekls"])
def test_state_dict_resume_and_scheduler(name: str) -> None:
    """Resume from HybridOptimizer.state_dict == uninterrupted (bitwise); an LR scheduler reaches both sides."""
    ids = _batch()
    torch.manual_seed(0)
    ref_model = tiny_qwen3_moe()
    init = {k: v.clone() for k, v in ref_model.state_dict().items()}
    ref_opt = _build(CONFIGS[name], ref_model)
    _train(ref_model, ref_opt, 4, ids)

    model = tiny_qwen3_moe()
    model.load_state_dict(init)
    opt = _build(CONFIGS[name], model)
    _train(model, opt, 2, ids)
    saved_model, saved_opt = {k: v.clone() for k, v in model.state_dict().items()}, opt.state_dict()
    resumed = tiny_qwen3_moe()
    resumed.load_state_dict(saved_model)
    opt2 = _build(CONFIGS[name], resumed)
    opt2.load_state_dict(saved_opt)
    _train(resumed, opt2, 2, ids)
    for k, v in ref_model.state_dict().items():
        assert torch.equal(v, resumed.state_dict()[k]), k

    sched = torch.optim.lr_scheduler.LambdaLR(opt2, lambda step: 0.5 ** (step + 1))
    assert {g["lr"] for o in opt2.optimizers.values() for g in o.param_groups} == {1.5e-3}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the scheduler must see HybridOptimizer.step being called
        _train(resumed, opt2, 1, ids)
        sched.step()
    assert {g["lr"] for o in opt2.optimizers.values() for g in o.param_groups} == {7.5e-4}


def test_nan_gradient_is_named_and_skipped() -> None:
    """A NaN injected into one expert stack's gradient is reported by its HF name; that weight stays put."""
    torch.manual_seed(0)
    model = tiny_qwen3_moe()
    opt = _build(CONFIGS["muon"], model)
    ids = _batch()
    model(input_ids=ids, labels=ids).loss.backward()
    down = model.model.layers[1].mlp.experts.down_proj
    down.grad[0, 0, 0] = float("nan")
    before, q_before = down.detach().clone(), model.model.layers[1].self_attn.q_proj.weight.detach().clone()
    with pytest.warns(optim.NonFiniteWarning, match=r"model\.layers\.1\.mlp\.experts\.down_proj at step 1"):
        opt.step()
    assert torch.equal(down.detach(), before)
    assert not torch.equal(model.model.layers[1].self_attn.q_proj.weight.detach(), q_before)
