"""`optimizer.implementation=ours` through Bridge's `provide()` seam (recipes/bridge.py), on a real tiny Megatron
GPT on CPU. Megatron-Bridge cannot be imported here (no Transformer Engine), so its OptimizerConfig module is
stood in for by Megatron-Core's OptimizerConfig, which Bridge's class subclasses without adding fields.
"""

from __future__ import annotations

import pickle
import sys
import types

import pytest

from config.schema import MuonSchema

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture
def bridge_config_stub(monkeypatch: pytest.MonkeyPatch):
    """`megatron.bridge.training.config.OptimizerConfig` = MCore's OptimizerConfig, for this test only."""
    from megatron.core.optimizer import OptimizerConfig

    from recipes import bridge as rb

    stub = types.ModuleType("megatron.bridge.training.config")
    stub.OptimizerConfig = OptimizerConfig  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "megatron.bridge.training.config", stub)
    rb._ours_optimizer_class.cache_clear()
    yield rb
    rb._ours_optimizer_class.cache_clear()


def test_ours_config_keeps_fields_pickles_and_provides_our_optimizer(bridge_config_stub, monkeypatch) -> None:
    """The config copies Bridge's applied fields, survives pickling, and provide() hands our schema to the adapter
    (`optim.megatron.build_ours` needs CUDA for Megatron's wrappers, so its call is captured here)."""
    from megatron.core.optimizer import OptimizerConfig

    import optim.megatron
    from optim.configs import MuonConfig

    rb = bridge_config_stub
    base = OptimizerConfig(optimizer="adam", lr=3e-4, min_lr=3e-5, weight_decay=0.033, clip_grad=0.5)
    cfg = rb._ours_optimizer_config(base, MuonSchema(num_ns_steps=6, implementation="ours", split_qkv=False))
    assert isinstance(cfg, OptimizerConfig) and (cfg.lr, cfg.clip_grad, cfg.weight_decay) == (
        3e-4,
        0.5,
        0.033,
    )
    assert cfg.muonbench_optimizer["num_ns_steps"] == 6
    assert type(pickle.loads(pickle.dumps(cfg))) is rb.OursOptimizerConfig  # importable by name

    seen = {}

    def fake_build_ours(chunks, matrix, adamw, routing, *, clip_grad, tp_mode, layerwise):
        seen.update(
            chunks=chunks,
            matrix=matrix,
            adamw=adamw,
            routing=routing,
            clip_grad=clip_grad,
            tp_mode=tp_mode,
            layerwise=layerwise,
        )
        return "optimizer", []

    monkeypatch.setattr(optim.megatron, "build_ours", fake_build_ours)
    model = object()
    assert cfg.provide(model_chunks=model, config_overrides={"ignored": 1}) == "optimizer"
    assert seen["chunks"] == [model] and seen["clip_grad"] == 0.5 and seen["tp_mode"] == "blockwise"
    assert isinstance(seen["matrix"], MuonConfig) and seen["matrix"].num_ns_steps == 6
    assert seen["routing"].split_qkv is False and seen["adamw"].lr == 3e-4
