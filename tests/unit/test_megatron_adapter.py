"""optim/megatron.py routing and bench/engines/megatron_*.py construction on real (tiny) Megatron GPT models on CPU.

Megatron models only run on CUDA, but with `use_cpu_initialization` and the allgather dispatcher a GQA GPTModel
builds on the CPU (MLA needs `torch.cuda.current_device` patched: its rotary embedding asks for a device), so the
routing is tested on the real parameter names and attributes Megatron produces.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

pytest.importorskip("megatron.core")

from bench.engines import megatron_data as md
from bench.engines import megatron_model as mm
from muonbench.schema import ModelConfig, ParallelismConfig
from optim import megatron as om
from optim.configs import AdamWConfig, MuonConfig, RoutingConfig


def _gqa_model() -> ModelConfig:
    return ModelConfig(
        name="tiny_gqa",
        family="qwen3_moe",
        num_layers=2,
        hidden_size=64,
        num_attention_heads=8,
        attention="gqa",
        num_query_groups=2,
        kv_channels=16,
        ffn_hidden_size=128,
        num_dense_layers=1,
        num_experts=4,
        moe_router_topk=2,
        moe_ffn_hidden_size=32,
        moe_shared_expert_intermediate_size=32,
        vocab_size=250,
        seq_length=32,
    )


def _mla_model() -> ModelConfig:
    return ModelConfig(
        name="tiny_mla",
        family="deepseek_v3",
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        attention="mla",
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_head_dim=16,
        qk_pos_emb_head_dim=8,
        v_head_dim=16,
        ffn_hidden_size=128,
        num_dense_layers=1,
        num_experts=4,
        moe_router_topk=2,
        moe_ffn_hidden_size=32,
        moe_shared_expert_intermediate_size=32,
        vocab_size=256,
        seq_length=32,
        moe_router_score_function="sigmoid",
        moe_router_enable_expert_bias=True,
    )


PAR = ParallelismConfig(name="one", world_size=1)
CPU_OPTS = mm.BuildOptions(
    use_te=False, dispatcher="allgather", cpu_init=True, router_dtype=None, grouped_mm_experts=False
)


@pytest.fixture(scope="module")
def megatron_groups(tmp_path_factory):
    """A one-process gloo group and Megatron's parallel state (TP=PP=EP=1); rendezvous through a file, so no TCP
    port is needed (a fixed one fails whenever another process on the machine holds it)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    started = False
    if not dist.is_initialized():
        store = dist.FileStore(str(tmp_path_factory.mktemp("gloo") / "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        started = True
    ps.initialize_model_parallel(1, 1)
    yield
    ps.destroy_model_parallel()
    if started:
        dist.destroy_process_group()


def _build(model: ModelConfig, monkeypatch: pytest.MonkeyPatch | None = None):
    if model.attention == "mla" and monkeypatch is not None:
        monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    config = mm.transformer_config(model, PAR, CPU_OPTS)
    spec = mm.decoder_block_spec(config, CPU_OPTS)
    return mm.build_gpt_model(model, config, spec, pre_process=True, post_process=True), config


def test_spec_uses_sdpa_core_attention_without_te(megatron_groups):
    """Localises a slow baseline: every layer of a TE-free spec must carry SDPACoreAttention, not DotProductAttention."""
    from bench.engines.megatron_attention import SDPACoreAttention

    config = mm.transformer_config(_gqa_model(), PAR, CPU_OPTS)
    spec = mm.decoder_block_spec(config, CPU_OPTS)
    assert len(spec.layer_specs) == 2
    for layer in spec.layer_specs:
        assert layer.submodules.self_attention.submodules.core_attention is SDPACoreAttention
    assert config.moe_layer_freq == [0, 1]
    assert config.num_moe_experts == 4 and config.moe_shared_expert_intermediate_size == 32


def test_transformer_config_mla_and_router(megatron_groups):
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    config = mm.transformer_config(_mla_model(), PAR, CPU_OPTS)
    assert isinstance(config, MLATransformerConfig)
    assert (config.q_lora_rank, config.kv_lora_rank, config.qk_pos_emb_head_dim) == (32, 16, 8)
    assert config.moe_router_score_function == "sigmoid" and config.moe_router_enable_expert_bias
    assert mm.gpt_model_kwargs(_gqa_model(), tp=1)["vocab_size"] == 256
    assert mm.moe_layer_pattern(dataclasses.replace(_gqa_model(), num_dense_layers=0)) == [1, 1]


def test_fusion_options_reach_the_transformer_config() -> None:
    """engine.moe_permute_fusion / apply_rope_fusion / moe_router_fusion / moe_router_dtype set the same-named
    TransformerConfig fields (the way Megatron-Bridge's Qwen3 recipe does, `none` as Megatron-Core's None);
    defaults keep the engine's earlier configuration (fusions off, fp32 router)."""
    import muonbench

    base = ["experiment=h200/qwen3_30b_a3b_slice_flops_adamw_1gpu", "engine.layers=te"]
    flips = [
        "engine.moe_permute_fusion=true",
        "engine.apply_rope_fusion=true",
        "engine.moe_router_fusion=true",
        "engine.moe_router_dtype=none",
    ]
    root = muonbench.load(base)
    default = mm.build_options(root, use_te=True)
    flipped = mm.build_options(muonbench.load([*base, *flips]), use_te=True)
    _, kw_default = mm.transformer_config_kwargs(root.model, root.parallelism, default)
    _, kw_flipped = mm.transformer_config_kwargs(root.model, root.parallelism, flipped)
    names = ("moe_permute_fusion", "apply_rope_fusion", "moe_router_fusion", "moe_router_dtype")
    assert [kw_default[k] for k in names] == [False, False, False, "fp32"]
    assert [kw_flipped[k] for k in names] == [True, True, True, None]
    assert {k for k in kw_flipped if kw_flipped[k] != kw_default[k]} == set(names)
    assert default.use_te and default.bf16 and kw_default["moe_grouped_gemm"]
    fp64 = mm.build_options(muonbench.load([*base, "engine.moe_router_dtype=fp64"]), use_te=True)
    assert mm.transformer_config_kwargs(root.model, root.parallelism, fp64)[1]["moe_router_dtype"] == "fp64"


def test_grad_reduce_in_fp32_reaches_the_ddp_config() -> None:
    """engine.grad_reduce_in_fp32=false gives Megatron's DDP a main-grad buffer in the parameters' dtype (as
    Megatron-Bridge's bf16 preset); the default keeps the fp32 buffer, for every optimizer kind."""
    import muonbench
    from bench.engines.megatron import ddp_config

    for opt in ("adamw", "muon", "muon_megatron"):
        base = ["experiment=h200/qwen3_30b_a3b_slice_flops_adamw_1gpu", f"optimizer={opt}"]
        flipped = muonbench.load([*base, "engine.grad_reduce_in_fp32=false"])
        assert ddp_config(muonbench.load(base)).grad_reduce_in_fp32 is True
        assert ddp_config(flipped).grad_reduce_in_fp32 is False


def test_transformer_config_is_built_from_its_kwargs(megatron_groups) -> None:
    """`transformer_config` builds exactly what `transformer_config_kwargs` (read by bench.tools.bridge_diff) declares."""
    cls, kw = mm.transformer_config_kwargs(_gqa_model(), PAR, CPU_OPTS)
    config = mm.transformer_config(_gqa_model(), PAR, CPU_OPTS)
    assert type(config) is cls
    assert {k: getattr(config, k) for k in kw if k != "activation_func"} == {
        k: v for k, v in kw.items() if k != "activation_func"
    }


def test_fusion_options_need_transformer_engine() -> None:
    """A fusion option on a machine without TE fails at setup naming the option, not deep in Megatron-Core."""
    if mm.te_available():
        pytest.skip("Transformer Engine imports here")
    from muonbench.engines import MegatronEngineConfig as EngineConfig

    mm.check_fusions(EngineConfig(name="megatron"))
    with pytest.raises(ValueError, match=r"engine.moe_permute_fusion=True: .*allowed without it: False"):
        mm.check_fusions(EngineConfig(name="megatron", moe_permute_fusion=True))
    with pytest.raises(ValueError, match=r"engine.apply_rope_fusion=True"):
        mm.check_fusions(EngineConfig(name="megatron", apply_rope_fusion=True))
    with pytest.raises(ValueError, match=r"engine.moe_router_fusion=True"):
        mm.check_fusions(EngineConfig(name="megatron", moe_router_fusion=True))
    mm.check_fusions(EngineConfig(name="megatron", moe_router_dtype="none", grad_reduce_in_fp32=False))


@pytest.mark.parametrize("tied", [True, False])
def test_tied_embeddings_share_one_megatron_matrix(megatron_groups, tied: bool) -> None:
    """`model.tie_embeddings` (a Hugging Face `tie_word_embeddings`) builds Megatron's shared embedding and output
    weight: no output_layer.weight of its own when tied, one when untied."""
    gpt, _ = _build(dataclasses.replace(_gqa_model(), tie_embeddings=tied))
    names = {n for n, _ in gpt.named_parameters()}
    assert gpt.share_embeddings_and_output_weights is tied
    assert "embedding.word_embeddings.weight" in names
    assert ("output_layer.weight" in names) is not tied
    routes = {r.name: r for _, r in om.classify([gpt], RoutingConfig())}
    assert routes["embedding.word_embeddings.weight"].optimizer == "adamw"


def test_gqa_routing_on_real_megatron_model(megatron_groups):
    """Routes of every parameter of a real Megatron GQA MoE model (dense first layer, routed + shared experts)."""
    gpt, _config = _build(_gqa_model())
    routes = {r.name: r for _, r in om.classify([gpt], RoutingConfig())}
    emb = routes["embedding.word_embeddings.weight"]
    out = routes["output_layer.weight"]
    assert (emb.role, emb.optimizer, out.role, out.optimizer) == ("embedding", "adamw", "output", "adamw")
    qkv = routes["decoder.layers.0.self_attention.linear_qkv.weight"]
    assert qkv.role == "qkv" and qkv.optimizer == "matrix" and qkv.partition_dim == 0
    # 8 heads in 2 groups of head dim 16: per group q = 4 * 16 = 64, k = v = 16 rows.
    assert qkv.split is not None and (qkv.split.num_groups, qkv.split.sizes) == (2, (64, 16, 16))
    assert routes["decoder.layers.0.self_attention.linear_proj.weight"].partition_dim == 1
    assert routes["decoder.layers.0.mlp.linear_fc1.weight"].role == "dense_fc1"
    e1 = routes["decoder.layers.1.mlp.experts.local_experts.3.linear_fc1.weight"]
    assert e1.role == "expert_fc1" and e1.is_expert and e1.optimizer == "matrix" and e1.split is None
    assert not e1.expert_parallel  # EP = 1: Megatron keeps allreduce=True on experts
    sh = routes["decoder.layers.1.mlp.shared_experts.linear_fc2.weight"]
    assert sh.role == "shared_fc2" and not sh.is_expert
    router = routes["decoder.layers.1.mlp.router.weight"]
    assert router.role == "router" and router.optimizer == "matrix"
    norm = routes["decoder.layers.0.self_attention.q_layernorm.weight"]
    assert norm.optimizer == "adamw" and not norm.weight_decay
    counts = {}
    for r in routes.values():
        counts[r.optimizer] = counts.get(r.optimizer, 0) + 1
    # matrices: 2 x (qkv, proj) + dense fc1/fc2 + router + 4 experts x 2 + shared x 2
    assert counts["matrix"] == 4 + 2 + 1 + 8 + 2
    assert len(routes) == sum(1 for _ in gpt.parameters())


def test_routing_options_router_and_gate_up(megatron_groups):
    gpt, _ = _build(_gqa_model())
    routing = RoutingConfig(router_to_matrix=False, split_gate_up=True, split_qkv=False)
    routes = {r.name: r for _, r in om.classify([gpt], routing)}
    assert routes["decoder.layers.1.mlp.router.weight"].optimizer == "adamw"
    fc1 = routes["decoder.layers.1.mlp.experts.local_experts.0.linear_fc1.weight"]
    assert fc1.split is not None and fc1.split.sizes == (32, 32) and fc1.split.labels == ("gate", "up")
    assert routes["decoder.layers.0.self_attention.linear_qkv.weight"].split is None
    shapes = om.matrix_shapes(list(routes.values()))
    assert shapes.count((32, 64)) == 2 * 4 + 2  # gate and up halves of 4 experts + shared expert


def test_mla_routing_on_real_megatron_model(megatron_groups, monkeypatch):
    gpt, _config = _build(_mla_model(), monkeypatch)
    names = {n for n, _ in gpt.named_parameters()}
    routes = {r.name: r for _, r in om.classify([gpt], RoutingConfig(split_mla_kv_down=True))}
    kv_down = routes["decoder.layers.1.self_attention.linear_kv_down_proj.weight"]
    assert kv_down.role == "mla_kv_down" and kv_down.shape == (16 + 8, 64)
    assert kv_down.split is not None and kv_down.split.sizes == (16, 8)
    for role in ("mla_q_down", "mla_q_up", "mla_kv_up"):
        assert any(r.role == role and r.optimizer == "matrix" for r in routes.values()), role
    assert all(r.split is None for r in routes.values() if r.role != "mla_kv_down"), "only the asked split"
    assert any("kv_layernorm" in n for n in names)


def test_sdpa_core_attention_matches_reference():
    """GQA (2 groups for 4 heads) and MLA-like (v head dim < q/k head dim) against an explicit causal softmax."""
    from megatron.core.transformer.enums import AttnMaskType

    from bench.engines.megatron_attention import SDPACoreAttention

    cfg = type(
        "C", (), {"context_parallel_size": 1, "attention_dropout": 0.0, "kv_channels": 8, "window_size": None}
    )
    torch.manual_seed(0)
    for ng, hv in ((2, 8), (4, 6)):
        s, b, np_, hn = 7, 2, 4, 8
        q, k = torch.randn(s, b, np_, hn), torch.randn(s, b, ng, hn)
        v = torch.randn(s, b, ng, hv)
        mod = SDPACoreAttention.__new__(SDPACoreAttention)
        torch.nn.Module.__init__(mod)
        mod.attn_mask_type, mod.softmax_scale = AttnMaskType.causal, 0.3
        out = SDPACoreAttention.forward(mod, q, k, v, None)
        kk = k.repeat_interleave(np_ // ng, dim=2)
        vv = v.repeat_interleave(np_ // ng, dim=2)
        scores = torch.einsum("sbhd,tbhd->bhst", q, kk) * 0.3
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        ref = torch.einsum("bhst,tbhd->sbhd", scores.softmax(-1), vv).reshape(s, b, np_ * hv)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="attention_dropout"):
        SDPACoreAttention(type("C2", (cfg,), {"attention_dropout": 0.1}), 1, AttnMaskType.causal)


def test_optimizer_config_versions_and_errors():
    muon = MuonConfig(nesterov=True, num_ns_steps=6)
    cfg = om.megatron_optimizer_config(
        optimizer="muon",
        adamw=AdamWConfig(),
        clip_grad=1.0,
        use_distributed_optimizer=True,
        muon=muon,
        routing=RoutingConfig(),
    )
    assert (
        cfg.optimizer == "muon"
        and cfg.use_layer_wise_distributed_optimizer
        and not cfg.use_distributed_optimizer
    )
    assert cfg.muon_nesterov is True and cfg.muon_num_ns_steps == 6 and cfg.muon_fp32_matmul_prec == "medium"
    adam = om.megatron_optimizer_config(
        optimizer="adam", adamw=AdamWConfig(lr=1e-3), clip_grad=0.5, use_distributed_optimizer=True
    )
    assert adam.optimizer == "adam" and adam.use_distributed_optimizer and adam.lr == 1e-3
    with pytest.raises(ValueError, match="tp_mode"):
        om.megatron_optimizer_config(
            optimizer="muon",
            adamw=AdamWConfig(),
            clip_grad=1.0,
            use_distributed_optimizer=False,
            muon=muon,
            routing=RoutingConfig(),
            tp_mode="layer_sharded",
        )
    with pytest.raises(ValueError, match=r"ns_precision='fp16' .*bf16 or fp32"):
        om.megatron_optimizer_config(
            optimizer="muon",
            adamw=AdamWConfig(),
            clip_grad=1.0,
            use_distributed_optimizer=False,
            muon=MuonConfig(ns_precision="fp16"),
            routing=RoutingConfig(),
        )
    with pytest.raises(ValueError, match="optimizer="):
        om.megatron_optimizer_config(
            optimizer="lamb", adamw=AdamWConfig(), clip_grad=1.0, use_distributed_optimizer=False
        )
    assert om.ddp_config(kind="adamw", distributed=True, overlap_grad_reduce=False).use_distributed_optimizer
    assert not om.ddp_config(
        kind="megatron", distributed=True, overlap_grad_reduce=False
    ).use_distributed_optimizer
    with pytest.raises(ValueError, match="kind="):
        om.ddp_config(kind="eo", distributed=True, overlap_grad_reduce=False)


def test_data_mock_and_indexed(tmp_path):
    it = md.mock_batches(vocab_size=50, seq_length=16, mbs=3, seed=1, device="cpu")
    a, b = next(it), next(md.mock_batches(vocab_size=50, seq_length=16, mbs=3, seed=1, device="cpu"))
    assert a["tokens"].shape == (3, 16) and torch.equal(a["tokens"], b["tokens"])
    assert torch.equal(a["tokens"][:, 1:], a["labels"][:, :-1]) and int(a["tokens"].max()) < 50
    import numpy as np
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    prefix = str(tmp_path / "docs")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.int32)
    stream = np.arange(100, dtype=np.int32)
    for chunk in np.split(stream, [7, 30, 31, 64]):
        builder.add_document(torch.from_numpy(chunk), [len(chunk)])
    builder.finalize(prefix + ".idx")
    rank0 = next(md.indexed_batches(prefix, seq_length=9, mbs=2, dp_rank=0, dp_size=2, device="cpu"))
    rank1 = next(md.indexed_batches(prefix, seq_length=9, mbs=2, dp_rank=1, dp_size=2, device="cpu"))
    # windows of 10 consecutive ids; rank 0 takes windows 0 and 2, rank 1 windows 1 and 3.
    assert rank0["tokens"][:, 0].tolist() == [0, 20] and rank1["tokens"][:, 0].tolist() == [10, 30]
    assert rank0["labels"][0].tolist() == list(range(1, 10))
    with pytest.raises(ValueError, match="bench.data"):
        md.parse_data_spec("text:/x")


def test_engine_refuses_cpu(monkeypatch):
    """GPU-only engine: a clear ValueError, not a CUDA stack trace."""
    from bench.engines.base import RankInfo
    from bench.engines.megatron import MegatronEngine

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="GPUs only"):
        MegatronEngine().setup(None, RankInfo(rank=0, world_size=1, local_rank=0))  # type: ignore[arg-type]


def test_grouped_mm_experts_match_sequential_mlp(megatron_groups, monkeypatch):
    """Localises an expert-layout bug: the model with GroupedMMExperts equals the one with Megatron's SequentialMLP
    when the expert weights are copied across ([gate; up] fc1 rows, probs applied after SwiGLU)."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    model = _gqa_model()
    outs, params = [], []
    for grouped in (False, True):
        opts = dataclasses.replace(
            CPU_OPTS, bf16=False, grouped_mm_experts=grouped, force_balanced_router=False
        )
        config = mm.transformer_config(model, PAR, opts)
        config.cross_entropy_loss_fusion = False
        # Megatron's fused bias-SwiGLU is torch.compile'd: on CPU an inductor C++ build (~30 s) for the same values
        config.bias_activation_fusion = False
        torch.manual_seed(0)
        gpt = mm.build_gpt_model(
            model, config, mm.decoder_block_spec(config, opts), pre_process=True, post_process=True
        )
        params.append(dict(gpt.named_parameters()))
        outs.append(gpt)
    seq, grp = params
    with torch.no_grad():
        for name, p in grp.items():
            src = name
            if ".experts.linear_fc" in name:
                fc, idx = name.rsplit(".", 2)[-2], name.rsplit("weight", 1)[1]
                src = name.replace(f"experts.{fc}.weight{idx}", f"experts.local_experts.{idx}.{fc}.weight")
            p.copy_(seq[src])
    tok = torch.randint(0, 250, (2, 32), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(32)[None].expand(2, 32)
    ref, got = (g(tok, pos, None, labels=tok) for g in outs)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert any(".experts.linear_fc1.weight3" in n for n in grp)
    routes = {r.name: r for _, r in om.classify([outs[1]], RoutingConfig())}
    r = routes["decoder.layers.1.mlp.experts.linear_fc2.weight2"]
    assert r.role == "expert_fc2" and r.is_expert and r.optimizer == "matrix" and r.partition_dim == 1


def test_grouped_mm_experts_forward_backward_vs_loop():
    """grouped_mm path vs a per-expert F.linear loop, with an empty expert, and a backward from a sum (an expanded
    gradient, which grouped_mm's backward rejects unless made dense)."""
    from types import SimpleNamespace

    from bench.engines.megatron_experts import GroupedMMExperts, _swiglu

    torch.manual_seed(0)
    cfg = SimpleNamespace(
        expert_tensor_parallel_size=1,
        gated_linear_unit=True,
        add_bias_linear=False,
        moe_ffn_hidden_size=16,
        hidden_size=32,
        expert_model_parallel_size=1,
        use_cpu_initialization=True,
        params_dtype=torch.float32,
        init_method=lambda w: torch.nn.init.normal_(w, std=0.1),
        output_layer_init_method=lambda w: torch.nn.init.normal_(w, std=0.1),
    )
    mod = GroupedMMExperts.__new__(GroupedMMExperts)
    torch.nn.Module.__init__(mod)
    mod.num_local_experts = 3
    from bench.engines.megatron_experts import _ExpertWeights

    mod.linear_fc1 = _ExpertWeights(
        3,
        32,
        32,
        partition_dim=0,
        allreduce=True,
        init_method=cfg.init_method,
        dtype=torch.float32,
        device="cpu",
    )
    mod.linear_fc2 = _ExpertWeights(
        3,
        32,
        16,
        partition_dim=1,
        allreduce=True,
        init_method=cfg.output_layer_init_method,
        dtype=torch.float32,
        device="cpu",
    )
    counts = torch.tensor([5, 0, 7])
    x = torch.randn(12, 32, requires_grad=True)
    probs = torch.rand(12)
    out, bias = GroupedMMExperts.forward(mod, x, counts, probs)
    assert bias is None
    ref = torch.cat(
        [
            torch.nn.functional.linear(_swiglu(torch.nn.functional.linear(xe, a), pe), b)
            for xe, pe, a, b in zip(
                x.split([5, 0, 7]), probs.split([5, 0, 7]), mod.linear_fc1.weights(), mod.linear_fc2.weights()
            )
        ]
    )
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    out.sum().backward()
    assert mod.linear_fc1.weight0.grad is not None and float(mod.linear_fc1.weight1.grad.abs().sum()) == 0.0
    assert mod.linear_fc1.weight0.allreduce and mod.linear_fc2.weight2.partition_dim == 1


def test_layerwise_bridge_matches_plain_step_and_restores(megatron_groups):
    """MegatronLayerWise (one rank): masters from bf16 params, grads from main_grad, clip, Muon + AdamW, copy back;
    equal to stepping fp32 copies directly; state_dict round trip reproduces the next step."""
    from optim.optimizers.muon import Muon

    gpt, _ = _build(_gqa_model())
    routed = om.classify([gpt], RoutingConfig())
    routes = {r.name: r for _, r in routed}
    gen = torch.Generator().manual_seed(3)
    for p, _ in routed:
        p.main_grad = torch.randn(p.shape, generator=gen) * 0.01
    muon, adamw = MuonConfig(nesterov=True, lr=0.02), AdamWConfig(lr=1e-3, weight_decay=0.1)

    def factory(owned):
        return om._owned_optimizer(owned, routes, muon, adamw)

    def bridge():
        return om.MegatronLayerWise(
            [(r.name, p) for p, r in routed],
            factory,
            is_matrix=lambda n, p: routes[n].optimizer == "matrix",
            is_expert=lambda n: routes[n].is_expert,
            dp_group=None,
            expert_dp_group=None,
            clip_grad=1.0,
        )

    start = {r.name: p.detach().clone() for p, r in routed}
    lw = bridge()
    assert {type(o).__name__ for o in om._inner_torch_optimizers(lw)} == {"Muon", "AdamW"}
    assert lw.step() == (True, None, None)
    # reference: the same optimizers on fp32 copies with the same (clipped) gradients
    ref = {r.name: torch.nn.Parameter(start[r.name].float()) for _, r in routed}
    for p, r in routed:
        ref[r.name].grad = p.main_grad.clone()
    torch.nn.utils.clip_grad_norm_(list(ref.values()), 1.0)
    mats = [n for n in ref if routes[n].optimizer == "matrix"]
    splits = {ref[n]: routes[n].split for n in mats if routes[n].split is not None}
    Muon([ref[n] for n in mats], muon, splits=splits).step()
    rest = [n for n in ref if routes[n].optimizer != "matrix"]
    torch.optim.AdamW(
        [
            {"params": [ref[n] for n in rest if routes[n].weight_decay], "weight_decay": 0.1},
            {"params": [ref[n] for n in rest if not routes[n].weight_decay], "weight_decay": 0.0},
        ],
        lr=1e-3,
        betas=(0.9, 0.95),
        eps=1e-8,
    ).step()
    # Owned pieces are batched for Newton-Schulz in another order than the reference's: bf16 NS may then round
    # differently (seen: <= 1e-3 on two matrices), so an ulp-level tolerance; AdamW parameters match exactly.
    for p, r in routed:
        tol = 2e-3 if r.optimizer == "matrix" else 0.0
        torch.testing.assert_close(p.detach(), ref[r.name].detach().to(p.dtype), rtol=0, atol=tol)
    state = copy.deepcopy(lw.state_dict())  # torch state dicts alias the live moments; a checkpoint is a copy
    after_one = {r.name: p.detach().clone() for p, r in routed}
    lw.step()
    after_two = {r.name: p.detach().clone() for p, r in routed}
    with torch.no_grad():
        for p, r in routed:
            p.copy_(start[r.name])
    lw2 = bridge()
    lw2.load_state_dict(state)
    for p, r in routed:
        assert torch.equal(p.detach(), after_one[r.name])
    lw2.step()
    for p, r in routed:
        torch.testing.assert_close(p.detach(), after_two[r.name], rtol=0, atol=0)


def test_disable_ddp_grad_sync_refuses_overlap():
    chunk = torch.nn.Linear(2, 2)
    chunk.ddp_config = type("D", (), {"overlap_grad_reduce": True})()
    with pytest.raises(ValueError, match="overlap_grad_reduce"):
        om.disable_ddp_grad_sync([chunk])
    chunk.ddp_config.overlap_grad_reduce = False
    om.disable_ddp_grad_sync([chunk])
    assert chunk.finish_grad_sync() is None


def test_groups_survive_megatron_checkpoint_matching():
    """Localises a checkpoint bug: Megatron's loader matches param groups by identifier keys; our decay and
    no-decay AdamW groups must stay distinct (else the no-decay group would load weight_decay=0.033)."""
    from megatron.core.optimizer.optimizer import MegatronOptimizer

    a, b = torch.nn.Parameter(torch.ones(2, 2)), torch.nn.Parameter(torch.ones(2))
    groups = [
        om.megatron_group([a], ["a"], lr=1e-3, weight_decay=0.033, wd_mult=1.0),
        om.megatron_group([b], ["b"], lr=1e-3, weight_decay=0.0, wd_mult=0.0),
    ]
    opt = torch.optim.AdamW(groups, lr=1e-3)
    saved = copy.deepcopy(opt.state_dict()["param_groups"])
    loaded = MegatronOptimizer._filter_and_reorder_param_groups(opt.param_groups, saved)
    assert [g["weight_decay"] for g in loaded] == [0.033, 0.0]


def test_engine_times_ours_through_the_public_hook():
    """bench.engines.megatron_optim._time_ours finds our optimizer inside Megatron-style wrappers and times every
    NS call with its plain FLOPs (the engine's NS columns), through OrthogonalizedOptimizer.instrument."""
    from types import SimpleNamespace

    from bench.engines.megatron_optim import _time_ours
    from bench.timing import PhaseTimer, ns_flops_plain
    from optim import Muon, MuonConfig

    ps = [torch.randn(8, 12, requires_grad=True), torch.randn(12, 8, requires_grad=True)]
    muon = Muon(ps, MuonConfig(ns_precision="fp32"))
    wrapped = SimpleNamespace(
        chained_optimizers=[SimpleNamespace(optimizer=muon)]
    )  # ChainedOptimizer(Float16(..))
    timer = PhaseTimer(cuda=False)
    _time_ours(wrapped, timer, 5)
    for p in ps:
        p.grad = torch.randn_like(p)
    timer.reset()
    muon.step()
    phases = timer.collect()
    assert phases["ns"] > 0
    assert timer.counters["ns_flops"] == ns_flops_plain(8, 12, 5, batch=2)  # one batched call, both matrices


def test_engine_and_bridge_recipe_share_one_megatron_muon_mapping():
    """The megatron engine's OptimizerConfig and the Bridge recipe's optimizer section carry the same muon_* fields
    for one config (one adapter, `optim.megatron.megatron_muon_fields`), and both refuse what MCore cannot run."""
    import muonbench
    from bench.engines.megatron_optim import megatron_config
    from recipes.bridge import build_plan

    overrides = ["model=qwen3_moe_tiny", "optimizer=muon_megatron", "optimizer.num_ns_steps=7"]
    engine = megatron_config(muonbench.load(["engine=megatron", *overrides]))
    recipe = build_plan(muonbench.load(["engine=bridge", "engine.device=cuda", *overrides])).overrides[
        "optimizer"
    ]
    muon_keys = [k for k in recipe if k.startswith("muon_") and k != "muon_scalar_optimizer"]
    assert len(muon_keys) >= 9 and recipe["muon_num_ns_steps"] == 7
    assert {k: getattr(engine, k) for k in muon_keys} == {k: recipe[k] for k in muon_keys}
    gram = muonbench.load(["engine=megatron", *overrides, "optimizer.use_gram_ns=true"])
    with pytest.raises(ValueError, match="use_gram_ns=True.*Gram"):
        megatron_config(gram)


def test_megatron_param_groups_are_accepted_by_our_optimizers(megatron_groups):
    """Localises our optimizers refusing (or the key list missing) a key Megatron-Core itself puts into a param
    group: the groups of `megatron.core.optimizer._get_param_groups` on a real model, with every field of its
    `ParamGroupOverride` set on the matrices, build Muon and SOAP as they are; an unknown key is still refused."""
    from megatron.core.optimizer import OptimizerConfig, ParamKey, _get_param_groups
    from megatron.core.optimizer_param_scheduler import ParamGroupOverride

    from optim import SOAP, Muon
    from optim.configs import SOAPConfig
    from optim.optimizers.base import MEGATRON_GROUP_KEYS

    assert set(ParamGroupOverride.__annotations__) <= MEGATRON_GROUP_KEYS
    gpt, _config = _build(_gqa_model())
    override = ParamGroupOverride(
        max_lr=2e-3, min_lr=1e-4, start_wd=0.1, end_wd=0.1, wd_mult=0.5, optimizer="muon"
    )
    groups = _get_param_groups(
        [gpt], OptimizerConfig(lr=1e-3, min_lr=1e-5), {ParamKey(name="*linear_fc1.weight"): override}
    )
    matrices = [{**g, "params": [p for p in g["params"] if p.ndim == 2]} for g in groups]
    assert set(override) | {"lr_mult", "is_expert_parallel", "is_decoupled_lr", "default_config"} <= {
        k for g in matrices for k in g
    }
    matrices = [g for g in matrices if g["params"]]
    assert len(matrices) == 2  # the override's group and the default one
    Muon([dict(g) for g in matrices], MuonConfig())  # torch's add_param_group fills in defaults in place
    SOAP([dict(g) for g in matrices], SOAPConfig())
    with pytest.raises(ValueError, match=r"^param group 1: wd_mul=0.5 is not a key of a Muon param group"):
        Muon([matrices[0], {**matrices[1], "wd_mul": 0.5}], MuonConfig())
