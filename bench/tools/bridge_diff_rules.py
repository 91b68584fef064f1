"""What the settings `bench.tools.bridge_diff` compares do: which are shapes, and whether a differing one can change the step
time on the compared run's layout (`perf`) or cannot (`inert`, with the reason).

A rule is (kind, note) or a function of the run's config returning one, for rules that hold on some layouts only
(at DP = 1, in bf16, ...). A differing field without a rule is `unclassified`; the unit test on the live slice
configs fails on one, so a new Bridge or Megatron-Core default is looked at before it is trusted.
"""

from __future__ import annotations

from collections.abc import Callable

from muonbench.schema import RootConfig

Rule = tuple[str, str] | Callable[[RootConfig], tuple[str, str]]

SHAPE_FIELDS = frozenset(
    {
        "layers.implementation",
        *(
            f"model.{name}"
            for name in (
                "num_layers",
                "hidden_size",
                "ffn_hidden_size",
                "num_attention_heads",
                "num_query_groups",
                "kv_channels",
                "q_lora_rank",
                "kv_lora_rank",
                "qk_head_dim",
                "qk_pos_emb_head_dim",
                "v_head_dim",
                "num_moe_experts",
                "moe_ffn_hidden_size",
                "moe_router_topk",
                "moe_layer_freq",
                "moe_shared_expert_intermediate_size",
                "gated_linear_unit",
                "activation_func",
                "add_bias_linear",
                "add_qkv_bias",
                "qk_layernorm",
                "normalization",
                "tensor_model_parallel_size",
                "pipeline_model_parallel_size",
                "context_parallel_size",
                "expert_model_parallel_size",
                "expert_tensor_parallel_size",
                "bf16",
                "params_dtype",
            )
        ),
        "gpt_model.vocab_size",
        "gpt_model.max_sequence_length",
        "gpt_model.share_embeddings_and_output_weights",
        "gpt_model.position_embedding_type",
        "gpt_model.rotary_base",
        "train.micro_batch_size",
        "train.global_batch_size",
        "flops.model_flops_per_step",
    }
)
"""Always reported, equal or not: what makes the two runs the same model and workload."""

WATCHED = frozenset(
    {
        *(
            f"model.{name}"
            for name in (
                "gradient_accumulation_fusion",
                "bias_activation_fusion",
                "bias_dropout_fusion",
                "cross_entropy_loss_fusion",
                "moe_grouped_gemm",
                "moe_token_dispatcher_type",
                "moe_router_load_balancing_type",
                "moe_router_force_load_balancing",
                "moe_aux_loss_coeff",
                "recompute_granularity",
                "cpu_offloading",
                "fp8",
            )
        ),
        "ddp.use_distributed_optimizer",
        "optimizer.use_distributed_optimizer",
        "optimizer.optimizer",
        "train.empty_unused_memory_level",
        "data.attention_mask_to_gpu",
    }
)
"""Settings that can change the step time, reported also when both sides agree (kind `same`)."""

PERF = "perf"
INERT = "inert"


def _rule(kind: str, note: str) -> Rule:
    return kind, note


def _when(condition: Callable[[RootConfig], bool], inert: str, perf: str) -> Rule:
    """`inert` with its reason where `condition(root)` holds, else `perf`."""
    return lambda root: (INERT, inert) if condition(root) else (PERF, perf)


def _dp1(root: RootConfig) -> bool:
    return root.parallelism.dp == 1


def _bf16(root: RootConfig) -> bool:
    return root.precision.name == "bf16"


def _one_gpu(root: RootConfig) -> bool:
    return root.parallelism.world_size == 1


_FP8 = _when(_bf16, "an FP8 setting; precision is bf16 (fp8=None)", "FP8 recipe setting")
_NCCL = _when(_one_gpu, "an NCCL setting; one GPU moves nothing between GPUs", "NCCL setting")
_UPDATE_VALUE = (INERT, "a value of the update, not of its cost")
_PARAM_GATHER = _rule(
    PERF,
    "when the distributed optimizer's parameter all-gather runs: in the next forward's pre-hooks (True) or at the "
    "end of optimizer.step (False); at DP = 1 a one-rank copy of the bf16 parameters either way",
)

RULES: dict[str, Rule] = {
    "model.moe_permute_fusion": _rule(
        PERF,
        "TE's fused token permute / unpermute in the MoE dispatcher; off: an argsort over experts x tokens, "
        "index_select and a scatter-add of the top-k copies of every token, forward and backward, per MoE layer "
        "and micro-batch",
    ),
    "model.moe_router_fusion": _rule(
        PERF,
        "TE's fused top-k + score function and aux-loss scores of the router; off: a dozen small kernels per MoE "
        "layer and micro-batch",
    ),
    "model.moe_router_dtype": _rule(
        PERF,
        "router logits, score function and aux loss in fp32 / fp64 or in the activations' bf16 (None)",
    ),
    "model.apply_rope_fusion": _rule(
        PERF,
        "TE's fused rotary embedding of query and key; off: separate multiply, rotate-half, concatenate and add "
        "kernels over q and k, forward and backward",
    ),
    "model.cross_entropy_fusion_impl": _rule(
        PERF,
        "both fuse the vocabulary cross entropy: TE's kernel (te) or Megatron-Core's (native), over "
        "seq x mbs x vocab logits per micro-batch",
    ),
    "model.cuda_graph_impl": _rule(
        PERF,
        "TE CUDA graphs, captured by Bridge's training loop after cuda_graph_warmup_steps; the megatron engine "
        "captures none",
    ),
    "model.cuda_graph_scope": _rule(
        PERF,
        "what is graphed: each MoE layer's router and dispatch preprocessing, one launch instead of their kernels",
    ),
    "model.use_te_rng_tracker": (
        INERT,
        "TE's RNG tracker, required by CUDA graphs; these models have no dropout",
    ),
    "model.deallocate_pipeline_outputs": _when(
        lambda root: root.parallelism.pp == 1,
        "frees pipeline-stage outputs between stages; at PP = 1 it only picks the autograd entry point of the "
        "backward (custom_backward or torch.autograd.backward)",
        "frees each pipeline stage's output after sending it",
    ),
    "model.attention_backend": _rule(
        INERT,
        "None sets no NVTE_*_ATTN variable, auto sets all three to 1: both leave TE its choice of attention kernel",
    ),
    "model.attention_softmax_in_fp32": _rule(
        INERT,
        "read by Megatron-Core's local DotProductAttention only, which neither side runs (TE attention; the "
        "engine's local layers use SDPA)",
    ),
    "model.masked_softmax_fusion": _rule(
        INERT,
        "read by Megatron-Core's local DotProductAttention only, which neither side runs (TE attention; the "
        "engine's local layers use SDPA)",
    ),
    "model.fp8_recipe": _FP8,
    "model.num_layers_at_start_in_bf16": _FP8,
    "model.num_layers_at_end_in_bf16": _FP8,
    "model.moe_hybridep_num_sms": _when(
        lambda root: root.parallelism.ep == 1,
        "HybridEP (flex dispatcher) only; at EP = 1 both run the alltoall dispatcher",
        "SMs of the HybridEP dispatcher",
    ),
    "model.offload_modules": (INERT, "None and [] both mean no activation offloading"),
    "model.moe_grouped_gemm": _rule(
        PERF,
        "TE's grouped-GEMM experts (True) or the local spec's experts (False; the engine's local layers run them "
        "as torch grouped_mm, GroupedMMExperts)",
    ),
    "model.gradient_accumulation_fusion": _rule(
        PERF,
        "weight gradients accumulated into main_grad inside the GEMM (off: a separate add per micro-batch)",
    ),
    "train.manual_gc": _rule(
        PERF,
        "where Python's garbage collector runs; the engine's young-generation collection is inside its timed step",
    ),
    "train.empty_unused_memory_level": (PERF, "torch.cuda.empty_cache() calls inside the step"),
    "ddp.grad_reduce_in_fp32": _rule(
        PERF,
        "dtype of the main-grad buffer; with gradient-accumulation fusion off (both sides), every micro-batch's "
        "weight gradients are added into it, so fp32 doubles the buffer and that traffic",
    ),
    "ddp.overlap_grad_reduce": _rule(
        PERF,
        "gradient reduce-scatter per bucket during the last micro-batch's backward (True) or after it; at DP = 1 "
        "a one-rank collective either way",
    ),
    "ddp.overlap_param_gather": _PARAM_GATHER,
    "optimizer.overlap_param_gather": _PARAM_GATHER,
    "ddp.average_in_collective": _when(
        _dp1,
        "where the gradient is divided by DP; at DP = 1 there is nothing to divide",
        "gradient averaging inside the collective or before it",
    ),
    "ddp.data_parallel_sharding_strategy": (
        INERT,
        "Megatron-FSDP only (use_megatron_fsdp is off on both sides)",
    ),
    "optimizer.optimizer": (PERF, "the name Megatron-Core's optimizer factory dispatches on"),
    "optimizer.use_layer_wise_distributed_optimizer": _rule(
        PERF,
        "Megatron's Muon under LayerWiseDistributedOptimizer (each rank steps the matrices it owns) or not; at "
        "DP = 1 one rank owns them all",
    ),
    "optimizer.fp8_recipe": _FP8,
    "optimizer.lr": _UPDATE_VALUE,
    "optimizer.min_lr": _UPDATE_VALUE,
    "optimizer.weight_decay": _UPDATE_VALUE,
    "optimizer.adam_beta1": _UPDATE_VALUE,
    "optimizer.adam_beta2": _UPDATE_VALUE,
    "optimizer.adam_eps": _UPDATE_VALUE,
    "data.loader": _rule(
        PERF,
        "Bridge's step takes each micro-batch from its DataLoader's workers and copies it to the GPU; the engine's "
        "mock batches are made on the GPU",
    ),
    "data.create_attention_mask": _rule(
        INERT,
        "the mask is built by the DataLoader workers on the CPU and not copied to the GPU "
        "(data.attention_mask_to_gpu); TE's causal attention needs none",
    ),
    "data.attention_mask_to_gpu": (
        PERF,
        "a seq x seq mask per sequence copied to the GPU with every micro-batch",
    ),
    "env.PYTORCH_CUDA_ALLOC_CONF": _rule(
        PERF,
        "caching-allocator options (expandable segments: less fragmentation near full memory). Bridge sets its "
        "recipe's variables with os.environ.setdefault at the start of pretrain, after the bench worker has "
        "initialised CUDA; whether its allocator read this one is not established",
    ),
    "env.NCCL_GRAPH_REGISTER": _NCCL,
    "env.NCCL_NVLS_ENABLE": _NCCL,
    "env.TORCH_NCCL_AVOID_RECORD_STREAMS": _NCCL,
    "env.TORCH_NCCL_HIGH_PRIORITY": _NCCL,
}


def classify(field: str, root: RootConfig) -> tuple[str, str]:
    """(kind, note) of a differing `field` on the run configured by `root` (kind: perf | inert | unclassified)."""
    rule = RULES.get(field)
    if rule is None:
        return "unclassified", "no rule in bench/tools/bridge_diff_rules.py"
    return rule(root) if callable(rule) else rule
