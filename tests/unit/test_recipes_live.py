"""The real Megatron-Bridge 0.6.2 ConfigContainer of every Bridge experiment, built offline on CPU, checked by value.

`recipes.bridge.make_config_container` calls Bridge's own recipe functions (the HF config is written locally by
`recipes.hf_config`), applies our plan and returns the container `pretrain` would receive. Expected values are those
of Megatron-Bridge 0.6.2 `perf_recipes/{kimi,qwen}/gb300/` (fp8mx) and of our config tree; the signatures Bridge's
training loop relies on (`pretrain`, `Callback`, `CallbackContext`, the `provide()` call, the FLOP count) are read
with `inspect` from the installed package.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pytest

from tests.bridge_live import bridge_importable, import_bridge

pytestmark = pytest.mark.filterwarnings("ignore")

_SKIP = bridge_importable()
if _SKIP:
    pytest.skip(_SKIP, allow_module_level=True)

SINGLE = ["parallelism=single_gpu", "engine=bridge", "hardware=h200", "precision=bf16"]
CASES: dict[str, list[str]] = {
    "kimi_adamw": ["experiment=gb300/kimi_k2_adamw"],
    "kimi_muon_megatron": ["experiment=gb300/kimi_k2_muon"],
    "kimi_muon_ours": ["experiment=gb300/kimi_k2_muon", "optimizer=muon"],
    "qwen_adamw": ["experiment=gb300/qwen3_30b_a3b_adamw"],
    "qwen_muon_megatron": ["experiment=gb300/qwen3_30b_a3b_muon"],
    "qwen_muon_ours": ["experiment=gb300/qwen3_30b_a3b_muon", "optimizer=muon"],
    **{
        f"{model}_{opt}": [f"model={model}", *SINGLE, f"optimizer={opt}"]
        for model in ("qwen3_moe_tiny", "kimi_k2_tiny")
        for opt in ("adamw", "muon", "muon_megatron")
    },
    **{
        f"slice_{opt}": ["experiment=h200/qwen3_30b_a3b_slice_flops_bridge_1gpu", f"optimizer={opt}"]
        for opt in ("adamw", "muon", "muon_megatron")
    },
}
GB300 = [k for k in CASES if CASES[k][0].startswith("experiment=gb300/")]
ONE_GPU = [k for k in CASES if k not in GB300]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, Any, Any]]:
    """case -> (RootConfig, ConfigContainer, BridgePlan), every case built once (Bridge imports once)."""
    import_bridge()
    import muonbench
    from recipes.bridge import make_config_container

    out = {}
    for name, overrides in CASES.items():
        root = muonbench.load(overrides)
        cfg, plan = make_config_container(root, hf_dir=tmp_path_factory.mktemp(f"hf_{name}"))
        out[name] = (root, cfg, plan)
    return out


def _kind(name: str) -> str:
    """'adamw', 'ours' or 'megatron' (Megatron's Muon) for a case name."""
    if name.endswith(("_muon_megatron", "_megatron")):
        return "megatron"
    if name.endswith(("_muon_ours", "_muon")):
        return "ours"
    return "adamw"


@pytest.mark.parametrize("name", GB300)
def test_gb300_layout_dispatcher_and_env(built, name: str) -> None:
    root, cfg, _ = built[name]
    m = cfg.model
    kimi = name.startswith("kimi")
    # perf_recipes/kimi/gb300/kimi_k2.py: TP1 PP4 VP4 EP64, GBS 4096 MBS 2; qwen/gb300: TP1 PP1 EP8, GBS 512 MBS 8.
    want = (1, 4, 4, 64, 4096, 2) if kimi else (1, 1, None, 8, 512, 8)
    got = (
        m.tensor_model_parallel_size,
        m.pipeline_model_parallel_size,
        m.virtual_pipeline_model_parallel_size,
        m.expert_model_parallel_size,
        cfg.train.global_batch_size,
        cfg.train.micro_batch_size,
    )
    assert got == want
    assert (m.moe_token_dispatcher_type, m.moe_flex_dispatcher_backend, m.moe_hybridep_num_sms) == (
        "flex",
        "hybridep",
        32,
    )
    assert m.moe_router_force_load_balancing is True and m.moe_router_fusion is True
    assert dict(root.launcher.env) and dict(root.launcher.env).items() <= cfg.env_vars.items()
    assert cfg.env_vars["NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"] == ("64" if kimi else "8")
    if kimi:  # Kimi K2: 61 layers of hidden 7168, 384 routed experts; MLA provider
        assert type(m).__name__ == "MLAModelProvider"
        assert (m.num_layers, m.hidden_size, m.num_moe_experts, m.moe_router_topk) == (61, 7168, 384, 8)
        assert m.pipeline_model_parallel_layout is not None  # "Et*4|(t*4|)*14tL", parsed by Bridge
        assert m.recompute_modules == ["mla_up_proj"]
    else:  # Qwen3-30B-A3B: 48 layers of hidden 2048, 128 experts, top-8
        assert type(m).__name__ == "GPTModelProvider"
        assert (m.num_layers, m.hidden_size, m.num_moe_experts, m.moe_router_topk) == (48, 2048, 128, 8)
        assert m.cuda_graph_impl == "transformer_engine"
        assert m.cuda_graph_scope == ["moe_router", "moe_preprocess"]


# MB 0.6.2 perf recipes, fp8mx: Kimi K2 turns MXFP8 param gather off for both optimizers; Qwen3 AdamW keeps it on
# (with the gradient-buffer reuse Bridge requires alongside), our Qwen3 Muon runs with it off.
PRECISION = {
    "kimi_adamw": (False, False),
    "kimi_muon_megatron": (False, False),
    "kimi_muon_ours": (False, False),
    "qwen_adamw": (True, True),
    "qwen_muon_megatron": (False, False),
    "qwen_muon_ours": (False, False),
}


@pytest.mark.parametrize("name", GB300)
def test_gb300_mxfp8_precision(built, name: str) -> None:
    _, cfg, plan = built[name]
    mp = cfg.mixed_precision
    assert plan.precision_preset == "bf16_with_mxfp8_mixed"
    assert (mp.bf16, mp.fp8, mp.fp8_recipe) == (True, "e4m3", "mxfp8")
    assert (mp.fp8_param_gather, mp.reuse_grad_buf_for_mxfp8_param_ag) == PRECISION[name]
    assert mp.grad_reduce_in_fp32 is False and cfg.ddp.grad_reduce_in_fp32 is False


# (ddp.overlap_grad_reduce, ddp.overlap_param_gather, distributed optimizer) per optimizer kind. Kimi's perf recipe
# and the Qwen3 8-GPU base recipe both overlap the gradient reduce-scatter; ours (layer-wise) reduces it itself.
OVERLAP = {"adamw": (True, True, True), "megatron": (True, False, False), "ours": (False, False, False)}


@pytest.mark.parametrize("name", list(CASES))
def test_overlap_and_distributed_optimizer(built, name: str) -> None:
    _, cfg, plan = built[name]
    kind = _kind(name)
    ddp = cfg.ddp
    assert (ddp.overlap_grad_reduce, ddp.overlap_param_gather, ddp.use_distributed_optimizer) == OVERLAP[kind]
    assert cfg.optimizer.use_distributed_optimizer is OVERLAP[kind][2]
    assert cfg.optimizer.overlap_param_gather is OVERLAP[kind][1]
    if kind == "ours":
        assert cfg.comm_overlap.overlap_grad_reduce is False
        assert plan.metadata["optimizer"]["ours_distribution"]["distributed"] == "layerwise"
    elif name.startswith("kimi"):
        assert cfg.comm_overlap.overlap_grad_reduce is True  # perf_recipes/kimi/gb300


@pytest.mark.parametrize("name", list(CASES))
def test_optimizer_provider(built, name: str) -> None:
    from megatron.bridge.training.config import OptimizerConfig

    root, cfg, plan = built[name]
    opt = cfg.optimizer
    assert isinstance(opt, OptimizerConfig)
    kind = _kind(name)
    if kind == "ours":
        assert type(opt).__name__ == "OursOptimizerConfig" and plan.optimizer_impl == "ours"
        assert opt.optimizer == "adam"  # the scalar AdamW side
        assert opt.muonbench_optimizer["name"] == "muon"
        assert opt.muonbench_optimizer["implementation"] == "ours"
        assert opt.muonbench_optimizer["num_ns_steps"] == root.optimizer.num_ns_steps
        assert callable(opt.provide)
    else:
        assert type(opt) is OptimizerConfig and plan.optimizer_impl == "megatron"
        assert not hasattr(opt, "provide")  # Bridge's own optimizer factory builds it
        assert opt.optimizer == ("dist_muon" if kind == "megatron" else "adam")
    assert (opt.lr, opt.min_lr, opt.clip_grad) == (
        root.optimizer.lr,
        root.optimizer.min_lr,
        root.optimizer.clip_grad,
    )
    assert opt.use_precision_aware_optimizer is False


@pytest.mark.parametrize("name", list(CASES))
def test_hf_config_read_offline(built, name: str) -> None:
    _, _, plan = built[name]
    env = plan.metadata["hf_offline"]
    assert env["HF_HUB_OFFLINE"] == "1"
    assert Path(env["HF_HUB_CACHE"]).is_dir()
    assert list(Path(env["HF_HUB_CACHE"]).glob("models--*/snapshots/*/config.json"))


@pytest.mark.parametrize("name", ONE_GPU)
def test_one_gpu_proxies(built, name: str) -> None:
    root, cfg, plan = built[name]
    m = cfg.model
    assert (m.tensor_model_parallel_size, m.pipeline_model_parallel_size, m.expert_model_parallel_size) == (
        1,
        1,
        1,
    )
    assert m.virtual_pipeline_model_parallel_size is None
    assert m.moe_token_dispatcher_type == "alltoall"  # no expert parallelism: Megatron's local permute
    assert (cfg.train.global_batch_size, cfg.train.micro_batch_size) == (
        root.parallelism.gbs,
        root.parallelism.mbs,
    )
    assert (m.num_layers, m.hidden_size, m.num_moe_experts) == (
        root.model.num_layers,
        root.model.hidden_size,
        root.model.num_experts,
    )
    assert m.seq_length == root.model.seq_length == cfg.dataset.seq_length
    mp = cfg.mixed_precision
    assert plan.precision_preset == "bf16_mixed" and (mp.bf16, mp.fp8) == (True, None)
    assert dict(root.launcher.env).items() <= cfg.env_vars.items()
    # No APEX / TE on this node: off (recorded for Kimi, whose recipe sets it; the Qwen3 provider drops it itself).
    assert m.gradient_accumulation_fusion is False
    if name.startswith("slice"):
        assert (m.num_layers, m.hidden_size, m.num_moe_experts, cfg.train.global_batch_size) == (
            6,
            2048,
            128,
            328,
        )


def test_qwen3_base_is_the_8gpu_h100_recipe(built) -> None:
    """The 8-GPU H100 recipe leaves `comm_overlap` None and sets `moe_hybridep_num_sms` 16; the 16-GPU one (the
    `recipes.qwen.qwen3_moe` alias) sets CommOverlapConfig(tp_comm_overlap=True) and 32."""
    for name in ("qwen_adamw", "qwen_muon_megatron"):
        _, cfg, plan = built[name]
        assert plan.base_recipe.endswith("qwen.h100.qwen3_moe:qwen3_30b_a3b_pretrain_8gpu_h100_bf16_config")
        assert cfg.comm_overlap is None
    for name in ("qwen3_moe_tiny_adamw", "slice_adamw"):
        _, cfg, _ = built[name]
        assert cfg.comm_overlap is None
        assert cfg.model.moe_hybridep_num_sms == 16  # hybridep is not used at EP 1: the base value stays
    _, cfg, _ = built["qwen_muon_ours"]
    # created by recipes.bridge (OPTIONAL_SECTIONS) for ours, not the 16-GPU recipe's
    assert cfg.comm_overlap.tp_comm_overlap is False


def test_kimi_gradient_accumulation_fusion_recorded(built) -> None:
    for name in ("kimi_adamw", "kimi_k2_tiny_muon"):
        _, cfg, plan = built[name]
        changed = plan.metadata["node_adjustments"]["model.gradient_accumulation_fusion"]
        assert (changed["recipe"], changed["used"]) == (True, False)
        assert cfg.model.gradient_accumulation_fusion is False


def test_cuda_graph_capture_falls_in_warmup(built) -> None:
    """Bridge captures TE CUDA graphs in iteration `cuda_graph_warmup_steps` (0-based); the bench times the steps
    from `bench.warmup_steps` on, so the capture must come earlier, and the change is recorded."""
    for name in ("qwen_adamw", "slice_muon", "qwen3_moe_tiny_adamw", "kimi_adamw"):
        root, cfg, plan = built[name]
        if cfg.model.cuda_graph_impl != "transformer_engine":
            assert name.startswith("kimi")  # Kimi K2's published recipe runs without CUDA graphs
            continue
        assert cfg.model.cuda_graph_warmup_steps < root.bench.warmup_steps
    # default bench (3 warm-up steps) against the recipe's 3: moved to the last warm-up step
    root, cfg, plan = built["qwen3_moe_tiny_adamw"]
    assert root.bench.warmup_steps == 3 and cfg.model.cuda_graph_warmup_steps == 2
    assert plan.metadata["benchmark"]["cuda_graph_warmup_steps"] == {"recipe": 3, "used": 2}
    root, cfg, plan = built["qwen_adamw"]  # published: 10 warm-up steps, the recipe's value stays
    assert (
        cfg.model.cuda_graph_warmup_steps == 3 and "cuda_graph_warmup_steps" not in plan.metadata["benchmark"]
    )


def test_cuda_graphs_need_two_warmup_steps(tmp_path) -> None:
    import muonbench
    from recipes.bridge import make_config_container

    root = muonbench.load(["model=qwen3_moe_tiny", *SINGLE, "optimizer=adamw", "bench.warmup_steps=1"])
    with pytest.raises(ValueError, match=r"bench.warmup_steps=1: .*bench.warmup_steps >= 2"):
        make_config_container(root, hf_dir=tmp_path)


# ---- signatures of the Bridge objects the engine and recipes call ---------------------------------------------


def test_pretrain_signature(built) -> None:
    from megatron.bridge.training.pretrain import pretrain

    params = inspect.signature(pretrain).parameters
    assert list(params)[:2] == ["config", "forward_step_func"]
    assert "callbacks" in params
    inspect.signature(pretrain).bind(object(), object(), callbacks=[])


def test_callback_hooks_and_context_fields(built) -> None:
    from megatron.bridge.training.callbacks import Callback, CallbackContext

    for hook in ("on_train_start", "on_train_step_start", "on_train_step_end"):
        assert callable(getattr(Callback, hook))
        assert list(inspect.signature(getattr(Callback, hook)).parameters) == ["self", "context"]
    fields = {f.name for f in dataclasses.fields(CallbackContext)}
    assert {"state", "model", "optimizer", "loss_dict", "grad_norm", "skipped_iter"} <= fields


def _provide_call_keywords() -> list[str]:
    """Keyword names of the `optimizer_config.provide(...)` call in Bridge's training/optim.py."""
    from megatron.bridge.training import optim

    tree = ast.parse(inspect.getsource(optim))
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "provide"
    ]
    assert len(calls) == 1, "Bridge's setup_optimizer calls provide() once"
    assert not calls[0].args, "provide() is called with keywords only"
    return [kw.arg for kw in calls[0].keywords]


def test_provide_accepts_bridges_call(built) -> None:
    from megatron.bridge.training.config import OptimizerConfig

    from recipes.bridge import OursOptimizerConfig

    keywords = _provide_call_keywords()
    assert keywords == ["model_chunks", "config_overrides", "use_gloo_process_groups", "pg_collection"]
    ours = inspect.signature(OursOptimizerConfig.provide)
    ours.bind(None, **dict.fromkeys(keywords))
    base = getattr(OptimizerConfig, "provide", None)
    if base is not None:  # a later Bridge with a base provide(): ours must keep its parameters
        assert list(inspect.signature(base).parameters) == list(ours.parameters)


def test_bridge_flop_count_of_the_slice(built) -> None:
    from megatron.bridge.training.utils.flop_utils import num_floating_point_operations

    from bench.engines.bridge import bridge_step_flops

    assert "batch_size" in inspect.signature(num_floating_point_operations).parameters
    root, cfg, _ = built["slice_adamw"]
    flops = num_floating_point_operations(cfg, batch_size=root.parallelism.gbs)
    assert flops > 0
    assert bridge_step_flops(cfg, root.parallelism.gbs) == pytest.approx(float(flops))
    # linear in the batch: half the sequences, half the FLOPs
    assert num_floating_point_operations(cfg, batch_size=root.parallelism.gbs // 2) == pytest.approx(
        flops / 2
    )


def test_adapt_to_node_turns_fusion_off_and_records(built) -> None:
    from recipes.bridge import APEX_FUSED_WGRAD, _importable, adapt_to_node

    assert not _importable(APEX_FUSED_WGRAD)  # this CPU node has no APEX
    _, cfg, _ = built["qwen3_moe_tiny_adamw"]
    cfg.model.gradient_accumulation_fusion = True
    changed = adapt_to_node(cfg)
    assert cfg.model.gradient_accumulation_fusion is False
    assert changed["model.gradient_accumulation_fusion"]["used"] is False
    assert APEX_FUSED_WGRAD in changed["model.gradient_accumulation_fusion"]["why"]
    assert adapt_to_node(cfg) == {}  # nothing left to change
