"""Megatron-core GPT model (dense or MoE) from our `ModelConfig`: transformer config, layer specs, model.

- GQA (Llama, Mistral, Qwen2/3, Qwen3-MoE, Mixtral, OLMoE) -> `TransformerConfig`; MLA (Kimi K2 / DeepSeek-V3) ->
  `MLATransformerConfig`.
- Dense first layers -> `moe_layer_freq` list ([0] * num_dense_layers + [1] * rest); no experts: every layer dense.
- Routed + shared experts, SwiGLU, RMSNorm, optional qk-norm, q/k/v biases only where the model has them (Qwen2),
  tied or untied embeddings, RoPE.
- Transformer Engine specs when TE imports, else the local specs with `SDPACoreAttention` in place of Megatron's
  materialising `DotProductAttention` (see megatron_attention.py).

torch and megatron are imported inside the functions: importing this module costs nothing on a login node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.flops import padded_vocab_size
from muonbench.engines import MegatronEngineConfig
from muonbench.families import features
from muonbench.schema import ModelConfig, ParallelismConfig, RootConfig


def te_available() -> bool:
    """True when Transformer Engine's PyTorch extension imports (then the TE layer specs are used)."""
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception:  # noqa: BLE001 - ImportError, or a broken TE build raising at import
        return False
    return True


LAYER_IMPLS = ("auto", "te", "local")


def use_te(layers: str) -> bool:
    """Whether `engine.layers` builds Transformer Engine layers.

    Raises:
        ValueError: an unknown value, or `te` where Transformer Engine does not import.
    """
    if layers not in LAYER_IMPLS:
        raise ValueError(f"engine.layers={layers!r}: allowed {list(LAYER_IMPLS)}")
    if layers == "te" and not te_available():
        raise ValueError("engine.layers='te': Transformer Engine does not import here; use auto or local")
    return layers == "te" or (layers == "auto" and te_available())


@dataclass(frozen=True, kw_only=True, slots=True)
class BuildOptions:
    """How the Megatron model is built (not what it is: that is ModelConfig)."""

    use_te: bool = False
    """Transformer Engine layer specs (TE attention, fused norms + linears, grouped GEMM experts)."""
    sdpa_attention: bool = True
    """Without TE: replace the local core attention by SDPACoreAttention (flash kernels)."""
    grouped_mm_experts: bool = True
    """Without TE: replace SequentialMLP experts by GroupedMMExperts (torch grouped GEMM)."""
    dispatcher: str = "alltoall"
    """MoE token dispatcher: alltoall (GPU) | allgather (works on CPU, used by the unit tests)."""
    cpu_init: bool = False
    """Initialise parameters on the CPU (unit tests); GPU runs initialise on the device."""
    bf16: bool = True
    router_dtype: str | None = "fp32"
    """Router logits, softmax/sigmoid and aux-loss precision: fp32 | fp64 | None (the activations' dtype)
    (`engine.moe_router_dtype`, none -> None)."""
    force_balanced_router: bool = True
    """Forced-balanced routing as in the published perf runs (moe_router_force_load_balancing)."""
    moe_permute_fusion: bool = False
    """Transformer Engine's fused token permute / unpermute in the MoE dispatcher (`engine.moe_permute_fusion`)."""
    apply_rope_fusion: bool = False
    """Transformer Engine's fused rotary embedding on query and key (`engine.apply_rope_fusion`)."""
    moe_router_fusion: bool = False
    """Transformer Engine's fused router top-k + score function and aux-loss scores (`engine.moe_router_fusion`)."""

    def __post_init__(self) -> None:
        if self.dispatcher not in ("alltoall", "allgather"):
            raise ValueError(f"dispatcher={self.dispatcher!r} is not one of ('alltoall', 'allgather')")


FUSION_OPTIONS = ("moe_permute_fusion", "apply_rope_fusion", "moe_router_fusion")
"""`engine.*` options that turn on a Transformer Engine kernel of the same-named TransformerConfig field."""


def check_fusions(engine: MegatronEngineConfig) -> None:
    """Raise a ValueError naming the option when one of `FUSION_OPTIONS` is on and Transformer Engine (whose kernel
    it runs, with TE or local layers alike) does not import here."""
    for name in FUSION_OPTIONS:
        if getattr(engine, name) and not te_available():
            raise ValueError(
                f"engine.{name}=True: runs a Transformer Engine kernel, and Transformer Engine does not import "
                "here; allowed without it: False"
            )


def build_options(cfg: RootConfig, *, use_te: bool, grouped_mm_experts: bool = True) -> BuildOptions:
    """The engine's `BuildOptions` for `cfg`; the layer implementation (`use_te`) is resolved by the caller."""
    return BuildOptions(
        use_te=use_te,
        bf16=cfg.precision.params_dtype == "bf16",
        grouped_mm_experts=grouped_mm_experts,
        router_dtype=None if cfg.engine.moe_router_dtype == "none" else cfg.engine.moe_router_dtype,
        **{name: getattr(cfg.engine, name) for name in FUSION_OPTIONS},
    )


def moe_layer_pattern(model: ModelConfig) -> list[int]:
    """Megatron's moe_layer_freq list: 0 = dense layer, 1 = MoE layer (dense first, as Kimi K2's first layer)."""
    if model.num_experts == 0:
        return [0] * model.num_layers
    return [0] * model.num_dense_layers + [1] * (model.num_layers - model.num_dense_layers)


def transformer_config(model: ModelConfig, par: ParallelismConfig, opts: BuildOptions) -> Any:
    """Megatron `TransformerConfig` (GQA) or `MLATransformerConfig` (MLA) for `model` under layout `par`."""
    cls, kw = transformer_config_kwargs(model, par, opts)
    return cls(**kw)


def transformer_config_kwargs(
    model: ModelConfig, par: ParallelismConfig, opts: BuildOptions
) -> tuple[type, dict[str, Any]]:
    """The config class and the keyword arguments `transformer_config` builds it from (every field not named keeps
    Megatron-Core's default). Builds nothing: `bench.tools.bridge_diff` reads the fields on a machine without CUDA or TE."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    dtype = torch.bfloat16 if opts.bf16 else torch.float32
    kw: dict[str, Any] = {
        "num_layers": model.num_layers,
        "hidden_size": model.hidden_size,
        "num_attention_heads": model.num_attention_heads,
        "ffn_hidden_size": model.ffn_hidden_size or 4 * model.hidden_size,
        "gated_linear_unit": model.gated_linear_unit,
        "activation_func": F.silu if model.gated_linear_unit else F.gelu,
        "bias_activation_fusion": model.gated_linear_unit,
        "normalization": "RMSNorm",
        "layernorm_epsilon": model.norm_eps,
        "qk_layernorm": model.qk_layernorm,
        "add_bias_linear": False,
        "add_qkv_bias": model.qkv_bias,
        "attention_dropout": 0.0,
        "hidden_dropout": 0.0,
        "tensor_model_parallel_size": par.tp,
        "pipeline_model_parallel_size": par.pp,
        "context_parallel_size": par.cp,
        "expert_model_parallel_size": par.ep,
        "expert_tensor_parallel_size": par.etp,
        "sequence_parallel": par.sequence_parallel and par.tp > 1,
        "bf16": opts.bf16,
        "params_dtype": dtype,
        "pipeline_dtype": dtype,
        "use_cpu_initialization": opts.cpu_init,
        "cross_entropy_loss_fusion": True,
        "cross_entropy_fusion_impl": "native",
        "apply_rope_fusion": opts.apply_rope_fusion,
    }
    if par.pp > 1 and par.vp > 1:
        kw["virtual_pipeline_model_parallel_size"] = par.vp
    if model.num_experts:
        kw.update(
            num_moe_experts=model.num_experts,
            moe_ffn_hidden_size=model.moe_ffn_hidden_size,
            moe_router_topk=model.moe_router_topk,
            moe_layer_freq=moe_layer_pattern(model),
            moe_token_dispatcher_type=opts.dispatcher,
            moe_router_load_balancing_type="aux_loss",
            moe_aux_loss_coeff=model.moe_aux_loss_coeff,
            moe_router_dtype=opts.router_dtype,
            moe_router_force_load_balancing=opts.force_balanced_router,
            moe_grouped_gemm=opts.use_te,
            moe_permute_fusion=opts.moe_permute_fusion,
            moe_router_fusion=opts.moe_router_fusion,
        )
        if model.moe_shared_expert_intermediate_size:
            kw["moe_shared_expert_intermediate_size"] = model.moe_shared_expert_intermediate_size
            kw["moe_shared_expert_gate"] = "shared-expert gate" in features(model)  # Qwen2-MoE
        kw.update(
            moe_router_score_function=model.moe_router_score_function,
            moe_router_enable_expert_bias=model.moe_router_enable_expert_bias,
            moe_router_pre_softmax=model.moe_router_pre_softmax,
        )
        if model.moe_router_topk_scaling_factor != 1.0:
            kw["moe_router_topk_scaling_factor"] = model.moe_router_topk_scaling_factor
    if model.attention == "mla":
        return MLATransformerConfig, {
            **kw,
            "q_lora_rank": model.q_lora_rank or None,
            "kv_lora_rank": model.kv_lora_rank,
            "qk_head_dim": model.qk_head_dim,
            "qk_pos_emb_head_dim": model.qk_pos_emb_head_dim,
            "v_head_dim": model.v_head_dim,
            "rope_type": "rope",
            "rotary_base": model.rotary_base,
        }
    return TransformerConfig, {
        **kw,
        "num_query_groups": model.num_query_groups,
        "kv_channels": model.kv_channels,
    }


def decoder_block_spec(config: Any, opts: BuildOptions) -> Any:
    """Megatron decoder block spec; without TE the core attention of every layer becomes SDPACoreAttention."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=opts.use_te, normalization="RMSNorm")
    if not opts.use_te and opts.sdpa_attention:
        from bench.engines.megatron_attention import SDPACoreAttention

        for layer_spec in spec.layer_specs:
            layer_spec.submodules.self_attention.submodules.core_attention = SDPACoreAttention
    if not opts.use_te and opts.grouped_mm_experts:
        from bench.engines.megatron_experts import use_grouped_mm_experts

        use_grouped_mm_experts(spec)
    return spec


def build_gpt_model(
    model: ModelConfig, config: Any, spec: Any, *, pre_process: bool, post_process: bool
) -> Any:
    """A Megatron `GPTModel` (untied embeddings, RoPE) for one pipeline stage."""
    from megatron.core.models.gpt import GPTModel

    return GPTModel(
        config=config,
        transformer_layer_spec=spec,
        pre_process=pre_process,
        post_process=post_process,
        **gpt_model_kwargs(model, tp=config.tensor_model_parallel_size),
    )


def gpt_model_kwargs(model: ModelConfig, *, tp: int) -> dict[str, Any]:
    """The `GPTModel` arguments that fix shapes and embeddings (the rest of `build_gpt_model`'s call)."""
    # Llama 3.1's frequency scaling (Megatron's fixed 8192-token context, checked by muonbench.engines)
    llama3 = "llama3 RoPE scaling" in features(model)
    scaling = {"rope_scaling": True, "rope_scaling_factor": model.rope_scaling_factor} if llama3 else {}
    return {
        "vocab_size": padded_vocab_size(model.vocab_size, model.make_vocab_size_divisible_by, tp),
        "max_sequence_length": model.seq_length,
        "share_embeddings_and_output_weights": model.tie_embeddings,
        "position_embedding_type": "rope",  # MLA layers carry their own rotary embedding; GPTModel skips it
        "rotary_base": int(model.rotary_base),
        **scaling,
    }
