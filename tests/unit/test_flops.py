"""FLOP accounting (bench/flops.py): Megatron model FLOPs, NS FLOPs per matrix, per step and per GPU, and the CLI.

Published numbers come from docs/references.md (#megatron-flops, #nvidia-table1, #mb-perf-recipes, #ns-flops);
hand-computed ones are written out factor by factor.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import sysconfig
from dataclasses import replace
from pathlib import Path

import pytest

from bench import flops
from muonbench import ConfigError, load
from muonbench.pipeline import parse_pipeline_layout, stage_layers
from muonbench.schema import ModelConfig, ParallelismConfig
from optim.cost import CONVENTIONS, ns_flops

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cfgs() -> dict[str, ModelConfig | ParallelismConfig]:
    out: dict[str, ModelConfig | ParallelismConfig] = {}
    for model, par in (("kimi_k2", "pp4_dp64_ep64"), ("qwen3_30b_a3b", "dp8_ep8")):
        root = load([f"model={model}", f"parallelism={par}"])
        out[model], out[par] = root.model, root.parallelism
    for model in ("qwen3_moe_tiny", "kimi_k2_tiny"):
        out[model] = load([f"model={model}"]).model
    return out


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


# ------------------------------------------------------------------------------------------------ model FLOPs
def test_published_model_flops(cfgs) -> None:
    """Kimi K2 204.5 and Qwen3-30B-A3B 23.0 GFLOP/token at seq 4096 (MB's figures), and per global batch."""
    kimi, qwen = cfgs["kimi_k2"], cfgs["qwen3_30b_a3b"]
    assert rel(flops.model_flops_per_token(kimi), 204.5e9) < 0.005
    assert rel(flops.model_flops_per_token(qwen), 23.0e9) < 0.005
    assert rel(flops.model_flops_per_step(kimi, cfgs["pp4_dp64_ep64"]), 3.431e18) < 0.001
    assert rel(flops.model_flops_per_step(qwen, cfgs["dp8_ep8"]), 4.825e16) < 0.001


@pytest.mark.parametrize(
    ("model", "terms"),
    [
        ("kimi_k2", {"mlp": 145.07, "attn_linear": 37.01, "attn_core": 15.35, "logits": 7.05}),
        ("qwen3_30b_a3b", {"mlp": 10.87, "attn_linear": 5.44, "attn_core": 4.83, "logits": 1.87}),
    ],
)
def test_breakdown_matches_worked_factors(cfgs, model: str, terms: dict[str, float]) -> None:
    """Each term of docs/references.md (published model FLOPs) worked table, so a compensating error in two terms cannot pass."""
    got = flops.model_flops_breakdown(cfgs[model])
    for term, gflop in terms.items():
        assert rel(got[term], gflop * 1e9) < 0.002, (term, got[term])


def test_hand_computed_tiny_models(cfgs) -> None:
    """GQA and MLA paths on tiny shapes, written out factor by factor."""
    # qwen3_moe_tiny: h 64, 2 layers all MoE, 4 heads x 16 (q 64), 2 groups (kv 32), 8 experts top-2 of 32, V 512, s 64
    mlp = 6 * 64 * (3 * 32 * 2 * 2)  # 6 h (g f_moe k n_moe)
    lin = 6 * 2 * (64 * (64 + 2 * 32) + 64 * 64)  # 6 L (h (q + 2 kv) + q h)
    core = 6 * 2 * 64 * 64  # 6 L q s
    logits = 6 * 64 * 512
    assert (mlp, lin, core, logits) == (147_456, 147_456, 49_152, 196_608)
    assert flops.model_flops_per_token(cfgs["qwen3_moe_tiny"]) == mlp + lin + core + logits
    # kimi_k2_tiny: h 64, 3 layers (1 dense FFN 128, 2 MoE: 8 experts top-2 of 32 + shared 32), 4 heads,
    # r_q 32, r_kv 16, d_qk 16, d_rope 8, d_v 16, V 512, s 64
    mlp = 6 * 64 * (3 * 128 * 1 + 3 * 32 * 2 * 2 + 3 * 32 * 2)
    lin = 6 * 3 * (32 * (64 + 4 * 24 + 1) + 16 * (64 + 4 * 32 + 1) + 64 * 8 + 4 * 16 * 64)
    core = 3 * 3 * 64 * 4 * (16 + 8 + 16)
    assert (mlp, lin, core) == (368_640, 231_264, 92_160)
    assert flops.model_flops_per_token(cfgs["kimi_k2_tiny"]) == mlp + lin + core + 196_608
    # no q_lora_rank: one q projection h x n_h (d_qk + d_rope) replaces r_q (h + n_h (d_qk + d_rope) + 1)
    no_q_lora = replace(cfgs["kimi_k2_tiny"], q_lora_rank=0)
    delta = 6 * 3 * (64 * 4 * 24 - 32 * (64 + 4 * 24 + 1))
    assert flops.model_flops_per_token(no_q_lora) - flops.model_flops_per_token(cfgs["kimi_k2_tiny"]) == delta


def test_logits_use_the_padded_vocabulary(cfgs) -> None:
    """Megatron pads V to a multiple of make_vocab_size_divisible_by x TP."""
    assert flops.padded_vocab_size(151936, 128) == 151936
    assert flops.padded_vocab_size(513, 128) == 640
    assert flops.padded_vocab_size(513, 128, tp=2) == 768
    m = replace(cfgs["qwen3_moe_tiny"], vocab_size=513)
    assert flops.model_flops_breakdown(m)["logits"] == 6 * 64 * 640
    assert flops.model_flops_breakdown(m, tp=2)["logits"] == 6 * 64 * 768


# ------------------------------------------------------------------------------------------------ NS per matrix
def test_ns_flops_formulas_by_hand() -> None:
    """m = 2, n = 3: plain k(4m^2n + 2m^3), SYRK k(3m^2n + m^3), Gram 3s m^2n + (4k - 3s) m^3."""
    assert ns_flops(2, 3, 1, "plain") == 4 * 4 * 3 + 2 * 8
    assert ns_flops(3, 2, 1, "plain") == ns_flops(
        2, 3, 1, "plain"
    )  # transposed to the short side
    assert ns_flops(2, 3, 5, "syrk") == 5 * (3 * 4 * 3 + 8)
    assert ns_flops(2, 3, 5, "gram") == 6 * 4 * 3 + 14 * 8  # k = 5, restart after step 2
    assert ns_flops(2, 3, 2, "gram") == 3 * 4 * 3 + 5 * 8  # restart at k is no restart
    assert ns_flops(2, 3, 8, "gram", restart_iterations=(2, 5)) == 9 * 4 * 3 + (32 - 9) * 8
    assert ns_flops(64, 64, 5, "gram") == ns_flops(64, 64, 5, "syrk")  # equal on square matrices


@pytest.mark.parametrize(
    ("shape", "tflop"),
    [
        ((4096, 7168), (3.09, 2.15, 1.68)),
        ((7168, 2048), (0.687, 0.494, 0.301)),
        ((7168, 8192), (12.10, 8.16, 7.68)),
        ((12288, 1536), (0.616, 0.453, 0.225)),
        ((1536, 7168), (0.375, 0.272, 0.152)),
        ((36864, 7168), (41.6, 30.3, 16.5)),
        ((4096, 2048), (0.430, 0.301, 0.223)),
        ((512, 2048), (0.0121, 0.0087, 0.0051)),
        ((5120, 2048), (0.515, 0.365, 0.249)),
        ((1536, 2048), (0.133, 0.091, 0.080)),
        ((2048, 768), (0.0287, 0.0204, 0.0136)),
    ],
)
def test_ns_flops_anchor_table(shape: tuple[int, int], tflop: tuple[float, float, float]) -> None:
    """docs/references.md#ns-flops per-matrix table (k = 5), all three conventions, to the table's printed precision."""
    for conv, want in zip(CONVENTIONS, tflop, strict=True):
        assert rel(ns_flops(*shape, 5, conv), want * 1e12) < 0.02, (shape, conv)


def test_ns_flops_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match=r"convention='fast'.*plain"):
        ns_flops(2, 3, 5, "fast")
    with pytest.raises(ValueError, match="num_ns_steps=0"):
        ns_flops(2, 3, 0)


# ------------------------------------------------------------------------------------------------ enumeration
def test_enumeration_counts_and_numel(cfgs) -> None:
    """Muon-managed parameters (docs/references.md#model-shapes: Kimi ~1.024 T, Qwen ~29.9 B) and the per-layer matrix counts."""
    kimi = flops.enumerate_ns_matrices(cfgs["kimi_k2"])
    qwen = flops.enumerate_ns_matrices(cfgs["qwen3_30b_a3b"])
    assert rel(sum(m.count * m.rows * m.cols for m in kimi), 1.024e12) < 0.005
    assert rel(sum(m.count * m.rows * m.cols for m in qwen), 29.9e9) < 0.005
    by = {m.kind: m for m in kimi}
    assert (by["expert_fc1"].rows, by["expert_fc1"].cols, by["expert_fc1"].count) == (4096, 7168, 23040)
    assert (by["mla_kv_down"].rows, by["mla_q_up"].rows, by["dense_fc1"].count, by["shared_fc2"].count) == (
        576,
        12288,
        1,
        60,
    )
    assert by["expert_fc1"].expert and not by["shared_fc1"].expert and by["router"].count == 60
    assert {m.kind: (m.rows, m.count) for m in qwen if m.kind.startswith("attn")} == {
        "attn_q": (4096, 48),
        "attn_k": (512, 48),
        "attn_v": (512, 48),
        "attn_proj": (2048, 48),
    }


@pytest.mark.parametrize("option", ["split_qkv", "split_mla_kv_down", "split_gate_up"])
def test_splits_preserve_elements(cfgs, option: str) -> None:
    """A split changes the matrices, never the parameter count."""
    for name in ("qwen3_30b_a3b", "kimi_k2"):
        base = {"split_qkv": False, "split_mla_kv_down": False, "split_gate_up": False}
        a = flops.enumerate_ns_matrices(cfgs[name], **base)
        b = flops.enumerate_ns_matrices(cfgs[name], **{**base, option: True})
        assert sum(m.count * m.rows * m.cols for m in a) == sum(m.count * m.rows * m.cols for m in b)
    kinds = {
        m.kind
        for m in flops.enumerate_ns_matrices(cfgs["kimi_k2"], split_mla_kv_down=True, split_gate_up=True)
    }
    assert {"mla_kv_down_latent", "mla_kv_down_rope", "mla_kv_up_k", "mla_q_up_rope", "expert_gate"} <= kinds
    assert "router" not in {
        m.kind for m in flops.enumerate_ns_matrices(cfgs["kimi_k2"], router_to_matrix=False)
    }


@pytest.mark.parametrize(
    ("model", "plain", "syrk", "gram"),
    [("kimi_k2", 8.82e16, 6.16e16, 4.64e16), ("qwen3_30b_a3b", 1.035e15, 7.12e14, 5.95e14)],
)
def test_ns_per_step_published(cfgs, model: str, plain: float, syrk: float, gram: float) -> None:
    """docs/references.md#ns-flops: NS FLOPs of one optimizer step with MCore's QKV split."""
    mats = flops.enumerate_ns_matrices(cfgs[model])
    for conv, want in zip(CONVENTIONS, (plain, syrk, gram), strict=True):
        assert rel(flops.ns_flops_per_step(mats, 5, conv), want) < 0.005, conv


# ------------------------------------------------------------------------------------------------ per GPU
def test_layout_string_matches_megatron_bridge() -> None:
    """Our layout string unrolls to MB's _get_kimi_k2_pipeline_layout(4, 4) (read from the installed source)."""
    src = Path(sysconfig.get_paths()["purelib"]) / "megatron/bridge/recipes/kimi/h100/kimi_k2.py"
    expr = re.search(r"\(4, 4\): (.+),\n", src.read_text()).group(1)
    mb = eval(expr, {"__builtins__": {}})  # list arithmetic on string literals only
    short = {"embedding": "E", "decoder": "t", "loss": "L"}
    layout = load(["parallelism=pp4_dp64_ep64", "model=kimi_k2"]).parallelism.pipeline_layout
    assert parse_pipeline_layout(layout) == ["".join(short[x] for x in chunk) for chunk in mb]


def test_stage_layers_kimi(cfgs) -> None:
    stages = stage_layers(cfgs["kimi_k2"], cfgs["pp4_dp64_ep64"])
    assert [len(s) for s in stages] == [16, 16, 16, 13]
    assert stages[0][:5] == [0, 1, 2, 3, 16] and stages[3][-1] == 60


def test_ns_per_gpu_qwen_dp8_ep8(cfgs) -> None:
    """docs/references.md#ns-flops: 16 experts x 48 layers x 2 = 1,536 expert matrices + 24 of 192 attention per GPU, 1.29e14."""
    load_ = flops.ns_load_per_gpu(cfgs["qwen3_30b_a3b"], cfgs["dp8_ep8"])
    assert rel(load_["mean"]["plain"], 1.29e14) < 0.005
    assert rel(load_["max"]["plain"], load_["mean"]["plain"]) < 1e-9  # LPT balances this layout exactly
    k = load_["kinds_on_max_gpu"]
    assert k["expert_fc1"] + k["expert_fc2"] == 1536
    assert sum(v for kind, v in k.items() if kind.startswith("attn")) == 24


def test_ns_per_gpu_kimi_pp4_dp64_ep64(cfgs) -> None:
    """docs/references.md#ns-flops: 3.44e14 = the mean over 256 GPUs; the max is PP rank 0 (15 MoE layers x 6 experts x 2 = 180
    expert matrices, plus the dense layer's fc1 whole on one DP rank)."""
    model, par = cfgs["kimi_k2"], cfgs["pp4_dp64_ep64"]
    load_ = flops.ns_load_per_gpu(model, par)
    total = flops.ns_flops_per_step(flops.enumerate_ns_matrices(model))
    assert rel(load_["mean"]["plain"], 3.44e14) < 0.005
    assert rel(load_["mean"]["plain"], total / par.world_size) < 1e-9  # TP = 1: each matrix once
    k = load_["kinds_on_max_gpu"]
    assert (load_["max_pp_rank"], k["expert_fc1"], k["expert_fc2"], k["dense_fc1"]) == (0, 90, 90, 1)
    expert = ns_flops(4096, 7168) + ns_flops(7168, 2048)
    assert rel(load_["max"]["plain"], 90 * expert + ns_flops(36864, 7168)) < 1e-9
    assert [s["moe_layers"] for s in load_["stages"]] == [15, 16, 16, 13]


def test_ns_per_gpu_options(cfgs) -> None:
    """Replication and TP modes change the per-GPU load as stated."""
    model = cfgs["qwen3_moe_tiny"]
    dp2 = ParallelismConfig(name="dp2", world_size=2, nodes=1, gpus_per_node=2)
    total = flops.ns_flops_per_step(flops.enumerate_ns_matrices(model))
    assert rel(flops.ns_load_per_gpu(model, dp2, distributed="none")["max"]["plain"], total) < 1e-12
    assert flops.ns_load_per_gpu(model, dp2)["max"]["plain"] < 0.6 * total
    tp2 = ParallelismConfig(name="tp2", world_size=2, tp=2, etp=2, nodes=1, gpus_per_node=2)
    dup = flops.ns_load_per_gpu(model, tp2, tp_mode="duplicated")["max"]["plain"]
    block = flops.ns_load_per_gpu(model, tp2, tp_mode="blockwise")["max"]["plain"]
    assert (
        rel(dup, total) < 1e-12 and block < 0.6 * dup
    )  # blockwise: each rank orthogonalizes its shards only
    dist = flops.ns_load_per_gpu(model, tp2, tp_mode="distributed")["max"]
    assert flops.ns_load_per_gpu(model, tp2, tp_mode="distributed_gram")["max"] == dist  # gram: its own column
    assert flops.ns_load_per_gpu(model, tp2, tp_mode="auto")["max"]["plain"] == block  # counted as blockwise
    with pytest.raises(ValueError, match=r"tp_mode='sideways'.*duplicated.*auto"):
        flops.ns_load_per_gpu(model, tp2, tp_mode="sideways")


# ------------------------------------------------------------------------------------------------ CLI and errors
def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench.tools.flops", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_cli_json() -> None:
    """`format=json` prints one JSON object with the FLOP keys reports read."""
    res = _cli("model=qwen3_30b_a3b", "parallelism=dp8_ep8", "format=json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    for key in (
        "model_flops_per_token",
        "model_flops_per_step",
        "ns_flops_per_step",
        "ns_flops_per_gpu_max",
        "ns_flops_per_step_syrk",
        "ns_flops_per_step_gram",
        "ns_flops_per_gpu_max_syrk",
        "ns_flops_per_gpu_max_gram",
        "ns_flops_per_gpu_mean",
    ):
        assert isinstance(out[key], float), key
    assert rel(out["model_flops_per_token"], 23.0e9) < 0.005
    assert rel(out["ns_flops_per_gpu_max"], 1.29e14) < 0.005
    assert {m["kind"] for m in out["ns_matrices"]} >= {"attn_q", "expert_fc1", "router"}


def test_cli_text_and_optimizer_options() -> None:
    """The text form prints the tables; optimizer fields drive the enumeration (split_qkv=false: fused QKV)."""
    res = _cli(
        "model=qwen3_30b_a3b", "parallelism=dp8_ep8", "optimizer.split_qkv=false", "optimizer.num_ns_steps=6"
    )
    assert res.returncode == 0, res.stderr
    assert "attn_qkv" in res.stdout and "5120x2048" in res.stdout and "num_ns_steps=6" in res.stdout


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["model=qwen3_30b_a3b", "parallelism=pp4_dp64_ep64"], "parallelism.pipeline_layout"),
        (["model=kimi_k2", "parallelism=dp8_ep8", "parallelism.ep=5"], "parallelism.ep"),
        (["model=qwen3_30b_a3b", "parallelism=dp8_ep8", "parallelism.gbs=500"], "parallelism.gbs"),
        (["model=qwen3_30b_a3b", "format=xml"], "format"),
    ],
)
def test_cli_bad_config_names_field_value_rule(args: list[str], field: str) -> None:
    res = _cli(*args)
    assert res.returncode == 2
    line = res.stderr.strip().splitlines()[0]
    assert line.startswith(f"error: {field}="), line
    assert "must" in line or "holds" in line


def test_bad_layout_in_python(cfgs) -> None:
    bad = replace(cfgs["pp4_dp64_ep64"], pipeline_layout="Et*4|(t*4|)*14tX")
    with pytest.raises(ValueError, match=r"parallelism.pipeline_layout='Et\*4.*only E, t, m, L"):
        stage_layers(cfgs["kimi_k2"], bad)
    with pytest.raises(ConfigError, match=r"^parallelism.ep=5: "):
        load(["model=kimi_k2", "parallelism=dp8_ep8", "parallelism.ep=5"])
