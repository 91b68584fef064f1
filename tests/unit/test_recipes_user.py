"""Our optimizer put into real Megatron-Bridge 0.6.2 ConfigContainers of Bridge's own recipes (Llama 3, Qwen3,
Kimi K2), built offline on CPU, and the `engine.recipe` path that names a recipe function by dotted path.

The recipes read their model's Hub `config.json`; the tests write it into a local offline Hub cache (Llama-3-8B's
and Qwen3-0.6B's published shapes; Kimi K2's through `recipes.hf_config`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from tests.bridge_live import bridge_importable, import_bridge

pytestmark = pytest.mark.filterwarnings("ignore")

_SKIP = bridge_importable()
if _SKIP:
    pytest.skip(_SKIP, allow_module_level=True)

HUB_CONFIGS: dict[str, dict[str, Any]] = {
    "meta-llama/Meta-Llama-3-8B": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "max_position_embeddings": 8192,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
    },
    "Qwen/Qwen3-0.6B": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "max_position_embeddings": 40960,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
    },
}
LLAMA = "megatron.bridge.recipes.llama.llama3_8b_pretrain_config"
QWEN3 = "megatron.bridge.recipes.qwen.qwen3_600m_pretrain_config"
KIMI = "megatron.bridge.recipes.kimi.kimi_k2:kimi_k2_pretrain_config"
# (recipe, optimizer, distribution) per case: three recipe families, our three matrix optimizers, both
# distributions, and Megatron's own Muon
CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama_muon": (LLAMA, "muon", {}),
    "llama_soap": (LLAMA, "soap_rekls", {"distributed": "none"}),
    "qwen3_mop": (QWEN3, "mop", {}),
    "qwen3_muon_megatron": (
        QWEN3,
        "muon_megatron",
        {"assignment": "ping_pong_numel", "grad_sync": "all_reduce"},
    ),
    "kimi_muon": (KIMI, "muon", {"tp_mode": "duplicated"}),
}


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An offline Hub cache holding the configs the recipes read (this process's Hub client points at it)."""
    import muonbench
    from recipes.hf_config import offline_hub

    root = tmp_path_factory.mktemp("hub_root")
    env = offline_hub(muonbench.load(["model=kimi_k2"]).model, root)
    cache = Path(env["HF_HUB_CACHE"])
    for repo, config in HUB_CONFIGS.items():
        text = json.dumps(config)
        revision = hashlib.sha1(text.encode()).hexdigest()
        base = cache / f"models--{repo.replace('/', '--')}"
        (base / "snapshots" / revision).mkdir(parents=True)
        (base / "snapshots" / revision / "config.json").write_text(text)
        (base / "refs").mkdir()
        (base / "refs" / "main").write_text(revision)
    return cache


@pytest.fixture(scope="module")
def built(hub: Path) -> dict[str, tuple[Any, Any]]:
    """case -> (the recipe's untouched ConfigContainer, the same recipe with our optimizer applied)."""
    import_bridge()
    from recipes import apply_optimizer, load_recipe

    out = {}
    for name, (recipe, optimizer, distribution) in CASES.items():
        before = load_recipe(recipe)
        out[name] = (before, apply_optimizer(load_recipe(recipe), optimizer, distribution))
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_optimizer_provider_and_ddp(built, name: str) -> None:
    from megatron.bridge.training.config import OptimizerConfig

    before, cfg = built[name]
    _, optimizer, distribution = CASES[name]
    opt = cfg.optimizer
    assert isinstance(opt, OptimizerConfig)
    # Llama and Qwen3 shard AdamW's state (ZeRO-1); Kimi K2's recipe ships with Megatron's layer-wise Muon
    assert before.ddp.use_distributed_optimizer is (not name.startswith("kimi"))
    assert cfg.ddp.use_distributed_optimizer is False and opt.use_distributed_optimizer is False
    assert cfg.ddp.overlap_param_gather is False and opt.overlap_param_gather is False
    if optimizer == "muon_megatron":  # Megatron's own layer-wise Muon, built by Bridge's optimizer factory
        assert type(opt) is OptimizerConfig and opt.optimizer == "dist_muon"
        assert (opt.muon_tp_mode, opt.muon_num_ns_steps) == ("blockwise", 5)
        assert cfg.ddp.overlap_grad_reduce is before.ddp.overlap_grad_reduce  # DDP all-reduces, as published
        return
    assert type(opt).__name__ == "OursOptimizerConfig" and callable(opt.provide)
    assert opt.optimizer == "adam"  # the scalar AdamW side
    assert opt.muonbench_optimizer["name"] == optimizer
    assert opt.muonbench_optimizer["implementation"] == "ours"
    dist = opt.muonbench_distribution
    assert dist["distributed"] == distribution.get("distributed", "layerwise")
    assert dist["tp_mode"] == distribution.get("tp_mode", "blockwise")
    layerwise = dist["distributed"] == "layerwise"
    # the layer-wise optimizer reduce-scatters gradients itself: DDP must not overlap a reduction of its own
    assert cfg.ddp.overlap_grad_reduce is (before.ddp.overlap_grad_reduce and not layerwise)
    if layerwise:
        assert cfg.comm_overlap.overlap_grad_reduce is False


def test_settings_come_from_the_optimizer_config(built) -> None:
    import muonbench

    _, cfg = built["llama_muon"]
    muon = muonbench.load(["optimizer=muon"]).optimizer
    opt = cfg.optimizer
    assert (opt.lr, opt.min_lr, opt.weight_decay, opt.clip_grad) == (
        muon.lr,
        muon.min_lr,
        muon.weight_decay,
        muon.clip_grad,
    )
    assert opt.muonbench_optimizer["num_ns_steps"] == muon.num_ns_steps
    assert cfg.scheduler.lr_warmup_iters == muon.lr_warmup_steps
    assert cfg.scheduler.start_weight_decay == muon.weight_decay


def test_recipe_model_and_layout_untouched(built) -> None:
    for name in CASES:
        before, cfg = built[name]
        for field in ("num_layers", "hidden_size", "tensor_model_parallel_size", "context_parallel_size"):
            assert getattr(cfg.model, field) == getattr(before.model, field)
        assert cfg.train.global_batch_size == before.train.global_batch_size
    assert built["llama_muon"][1].model.num_layers == 32
    assert built["qwen3_mop"][1].model.hidden_size == 1024
    assert built["kimi_muon"][1].model.num_moe_experts == 384


def test_fields_and_keep_schedule(hub) -> None:
    from recipes import apply_optimizer, load_recipe

    before = load_recipe(QWEN3)
    cfg = apply_optimizer(load_recipe(QWEN3), "muon", schedule=False, num_ns_steps=6, coefficient_type="aol")
    assert cfg.optimizer.muonbench_optimizer["num_ns_steps"] == 6
    assert cfg.optimizer.muonbench_optimizer["coefficient_type"] == "aol"
    assert cfg.scheduler.lr_warmup_iters == before.scheduler.lr_warmup_iters


def test_bad_input_names_the_field(hub) -> None:
    import muonbench
    from recipes import apply_optimizer, load_recipe

    with pytest.raises(muonbench.ConfigError, match=r"optimizer=nope: no such option; available: .*muon"):
        apply_optimizer(load_recipe(QWEN3), "nope")
    with pytest.raises(ValueError, match=r"tp_mode='sideways': must be one of"):
        apply_optimizer(load_recipe(QWEN3), "muon", {"tp_mode": "sideways"})
    with pytest.raises(ValueError, match=r"optimizer.use_gram_ns=True: .*Megatron-Core, which has no Gram"):
        apply_optimizer(load_recipe(QWEN3), "muon_megatron", use_gram_ns=True)
    with pytest.raises(ValueError, match=r"container: builtins.dict, not a Bridge ConfigContainer"):
        apply_optimizer({}, "muon")


def test_recipe_path_checked_before_launch() -> None:
    from recipes.user_recipe import check_recipe, load_recipe

    assert check_recipe(LLAMA) == ("megatron.bridge.recipes.llama", "llama3_8b_pretrain_config")
    assert check_recipe(KIMI) == ("megatron.bridge.recipes.kimi.kimi_k2", "kimi_k2_pretrain_config")
    with pytest.raises(ValueError, match=r"engine.recipe='llama3': a recipe function by dotted path"):
        check_recipe("llama3")
    with pytest.raises(ValueError, match=r"engine.recipe=.*no module 'megatron.bridge.recipes.llama4'"):
        check_recipe("megatron.bridge.recipes.llama4.llama4_pretrain_config")
    with pytest.raises(ValueError, match=r"defines no function 'llama9_pretrain_config'"):
        check_recipe("megatron.bridge.recipes.llama.llama9_pretrain_config")
    with pytest.raises(ValueError, match=r"recipe='builtins.dict' returned: builtins.dict, not a Bridge"):
        load_recipe("builtins.dict")
    with pytest.raises(ValueError, match=r"not callable"):
        load_recipe("math.pi")
    # a builtin or a class is no recipe function, whether Bridge imports here or not
    for dotted, kind in (("os.getcwd", "builtin_function_or_method"), ("collections.OrderedDict", "type")):
        with pytest.raises(ValueError, match=rf"engine.recipe='{dotted}': a {kind}, not a function"):
            check_recipe(dotted)


def test_engine_recipe_cli_path(hub, tmp_path) -> None:
    """`engine.recipe` replaces the family's recipe; `model` sets the shapes (a Kimi K2 slice here)."""
    import muonbench
    from bench.sweep import preflight
    from recipes.bridge import make_config_container

    overrides = ["model=kimi_k2_tiny", "parallelism=single_gpu", "engine=bridge", "hardware=h200"]
    overrides.append("precision=bf16")
    root = muonbench.load([*overrides, f"engine.recipe={KIMI}", "optimizer=muon"])
    cfg, plan = make_config_container(root)
    assert plan.base_recipe == "megatron.bridge.recipes.kimi.kimi_k2:kimi_k2_pretrain_config"
    assert plan.metadata["user_recipe"] == KIMI and "hf_offline" not in plan.metadata
    assert cfg.model.num_layers == root.model.num_layers and cfg.model.hidden_size == root.model.hidden_size
    assert cfg.model.moe_router_fusion is False  # our Kimi recipe's published perf settings are not added
    assert type(cfg.optimizer).__name__ == "OursOptimizerConfig"
    assert cfg.ddp.use_distributed_optimizer is False
    assert cfg.train.train_iters == root.bench.steps
    good = preflight([[*overrides, f"engine.recipe={KIMI}"]])  # this CPU node fails only the GPU check
    assert all("engine.recipe" not in e for e in good)
    bad = preflight([[*overrides, "engine.recipe=megatron.bridge.recipes.llama.nope_config"]])
    assert len(bad) == 1 and "engine.recipe=" in bad[0] and "no function 'nope_config'" in bad[0]
    wrong = preflight([["engine=hf", f"engine.recipe={LLAMA}"]])
    assert len(wrong) == 1 and wrong[0].startswith("engine.recipe=") and "only engine=bridge has it" in wrong[0]


def test_recipe_return_type_checked_before_launch(tmp_path, monkeypatch) -> None:
    """Localises a recipe function that returns something else than a ConfigContainer failing only on the worker
    rank: `check_recipe` (bench.run's preflight) refuses it naming engine.recipe and the value, from a Bridge
    module's source, from a user function's annotation, or (unannotated) from its value."""
    from recipes.fields import function_returns
    from recipes.user_recipe import check_recipe

    assert function_returns("megatron.bridge.recipes.llama", "llama3_8b_pretrain_config") == "ConfigContainer"
    bad_bridge = "megatron.bridge.recipes.utils.optimizer_utils.distributed_fused_adam_with_cosine_annealing"
    with pytest.raises(ValueError, match=rf"engine.recipe='{bad_bridge}': returns tuple\[OptimizerConfig"):
        check_recipe(bad_bridge)
    (tmp_path / "my_recipes.py").write_text(
        "from __future__ import annotations\n"
        "from megatron.bridge.training.config import ConfigContainer\n"
        "def good() -> ConfigContainer:\n    raise AssertionError('an annotated recipe is not called')\n"
        "def annotated() -> dict:\n    return {}\n"
        "def bare():\n    return 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert check_recipe("my_recipes.good") == ("my_recipes", "good")
    with pytest.raises(ValueError, match=r"engine.recipe='my_recipes.annotated': returns dict, not a Bridge"):
        check_recipe("my_recipes.annotated")
    with pytest.raises(ValueError, match=r"engine.recipe='my_recipes.bare' returned: builtins.int, not a Bridge"):
        check_recipe("my_recipes.bare")
    with pytest.raises(ValueError, match=r"engine.recipe='builtins.dict': a type, not a function"):
        check_recipe("builtins.dict")
