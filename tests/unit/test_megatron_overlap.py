"""NS overlapped with the backward (`optim.megatron.overlap`), on CPU: a two-layer torch model whose parameters carry
Megatron-DDP-style `main_grad` accumulation hooks, several micro-batches, our fused Muon (torch reference path).
The overlap, armed before the last micro-batch, launches each layer's NS once its gradient is final, and the steps
equal plain steps bitwise (confirmed), or recompute after clipping (not confirmed)."""

from __future__ import annotations

import types

import pytest
import torch

from optim.configs import MuonConfig
from optim.megatron import overlap as ov
from optim.megatron.builders import confirm_unclipped
from optim.optimizers.muon import Muon
from tests.unit._optim_fixtures import one_thread  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")


class _Layer(torch.nn.Module):
    def __init__(self, g: torch.Generator) -> None:
        super().__init__()
        self.fc1 = torch.nn.Parameter(torch.randn(24, 16, generator=g) * 0.2)
        self.fc2 = torch.nn.Parameter(torch.randn(16, 24, generator=g) * 0.2)
        self.norm = torch.nn.Parameter(torch.ones(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(x @ self.fc1.T) @ self.fc2.T * self.norm


class _Model(torch.nn.Module):
    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.decoder = torch.nn.Module()
        self.decoder.layers = torch.nn.ModuleList([_Layer(g), _Layer(g)])
        self.head = torch.nn.Parameter(torch.randn(3, 16, generator=g) * 0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.decoder.layers:
            x = layer(x)
        return (x @ self.head.T).square().mean()


def _ddp_like(model: torch.nn.Module) -> list:
    """Megatron DDP's accumulation: a post-hook on each AccumulateGrad adds .grad into main_grad, clears .grad."""
    keep = []
    for p in model.parameters():
        p.main_grad = torch.zeros_like(p)

        def hook(*_, p=p):
            p.main_grad.add_(p.grad)
            p.grad = None

        acc = p.expand_as(p).grad_fn.next_functions[0][0]
        acc.register_hook(hook)
        keep.append(acc)
    return keep


def _setup(monkeypatch, overlap: bool, n_mb: int, seed: int = 0):
    monkeypatch.setattr(Muon, "_fused_available", lambda self: True)
    model = _Model(seed)
    keep = _ddp_like(model)
    mats = [p for n, p in model.named_parameters() if n.endswith(("fc1", "fc2"))]
    opt = Muon(mats, MuonConfig(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.1))
    calls: list[tuple[str, list[torch.Tensor]]] = []
    ctl = None
    if overlap:
        real = opt.speculate

        def spy(params, grads, **kw):
            names = {id(p): n for n, p in model.named_parameters()}
            calls.append((names[id(params[0])], [g.clone() for g in grads]))
            return real(params, grads, **kw)

        opt.speculate = spy
        pairs = [(n, p, p) for n, p in model.named_parameters()]
        ctl = ov.NSOverlap.attach(opt, pairs, n_mb)
    return model, opt, ctl, calls, keep


def _train(model, opt, ctl, n_mb: int, steps: int, clip: float, seed: int = 5):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in model.parameters():
            p.main_grad.zero_()
        if ctl is not None:
            ctl.begin()
        for mb in range(n_mb):
            if ctl is not None and mb == n_mb - 1:
                assert not opt.fused.speculation.pending and ctl.launched == 0  # nothing before the last micro-batch
                ctl.arm()
            model(torch.randn(4, 16, generator=g)).backward()
        for p in opt.param_groups[0]["params"]:
            p.grad = p.main_grad  # Megatron's wrapper: main_param.grad = main_grad (fp32: the same tensor)
        norm = float(
            torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in opt.param_groups[0]["params"]]))
        )
        confirm_unclipped(norm, [opt], clip)
        if clip > 0 and clip / (norm + 1e-6) < 1.0:
            for p in opt.param_groups[0]["params"]:
                p.grad.mul_(clip / (norm + 1e-6))
        opt.step()


@pytest.mark.parametrize("n_mb", [1, 3])
def test_overlapped_steps_equal_plain_steps(monkeypatch, n_mb):
    """Each (layer, shape) unit is speculated once per step, after its last micro-batch (layer 1 before layer 0:
    backward order), from the final accumulated gradient; three steps equal plain steps bitwise."""
    ref_model, ref_opt, _, _, _k1 = _setup(monkeypatch, False, n_mb)
    model, opt, ctl, calls, _k2 = _setup(monkeypatch, True, n_mb)
    assert [u.name for u in ctl.units] == [
        "decoder.layers.0 (24, 16)",
        "decoder.layers.0 (16, 24)",
        "decoder.layers.1 (24, 16)",
        "decoder.layers.1 (16, 24)",
    ]
    _train(ref_model, ref_opt, None, n_mb, 3, clip=0.0)
    _train(model, opt, ctl, n_mb, 3, clip=0.0)
    assert [n.split(".")[2] for n, _ in calls] == ["1", "1", "0", "0"] * 3
    assert opt.spec_stats == {"used": 4, "discarded": 0} and ctl.launched == 4
    assert len(ctl.handles) == 4  # one per matrix, armed until the next begin()
    for p, q in zip(ref_model.parameters(), model.parameters(), strict=True):
        assert torch.equal(p, q)
    for p, q in zip(ref_opt.param_groups[0]["params"], opt.param_groups[0]["params"], strict=True):
        assert torch.equal(ref_opt.state[p]["momentum_buffer"], opt.state[q]["momentum_buffer"])
    # the gradient handed to speculate was the final one (the last step's main_grad, unchanged since)
    last = {n: gs[0] for n, gs in calls[-4:]}
    params = dict(model.named_parameters())
    for n, g in last.items():
        assert torch.equal(g, params[n].main_grad)
    ctl.begin()
    assert not ctl.handles
    model(torch.randn(4, 16)).backward()  # unarmed: no speculation
    assert not opt.fused.speculation.pending and ctl.launched == 0


def test_clipped_step_recomputes(monkeypatch):
    """A global norm above clip_grad: not confirmed, the speculative results are dropped and the step runs on
    the clipped gradients, equal to the plain run with the same clipping."""
    ref_model, ref_opt, _, _, _k1 = _setup(monkeypatch, False, 2)
    model, opt, ctl, _, _k2 = _setup(monkeypatch, True, 2)
    _train(ref_model, ref_opt, None, 2, 2, clip=1e-3)
    _train(model, opt, ctl, 2, 2, clip=1e-3)
    assert opt.spec_stats == {"used": 0, "discarded": 4}
    for p, q in zip(ref_model.parameters(), model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_begin_drops_results_of_a_step_that_did_not_run(monkeypatch):
    """A forward-backward without a step (e.g. a skipped update) leaves results pending; begin() discards them, so
    the next step speculates afresh and still equals the plain run that also skipped that update."""
    ref_model, ref_opt, _, _, _k1 = _setup(monkeypatch, False, 2)
    model, opt, ctl, _calls, _k2 = _setup(monkeypatch, True, 2)
    ctl.begin()
    model(torch.randn(4, 16)).backward()
    ctl.arm()
    model(torch.randn(4, 16)).backward()
    assert len(opt.fused.speculation.pending) == 4
    ctl.begin()
    assert not opt.fused.speculation.pending and opt.spec_stats["discarded"] == 4
    _train(ref_model, ref_opt, None, 2, 1, clip=0.0)
    _train(model, opt, ctl, 2, 1, clip=0.0)
    assert opt.spec_stats == {"used": 4, "discarded": 0}
    for p, q in zip(ref_model.parameters(), model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_confirm_unclipped_follows_megatrons_clip_test():
    seen = []
    t = types.SimpleNamespace(confirm_speculation=lambda: seen.append(1))
    assert confirm_unclipped(0.5, [t], 1.0) and confirm_unclipped(5.0, [t], 0.0)
    assert not confirm_unclipped(1.0, [t], 1.0)  # 1 / (1 + 1e-6) < 1: Megatron scales
    assert not confirm_unclipped(float("nan"), [t], 1.0) and not confirm_unclipped(float("inf"), [t], 0.0)
    assert not confirm_unclipped(torch.tensor(0.1), [t], 1.0)  # a device norm is not read
    assert len(seen) == 2


def test_attach_and_install_refuse_what_they_cannot_overlap(monkeypatch):
    """No fused-path matrix among the pairs, zero micro-batches; install at DP x CP > 1, with per-token loss, or
    without exactly one matrix optimizer in the chain's norm targets: each a ValueError saying why."""
    monkeypatch.setattr(Muon, "_fused_available", lambda self: True)
    model = _Model()
    mats = [model.decoder.layers[0].fc1]
    opt = Muon(mats, MuonConfig())
    with pytest.raises(ValueError, match="nothing to overlap"):
        ov.NSOverlap.attach(opt, [("head", model.head, model.head)], 2)
    with pytest.raises(ValueError, match="num_microbatches=0"):
        ov.NSOverlap.attach(opt, [("decoder.layers.0.fc1", mats[0], mats[0])], 0)
    from megatron.core import parallel_state as ps

    chain = types.SimpleNamespace(
        finite_targets=[opt], chained_optimizers=[types.SimpleNamespace(optimizer=opt, float16_groups=None)]
    )
    cfg = types.SimpleNamespace(calculate_per_token_loss=False)
    monkeypatch.setattr(ps, "get_pipeline_model_parallel_world_size", lambda: 2)
    with pytest.raises(ValueError, match=r"PP = 1 \(got 2\)"):
        ov.install(chain, [model], 2, cfg)
    monkeypatch.setattr(ps, "get_pipeline_model_parallel_world_size", lambda: 1)
    monkeypatch.setattr(ps, "get_data_parallel_world_size", lambda **kw: 2)
    with pytest.raises(ValueError, match=r"DP x CP = 1 \(got 2\)"):
        ov.install(chain, [model], 2, cfg)
    monkeypatch.setattr(ps, "get_data_parallel_world_size", lambda **kw: 1)
    with pytest.raises(ValueError, match="calculate_per_token_loss=True"):
        ov.install(chain, [model], 2, types.SimpleNamespace(calculate_per_token_loss=True))
    with pytest.raises(ValueError, match="exactly one matrix optimizer"):
        ov.install(
            types.SimpleNamespace(finite_targets=[], chained_optimizers=chain.chained_optimizers),
            [model],
            2,
            cfg,
        )


def test_install_maps_megatrons_fp32_copies_and_skips_post_backward_params(monkeypatch):
    """install() pairs each bf16 model matrix with the wrapper's fp32 copy (float16_groups /
    fp32_from_float16_groups), hooks the model parameter and leaves out sequence-parallel ones."""
    monkeypatch.setattr(Muon, "_fused_available", lambda self: True)
    from megatron.core import parallel_state as ps

    monkeypatch.setattr(ps, "get_data_parallel_world_size", lambda **kw: 1)
    monkeypatch.setattr(ps, "get_pipeline_model_parallel_world_size", lambda: 1)
    model = _Model()
    _k = _ddp_like(model)
    layer0, layer1 = model.decoder.layers
    layer1.fc2.sequence_parallel = True
    model_mats = [layer0.fc1, layer0.fc2, layer1.fc1, layer1.fc2]
    mains = [p.detach().clone().requires_grad_(True) for p in model_mats]
    opt = Muon(mains, MuonConfig())
    wrapper = types.SimpleNamespace(
        optimizer=opt, float16_groups=[model_mats], fp32_from_float16_groups=[mains], fp32_from_fp32_groups=[]
    )
    chain = types.SimpleNamespace(finite_targets=[opt], chained_optimizers=[wrapper])
    ctl = ov.install(chain, [model], 1, types.SimpleNamespace(calculate_per_token_loss=False))
    assert [u.name for u in ctl.units] == [
        "chunk0.decoder.layers.0 (24, 16)",
        "chunk0.decoder.layers.0 (16, 24)",
        "chunk0.decoder.layers.1 (24, 16)",
    ]
    assert [u.main[0] for u in ctl.units] == mains[:3] and [u.model[0] for u in ctl.units] == model_mats[:3]
    ctl.begin()
    ctl.arm()
    model(torch.randn(4, 16)).backward()
    assert ctl.launched == 3 and len(opt.fused.speculation.pending) == 3
    ctl.remove()
    assert not opt.fused.speculation.pending and not ctl.handles


def test_engine_arms_before_the_last_microbatch_only():
    """The megatron engine's forward-step wrapper calls arm() once, before the last micro-batch's forward."""
    pytest.importorskip("megatron.core")
    from bench.engines.megatron import _arm_before_last

    log = []
    step = _arm_before_last(lambda i: log.append(i), lambda: log.append("arm"), 3)
    for i in range(3):
        step(i)
    assert log == [0, 1, "arm", 2]
