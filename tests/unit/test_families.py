"""The model-family table: a new family is one entry (`muonbench.families.FAMILIES`) with its reader and exporter;
every consumer (config checks, `config_json`, the Bridge check) reads the table."""

from __future__ import annotations

from typing import Any

import pytest

import muonbench
from muonbench import families, hf_export
from muonbench.schema import ModelConfig


def _toy_read(cfg: Any) -> dict[str, Any]:
    return {"family": "toy_moe", "num_layers": cfg.num_hidden_layers}


def _toy_export(model: ModelConfig) -> dict[str, Any]:
    return {"num_experts": model.num_experts, "toy_key": 1}


TOY = families.Family(
    architecture="ToyMoeForCausalLM",
    read=_toy_read,
    export=_toy_export,
    moe=True,
    bridged=False,
    aliases=("toy2",),
)


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> families.Family:
    monkeypatch.setitem(families.FAMILIES, "toy_moe", TOY)
    return TOY


def test_a_toy_family_needs_only_its_entry(toy: families.Family) -> None:
    """Localises a consumer that keeps its own list of families (a second list drifts: mixtral and olmoe were
    missing from the MoE rule)."""
    root = muonbench.load(["model.family=toy_moe"])
    assert root.model.family == "toy_moe"
    with pytest.raises(
        muonbench.ConfigError, match="model.num_experts=0: must be >= 1: model.family='toy_moe'"
    ):
        muonbench.load(["model.family=toy_moe", "model.num_experts=0"])
    out = families.config_json(root.model)
    assert out["architectures"] == ["ToyMoeForCausalLM"] and out["toy_key"] == 1
    assert out["hidden_size"] == root.model.hidden_size
    assert families.model_types()["toy2"] == "toy_moe"
    from recipes.autobridge import check_bridged

    with pytest.raises(ValueError, match="model.family='toy_moe'.*no bridge"):
        check_bridged(root.model)


def test_every_moe_family_refuses_zero_experts() -> None:
    """Localises the MoE rule knowing only qwen3_moe and deepseek_v3 (mixtral and olmoe passed with 0 experts)."""
    assert {n for n, f in families.FAMILIES.items() if f.moe} == {
        "qwen3_moe",
        "qwen2_moe",
        "mixtral",
        "olmoe",
        "gpt_oss",
        "deepseek_v2",
        "deepseek_v3",
    }
    with pytest.raises(
        muonbench.ConfigError, match="model.num_experts=0: must be >= 1: model.family='mixtral'"
    ):
        muonbench.load(["model.family=mixtral", "model.num_experts=0"])


def test_unknown_family_is_refused_naming_the_table() -> None:
    with pytest.raises(muonbench.ConfigError, match=r"model.family='gpt2': must be one of \['llama'"):
        muonbench.load(["model.family=gpt2"])
    assert hf_export.common  # the shared keys are built in one place
