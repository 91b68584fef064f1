"""`model=hf:<spec>`: a Hugging Face config.json read into ModelConfig (muonbench/hf_model.py, muonbench.compose).

The fixtures under fixtures/hf_configs/ carry the public config.json values of each family
(docs/references.md#hugging-face-model-configs).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import muonbench
from bench.flops import model_flops_per_token
from muonbench import ConfigError

FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"
sys.path.insert(0, str(Path(__file__).parent.parent))


def hf(name: str, *extra: str) -> muonbench.schema.RootConfig:
    return muonbench.load([f"model=hf:{FIXTURES / name}", *extra])


# name: (family, layers, hidden, heads, kv groups, head dim, dense FFN, experts, top-k, expert FFN, shared, dense
# layers, vocab, qk-norm, pre-softmax router)
EXPECTED = {
    "llama3_8b": ("llama", 32, 4096, 32, 8, 128, 14336, 0, 0, 0, 0, 0, 128256, False, False),
    "qwen2_5_7b": ("qwen2", 28, 3584, 28, 4, 128, 18944, 0, 0, 0, 0, 0, 152064, False, False),
    "qwen3_8b": ("qwen3", 36, 4096, 32, 8, 128, 12288, 0, 0, 0, 0, 0, 151936, True, False),
    "qwen3_30b_a3b": ("qwen3_moe", 48, 2048, 32, 4, 128, 6144, 128, 8, 768, 0, 0, 151936, True, False),
    "mixtral_8x7b": ("mixtral", 32, 4096, 32, 8, 128, 14336, 8, 2, 14336, 0, 0, 32000, False, False),
    "olmoe_1b_7b": ("olmoe", 16, 2048, 16, 16, 128, 1024, 64, 8, 1024, 0, 0, 50304, True, True),
    "deepseek_v3": ("deepseek_v3", 61, 7168, 128, 0, 0, 18432, 256, 8, 2048, 2048, 3, 129280, True, False),
    "deepseek_v2_lite": ("deepseek_v2", 27, 2048, 16, 0, 0, 10944, 64, 6, 1408, 2816, 1, 102400, True, True),
    "gpt_oss_20b": ("gpt_oss", 24, 2880, 64, 8, 64, 2880, 32, 4, 2880, 0, 0, 201088, False, False),
    "qwen1_5_moe_a2_7b": ("qwen2_moe", 24, 2048, 16, 16, 128, 5632, 60, 4, 1408, 5632, 0, 151936, False, True),
    "gemma2_9b": ("gemma2", 42, 3584, 16, 8, 256, 14336, 0, 0, 0, 0, 0, 256000, False, False),
    "phi3_mini": ("phi3", 32, 3072, 32, 32, 96, 8192, 0, 0, 0, 0, 0, 32064, False, False),
}
FIELDS = [
    "family",
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "kv_channels",
    "ffn_hidden_size",
    "num_experts",
    "moe_router_topk",
    "moe_ffn_hidden_size",
    "moe_shared_expert_intermediate_size",
    "num_dense_layers",
    "vocab_size",
    "qk_layernorm",
    "moe_router_pre_softmax",
]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_family_fields(name: str) -> None:
    m = hf(name).model
    assert tuple(getattr(m, f) for f in FIELDS) == EXPECTED[name]
    assert m.name == name and m.source == f"hf:{FIXTURES / name}"
    assert m.seq_length == 4096 and m.tie_embeddings is (name == "gemma2_9b")  # Gemma ties its embeddings


def test_deepseek_v3_mla_and_router() -> None:
    m = hf("deepseek_v3").model
    assert (
        m.attention,
        m.q_lora_rank,
        m.kv_lora_rank,
        m.qk_head_dim,
        m.qk_pos_emb_head_dim,
        m.v_head_dim,
    ) == (
        "mla",
        1536,
        512,
        128,
        64,
        128,
    )
    assert m.moe_router_score_function == "sigmoid" and m.moe_router_enable_expert_bias
    assert m.moe_router_topk_scaling_factor == 2.5
    assert (m.rope_scaling_factor, m.rope_original_max_position_embeddings, m.rotary_base) == (
        40.0,
        4096,
        10000.0,
    )
    assert m.make_vocab_size_divisible_by == 1280


def _gqa_by_hand(L: int, h: int, q: int, kv: int, mlp_width: int, v: int, s: int = 4096) -> int:
    """Megatron's per-token training FLOPs of a GQA model: 6 x (QKV + out) + 6 q s (causal core) + 6 h 3 ffn (SwiGLU;
    ffn = dense width, or top-k x expert width) + 6 h V (logits)."""
    return 6 * L * (h * (q + 2 * kv) + q * h) + 6 * L * q * s + 6 * h * 3 * mlp_width * L + 6 * h * v


BY_HAND = {
    "llama3_8b": _gqa_by_hand(32, 4096, 32 * 128, 8 * 128, 14336, 128256),
    "qwen2_5_7b": _gqa_by_hand(28, 3584, 28 * 128, 4 * 128, 18944, 152064),
    "qwen3_8b": _gqa_by_hand(36, 4096, 32 * 128, 8 * 128, 12288, 151936),
    "qwen3_30b_a3b": _gqa_by_hand(48, 2048, 32 * 128, 4 * 128, 8 * 768, 151936),
    "mixtral_8x7b": _gqa_by_hand(32, 4096, 32 * 128, 8 * 128, 2 * 14336, 32000),
    "olmoe_1b_7b": _gqa_by_hand(16, 2048, 16 * 128, 16 * 128, 8 * 1024, 50304),
    # MLA: 61 layers, h 7168, 128 heads, q rank 1536, kv rank 512, qk 128 + rope 64, v 128; 3 dense layers (FFN
    # 18432) and 58 MoE layers (top-8 of 2048 + one shared 2048); vocab 129280 = 101 x 1280.
    "deepseek_v3": 6
    * 61
    * (
        1536 * (7168 + 128 * (128 + 64) + 1)
        + 512 * (7168 + 128 * (128 + 128) + 1)
        + 7168 * 64
        + 128 * 128 * 7168
    )
    + 3 * 61 * 4096 * 128 * (128 + 64 + 128)
    + 6 * 7168 * 3 * (18432 * 3 + 2048 * 8 * 58 + 2048 * 58)
    + 6 * 7168 * 129280,
}


@pytest.mark.parametrize("name", sorted(BY_HAND))
def test_flops_per_token_by_hand(name: str) -> None:
    assert model_flops_per_token(hf(name).model) == pytest.approx(BY_HAND[name], rel=1e-3)


BRIDGED = ("llama3_8b", "qwen2_5_7b", "qwen3_8b", "qwen3_30b_a3b", "olmoe_1b_7b", "deepseek_v3")
"""Families Megatron-Bridge 0.6.2 has a bridge for (it has none for Mixtral)."""


@pytest.mark.parametrize("name", BRIDGED)
def test_flops_equal_bridge_own_count(name: str) -> None:
    """Bridge's own provider of the same config.json (AutoBridge, no weights) counts the FLOPs we record."""
    from bridge_live import bridge_importable, import_bridge

    if reason := bridge_importable():
        pytest.skip(reason)
    import_bridge()
    from megatron.bridge.models.conversion.auto_bridge import AutoBridge
    from megatron.bridge.training.utils.flop_utils import num_floating_point_operations
    from transformers import AutoConfig

    m = hf(name).model
    provider = AutoBridge.from_hf_config(AutoConfig.from_pretrained(FIXTURES / name)).to_megatron_provider(
        load_weights=False
    )
    provider.seq_length = m.seq_length  # the benchmark's sequence, not the config's context
    provider.mtp_num_layers = None  # no engine builds multi-token prediction (muonbench/hf_model.py)
    if (
        provider.kv_channels is None
    ):  # Qwen2: Megatron's TransformerConfig derives it when the provider is finalized
        provider.kv_channels = provider.hidden_size // provider.num_attention_heads
    bridge = num_floating_point_operations(SimpleNamespace(model=provider), batch_size=2)
    assert bridge == pytest.approx(2 * m.seq_length * model_flops_per_token(m), rel=1e-9)


def test_overrides_apply_on_top() -> None:
    m = hf("qwen3_30b_a3b", "model.num_layers=2", "model.hidden_size=64", "model.num_experts=8").model
    assert (m.num_layers, m.hidden_size, m.num_experts, m.moe_router_topk, m.kv_channels) == (
        2,
        64,
        8,
        8,
        128,
    )
    assert m.family == "qwen3_moe"


def test_folder_and_file_specs_agree() -> None:
    from dataclasses import replace

    by_file = muonbench.load([f"model=hf:{FIXTURES / 'llama3_8b' / 'config.json'}"]).model
    assert replace(by_file, source="") == replace(hf("llama3_8b").model, source="")


def _write(tmp_path: Path, base: str, **changes: object) -> Path:
    raw = json.loads((FIXTURES / base / "config.json").read_text())
    raw.update(changes)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    return path


@pytest.mark.parametrize(
    ("base", "changes", "field"),
    [
        ("llama3_8b", {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, "model_type='gpt2'"),
        ("llama3_8b", {"hidden_size": 4100, "num_attention_heads": 30}, "num_attention_heads=30"),
        ("llama3_8b", {"num_key_value_heads": 5}, "num_key_value_heads=5"),
        ("mixtral_8x7b", {"num_experts_per_tok": 0}, "num_experts_per_tok=0"),
        ("mixtral_8x7b", {"num_experts_per_tok": 9}, "num_experts_per_tok=9"),
        ("llama3_8b", {"hidden_act": "gelu"}, "hidden_act='gelu'"),
        ("qwen3_30b_a3b", {"mlp_only_layers": [3]}, "mlp_only_layers=[3]"),
        ("qwen1_5_moe_a2_7b", {"use_sliding_window": True}, "use_sliding_window=True"),
        ("gemma2_9b", {"attn_logit_softcapping": 40.0}, "attn_logit_softcapping=40.0"),
        ("llama3_2_1b", {"rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 2.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
         "low_freq_factor=2.0"),
    ],
)
def test_bad_config_names_the_field(tmp_path: Path, base: str, changes: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace("[", r"\[").replace("]", r"\]")):
        muonbench.load([f"model=hf:{_write(tmp_path, base, **changes)}"])


def test_unsupported_architecture_lists_the_supported() -> None:
    with pytest.raises(ConfigError) as err:
        muonbench.load([f"model=hf:{FIXTURES / 'llama3_8b'}", "model.family=gpt2"])
    assert "model.family='gpt2'" in str(err.value) and "'llama'" in str(err.value)


def test_remote_code_names_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"model\.trust_remote_code=true"):
        muonbench.load([f"model=hf:{FIXTURES / 'kimi_k2'}"])


def test_hub_id_not_cached_says_how_to_fetch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ConfigError, match=r"`hf download someone/unseen-model config\.json`"):
        muonbench.load(["model=hf:someone/unseen-model"])


def test_hub_id_from_the_local_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    snap = tmp_path / "models--meta-llama--Meta-Llama-3-8B" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text((FIXTURES / "llama3_8b" / "config.json").read_text())
    (tmp_path / "models--meta-llama--Meta-Llama-3-8B" / "refs").mkdir()
    (tmp_path / "models--meta-llama--Meta-Llama-3-8B" / "refs" / "main").write_text("abc")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    m = muonbench.load(["model=hf:meta-llama/Meta-Llama-3-8B"]).model
    assert (m.name, m.family, m.num_layers) == ("meta_llama_3_8b", "llama", 32)


def test_missing_path_and_bare_placeholder() -> None:
    with pytest.raises(ConfigError, match="no such file"):
        muonbench.load(["model=hf:/nonexistent/config.json"])
    with pytest.raises(ConfigError, match=r"model=hf:<config\.json"):
        muonbench.load(["model=hf"])


def test_model_tool_prints_a_committable_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    from omegaconf import OmegaConf

    from bench.tools.model import main
    from muonbench.schema import ModelConfig

    assert main([f"hf:{FIXTURES / 'olmoe_1b_7b'}", "model.num_layers=4"]) == 0
    text = capsys.readouterr().out
    values = OmegaConf.to_container(OmegaConf.create(text))
    assert values.pop("defaults") == ["base_model"]
    rebuilt = ModelConfig(**values)
    expected = hf("olmoe_1b_7b", "model.num_layers=4").model
    assert rebuilt == ModelConfig(**{**vars(expected), "source": "", "trust_remote_code": False})
    assert main([f"hf:{FIXTURES / 'kimi_k2'}"]) == 2
    assert "trust_remote_code" in capsys.readouterr().err


def test_flops_tool_takes_hf_models(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.tools.flops import main

    assert main([f"model=hf:{FIXTURES / 'llama3_8b'}", "parallelism=cpu_dp2", "format=json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model_flops_per_token"] == BY_HAND["llama3_8b"]


def test_tiny_slice_experiment_keeps_the_layer_types() -> None:
    """experiment=cpu/hf_tiny_dp2 (make bench-hf) shrinks any family; its values stay over the config's, a slice
    shorter than DeepSeek-V3's three dense layers keeps one MoE layer, the shared expert keeps its count."""
    m = muonbench.load(["experiment=cpu/hf_tiny_dp2", f"model=hf:{FIXTURES / 'deepseek_v3'}"]).model
    assert (m.num_layers, m.hidden_size, m.num_experts, m.moe_router_topk, m.num_dense_layers) == (
        2,
        64,
        256,
        8,
        1,
    )
    assert m.moe_shared_expert_intermediate_size == m.moe_ffn_hidden_size == 32
    m = muonbench.load(
        ["experiment=cpu/hf_tiny_dp2", f"model=hf:{FIXTURES / 'llama3_8b'}", "model.num_layers=4"]
    ).model
    assert (m.family, m.num_layers, m.hidden_size, m.num_experts, m.rotary_base) == (
        "llama",
        4,
        64,
        0,
        500000.0,
    )


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_written_config_reads_back_to_the_same_model(name: str, tmp_path: Path) -> None:
    """`families.config_json` is the inverse of the reader: a field it drops or misnames shows up here."""
    from muonbench.families import config_json, model_fields

    read = model_fields(str(FIXTURES / name))
    model = muonbench.schema.ModelConfig(**read)
    (tmp_path / "config.json").write_text(json.dumps(config_json(model)))
    again = model_fields(str(tmp_path))
    assert {k: again[k] for k in read if k not in ("name", "source")} == {
        k: v for k, v in read.items() if k not in ("name", "source")
    }


def test_run_folders_carry_the_model_name() -> None:
    """`model=hf:<spec>` names the model for Hydra too (the run folder pattern reads model.name); a later
    `model.name=` still wins."""
    from muonbench.compose import expand_hf

    spec = str(FIXTURES / "llama3_8b")
    assert expand_hf([f"model=hf:{spec}", "optimizer=muon"]) == [
        "model=hf",
        f"model.source='hf:{spec}'",
        "model.name='llama3_8b'",
        "optimizer=muon",
    ]
    assert hf("llama3_8b").model.name == "llama3_8b"
    assert hf("llama3_8b", "model.name=mine").model.name == "mine"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_tiny_slice_config_has_no_token_id_outside_its_vocabulary(name: str) -> None:
    """The recommendation's CPU check builds each family on a 512-token slice: the exported config sets no token
    ids (a family's defaults, e.g. OLMoE's eos 50279, lie outside and transformers warns about them)."""
    import transformers

    from bench.tools.recommend_checks import slice_of
    from muonbench.families import config_json, model_fields

    tiny = slice_of(muonbench.schema.ModelConfig(**model_fields(str(FIXTURES / name))))
    cfg = transformers.AutoConfig.for_model(**config_json(tiny))
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(cfg, key, None)
        assert value is None or value < cfg.vocab_size, (key, value)
