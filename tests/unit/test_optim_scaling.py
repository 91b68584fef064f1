"""bench.tools.optim_scaling on CPU in one process: parameters as the Megatron adapter sees them, rows in JSON."""

from __future__ import annotations

import json
import math

import pytest
import torch

from bench.tools.optim_scaling import layer_params, main, parse_args, scaling_summary


@pytest.fixture(scope="module")
def qwen3() -> object:
    from muonbench import load

    return load(["model=qwen3_30b_a3b"]).model


def test_layer_params_match_megatron_layout(qwen3: object) -> None:
    """Localises a wrong parameter set: fused QKV with the per-query-group split (4 groups of [1024 q, 128 k,
    128 v] rows), o_proj, router, and 128 experts x fc1/fc2 as separate 2-D weights or as stacks."""
    specs = layer_params(qwen3, layers=2, scale=1.0, experts="separate", qkv="split")
    by_name = {s["name"]: s for s in specs}
    assert len(specs) == 2 * (3 + 2 * 128)
    qkv = by_name["decoder.layers.1.self_attention.linear_qkv.weight"]
    assert qkv["shape"] == (5120, 2048)
    assert qkv["split"].num_groups == 4 and qkv["split"].sizes == (1024, 128, 128)
    assert by_name["decoder.layers.0.self_attention.linear_proj.weight"]["shape"] == (2048, 4096)
    assert by_name["decoder.layers.0.mlp.router.weight"]["shape"] == (128, 2048)
    assert by_name["decoder.layers.0.mlp.experts.linear_fc1.weight127"]["shape"] == (1536, 2048)
    assert by_name["decoder.layers.0.mlp.experts.linear_fc2.weight0"]["shape"] == (2048, 768)
    total = sum(math.prod(s["shape"]) for s in specs)
    assert total == 2 * (5120 * 2048 + 2048 * 4096 + 128 * 2048 + 128 * (1536 * 2048 + 2048 * 768))
    stacked = layer_params(qwen3, layers=1, scale=1.0, experts="stacked", qkv="fused")
    assert [s["shape"] for s in stacked][-2:] == [(128, 1536, 2048), (128, 2048, 768)]
    assert all(s["split"] is None for s in stacked)
    tiny = layer_params(qwen3, layers=1, scale=0.02, experts="separate", qkv="split")
    t_qkv = tiny[0]
    assert t_qkv["shape"][0] == sum(t_qkv["split"].sizes) * t_qkv["split"].num_groups  # split stays exact


def test_parse_args_rejects_unknown_values() -> None:
    assert parse_args([])["strategies"] == ["lpt_cost", "round_robin", "ping_pong_numel"]
    with pytest.raises(ValueError, match="strategies='lpt_cost,greedy'"):
        parse_args(["strategies=lpt_cost,greedy"])
    with pytest.raises(ValueError, match="format='xml'"):
        parse_args(["format=xml"])
    with pytest.raises(ValueError, match="key one of"):
        parse_args(["stepz=3"])
    with pytest.raises(ValueError, match="scale=0.0: must be > 0"):
        parse_args(["scale=0"])


def test_cpu_run_writes_rows(tmp_path, capsys) -> None:
    """Localises a broken timing or summary: one JSON row per strategy, appended, with phases that fit in the
    step and the single rank owning everything."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        args = [
            "scale=0.02",
            "steps=2",
            "warmup=1",
            "strategies=lpt_cost,round_robin",
            f"out={tmp_path}",
            "format=json",
        ]
        assert main(args) == 0
        assert main([*args[:3], "strategies=ping_pong_numel", *args[4:]]) == 0
    finally:
        torch.set_num_threads(threads)
    rows = [json.loads(line) for line in (tmp_path / "scaling.jsonl").read_text().splitlines()]
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [r["strategy"] for r in rows] == ["lpt_cost", "round_robin", "ping_pong_numel"]
    assert printed == rows
    for r in rows:
        assert r["world_size"] == 1 and r["device"] == "cpu" and r["steps"] == 2
        assert r["num_params"] == 3 + 2 * 128
        assert r["owned_numel_max"] == r["numel"] and r["owned_imbalance"] == 1.0
        assert r["step_ms"] > 0 and 0 < r["ns_max_ms"] <= r["step_ms"]
        assert r["ns_imbalance"] == 1.0 and r["comm_bytes_per_rank"] == 0
        assert r["grad_sync_ms"] >= 0 and r["param_gather_ms"] >= 0
        assert r["grad_sync_ms"] + r["param_gather_ms"] < r["step_ms"]


def test_scaling_summary_speedup() -> None:
    """Speedup and efficiency are against the same strategy's one-rank row; the last appended row of a key
    wins; the one-rank row of another grad path serves as baseline (one rank moves nothing)."""
    base = {
        "grad_sync": "reduce_scatter",
        "ns_max_ms": 1.0,
        "ns_imbalance": 1.0,
        "grad_sync_ms": 0.0,
        "param_gather_ms": 0.0,
        "other_ms": 0.0,
    }
    rows = [
        {**base, "strategy": "lpt_cost", "world_size": 1, "step_ms": 99.0},
        {**base, "strategy": "lpt_cost", "world_size": 1, "step_ms": 10.0},
        {**base, "strategy": "lpt_cost", "world_size": 2, "step_ms": 8.0},
        {**base, "strategy": "lpt_cost", "world_size": 2, "step_ms": 4.0, "grad_sync": "all_reduce"},
        {**base, "strategy": "round_robin", "world_size": 2, "step_ms": 5.0},
    ]
    lines = scaling_summary(rows).splitlines()
    cells = {tuple(c.strip() for c in line.split("|")[1:4]): line.split("|")[5:7] for line in lines[2:]}
    assert [c.strip() for c in cells[("lpt_cost", "reduce_scatter", "1")]] == ["1.00", "1.00"]
    assert [c.strip() for c in cells[("lpt_cost", "reduce_scatter", "2")]] == ["1.25", "0.62"]
    assert [c.strip() for c in cells[("lpt_cost", "all_reduce", "2")]] == ["2.50", "1.25"]
    assert [c.strip() for c in cells[("round_robin", "reduce_scatter", "2")]] == ["n/a", "n/a"]
