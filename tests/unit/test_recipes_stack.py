"""The stack check run on the compute node (`recipes.versions.check_imported_stack`) and the offline Hugging Face
config the Bridge recipes read (`recipes.hf_config`), loaded back by transformers' AutoConfig with the Hub offline."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import muonbench
from recipes import hf_config as hc
from recipes.versions import check_imported_stack


def test_check_imported_stack_names_module_version_and_path() -> None:
    import torch

    want = "0.0.1"
    with pytest.raises(RuntimeError) as err:
        check_imported_stack(checked={"torch": want})
    msg = str(err.value)
    assert f"torch {torch.__version__}" in msg and f"checked against {want}" in msg
    assert str(Path(torch.__file__)) in msg
    stack = check_imported_stack(checked={"torch": torch.__version__.split("+")[0]})
    assert stack["torch"] == {"version": torch.__version__, "path": torch.__file__}


def test_check_imported_stack_refuses_a_missing_module() -> None:
    with pytest.raises(RuntimeError, match=r"no_such_module_muonbench None from None"):
        check_imported_stack(checked={"no_such_module_muonbench": "1.0"})


@pytest.mark.parametrize("model", ["qwen3_30b_a3b", "kimi_k2"])
def test_snapshot_layout_and_offline_autoconfig(model: str, tmp_path: Path, monkeypatch) -> None:
    from transformers import AutoConfig

    m = muonbench.load([f"model={model}"]).model
    source = hc.HUB_SOURCES[m.family]
    path = hc.write_snapshot(m, tmp_path / "hub")
    repo = tmp_path / "hub" / f"models--{source.repo_id.replace('/', '--')}"
    revision = (repo / "refs" / "main").read_text()
    assert path == repo / "snapshots" / revision / "config.json"
    if source.revision is not None:
        assert revision == source.revision  # the commit the Bridge recipe pins
    assert json.loads(path.read_text()) == hc.hf_config(m)

    import huggingface_hub.constants as hub_constants

    # offline_hub sets these for the process; recorded here so that they are restored after the test
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "unused"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", hub_constants.HF_HUB_CACHE)
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", hub_constants.HF_HUB_OFFLINE)
    env = hc.offline_hub(m, tmp_path)
    assert env == {"HF_HUB_CACHE": str((tmp_path / "hub").resolve()), "HF_HUB_OFFLINE": "1"}
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    cfg = AutoConfig.from_pretrained(
        source.repo_id, revision=source.revision
    )  # no network: offline cache only
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == (
        m.num_layers,
        m.hidden_size,
        m.vocab_size,
    )
    assert cfg.moe_intermediate_size == m.moe_ffn_hidden_size
    if m.family == "qwen3_moe":
        assert cfg.model_type == "qwen3_moe"
        assert (cfg.num_experts, cfg.num_experts_per_tok) == (m.num_experts, m.moe_router_topk)
        assert (cfg.num_key_value_heads, cfg.head_dim) == (m.num_query_groups, m.kv_channels)
    else:
        assert cfg.model_type == "deepseek_v3" and cfg.architectures == ["KimiK2ForCausalLM"]
        assert (cfg.n_routed_experts, cfg.num_experts_per_tok) == (m.num_experts, m.moe_router_topk)
        assert (cfg.q_lora_rank, cfg.kv_lora_rank) == (m.q_lora_rank, m.kv_lora_rank)
        assert cfg.first_k_dense_replace == m.num_dense_layers


def test_hf_config_refuses_an_unknown_family() -> None:
    import dataclasses

    m = dataclasses.replace(muonbench.load(["model=qwen3_30b_a3b"]).model, family="llama")
    with pytest.raises(ValueError, match=r"model.family='llama': allowed \['deepseek_v3', 'qwen3_moe'\]"):
        hc.hf_config(m)
