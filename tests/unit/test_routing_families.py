"""Routing of transformers models other than our benchmark families (GPT-2, GPT-NeoX, T5, Llama; tiny configs
built on CPU) and of custom models: embeddings and output heads go to AdamW by module type, whatever their names."""

from __future__ import annotations

import warnings

import pytest
import torch

import optim
from optim.configs import MuonConfig
from optim.routing import RoutingWarning, route_parameters
from tests.unit._optim_fixtures import one_thread  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")
SMALL = {"vocab_size": 96}


def _gpt2():  # type: ignore[no-untyped-def]
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=1, n_head=2, n_positions=32, **SMALL))


def _neox():  # type: ignore[no-untyped-def]
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = GPTNeoXConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, **SMALL
    )
    return GPTNeoXForCausalLM(cfg)


def _t5():  # type: ignore[no-untyped-def]
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2, tie_word_embeddings=False, **SMALL)
    return T5ForConditionalGeneration(cfg)


def _llama():  # type: ignore[no-untyped-def]
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, **SMALL
    )
    return LlamaForCausalLM(cfg)


def _non_matrix_ids(model: torch.nn.Module) -> set[int]:
    """Parameters that are not hidden matrices: every embedding, the output head and every non-2-D tensor."""
    ids = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    ids |= {id(p) for p in model.get_output_embeddings().parameters()}
    return ids | {id(p) for p in model.parameters() if p.ndim != 2}


@pytest.mark.parametrize("build", [_gpt2, _neox, _t5, _llama], ids=["gpt2", "gpt_neox", "t5", "llama"])
def test_hf_families_route_non_matrix_layers_to_adamw(build) -> None:  # type: ignore[no-untyped-def]
    """Localises GPT-2 wte/wpe, GPT-NeoX embed_in/embed_out or T5 shared / relative_attention_bias / lm_head
    being orthogonalized because only `embed_tokens` / `lm_head` were known."""
    torch.manual_seed(0)
    model = build()
    opt = optim.build_optimizer(model, MuonConfig(lr=0.01))
    matrix = {id(p) for g in opt.optimizers["matrix"].param_groups for p in g["params"]}
    adamw = {id(p) for g in opt.optimizers["adamw"].param_groups for p in g["params"]}
    assert adamw == _non_matrix_ids(model)
    assert matrix == {id(p) for p in model.parameters()} - adamw and matrix
    # by names alone (model.named_parameters()) the same split, and no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error", RoutingWarning)
        named = optim.build_optimizer(model.named_parameters(), MuonConfig(lr=0.01))
    assert {id(p) for g in named.optimizers["adamw"].param_groups for p in g["params"]} == adamw


class _Custom(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(1000, 16)
        self.body = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 1000)


def test_custom_names_route_by_module_type_and_warn_from_names() -> None:
    """Localises `emb` / `head` (names no list knows) going to Muon silently."""
    model = _Custom()
    routes = {r.name: (r.kind, r.optimizer) for r in route_parameters(model)}
    assert routes["emb.weight"] == ("embedding", "adamw")
    assert routes["head.weight"] == ("output", "adamw") and routes["head.bias"][1] == "adamw"
    assert routes["body.weight"] == ("matrix", "matrix")
    with pytest.warns(RoutingWarning, match=r"emb.weight \(1000, 16\), head.weight \(1000, 16\)"):
        from_names = {r.name: r.optimizer for r in route_parameters(model.named_parameters())}
    assert from_names["emb.weight"] == "matrix"  # cannot tell: routed as before, but said so
    tied = [("tied.weight", model.emb.weight), *model.named_parameters()]
    by_tie = {
        r.name: r.kind for r in route_parameters(tied)
    }  # listed twice: an embedding; same shape: output
    assert (
        by_tie["tied.weight"] == "embedding"
        and by_tie["head.weight"] == "output"
        and "emb.weight" not in by_tie
    )


def test_plain_tensors_and_empty_matrices_go_somewhere_that_steps() -> None:
    """Localises a list of tensors failing with "not enough values to unpack" and a (0, 5) matrix sent to Muon."""
    w, empty = torch.nn.Parameter(torch.randn(4, 4)), torch.nn.Parameter(torch.zeros(0, 5))
    opt = optim.build_optimizer([w, empty], MuonConfig(lr=0.01))
    assert [(r.name, r.optimizer) for r in opt.routes] == [("0", "matrix"), ("1", "adamw")]
    w.grad, empty.grad = torch.ones_like(w), torch.zeros_like(empty)
    opt.step()
    with pytest.raises(TypeError, match=r"\(name, tensor\) pairs or tensors; got int 3"):
        optim.build_optimizer([3], MuonConfig())
