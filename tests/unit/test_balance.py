"""bench.tools.balance: per-rank NS load, imbalance and bytes of the layer-wise optimizer from shapes alone."""

from __future__ import annotations

import json

import pytest

from bench.tools.balance import _segments_bytes, analyse, main, stage_matrices
from muonbench import load

KIMI = ["model=kimi_k2", "parallelism=pp4_dp64_ep64"]
QWEN = ["model=qwen3_30b_a3b", "parallelism=dp8_ep8"]


def test_kimi_stages_and_expert_counts() -> None:
    """Layout Et*4|(t*4|)*14tL -> 16/16/16/13 decoder layers; 6 experts per EP rank x (fc1, fc2) per MoE layer."""
    cfg = load(KIMI)
    stages = stage_matrices(cfg.model, cfg.parallelism)
    assert [n for n, _, _ in stages] == [16, 16, 16, 13]
    assert len(stages[0][2]) == 15 * 6 * 2  # stage 0 holds the dense layer 0
    assert len(stages[1][2]) == 16 * 6 * 2
    assert {(m.rows, m.cols) for m in stages[1][2]} == {(4096, 7168), (7168, 2048)}


def test_published_cases_lpt_reaches_the_whole_matrix_bound() -> None:
    """On both published layouts LPT is at the lower bound (largest dense matrix on top of the pinned expert load)
    and never worse than the published strategies; Qwen3-30B-A3B DP8 EP8 divides evenly (1.0 for all)."""
    for overrides in (KIMI, QWEN):
        cfg = load(overrides)
        res = {
            s: analyse(cfg.model, cfg.parallelism, s) for s in ("round_robin", "ping_pong_numel", "lpt_cost")
        }
        lpt = res["lpt_cost"]
        assert lpt["imbalance"] == pytest.approx(lpt["imbalance_bound"], rel=1e-9)
        assert lpt["imbalance"] <= min(res["round_robin"]["imbalance"], res["ping_pong_numel"]["imbalance"])
        assert lpt["bytes_per_step"] < lpt["bytes_per_step_published_path"]
    assert res["lpt_cost"]["imbalance"] == pytest.approx(1.0)


def test_lpt_meets_goal_where_published_strategies_do_not() -> None:
    """Kimi K2 slice (6 experts per layer, the per-GPU expert load of the published run) on 6 DP ranks."""
    cfg = load(
        [
            "model=kimi_k2_slice",
            "parallelism=dp8_ep8",
            "parallelism.world_size=6",
            "parallelism.ep=1",
            "parallelism.nodes=1",
            "parallelism.gpus_per_node=6",
            "parallelism.gbs=384",
        ]
    )
    res = {
        s: analyse(cfg.model, cfg.parallelism, s)["imbalance"]
        for s in ("round_robin", "ping_pong_numel", "lpt_cost")
    }
    assert res["lpt_cost"] <= 1.05 < min(res["round_robin"], res["ping_pong_numel"])


def test_segment_bytes_pick_padded_or_per_owner() -> None:
    even = _segments_bytes([10.0, 10.0, 10.0, 10.0], 0.0, 4, 4, 2)
    assert even["collective"] == "padded" and even["ours"] == 3 * 10 * 6
    assert even["published"] == pytest.approx(2 * 3 / 4 * 40 * 4 + 3 * 10 * 2)
    skewed = _segments_bytes([100.0, 0.0, 0.0, 0.0], 20.0, 4, 4, 2)
    assert skewed["collective"] == "per_owner" and skewed["ours"] == 120 * 6
    filled = _segments_bytes([30.0, 0.0, 0.0, 0.0], 90.0, 4, 4, 2)  # AdamW elements level the segments
    assert filled["padding"] == 0.0 and filled["collective"] == "padded"


def test_cli_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*QWEN]) == 0
    text = capsys.readouterr().out
    for s in ("round_robin", "ping_pong_numel", "lpt_cost", "whole-matrix lower bound", "GB/step"):
        assert s in text
    assert main([*KIMI, "strategy=lpt_cost", "format=json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["strategy"] == "lpt_cost" and out["imbalance"] > 1.0 and out["bytes_per_step"] > 0
    with pytest.raises(ValueError, match="strategy='greedy'"):
        main([*QWEN, "strategy=greedy"])


def test_cost_table_from_ns_kernels_csv(tmp_path) -> None:
    """A bench.tools.ns_kernels results.csv calibrates the model: fixed = fastest single call, per = (ms - fixed) / B."""
    from bench.tools.balance import cost_model_from

    path = tmp_path / "results.csv"
    path.write_text(
        "kind,shape,rows,cols,batch,impl,ms\n"
        "ns,router,128,2048,1,ours_gram,0.135\n"
        "ns,fc2,2048,768,128,ours_gram,8.135\n"
        "ns,fc2,2048,768,128,eo_plain,10.0\n"
    )
    model = cost_model_from(str(path), "ours_gram")
    assert model.terms((768, 2048)) == pytest.approx((0.135, 8.0 / 128))
    assert model.fixed_ms == pytest.approx(0.135)
    with pytest.raises(ValueError, match="impl='nope'"):
        cost_model_from(str(path), "nope")
