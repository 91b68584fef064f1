"""Tied and untied embeddings of a Hugging Face config (`tie_word_embeddings`): read into `model.tie_embeddings`
(the family's own default where the file leaves it out), built by the engines as one shared matrix or two, and
counted as parameters, never as FLOPs (the output layer's logits cost the same either way)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import muonbench
from bench.flops import model_flops_per_token, padded_vocab_size
from bench.memory import param_counts

FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"

# Llama-3.2-1B (tied) by hand, Megatron's formula per token: 6 x (QKV + out) per layer + 6 q s (causal core)
# + 6 h 3 ffn (SwiGLU) + 6 h V (logits); L 16, h 2048, q 32 x 64, kv 8 x 64, ffn 8192, V 128256, s 4096
LLAMA32_1B_FLOPS = (
    6 * 16 * (2048 * (2048 + 2 * 512) + 2048 * 2048)
    + 6 * 16 * 2048 * 4096
    + 6 * 2048 * 3 * 8192 * 16
    + 6 * 2048 * 128256
)


def _root(name: str) -> muonbench.schema.RootConfig:
    return muonbench.load([f"model=hf:{FIXTURES / name}"])


def test_tie_word_embeddings_reaches_the_model_config() -> None:
    """Localises tied Llama-3.2-1B read as untied (or Llama-3-8B as tied): a wrong parameter count and memory."""
    assert _root("llama3_2_1b").model.tie_embeddings is True
    assert _root("llama3_8b").model.tie_embeddings is False


def test_missing_field_takes_the_family_default(tmp_path: Path) -> None:
    """A config.json without `tie_word_embeddings` is untied for Llama (LlamaConfig's default), not tied
    (PretrainedConfig's default, True)."""
    raw = json.loads((FIXTURES / "llama3_8b" / "config.json").read_text())
    del raw["tie_word_embeddings"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert muonbench.load([f"model=hf:{tmp_path}"]).model.tie_embeddings is False


def test_tied_changes_parameters_not_flops() -> None:
    """Tying removes one V x h matrix from the parameters; the logits GEMM (6 h V per token) stays."""
    root = _root("llama3_2_1b")
    untied = dataclasses.replace(root, model=dataclasses.replace(root.model, tie_embeddings=False))
    assert model_flops_per_token(root.model) == pytest.approx(LLAMA32_1B_FLOPS, rel=1e-3)
    assert model_flops_per_token(untied.model) == model_flops_per_token(root.model)
    v = padded_vocab_size(128256, root.model.make_vocab_size_divisible_by)
    assert param_counts(untied)[0] - param_counts(root)[0] == v * 2048


@pytest.mark.parametrize("tied", [True, False])
def test_hf_engine_builds_tied_and_untied(tied: bool) -> None:
    """The hf engine's model shares one matrix between embedding and output exactly when tied."""
    from bench.models.hf_build import build_model

    tiny = muonbench.load(
        ["experiment=cpu/hf_tiny_dp2", f"model=hf:{FIXTURES / ('llama3_2_1b' if tied else 'llama3_8b')}"]
    ).model
    assert tiny.tie_embeddings is tied
    net = build_model(tiny, seed=0)
    assert (net.lm_head.weight is net.model.embed_tokens.weight) is tied
    n_params = sum(p.numel() for p in net.parameters())  # a shared matrix is counted once
    norms = sum(p.numel() for n, p in net.named_parameters() if "norm" in n)
    assert n_params - norms == sum(param_counts(dataclasses.replace(muonbench.load([]), model=tiny)))
