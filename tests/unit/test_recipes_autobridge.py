"""A model read from a Hugging Face config (`model=hf:<spec>`) built by the bridge engine through Bridge's own
AutoBridge: real Megatron-Bridge 0.6.2 ConfigContainers on CPU, Bridge's FLOP count equal to the one we record,
families Bridge has no bridge for refused before launch, and a model_type outside our family table (Gemma) read from
AutoBridge's provider, for engine=bridge only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.bridge_live import bridge_importable, import_bridge

pytestmark = pytest.mark.filterwarnings("ignore")

FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"
LAYOUT = ["engine=bridge", "parallelism=single_gpu", "hardware=h200", "precision=bf16", "parallelism.gbs=4"]
# fixture -> slice overrides (two layers of the real widths)
CASES: dict[str, list[str]] = {
    "llama3_8b": ["model.num_layers=2"],
    "olmoe_1b_7b": ["model.num_layers=2"],
    "qwen2_5_7b": ["model.num_layers=2"],
    "gemma_2b": ["model.num_layers=2"],  # no reader in muonbench.families: AutoBridge's provider is read
}


def _root(name: str, *extra: str) -> Any:
    import muonbench

    return muonbench.load([f"model=hf:{FIXTURES / name}", *CASES.get(name, []), *LAYOUT, *extra])


@pytest.fixture(scope="module")
def built() -> dict[str, tuple[Any, Any, Any]]:
    """fixture -> (root config, ConfigContainer with our Muon, its plan)."""
    if reason := bridge_importable():
        pytest.skip(reason)
    import_bridge()
    from recipes.bridge import make_config_container

    out = {}
    for name in CASES:
        root = _root(name, "optimizer=muon")
        cfg, plan = make_config_container(root)
        out[name] = (root, cfg, plan)
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_autobridge_provider_sliced_with_our_optimizer(built, name: str) -> None:
    root, cfg, plan = built[name]
    m = root.model
    assert plan.base_recipe == "recipes.autobridge:pretrain_config" and plan.model_arg
    assert plan.metadata["hf_config"] == f"hf:{FIXTURES / name}" and "hf_offline" not in plan.metadata
    # architecture details are Bridge's reading of the config, and agree with ours
    assert (cfg.model.rotary_base, cfg.model.qk_layernorm, cfg.model.add_qkv_bias) == (
        m.rotary_base,
        m.qk_layernorm,
        m.qkv_bias,
    )
    assert (cfg.model.num_layers, cfg.model.hidden_size, cfg.model.num_attention_heads) == (
        2,
        m.hidden_size,
        m.num_attention_heads,
    )
    assert cfg.model.num_query_groups == m.num_query_groups and cfg.model.ffn_hidden_size == m.ffn_hidden_size
    assert (cfg.model.num_moe_experts or 0) == m.num_experts
    assert cfg.model.mtp_num_layers is None
    # a MoE model is benchmarked with balanced routing: expert load must not depend on the optimizer
    assert cfg.model.moe_router_force_load_balancing is bool(m.num_experts)
    assert type(cfg.optimizer).__name__ == "OursOptimizerConfig"
    assert cfg.optimizer.muonbench_optimizer["name"] == "muon"
    assert cfg.ddp.use_distributed_optimizer is False
    assert cfg.train.train_iters == root.bench.steps and cfg.train.global_batch_size == 4
    assert cfg.tokenizer.tokenizer_type == "NullTokenizer" and cfg.tokenizer.vocab_size == m.vocab_size


@pytest.mark.parametrize("name", list(CASES))
def test_recorded_flops_equal_bridge_count(built, name: str) -> None:
    from megatron.bridge.training.utils.flop_utils import num_floating_point_operations

    from bench.flops import model_flops_per_token

    root, cfg, _ = built[name]
    tokens = root.parallelism.gbs * root.model.seq_length
    bridge = num_floating_point_operations(cfg, batch_size=root.parallelism.gbs)
    assert bridge == pytest.approx(tokens * model_flops_per_token(root.model), rel=1e-9)


def test_adamw_keeps_bridge_distributed_optimizer(built) -> None:
    from recipes.bridge import make_config_container

    cfg, plan = make_config_container(_root("llama3_8b", "optimizer=adamw"))
    assert plan.optimizer_impl == "megatron" and cfg.optimizer.optimizer == "adam"
    assert cfg.ddp.use_distributed_optimizer is True
    assert cfg.model.num_layers == 2 and cfg.model.rotary_base == 500000


def test_no_bridge_refused_before_launch(tmp_path: Path) -> None:
    """Mixtral: Bridge 0.6.2 has no bridge; the front says so naming the family and the bridged ones."""
    from bench.sweep import preflight

    errors = preflight([[f"model=hf:{FIXTURES / 'mixtral_8x7b'}", "model.num_layers=2", *LAYOUT,
                         f"bench.out_dir={tmp_path}"]])  # fmt: skip
    assert len(errors) == 1
    assert "model.family='mixtral'" in errors[0] and "no bridge" in errors[0] and "'llama'" in errors[0]
    assert not any(tmp_path.iterdir())  # nothing written


def test_bridged_families_are_registered_in_bridge_source() -> None:
    """Each family we route through AutoBridge names an architecture Bridge's source registers a bridge for."""
    from muonbench.families import FAMILIES
    from recipes.fields import bridge_version

    if bridge_version() is None:
        pytest.skip("megatron-bridge is not installed")
    from importlib import metadata

    root = Path(str(metadata.distribution("megatron-bridge").locate_file("megatron/bridge/models")))
    source = "\n".join(p.read_text(encoding="utf-8") for p in root.rglob("*_bridge.py"))
    for family, fam in FAMILIES.items():
        registered = f"source={fam.architecture}" in source or f'source="{fam.architecture}"' in source
        assert registered == fam.bridged, family


def test_family_outside_the_table_is_bridge_only(built) -> None:
    """Gemma (model_type `gemma`) was refused as unsupported although Bridge maps it; now its fields are the
    provider's, and the engines without a builder of it refuse it naming engine=bridge."""
    import muonbench
    from muonbench.families import FAMILIES

    root, cfg, _ = built["gemma_2b"]
    m = root.model
    assert m.family == "gemma" and "gemma" not in FAMILIES
    assert (m.activation, m.num_query_groups, m.kv_channels, m.tie_embeddings) == ("gelu_tanh", 1, 256, True)
    assert type(cfg.model).__name__ == "GemmaModelProvider"
    for engine in ("hf", "megatron"):
        with pytest.raises(muonbench.ConfigError, match=r"model.family='gemma': .*only engine=bridge builds it"):
            muonbench.check_runnable(_root("gemma_2b", f"engine={engine}", "parallelism=single_gpu"))


def test_without_bridge_a_family_outside_the_table_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import muonbench
    from recipes import autobridge

    monkeypatch.setattr(autobridge, "bridge_importable", lambda: False)
    with pytest.raises(muonbench.ConfigError, match=r"model_type='gemma': not supported; supported: .*AutoBridge"):
        _root("gemma_2b")
