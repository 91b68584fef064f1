"""The torch-free family readers (muonbench/families.py, for login-node tools) against Megatron-Bridge's own
reading of the same config.json (AutoBridge's provider, `recipes.autobridge.provider_fields`): every bridged family
gives the same ModelConfig fields, and Bridge's FLOP count of its provider equals ours, sliding windows included."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.bridge_live import bridge_importable, import_bridge

pytestmark = pytest.mark.filterwarnings("ignore")

FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"


def _bridged() -> list[str]:
    import json

    from muonbench.families import FAMILIES

    out = []
    for path in sorted(FIXTURES.glob("*/config.json")):
        model_type = json.loads(path.read_text())["model_type"]
        if FAMILIES.get(model_type) and FAMILIES[model_type].bridged:  # an alias (Kimi K2) needs remote code
            out.append(path.parent.name)
    return out


BRIDGED = _bridged()


@pytest.fixture(scope="module")
def providers() -> dict[str, Any]:
    """fixture -> Bridge's provider of its config.json (AutoBridge, no weights)."""
    if reason := bridge_importable():
        pytest.skip(reason)
    import_bridge()
    from megatron.bridge.models.conversion.auto_bridge import AutoBridge

    from muonbench.families import read

    return {n: AutoBridge.from_hf_config(read(str(FIXTURES / n))).to_megatron_provider(load_weights=False)
            for n in BRIDGED}  # fmt: skip


def test_every_new_family_is_bridged_where_bridge_has_it() -> None:
    assert {"deepseek_v2_lite", "gpt_oss_20b", "gemma2_9b", "llama3_2_1b"} <= set(BRIDGED)
    assert "qwen1_5_moe_a2_7b" not in BRIDGED and "phi3_mini" not in BRIDGED  # Bridge 0.6.2 has no bridge


@pytest.mark.parametrize("name", BRIDGED)
def test_reader_agrees_with_bridge_provider(providers, name: str) -> None:
    from muonbench.families import model_fields
    from muonbench.schema import ModelConfig
    from recipes.autobridge import provider_fields

    ours = ModelConfig(**model_fields(str(FIXTURES / name)))
    bridge = provider_fields(providers[name])
    if bridge.get("moe_router_score_function") == "sigmoid":
        bridge.pop("moe_router_pre_softmax")  # Megatron reads the flag on the softmax path only
    assert bridge == {k: getattr(ours, k) for k in bridge}


@pytest.mark.parametrize("name", BRIDGED)
def test_flops_equal_bridge_count(providers, name: str) -> None:
    """Gemma 2's provider slides on odd layers in its own attention, so Bridge's count is given the same rule
    (window_attn_skip_freq = 2); without it Bridge counts every layer as sliding."""
    import copy

    from megatron.bridge.training.utils.flop_utils import num_floating_point_operations

    import muonbench
    from bench.flops import model_flops_per_token

    m = muonbench.load([f"model=hf:{FIXTURES / name}"]).model
    p = copy.copy(providers[name])
    p.seq_length, p.mtp_num_layers = m.seq_length, None
    p.kv_channels = p.kv_channels or p.hidden_size // p.num_attention_heads  # Qwen2: derived at finalize
    p.window_attn_skip_freq = p.window_attn_skip_freq or m.window_attn_skip_freq or None
    bridge = num_floating_point_operations(SimpleNamespace(model=p), batch_size=2)
    assert bridge == pytest.approx(2 * m.seq_length * model_flops_per_token(m), rel=1e-12)


MEMORY_RTOL = 0.01
"""Our weight, gradient and AdamW-state bytes against Bridge's theoretical memory: Bridge also counts the norms
(we count matrices and the vocabulary) and approximates MLA's projections (DeepSeek-V2-Lite: +0.95%)."""


@pytest.mark.parametrize("name", BRIDGED)
def test_memory_within_tolerance_of_bridge_theoretical(providers, name: str) -> None:
    """engine=megatron, AdamW, one GPU, Megatron's distributed optimizer (6 + 12 / DP bytes per parameter, as ours).
    Bridge's count takes a gated feed-forward for three projections only with SiLU (`_ffn_projection_factor`), so
    for Gemma 2 (GeGLU) and gpt-oss (clamped quick-GELU) its count is set to that of the same provider with SiLU."""
    import copy

    import torch.nn.functional as F
    from megatron.bridge.training.utils.theoretical_memory_utils import estimate_training_memory

    import muonbench
    from bench import memory

    root = muonbench.load([f"model=hf:{FIXTURES / name}", "engine=megatron", "hardware=h200",
                           "parallelism=single_gpu", "optimizer=adamw"])  # fmt: skip
    p = copy.copy(providers[name])
    p.mtp_num_layers = None
    p.kv_channels = p.kv_channels or p.hidden_size // p.num_attention_heads
    p.activation_func = F.silu  # the projection count of a gated feed-forward, whatever its gate
    container = SimpleNamespace(model=p, optimizer=SimpleNamespace(use_distributed_optimizer=True), data_parallel_size=1)
    bridge = estimate_training_memory(container, include_activation=False).weight_and_optimizer_bytes
    exact, _ = memory.features(root)
    assert sum(exact.values()) == pytest.approx(bridge, rel=MEMORY_RTOL)
