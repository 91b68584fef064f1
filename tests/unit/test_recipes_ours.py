"""`optimizer.implementation=ours` through Bridge's `provide()` seam, with the real Megatron-Bridge 0.6.2 classes, on
a real tiny Megatron GPT on CPU (one process, gloo).

`OursOptimizerConfig.provide()` is called with the keywords Bridge's `setup_optimizer` passes; the optimizer it
returns must contain our `optim` optimizer and param groups carrying every key Bridge's training loop and Megatron's
`OptimizerParamScheduler` read, for the replicated optimizer (what `build_ours` builds at DP 1) and for the
layer-wise one (`optim.megatron.MegatronLayerWise`, built directly at DP 1 as tests/unit/test_megatron_adapter.py
does). Megatron's optimizer wrappers allocate their one-element loss-scale tensors on "cuda"; on this CPU machine
`_CudaAllocationsOnCpu` places those allocations on the CPU while the optimizer is built (nothing else changes).
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from muonbench.schema import DistributionConfig, MuonSchema
from tests.bridge_live import bridge_importable, import_bridge
from tests.unit.test_megatron_adapter import _build, _gqa_model, megatron_groups  # noqa: F401 - fixture

pytestmark = pytest.mark.filterwarnings("ignore")

_SKIP = bridge_importable()
if _SKIP:
    pytest.skip(_SKIP, allow_module_level=True)

SCHEDULER_KEYS = ("max_lr", "min_lr", "lr_mult", "wd_mult", "weight_decay")
"""What Megatron's OptimizerParamScheduler.step reads from every param group."""
TRAIN_LOOP_KEYS = ("is_decoupled_lr", "lr")
"""What Bridge's train.py reads from every param group when it logs (the loop around `training_log`)."""


class _CudaAllocationsOnCpu(TorchFunctionMode):
    """Factory calls with `device="cuda"` allocate on the CPU (Megatron's wrappers' loss-scale tensors)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


@pytest.fixture(scope="module")
def bridge():
    """`recipes.bridge` with the real Megatron-Bridge imported (its OursOptimizerConfig subclasses Bridge's)."""
    import_bridge()
    from recipes import bridge as rb

    return rb


def _ours_config(rb: Any, distribution: DistributionConfig | None = None, **schema: Any) -> Any:
    from megatron.bridge.training.config import OptimizerConfig

    # bf16 False: Bridge sets it from the mixed-precision config at run time; the CPU model here is fp32.
    base = OptimizerConfig(
        optimizer="adam", lr=3e-4, min_lr=3e-5, weight_decay=0.033, clip_grad=0.5, bf16=False
    )
    return rb._ours_optimizer_config(
        base, MuonSchema(implementation="ours", **schema), distribution or DistributionConfig()
    )


def _bridge_provide(cfg: Any, model: Any) -> Any:
    """`cfg.provide(...)` exactly as Bridge 0.6.2's training/optim.py::setup_optimizer calls it."""
    with _CudaAllocationsOnCpu():
        return cfg.provide(
            model_chunks=[model], config_overrides=None, use_gloo_process_groups=False, pg_collection=None
        )


def _schedule_and_log(optimizer: Any, steps: int = 3) -> tuple[float | None, float | None]:
    """Megatron's scheduler on `optimizer`, then the learning rates as Bridge's train.py reads them for its log."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    scheduler = OptimizerParamScheduler(
        optimizer,
        init_lr=0.0,
        max_lr=3e-4,
        min_lr=3e-5,
        lr_warmup_steps=2,
        lr_decay_steps=10,
        lr_decay_style="cosine",
        start_wd=0.033,
        end_wd=0.033,
        wd_incr_steps=10,
        wd_incr_style="constant",
    )
    for _ in range(steps):
        scheduler.step(increment=1)
    # megatron/bridge/training/train.py (0.6.2), the loop before training_log:
    learning_rate = None
    decoupled_learning_rate = None
    for param_group in optimizer.param_groups:
        if len(param_group) == 0:
            continue
        if param_group["is_decoupled_lr"]:
            decoupled_learning_rate = param_group["lr"]
        else:
            learning_rate = param_group["lr"]
    return learning_rate, decoupled_learning_rate


def _megatron_cosine(step: int, max_lr: float, min_lr: float, *, warmup: int, decay: int) -> float:
    """Megatron's cosine schedule after warm-up (optimizer_param_scheduler.get_lr)."""
    import math

    ratio = (step - warmup) / (decay - warmup)
    return min_lr + 0.5 * (math.cos(math.pi * ratio) + 1.0) * (max_lr - min_lr)


def _check_groups(optimizer: Any) -> None:
    groups = optimizer.param_groups
    assert groups
    for group in groups:
        missing = [k for k in (*TRAIN_LOOP_KEYS, *SCHEDULER_KEYS) if k not in group]
        assert not missing, f"param group without {missing}"
        assert group["is_decoupled_lr"] is False


def test_ours_config_is_bridges_class_keeps_fields_and_pickles(bridge) -> None:
    from megatron.bridge.training.config import OptimizerConfig

    cfg = _ours_config(bridge, DistributionConfig(tp_mode="duplicated"), num_ns_steps=6, split_qkv=False)
    assert isinstance(cfg, OptimizerConfig) and type(cfg) is bridge.OursOptimizerConfig
    assert (cfg.lr, cfg.clip_grad, cfg.weight_decay, cfg.bf16) == (3e-4, 0.5, 0.033, False)
    assert cfg.muonbench_optimizer["num_ns_steps"] == 6 and cfg.muonbench_optimizer["split_qkv"] is False
    assert cfg.muonbench_distribution["tp_mode"] == "duplicated" and "tp_mode" not in cfg.muonbench_optimizer
    assert type(pickle.loads(pickle.dumps(cfg))) is bridge.OursOptimizerConfig  # importable by name


def test_provide_builds_our_replicated_optimizer(bridge, megatron_groups) -> None:  # noqa: F811
    """DP 1: `build_ours` builds the replicated optimizer (layer-wise has one owner); ours steps the matrices."""
    from bench.engines.bridge import check_optimizer, optimizer_parts
    from optim.megatron import MegatronLayerWise

    gpt, _ = _build(_gqa_model())
    cfg = _ours_config(bridge, num_ns_steps=6)
    optimizer = _bridge_provide(cfg, gpt)
    assert not isinstance(optimizer, MegatronLayerWise)
    parts = optimizer_parts(optimizer)
    assert "optim.optimizers.muon.Muon" in parts and "torch.optim.adamw.AdamW" in parts
    check_optimizer(optimizer, "ours", "muon")
    with pytest.raises(RuntimeError, match="implementation=megatron, but our optimizer was built"):
        check_optimizer(optimizer, "megatron", "muon")
    muon = next(o for o in _inner(optimizer) if type(o).__name__ == "Muon")
    assert muon.config.num_ns_steps == 6  # the schema handed through provide()
    n_params = sum(len(g["params"]) for g in optimizer.param_groups)
    assert n_params == len(list(gpt.parameters()))
    _check_groups(optimizer)
    lr, decoupled = _schedule_and_log(optimizer)
    # step 3 of warm-up 2, cosine decay from max_lr to the config's min_lr over 10 (not held at max_lr)
    assert decoupled is None and lr == pytest.approx(_megatron_cosine(3, 3e-4, 3e-5, warmup=2, decay=10))
    assert all(g["lr"] == pytest.approx(lr) for g in optimizer.param_groups)


def _inner(optimizer: Any) -> list[torch.optim.Optimizer]:
    from optim.megatron.builders import _inner_torch_optimizers

    return _inner_torch_optimizers(optimizer)


def test_layerwise_optimizer_groups_carry_bridges_keys(bridge, megatron_groups) -> None:  # noqa: F811
    """MegatronLayerWise (one rank, as in tests/unit/test_megatron_adapter.py) under Megatron's scheduler and Bridge's
    logging loop."""
    from bench.engines.bridge import check_optimizer, optimizer_parts
    from optim import megatron as om
    from optim.configs import AdamWConfig, MuonConfig, RoutingConfig

    gpt, _ = _build(_gqa_model())
    routed = om.classify([gpt], RoutingConfig())
    routes = {r.name: r for _, r in routed}
    muon, adamw = MuonConfig(lr=3e-4), AdamWConfig(lr=3e-4, weight_decay=0.033)
    optimizer = om.MegatronLayerWise(
        [(r.name, p) for p, r in routed],
        lambda owned: om._owned_optimizer(owned, routes, muon, adamw),
        is_matrix=lambda n, p: routes[n].optimizer == "matrix",
        is_expert=lambda n: routes[n].is_expert,
        dp_group=None,
        expert_dp_group=None,
        clip_grad=1.0,
    )
    bridge.decay_to_min_lr(optimizer, 3e-5)  # what provide() does after build_ours
    assert set(optimizer_parts(optimizer)) >= {"optim.optimizers.muon.Muon", "torch.optim.adamw.AdamW"}
    check_optimizer(optimizer, "ours", "muon")
    _check_groups(optimizer)
    lr, decoupled = _schedule_and_log(optimizer)
    assert decoupled is None and lr == pytest.approx(_megatron_cosine(3, 3e-4, 3e-5, warmup=2, decay=10))
    assert all(g["lr"] == pytest.approx(lr) for g in optimizer.param_groups)


def test_check_optimizer_refuses_megatron_adam_for_ours(bridge, megatron_groups) -> None:  # noqa: F811
    """A Bridge that ignored `provide()` builds Megatron's Adam from the same config: ours must refuse it. (Megatron's
    Adam without TE / APEX and without a distributed optimizer: FP32Optimizer around torch's AdamW.)"""
    from megatron.core.optimizer import FP32Optimizer

    from bench.engines.bridge import check_optimizer, optimizer_parts
    from optim.configs import AdamWConfig
    from optim.megatron.config import megatron_optimizer_config

    gpt, _ = _build(_gqa_model())
    config = megatron_optimizer_config(
        optimizer="adam",
        adamw=AdamWConfig(lr=3e-4),
        clip_grad=1.0,
        use_distributed_optimizer=False,
        bf16=False,
    )
    with _CudaAllocationsOnCpu():
        adam = FP32Optimizer(torch.optim.AdamW(gpt.parameters(), lr=3e-4), config, None)
    assert not any(p.startswith("optim.") for p in optimizer_parts(adam))
    with pytest.raises(RuntimeError, match=r"optimizer=muon implementation=ours, but Megatron-Bridge built"):
        check_optimizer(adam, "ours", "muon")
    with pytest.raises(RuntimeError, match="Megatron built no Muon"):
        check_optimizer(adam, "megatron", "muon_megatron")
    check_optimizer(adam, "megatron", "adamw")
