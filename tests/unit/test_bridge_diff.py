"""bench.tools.bridge_diff on the live configs: Megatron-Bridge 0.6.2's ConfigContainer of the FLOP-matched Qwen3-30B-A3B
slice (built by its own recipe, offline) against the megatron engine's TransformerConfig / DDP / optimizer configs.

Localises: a fusion or buffer setting that differs between the two engines without being reported (the Bridge vs
megatron-engine throughput gap then has an unseen cause), shapes that stop matching (the two runs would no longer
be the same workload), and a new Bridge / Megatron-Core default that no rule classifies.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.bridge_live import bridge_importable, import_bridge

pytestmark = pytest.mark.filterwarnings("ignore")

_SKIP = bridge_importable()
if _SKIP:
    pytest.skip(_SKIP, allow_module_level=True)

SLICE = "experiment=h200/qwen3_30b_a3b_slice_flops_bridge_1gpu"
FLIPS = [
    "engine.moe_permute_fusion=true",
    "engine.apply_rope_fusion=true",
    "engine.moe_router_fusion=true",
    "engine.moe_router_dtype=none",
    "engine.grad_reduce_in_fp32=false",
]
"""The engine options set to Bridge's values; each removes one row of `PERF_DIFF`."""
FLIPPED_ROWS = {
    "model.moe_permute_fusion",
    "model.apply_rope_fusion",
    "model.moe_router_fusion",
    "model.moe_router_dtype",
    "ddp.grad_reduce_in_fp32",
}

# (Bridge, engine) of every setting that differs and can change the step time on the one-GPU bf16 slice.
PERF_DIFF: dict[str, tuple[Any, Any]] = {
    "model.moe_permute_fusion": (True, False),
    "model.apply_rope_fusion": (True, False),
    "model.moe_router_fusion": (True, False),
    "model.moe_router_dtype": (None, "fp32"),
    "model.cross_entropy_fusion_impl": ("te", "native"),
    "model.cuda_graph_impl": ("transformer_engine", "none"),
    "model.cuda_graph_scope": (["moe_router", "moe_preprocess"], None),
    "train.manual_gc": ("full collection every 100 steps", "young generations at each step start"),
    "ddp.grad_reduce_in_fp32": (False, True),
    "ddp.overlap_grad_reduce": (True, False),
    "ddp.overlap_param_gather": (True, False),
    "optimizer.overlap_param_gather": (True, False),
    "data.loader": (
        "MockGPTDataset in a DataLoader (num_workers=8, pin_memory=True)",
        "megatron_data.mock_batches (made on the GPU)",
    ),
    "env.PYTORCH_CUDA_ALLOC_CONF": ("expandable_segments:True", "unset"),
}


@pytest.fixture(scope="module")
def diffs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The slice compared as configured and with the engine options set to Bridge's values (Bridge imports once)."""
    import_bridge()
    from bench.tools.bridge_diff import compare

    return {
        "as_is": compare([SLICE], hf_dir=tmp_path_factory.mktemp("hf_as_is")),
        "flipped": compare([SLICE, *FLIPS], hf_dir=tmp_path_factory.mktemp("hf_flipped")),
    }


def test_shapes_batch_and_flops_agree(diffs) -> None:
    """Both sides build the same 6-layer x 128-expert slice at the same batch, and Bridge's FLOP count of a step
    (`num_floating_point_operations`) equals ours (bench/flops.py), 6.058e15."""
    diff = diffs["as_is"]
    shapes = {r.field: r for r in diff.of_kind("shape")}
    assert all(r.note == "equal" for r in shapes.values()), [r for r in shapes.values() if r.note != "equal"]
    want = {
        "layers.implementation": "te",
        "model.num_layers": 6,
        "model.hidden_size": 2048,
        "model.num_moe_experts": 128,
        "model.moe_ffn_hidden_size": 768,
        "model.moe_router_topk": 8,
        "model.moe_layer_freq": [1] * 6,  # Bridge's 1 read as the per-layer list the engine passes
        "gpt_model.vocab_size": 151936,
        "gpt_model.max_sequence_length": 4096,
        "train.micro_batch_size": 4,
        "train.global_batch_size": 328,
    }
    assert {k: shapes[k].bridge for k in want} == want
    flops = shapes["flops.model_flops_per_step"].engine
    assert flops == shapes["flops.model_flops_per_step"].bridge
    assert flops == pytest.approx(6.058e15, rel=1e-3)


def test_every_perf_difference_is_reported_with_its_values(diffs) -> None:
    """The settings that can change the step time and differ are exactly these, with these values."""
    rows = diffs["as_is"].of_kind("perf", "unclassified")
    got = {r.field: (r.bridge, r.engine) for r in rows}
    assert got == PERF_DIFF


def test_no_unclassified_difference(diffs) -> None:
    """Every differing setting has a rule (a new default of Bridge or Megatron-Core must be looked at first)."""
    assert diffs["as_is"].of_kind("unclassified") == []


@pytest.mark.parametrize("variant", ["optimizer=muon", "optimizer=muon_megatron", "engine.layers=local"])
def test_other_optimizers_and_layers_are_classified(variant: str, tmp_path) -> None:
    """Ours, Megatron's Muon and the engine's local layers: every difference has a rule; only the layer row may
    differ among the shapes (local layers are the one intended difference)."""
    import_bridge()
    from bench.tools.bridge_diff import compare

    diff = compare([SLICE, variant], hf_dir=tmp_path)
    assert diff.of_kind("unclassified") == []
    differing = [r.field for r in diff.of_kind("shape") if r.note != "equal"]
    assert differing == (["layers.implementation"] if variant == "engine.layers=local" else [])
    if variant == "optimizer=muon_megatron":
        assert (diff.row("optimizer.optimizer").bridge, diff.row("optimizer.optimizer").engine) == (
            "dist_muon",
            "muon",
        )


def test_origins_show_who_sets_each_value(diffs) -> None:
    """Bridge's recipe turns permute fusion on; our recipes/ overrides turn router fusion and rope fusion on; the
    engine's megatron_model passes its values explicitly (from the engine options)."""
    diff = diffs["as_is"]
    origins = {
        name: (diff.row(name).bridge_origin, diff.row(name).engine_origin)
        for name in ("model.moe_permute_fusion", "model.moe_router_fusion", "model.apply_rope_fusion")
    }
    assert origins == {
        "model.moe_permute_fusion": ("Bridge", "megatron_model"),
        "model.moe_router_fusion": ("recipes/", "megatron_model"),
        "model.apply_rope_fusion": ("recipes/", "megatron_model"),
    }


def test_inert_rows_name_their_reason(diffs) -> None:
    """Differences that cannot matter on one GPU in bf16 are listed apart, each with its reason."""
    inert = {r.field: r.note for r in diffs["as_is"].of_kind("inert")}
    assert "at PP = 1" in inert["model.deallocate_pipeline_outputs"]
    assert "precision is bf16" in inert["model.fp8_recipe"]
    assert "one GPU" in inert["env.TORCH_NCCL_HIGH_PRIORITY"]
    assert "DotProductAttention" in inert["model.masked_softmax_fusion"]
    assert all(inert.values())


def test_suspects_that_agree_are_shown(diffs) -> None:
    """Gradient-accumulation fusion (off on both: Bridge's node check / APEX missing), grouped GEMM experts, the
    alltoall dispatcher and no recomputation are reported as agreeing, not silently dropped."""
    same = {r.field: (r.bridge, r.engine) for r in diffs["as_is"].of_kind("same")}
    assert same["model.gradient_accumulation_fusion"] == (False, False)
    assert same["model.moe_grouped_gemm"] == (True, True)
    assert same["model.moe_token_dispatcher_type"] == ("alltoall", "alltoall")
    assert same["model.recompute_granularity"] == (None, None)
    assert same["ddp.use_distributed_optimizer"] == (True, True)


def test_engine_flips_remove_exactly_their_rows(diffs) -> None:
    """engine.moe_permute_fusion=true engine.apply_rope_fusion=true engine.moe_router_fusion=true
    engine.moe_router_dtype=none engine.grad_reduce_in_fp32=false set the four TransformerConfig fields and the DDP
    field as Bridge does: those rows leave the table (no inert or same row appears for them), every other
    difference stays with its values."""
    flipped = diffs["flipped"]
    got = {r.field: (r.bridge, r.engine) for r in flipped.of_kind("perf", "unclassified")}
    assert FLIPPED_ROWS <= set(PERF_DIFF)
    assert got == {k: v for k, v in PERF_DIFF.items() if k not in FLIPPED_ROWS}
    assert not FLIPPED_ROWS & {r.field for r in flipped.rows}
    assert flipped.engine_overrides[-len(FLIPS) :] == FLIPS
    assert all(r.note == "equal" for r in flipped.of_kind("shape"))


def test_render_has_the_four_tables(diffs) -> None:
    from bench.tools.bridge_diff import render

    text = render(diffs["as_is"])
    assert text.count("| field | Megatron-Bridge | megatron engine |") == 4
    assert "| `model.moe_permute_fusion` | True (Bridge) | False (megatron_model) |" in text


def test_engine_group_override_is_refused() -> None:
    from bench.tools.bridge_diff import split_args

    with pytest.raises(ValueError, match="engines are fixed"):
        split_args([SLICE, "engine=hf"])
    assert split_args([SLICE, "optimizer=muon", "engine.layers=local"]) == (
        [SLICE, "optimizer=muon"],
        ["engine.layers=local"],
    )


def test_cli_says_bridge_needs_transformer_engine() -> None:
    """Without TE the product does not import Bridge (the stand-in is for tests only): a clear exit, no traceback."""
    from bench.engines.megatron_model import te_available
    from bench.tools.bridge_diff import main

    if te_available():
        pytest.skip("Transformer Engine imports here: the CLI runs")
    with pytest.raises(SystemExit, match="transformer_engine"):
        main([SLICE])
