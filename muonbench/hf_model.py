"""A Hugging Face `config.json` as our `ModelConfig`: `model=hf:<spec>` wherever a model is chosen.

`<spec>` is a path to a `config.json`, a folder holding one, or a Hub id found in the local Hugging Face cache
(offline: nothing is downloaded). The file is read with transformers' `AutoConfig`, without remote code unless
`model.trust_remote_code=true`, and mapped to the `ModelConfig` fields of its family (the readers below, listed in `muonbench.families`). Every field the
mapping cannot represent, or that our engines and the Megatron FLOP formula do not cover, is refused naming the
field (`HFConfigError`), before anything is built or launched.

RoPE scaling (YaRN, Llama 3.1's) and sliding windows (every layer, or every N-th layer full) are fields of
`ModelConfig`; features a family always has (Gemma 2's soft-capping, gpt-oss's attention sinks, ...) are its
entry's `features` in `muonbench.families`; an engine that builds neither refuses them before launch.
Not represented (no effect on shapes or FLOPs): DeepSeek's group-limited routing (n_group / topk_group) and YaRN
attention scale (mscale), multi-token-prediction layers (mtp_num_layers = 0: no engine builds them; set it on the
command line for the FLOP tools). Values read and their sources: docs/references.md#hugging-face-model-configs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

SEQ_LENGTH = 4096
"""Sequence length of a model read from a config (the product's default), capped by its max_position_embeddings."""


class HFConfigError(ValueError):
    """A Hugging Face config we cannot read or represent: names the field, the value and the rule."""


def _fail(field: str, value: Any, rule: str) -> None:
    raise HFConfigError(f"{field}={value!r}: {rule}")


# --------------------------------------------------------------------------------------------------------------
# Finding and reading the config
# --------------------------------------------------------------------------------------------------------------
_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


def resolve(spec: str) -> Path:
    """The `config.json` of `spec`: a file, a folder holding one, or a Hub id in the local Hugging Face cache.

    Raises:
        HFConfigError: no such file, a folder without config.json, or a Hub id with no cached config.json.
    """
    path = Path(spec).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        if (path / "config.json").is_file():
            return path / "config.json"
        _fail("model", f"hf:{spec}", f"the folder holds no config.json ({path.resolve()})")
    if not _HUB_ID.match(spec) or spec.endswith(".json"):
        _fail("model", f"hf:{spec}", "no such file or folder, and not a Hub id (<owner>/<name>)")
    from huggingface_hub import constants, try_to_load_from_cache

    cached = try_to_load_from_cache(spec, "config.json")
    if isinstance(cached, str):
        return Path(cached)
    _fail(
        "model",
        f"hf:{spec}",
        f"no config.json of {spec} in the local Hugging Face cache ({constants.HF_HUB_CACHE}); nothing is "
        f"downloaded here. Fetch the one file with `hf download {spec} config.json` "
        "(or pass a path to a config.json)",
    )
    raise AssertionError  # unreachable: _fail raises


def model_type(spec: str) -> str | None:
    """The model_type the config.json of `spec` names (None where it cannot be read: `read` says why)."""
    try:
        raw = json.loads(resolve(spec).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return raw.get("model_type") if isinstance(raw, dict) else None


def read(spec: str, *, supported: Collection[str], trust_remote_code: bool = False) -> Any:
    """The transformers config of `spec` (`AutoConfig`, local files only), of a model_type in `supported`.

    Raises:
        HFConfigError: unreadable, or a model type transformers does not know that needs remote code while
            `trust_remote_code` is False.
    """
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    path = resolve(spec)
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        _fail("model", f"hf:{spec}", f"{path} is not a readable JSON config: {exc}")
    if not isinstance(raw, dict):
        _fail(
            "model", f"hf:{spec}", f"{path} holds a JSON {type(raw).__name__}, not an object of config fields"
        )
    model_type = raw.get("model_type")
    if not model_type:
        _fail("model_type", None, f"{path} names no model_type; supported: {sorted(supported)}")
    remote = "AutoConfig" in raw.get("auto_map", {})
    if model_type not in CONFIG_MAPPING and remote and not trust_remote_code:
        _fail(
            "model_type",
            model_type,
            f"{path}: its config class is remote code (auto_map); pass model.trust_remote_code=true to run it "
            f"(supported without it: {sorted(supported)})",
        )
    if model_type not in CONFIG_MAPPING and not remote:
        _fail("model_type", model_type, f"unknown to transformers; supported: {sorted(supported)}")
    if model_type not in supported:
        _fail(
            "model_type",
            model_type,
            f"not supported; supported: {sorted(supported)} (and, where Megatron-Bridge imports, any model type its "
            "AutoBridge maps, for engine=bridge)",
        )
    _check_heads(raw)
    # A file path reads that file; remote code is found beside it, so a folder is passed for it.
    source = str(path.parent if trust_remote_code and remote else path)
    try:
        cfg = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code, local_files_only=True)
    except Exception as exc:
        raise HFConfigError(f"transformers cannot read {path}: {exc}") from exc
    cfg.muonbench_given = frozenset(raw)  # what the file states; `_need` refuses transformers' class defaults
    return cfg


def _check_heads(raw: dict[str, Any]) -> None:
    """The head counts, checked on the raw file so the error names the field (transformers' own check does not)."""
    hidden, heads = raw.get("hidden_size"), raw.get("num_attention_heads")
    for name, value in (("hidden_size", hidden), ("num_attention_heads", heads)):
        if not _is_int(value) or value < 1:
            _fail(name, value, "must be an integer >= 1")
    groups = raw.get("num_key_value_heads")
    if groups is not None and (not _is_int(groups) or groups < 1):
        _fail("num_key_value_heads", groups, "must be an integer >= 1 (or absent: one per attention head)")
    if not raw.get("head_dim") and "kv_lora_rank" not in raw and hidden % heads:
        _fail(
            "num_attention_heads",
            heads,
            f"must divide hidden_size={hidden} (no head_dim given, so the head dim is hidden / heads)",
        )
    groups = raw.get("num_key_value_heads") or heads
    if heads % groups:
        _fail("num_key_value_heads", groups, f"must divide num_attention_heads={heads}")


# --------------------------------------------------------------------------------------------------------------
# Mapping a transformers config to ModelConfig fields: one reader per family (muonbench.families)
# --------------------------------------------------------------------------------------------------------------
def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _get(cfg: Any, name: str, default: Any = None) -> Any:
    return getattr(cfg, name, default)


def _need(cfg: Any, name: str) -> Any:
    """A field the file must state: a value transformers' config class filled in is not this model's."""
    value = _get(cfg, name)
    given = _get(cfg, "muonbench_given")
    if value is None or (given is not None and name not in given):
        _fail(name, None, f"required for model_type {cfg.model_type!r}: the config.json does not state it")
    return value


def _number(name: str, value: Any) -> float:
    """`value` of field `name` as a float, refused naming the field when it is not a number."""
    if _is_int(value) or isinstance(value, float):
        return float(value)
    _fail(name, value, "must be a number")
    raise AssertionError  # unreachable: _fail raises


def _rope(cfg: Any) -> dict[str, Any]:
    """RoPE base and YaRN scaling (transformers >= 5 keeps them in rope_parameters, older in rope_theta)."""
    params = dict(_get(cfg, "rope_parameters") or _get(cfg, "rope_scaling") or {})
    theta = params.get("rope_theta", _get(cfg, "rope_theta", 10000.0))
    out: dict[str, Any] = {"rotary_base": _number("rope_theta", theta)}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "llama3":
        for name, fixed in (("low_freq_factor", 1.0), ("high_freq_factor", 4.0)):
            if float(params.get(name, fixed)) != fixed:
                _fail(f"rope_parameters.{name}", params[name], f"Llama 3.1's value is represented; allowed: [{fixed}]")
    if kind in ("yarn", "llama3"):
        out |= {
            "rope_scaling_factor": float(params["factor"]),
            "rope_original_max_position_embeddings": int(params["original_max_position_embeddings"]),
            "rope_scaling_type": kind,
        }
    elif kind not in ("default", None):
        _fail("rope_parameters.rope_type", kind, "allowed: ['default', 'llama3', 'yarn']")
    return out


ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
"""transformers' `hidden_act` -> `ModelConfig.activation` (the gate of a gated feed-forward)."""


def _window(cfg: Any) -> dict[str, Any]:
    """Sliding-window attention: the window and which layers slide (transformers' `layer_types` where it has them,
    else every layer), as `ModelConfig.sliding_window` / `window_attn_skip_freq`."""
    window = _get(cfg, "sliding_window")
    if not window or not _get(cfg, "use_sliding_window", True):
        return {"sliding_window": 0, "window_attn_skip_freq": 0}
    if _get(cfg, "max_window_layers") is not None:  # Qwen2's: full attention below max_window_layers
        _fail("use_sliding_window", True, "Qwen2's sliding window over the top layers only is not built; allowed: false")
    types = list(_get(cfg, "layer_types") or [])
    sliding = [t == "sliding_attention" for t in types] or [True] * cfg.num_hidden_layers
    if not any(sliding):
        return {"sliding_window": 0, "window_attn_skip_freq": 0}
    freq = 0 if all(sliding) else next(i + 1 for i, s in enumerate(sliding) if not s)
    if any(s != bool(freq == 0 or (i + 1) % freq) for i, s in enumerate(sliding)):
        _fail("layer_types", types, "only every layer sliding, or every N-th layer full, is represented")
    return {"sliding_window": int(window), "window_attn_skip_freq": freq}


def _common(cfg: Any) -> dict[str, Any]:
    act = _get(cfg, "hidden_activation") or _get(cfg, "hidden_act", "silu")
    if act not in ACTIVATIONS:
        _fail("hidden_act", act, f"the engines build gated feed-forward layers; allowed: {list(ACTIVATIONS)}")
    hidden, heads = _need(cfg, "hidden_size"), _need(cfg, "num_attention_heads")
    for name in ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size"):
        if not _is_int(_need(cfg, name)) or _get(cfg, name) < 1:
            _fail(name, _get(cfg, name), "must be an integer >= 1")
    out = {
        "family": cfg.model_type,
        "num_layers": cfg.num_hidden_layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "vocab_size": cfg.vocab_size,
        "seq_length": min(SEQ_LENGTH, _get(cfg, "max_position_embeddings") or SEQ_LENGTH),
        "gated_linear_unit": True,
        "activation": ACTIVATIONS[act],
        "norm_eps": _number("rms_norm_eps", _get(cfg, "rms_norm_eps", 1e-6)),
        "tie_embeddings": bool(_get(cfg, "tie_word_embeddings", False)),
        **_rope(cfg),
        **_window(cfg),
    }
    return out


def _gqa(cfg: Any, *, qk_layernorm: bool, qkv_bias: bool = False) -> dict[str, Any]:
    hidden, heads = cfg.hidden_size, cfg.num_attention_heads
    head_dim = _get(cfg, "head_dim")
    if not head_dim:
        if hidden % heads:
            _fail(
                "num_attention_heads",
                heads,
                f"must divide hidden_size={hidden} (no head_dim given, so the head dim is hidden / heads)",
            )
        head_dim = hidden // heads
    groups = _get(cfg, "num_key_value_heads") or heads
    if heads % groups:
        _fail("num_key_value_heads", groups, f"must divide num_attention_heads={heads}")
    if _get(cfg, "attention_bias") and not qkv_bias:
        _fail("attention_bias", True, f"{cfg.model_type}: linear biases are not built; allowed: false")
    if _get(cfg, "mlp_bias"):
        _fail("mlp_bias", True, "linear biases are not built; allowed: false")
    return {
        "attention": "gqa",
        "num_query_groups": groups,
        "kv_channels": head_dim,
        "qk_layernorm": qk_layernorm,
        "qkv_bias": qkv_bias,
    }


def _experts(cfg: Any, *, num: str, ffn: str) -> dict[str, Any]:
    experts, topk = _get(cfg, num) or 0, _get(cfg, "num_experts_per_tok") or 0
    if experts and not topk:
        _fail("num_experts_per_tok", _get(cfg, "num_experts_per_tok"), f"{num}={experts} needs top-k >= 1")
    if topk > experts:
        _fail("num_experts_per_tok", topk, f"must be <= {num}={experts}")
    return {
        "num_experts": experts,
        "moe_router_topk": topk,
        "moe_ffn_hidden_size": _need(cfg, ffn),
        "moe_aux_loss_coeff": float(_get(cfg, "router_aux_loss_coef", 0.0) or 0.0),
        "moe_router_pre_softmax": not _get(cfg, "norm_topk_prob", True),
    }


def llama(cfg: Any) -> dict[str, Any]:
    return {**_common(cfg), **_gqa(cfg, qk_layernorm=False), "ffn_hidden_size": _need(cfg, "intermediate_size")}


def qwen2(cfg: Any) -> dict[str, Any]:
    # transformers' Qwen2 attention always has q/k/v biases (and no output bias).
    return {
        **_common(cfg),
        **_gqa(cfg, qk_layernorm=False, qkv_bias=True),
        "ffn_hidden_size": _need(cfg, "intermediate_size"),
    }


def qwen3(cfg: Any) -> dict[str, Any]:
    return {**_common(cfg), **_gqa(cfg, qk_layernorm=True), "ffn_hidden_size": _need(cfg, "intermediate_size")}


def qwen3_moe(cfg: Any) -> dict[str, Any]:
    return {
        **_common(cfg),
        **_gqa(cfg, qk_layernorm=True),
        **_experts(cfg, num="num_experts", ffn="moe_intermediate_size"),
        "ffn_hidden_size": _need(cfg, "intermediate_size"),
        "num_dense_layers": _moe_layers(cfg, cfg.num_hidden_layers),
    }


def mixtral(cfg: Any) -> dict[str, Any]:
    return {
        **_common(cfg),
        **_gqa(cfg, qk_layernorm=False),
        **_experts(cfg, num="num_local_experts", ffn="intermediate_size"),
        "ffn_hidden_size": cfg.intermediate_size,
    }


def olmoe(cfg: Any) -> dict[str, Any]:
    if _get(cfg, "clip_qkv") is not None:
        _fail("clip_qkv", cfg.clip_qkv, "QKV clipping is not built; allowed: null")
    return {
        **_common(cfg),
        **_gqa(cfg, qk_layernorm=True),
        **_experts(cfg, num="num_experts", ffn="intermediate_size"),
        "ffn_hidden_size": cfg.intermediate_size,
    }


def deepseek_v3(cfg: Any) -> dict[str, Any]:
    score = _get(cfg, "scoring_func", "sigmoid" if cfg.model_type == "deepseek_v3" else "softmax")
    if score not in ("sigmoid", "softmax"):
        _fail("scoring_func", score, "allowed: ['sigmoid', 'softmax']")
    routed = _get(cfg, "n_routed_experts") or 0
    shared = _get(cfg, "n_shared_experts") or 0
    moe_ffn = _need(cfg, "moe_intermediate_size")
    dense = _get(cfg, "first_k_dense_replace") or 0
    freq = _get(cfg, "moe_layer_freq", 1)
    if freq != 1:
        _fail("moe_layer_freq", freq, "allowed: 1 (every layer after the leading dense ones is MoE)")
    experts = _experts(cfg, num="n_routed_experts", ffn="moe_intermediate_size")
    experts["moe_aux_loss_coeff"] = float(_get(cfg, "aux_loss_alpha", 1e-3) or 0.0)
    experts["moe_router_pre_softmax"] = False
    return {
        **_common(cfg),
        "family": "deepseek_v3",
        "attention": "mla",
        "q_lora_rank": _get(cfg, "q_lora_rank") or 0,
        "kv_lora_rank": _need(cfg, "kv_lora_rank"),
        "qk_head_dim": _need(cfg, "qk_nope_head_dim"),
        "qk_pos_emb_head_dim": _need(cfg, "qk_rope_head_dim"),
        "v_head_dim": _need(cfg, "v_head_dim"),
        "num_query_groups": 0,
        "kv_channels": 0,
        "qk_layernorm": True,  # MLA: the q and kv latent norms
        "ffn_hidden_size": _need(cfg, "intermediate_size"),
        "num_dense_layers": min(dense, cfg.num_hidden_layers) if routed else 0,
        **experts,
        "moe_shared_expert_intermediate_size": shared * moe_ffn if routed else 0,
        "moe_router_score_function": score,
        "moe_router_topk_scaling_factor": float(_get(cfg, "routed_scaling_factor", 1.0) or 1.0),
        "moe_router_enable_expert_bias": _get(cfg, "topk_method", "noaux_tc") == "noaux_tc",
        "make_vocab_size_divisible_by": 1280,  # Megatron-Bridge's MLA providers (DeepSeek-V3, Kimi K2)
    }


def _moe_layers(cfg: Any, n: int) -> int:
    """The leading dense layers of a Qwen-MoE config (mlp_only_layers), refused unless they lead."""
    dense = sorted(_get(cfg, "mlp_only_layers") or [])
    if dense != list(range(len(dense))):
        _fail("mlp_only_layers", dense, "only leading dense layers are built: [0, 1, ..., k-1]")
    step = _get(cfg, "decoder_sparse_step", 1)
    if step != 1:
        _fail("decoder_sparse_step", step, "allowed: 1 (every layer after the leading dense ones is MoE)")
    return min(len(dense), n)


def qwen2_moe(cfg: Any) -> dict[str, Any]:
    # Qwen2 attention (q/k/v biases); one shared expert behind a sigmoid gate (muonbench.families features)
    return {
        **_common(cfg),
        **_gqa(cfg, qk_layernorm=False, qkv_bias=True),
        **_experts(cfg, num="num_experts", ffn="moe_intermediate_size"),
        "ffn_hidden_size": _need(cfg, "intermediate_size"),
        "num_dense_layers": _moe_layers(cfg, cfg.num_hidden_layers),
        "moe_shared_expert_intermediate_size": _get(cfg, "shared_expert_intermediate_size") or 0,
    }


def gemma2(cfg: Any) -> dict[str, Any]:
    out = {**_common(cfg), **_gqa(cfg, qk_layernorm=False), "ffn_hidden_size": _need(cfg, "intermediate_size")}
    fixed = {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "query_pre_attn_scalar": out["kv_channels"]}
    for name, value in fixed.items():  # the family's soft-capping and query scale: written back as these values
        if _get(cfg, name) != value:
            _fail(name, _get(cfg, name), f"Gemma 2's value is represented (query scale = head_dim); allowed: [{value}]")
    return out


def phi3(cfg: Any) -> dict[str, Any]:
    if _get(cfg, "partial_rotary_factor", 1.0) != 1.0:
        _fail("partial_rotary_factor", cfg.partial_rotary_factor, "partial rotary embeddings are not built; allowed: 1.0")
    return llama(cfg)


def gpt_oss(cfg: Any) -> dict[str, Any]:
    # attention sinks, biases on every linear layer and the clamped SwiGLU experts: muonbench.families features
    return {
        **_common(cfg),
        **_gqa(cfg, qk_layernorm=False, qkv_bias=True),
        **_experts(cfg, num="num_local_experts", ffn="intermediate_size"),
        "ffn_hidden_size": cfg.intermediate_size,
    }


def deepseek_v2(cfg: Any) -> dict[str, Any]:
    """DeepSeek-V2 (Lite): the DeepSeek-V3 layout with softmax routing, no expert bias, weights not renormalised
    where norm_topk_prob is false."""
    out = deepseek_v3(cfg)
    out |= {
        "family": "deepseek_v2",
        "make_vocab_size_divisible_by": 3200,  # Megatron-Bridge's DeepSeek-V2 provider
        "moe_router_enable_expert_bias": False,
        "moe_router_pre_softmax": not _get(cfg, "norm_topk_prob", False),
    }
    return out


def model_name(spec: str) -> str:
    """A config name from the spec: `meta-llama/Meta-Llama-3-8B` -> `meta_llama_3_8b`; a path: its folder."""
    path = Path(spec)
    stem = (
        path.parent.name if path.name == "config.json" else path.stem if path.suffix == ".json" else path.name
    )
    if _HUB_ID.match(spec) and not path.exists():
        stem = spec.split("/", 1)[1]
    return re.sub(r"[^0-9a-z]+", "_", (stem or "hf_model").lower()).strip("_") or "hf_model"
