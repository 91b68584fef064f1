"""Every YAML of the config tree composes, is typed by its group's schema, and validates (config.load)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from muonbench import CONF_DIR, engines, load, schema

GROUPS = ("model", "parallelism", "optimizer", "hardware", "precision", "engine", "launcher")
# Options that only validate next to a matching model (experts divisible by EP, layers matching the layout).
PARTNERS: dict[str, list[str]] = {
    "parallelism/pp4_dp64_ep64": ["model=kimi_k2"],
    "parallelism/dp8_ep8": ["model=qwen3_30b_a3b"],
}
OPTION_SCHEMA = {
    **schema.SCHEMAS,
    **{f"optimizer/{k}": v for k, v in schema.optimizer_schemas().items()},
    **{f"engine/{k}": e.config for k, e in engines.ENGINES.items()},
}


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def _experiments() -> list[str]:
    root = CONF_DIR / "experiment"
    return sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml"))


# model/hf is the placeholder `model=hf:<config.json>` fills (tests/unit/test_hf_model.py).
GROUP_OPTIONS = [(g, o) for g in GROUPS for o in _options(g) if (g, o) != ("model", "hf")]


def test_tree_has_the_required_options() -> None:
    """Localises a missing or misnamed config file (the issue lists these names)."""
    required = {
        "model": {
            "kimi_k2",
            "qwen3_30b_a3b",
            "qwen3_moe_tiny",
            "kimi_k2_tiny",
            "qwen3_30b_a3b_slice",
            "kimi_k2_slice",
        },
        "parallelism": {"pp4_dp64_ep64", "dp8_ep8", "single_gpu", "cpu_dp2", "cpu_dp4"},
        "optimizer": {"adamw", "muon", "mop", "soap_rekls", "muon_megatron"},
        "hardware": {"gb300", "b200", "h200", "h100", "cpu"},
        "precision": {"bf16", "fp8_mx"},
        "engine": {"hf", "megatron", "bridge"},
        "launcher": {"local", "slurm"},
    }
    for group, names in required.items():
        assert names <= set(_options(group)), (group, names - set(_options(group)))
    assert {
        "gb300/kimi_k2_muon",
        "gb300/kimi_k2_adamw",
        "gb300/qwen3_30b_a3b_muon",
        "gb300/qwen3_30b_a3b_adamw",
        "h200/qwen3_30b_a3b_slice_adamw_1gpu",
        "h200/qwen3_30b_a3b_slice_muon_1gpu",
    } <= set(_experiments())


@pytest.mark.parametrize(("group", "option"), GROUP_OPTIONS, ids=[f"{g}/{o}" for g, o in GROUP_OPTIONS])
def test_group_option_composes_typed(group: str, option: str) -> None:
    """Each option composes with the rest of the defaults, validates, and is typed by its group's schema."""
    root = load([f"{group}={option}", *PARTNERS.get(f"{group}/{option}", [])])
    node = getattr(root, group)
    expected = OPTION_SCHEMA.get(group) or OPTION_SCHEMA[f"{group}/{node.name}"]
    assert isinstance(node, expected), (group, option, type(node))
    if group != "optimizer":
        assert node.name == option
    text = (CONF_DIR / group / f"{option}.yaml").read_text()
    assert text.isascii()
    first_default = yaml.safe_load(text)["defaults"][0]
    assert first_default.startswith("base_") or (CONF_DIR / group / f"{first_default}.yaml").exists(), (
        first_default
    )


@pytest.mark.parametrize("name", _experiments())
def test_experiment_composes(name: str) -> None:
    """Golden combinations: global package, named by their path, and valid as a whole."""
    text = (CONF_DIR / "experiment" / f"{name}.yaml").read_text()
    assert text.startswith("# @package _global_"), name
    # An experiment on the model=hf placeholder needs a config (tests/unit/test_hf_model.py).
    model = [f"model=hf:{Path(__file__).parent / 'fixtures/hf_configs/qwen3_30b_a3b'}"] if "hf_" in name else []
    root = load([f"experiment={name}", *model])
    assert root.experiment_name == name
    gpu = Path(name).parts[0]
    if gpu != "cpu":
        assert root.hardware.name == gpu
        assert root.engine.device == "cuda"


def test_published_experiments_match_the_blog_setups() -> None:
    """The numbers behind NVIDIA's Table 1 (docs/references.md#nvidia-table1, #mb-perf-recipes): layouts, batch, precision, optimizer path."""
    kimi = load(["experiment=gb300/kimi_k2_muon"])
    p = kimi.parallelism
    assert (p.world_size, p.tp, p.pp, p.vp, p.ep, p.dp, p.expert_dp, p.mbs, p.gbs) == (
        256,
        1,
        4,
        4,
        64,
        64,
        1,
        2,
        4096,
    )
    assert (p.nodes, p.gpus_per_node) == (64, 4)
    assert kimi.precision.fp8_recipe == "mxfp8" and not kimi.precision.fp8_param_gather
    assert (
        kimi.optimizer.implementation == "megatron"
        and kimi.parallelism.distribution.grad_sync == "all_reduce"
    )
    adam = load(["experiment=gb300/kimi_k2_adamw"])
    # MB 0.6.2 perf_recipes/kimi/gb300/kimi_k2.py sets fp8_param_gather=False for both optimizers
    assert not adam.precision.fp8_param_gather and adam.optimizer.name == "adamw"
    qwen = load(["experiment=gb300/qwen3_30b_a3b_muon"])
    q = qwen.parallelism
    assert (q.world_size, q.ep, q.dp, q.mbs, q.gbs, q.grad_accum) == (8, 8, 8, 8, 512, 8)
    assert (kimi.bench.steps, kimi.bench.warmup_steps) == (50, 10)


def test_slice_keeps_per_layer_shapes() -> None:
    """Slices change only the stated fields of the full model."""
    full, sl = load(["model=qwen3_30b_a3b"]).model, load(["model=qwen3_30b_a3b_slice"]).model
    changed = {k for k in schema.ModelConfig.__dataclass_fields__ if getattr(full, k) != getattr(sl, k)}
    assert changed == {"name", "num_layers"}
    full, sl = load(["model=kimi_k2"]).model, load(["model=kimi_k2_slice"]).model
    changed = {k for k in schema.ModelConfig.__dataclass_fields__ if getattr(full, k) != getattr(sl, k)}
    assert changed == {"name", "num_layers", "num_experts", "moe_router_topk"}
    assert (sl.num_layers, sl.num_dense_layers, sl.num_experts) == (16, 1, 384 // 64)


def test_hardware_rows_carry_sources() -> None:
    """MFU needs a peak with a source (style: no guessed peaks)."""
    for option in _options("hardware"):
        hw = load([f"hardware={option}"]).hardware
        assert hw.source.strip()
        if option != "cpu":
            assert hw.peak_bf16_tflops > 0 and hw.peak_fp8_tflops >= 2 * hw.peak_bf16_tflops * 0.99


def test_muon_split_gate_up_option_is_muon_with_the_split() -> None:
    """`optimizer=muon_split_gate_up` composes to exactly `optimizer=muon optimizer.split_gate_up=true`, so the runs
    of both spellings share a configuration hash (bench.results.report pools by it)."""
    from muonbench import config_hash

    short = load(["optimizer=muon_split_gate_up"])
    long = load(["optimizer=muon", "optimizer.split_gate_up=true"])
    assert short.optimizer.split_gate_up and short == long
    assert config_hash(short) == config_hash(long) != config_hash(load(["optimizer=muon"]))


@pytest.mark.parametrize("experiment", ["cpu/qwen3_moe_tiny_dp2", "cpu/hf_tiny_dp2"])
@pytest.mark.parametrize("steps", [(30, 5), (4, 1)])
def test_cpu_smoke_lr_warmup_fits_its_steps(experiment: str, steps: tuple[int, int]) -> None:
    """Localises the CPU smoke warming the LR up over 2000 steps in a 4 to 30 step run: the LR stayed near 0 and
    AdamW and Muon ended at the same loss (6.242074 vs 6.242078), so the loss plot compared nothing."""
    import muonbench

    hf = [f"model=hf:{Path(__file__).parent / 'fixtures' / 'hf_configs' / 'qwen3_8b'}"] if "hf_" in experiment else []
    root = muonbench.load([f"experiment={experiment}", *hf, f"bench.steps={steps[0]}", f"bench.warmup_steps={steps[1]}"])
    assert root.optimizer.lr_warmup_steps == root.bench.warmup_steps < root.bench.steps
