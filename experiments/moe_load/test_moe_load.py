"""Probe moe_load: max / mean tokens per local expert, averaged over the step's experts calls."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from bench.engines.megatron_experts import GroupedMMExperts, _ExpertWeights
from experiments.moe_load.probe import Probe


def _experts(num: int = 3, hidden: int = 32, ffn: int = 16) -> GroupedMMExperts:
    mod = GroupedMMExperts.__new__(GroupedMMExperts)
    torch.nn.Module.__init__(mod)
    mod.num_local_experts = num
    init = lambda w: torch.nn.init.normal_(w, std=0.1)
    common = {"allreduce": True, "init_method": init, "dtype": torch.float32, "device": "cpu"}
    mod.linear_fc1 = _ExpertWeights(num, 2 * ffn, hidden, partition_dim=0, **common)
    mod.linear_fc2 = _ExpertWeights(num, hidden, ffn, partition_dim=1, **common)
    return mod


def test_load_ratio_per_call_averaged_read_once_and_hooks_removed() -> None:
    """Localises a counting bug: the hook sees every experts call's tokens_per_expert, after_step averages the
    ratios and resets, teardown leaves the module unhooked."""
    mod = _experts()
    engine = SimpleNamespace(
        model_chunks=[torch.nn.ModuleList([mod])], describe=lambda: {"experts": "grouped_mm"}
    )
    probe = Probe()
    probe.setup(engine)
    x, probs = torch.randn(12, 32), torch.rand(12)
    try:
        mod(x, torch.tensor([5, 0, 7]), probs)  # max / mean = 7 / 4
        mod(x, tokens_per_expert=torch.tensor([4, 4, 4]), probs=probs)  # 1
        assert probe.after_step() == {"moe_load_max_mean": pytest.approx((7 / 4 + 1.0) / 2)}
        assert probe.after_step() == {}
    finally:
        probe.teardown()
    mod(x, torch.tensor([12, 0, 0]), probs)
    assert probe.after_step() == {}


def test_no_grouped_experts_is_a_config_error() -> None:
    engine = SimpleNamespace(
        model_chunks=[torch.nn.Linear(2, 2)], describe=lambda: {"experts": "te_grouped_gemm"}
    )
    with pytest.raises(ValueError, match="te_grouped_gemm"):
        Probe().setup(engine)
