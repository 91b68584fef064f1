"""The families `model=hf:` gained (DeepSeek-V2-Lite, gpt-oss-20b, Qwen1.5-MoE-A2.7B, Gemma-2-9B, Phi-3-mini): each
counts in `flops`, projects in `project`, builds and trains as a tiny slice on the hf engine with its features
(sliding windows, attention sinks, soft-capping, the shared-expert gate), and is refused before launch, naming the
feature, by an engine that does not build it. Llama 3.1's RoPE scaling is carried, not dropped."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

import muonbench
from bench.flops import model_flops_per_token
from muonbench import ConfigError

FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"
NEW = ("deepseek_v2_lite", "gpt_oss_20b", "qwen1_5_moe_a2_7b", "gemma2_9b", "phi3_mini")
LAYOUT = ("hardware=h200", "parallelism=single_gpu")


def hf(name: str, *extra: str) -> Any:
    return muonbench.load([f"model=hf:{FIXTURES / name}", *LAYOUT, *extra])


# fixture -> {engine: the feature its refusal names, or None where it builds the model}
ENGINES: dict[str, dict[str, str | None]] = {
    "deepseek_v2_lite": {"hf": None, "megatron": None, "bridge": None},
    "gpt_oss_20b": {"hf": None, "megatron": "sliding-window attention", "bridge": None},
    "qwen1_5_moe_a2_7b": {"hf": None, "megatron": None, "bridge": "no bridge"},
    "gemma2_9b": {"hf": None, "megatron": "sliding-window attention", "bridge": None},
    "phi3_mini": {"hf": None, "megatron": "sliding-window attention", "bridge": "no bridge"},
}


@pytest.mark.parametrize("name", NEW)
def test_each_engine_builds_or_refuses_naming_the_feature(name: str) -> None:
    from recipes.autobridge import check_bridged

    for engine, refusal in ENGINES[name].items():
        root = hf(name, f"engine={engine}")
        if refusal is None:
            muonbench.check_runnable(root)
            continue
        with pytest.raises(ValueError, match=refusal) as err:
            muonbench.check_runnable(root)
            check_bridged(root.model)
        assert "\n" not in str(err.value)


def test_a_feature_without_its_window_is_still_named() -> None:
    """Gemma 2 without its window on engine=megatron: the next feature it lacks is named, never dropped."""
    with pytest.raises(ConfigError, match=r"model.activation='gelu_tanh': GeGLU feed-forward is not built"):
        muonbench.check_runnable(hf("gemma2_9b", "engine=megatron", "model.sliding_window=0"))


@pytest.mark.parametrize("name", NEW)
def test_flops_and_project(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    from bench.tools import flops, project

    assert flops.main([f"model=hf:{FIXTURES / name}", "parallelism=cpu_dp2", "format=json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model_flops_per_token"] == pytest.approx(model_flops_per_token(hf(name).model), rel=1e-12)
    assert project.main([f"model=hf:{FIXTURES / name}", *LAYOUT, "engine=hf", "format=json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] > 0


def test_sliding_windows_count_only_their_window() -> None:
    """gpt-oss: 12 of 24 layers see 128 keys; the core-attention FLOPs are Bridge's SWA formula, not full causal."""
    from bench.flops import model_flops_breakdown

    m = hf("gpt_oss_20b").model
    full = model_flops_breakdown(dataclasses.replace(m, sliding_window=0))["attn_core"]
    q, s = m.num_attention_heads * m.kv_channels, m.seq_length
    slide = 12 * q * 12 * (128 - 128 * 127 / (2 * s))
    assert model_flops_breakdown(m)["attn_core"] == pytest.approx(full / 2 + slide, rel=1e-12)


@pytest.fixture(scope="module")
def tiny() -> dict[str, Any]:
    """fixture -> (tiny slice, its transformers model after one forward/backward, the loss); windows of 8 tokens
    so a 64-token slice slides."""
    import torch

    from bench.models.hf_build import build_model
    from bench.tools.recommend_checks import slice_of

    out = {}
    torch.set_num_threads(1)
    for name in NEW:
        m = slice_of(hf(name, "model.seq_length=32").model)
        if m.sliding_window:
            m = dataclasses.replace(m, sliding_window=8)
        net = build_model(m, seed=0)
        x = torch.randint(0, m.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
        loss = net(input_ids=x, labels=x).loss
        loss.backward()
        out[name] = (m, net, float(loss))
    return out


@pytest.mark.parametrize("name", NEW)
def test_tiny_slice_trains_with_its_features(tiny, name: str) -> None:
    import math

    import torch

    from muonbench.schema import optim_configs
    from optim.hybrid import build_optimizer
    from optim.routing import SplitLayout

    m, net, loss = tiny[name]
    c = net.config
    assert math.isfinite(loss) and c.model_type == m.family
    if m.sliding_window:
        assert c.sliding_window == 8
    if name in ("gpt_oss_20b", "gemma2_9b"):
        assert c.layer_types[:2] == ["sliding_attention", "full_attention"]
    if name == "gpt_oss_20b":  # eager attention: SDPA would leave the sinks out (and their gradient 0)
        assert c._attn_implementation == "eager"
        assert all(layer.self_attn.sinks.grad.abs().sum() > 0 for layer in net.model.layers)
    if name == "gemma2_9b":
        assert (c.final_logit_softcapping, c.attn_logit_softcapping, c.hidden_activation) == (
            30.0, 50.0, "gelu_pytorch_tanh")  # fmt: skip
    if name == "qwen1_5_moe_a2_7b":
        assert net.model.layers[0].mlp.shared_expert_gate.weight.grad is not None
    algo, routing, adamw = optim_configs(hf(name, "optimizer=muon").optimizer)
    named = list(net.named_parameters())
    opt = build_optimizer(named, algo, naming="hf", routing=routing, layout=SplitLayout.from_hf_config(c),
                          adamw=adamw)  # fmt: skip
    opt.step()
    assert all(torch.isfinite(p).all() for _, p in named)
    matrix = {r.name for r in opt.routes if r.optimizer == "matrix"}
    assert matrix and not any("bias" in n or "sinks" in n or "norm" in n for n in matrix)


def test_llama3_rope_scaling_is_carried() -> None:
    """Llama 3.2's llama3 RoPE scaling was read and dropped; now the hf engine's config and Megatron's rotary
    embedding both carry it."""
    from bench.engines.megatron_model import gpt_model_kwargs
    from muonbench.families import config_json

    m = hf("llama3_2_1b").model
    assert (m.rope_scaling_type, m.rope_scaling_factor, m.rope_original_max_position_embeddings) == ("llama3", 32.0,
                                                                                                   8192)  # fmt: skip
    assert config_json(m)["rope_scaling"]["rope_type"] == "llama3"
    kw = gpt_model_kwargs(m, tp=1)
    assert (kw["rope_scaling"], kw["rope_scaling_factor"]) == (True, 32.0)
    muonbench.check_runnable(hf("llama3_2_1b", "engine=megatron"))
    with pytest.raises(ConfigError, match=r"model.rope_original_max_position_embeddings=4096: .*allowed: \[8192\]"):
        muonbench.check_runnable(hf("llama3_2_1b", "engine=megatron", "model.rope_original_max_position_embeddings=4096"))


def test_qwen2_moe_shared_expert_gate_on_megatron() -> None:
    from bench.engines import megatron_model as mm

    root = hf("qwen1_5_moe_a2_7b", "engine=megatron")
    _, kw = mm.transformer_config_kwargs(root.model, root.parallelism, mm.build_options(root, use_te=False))
    assert kw["moe_shared_expert_gate"] is True and kw["add_qkv_bias"] is True
