"""`bench.tools.recommend`: the recommended Muon settings are the fastest runnable ones the cost model prices, they
compose and run through the product's own checks, and the scaling curve is written as CSV and PNG."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

from bench.tools import recommend as rec

CASES = {
    "qwen3": ["model=qwen3_30b_a3b", "parallelism=dp8_ep8", "hardware=h200"],
    "kimi": ["model=kimi_k2", "parallelism=pp4_dp64_ep64", "hardware=gb300", "precision=fp8_mx"],
}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict[str, Any], list[Path]]]:
    out = {}
    for name, overrides in CASES.items():
        _, args = rec.split_args(overrides)
        res = rec.recommend(args)
        out[name] = (res, rec.write_outputs(tmp_path_factory.mktemp(name), res))
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_recommendation_builds_and_runs(results, name: str) -> None:
    import muonbench
    from muonbench.schema import optim_configs

    res, _ = results[name]
    root = muonbench.load([*rec.split_args(CASES[name])[1], *res["overrides"]])
    muonbench.check_runnable(root)
    algo, routing, _ = optim_configs(root.optimizer)
    assert algo.num_ns_steps == res["settings"]["num_ns_steps"]
    assert routing.split_gate_up is res["settings"]["split_gate_up"]
    assert root.parallelism.distribution.assignment == res["settings"]["assignment"]
    assert set(res["reasons"]) == set(res["settings"])  # one reason per choice
    assert res["settings"]["ns_overlap"] is False  # DP > 1: NS overlap does not run there


@pytest.mark.parametrize("name", list(CASES))
def test_recommendation_is_the_fastest_runnable_candidate(results, name: str) -> None:
    res, _ = results[name]
    ok = [c for c in res["candidates"] if c["runnable"]]
    assert len(ok) == len(res["candidates"]) == 3 * 2  # TP 1: assignment x split gate/up
    best = min(c["step_time_s"] for c in ok)
    assert res["muon_step_s"] == pytest.approx(best, rel=1e-6)
    assert res["ratio"] == pytest.approx(res["adamw_step_s"] / res["muon_step_s"])
    assert 0.5 < res["ratio"] < 1.05
    assert 0 < res["optimizer_step_s_per_gpu"] < res["muon_step_s"]
    assert 0 < res["state_memory_gib_per_gpu"] < res["memory_gib"]


@pytest.mark.parametrize("name", list(CASES))
def test_scaling_csv_and_png(results, name: str) -> None:
    res, written = results[name]
    csv_path, png_path, json_path = written
    rows = list(csv.DictReader(csv_path.open()))
    assert [int(r["dp"]) for r in rows] == list(rec.DP_SIZES)  # 8 .. 1024
    for r in rows:
        assert float(r["ratio"]) == pytest.approx(float(r["adamw_step_s"]) / float(r["muon_step_s"]))
        assert int(r["ep"]) <= int(r["dp"])  # expert parallelism fitted into the smaller layouts
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json_path.is_file()


def test_never_picks_what_the_engine_cannot_run() -> None:
    """Megatron's own Muon through Bridge cannot split gate/up and deals ping-pong by numel only: the faster
    candidates are refused, with the reason, and the pick is runnable."""
    _, args = rec.split_args(
        [
            *CASES["qwen3"],
            "engine=bridge",
            "optimizer.implementation=megatron",
            "parallelism.distribution.grad_sync=all_reduce",
        ]
    )
    found = rec.search(__import__("muonbench").load(args))
    refused = [c for c in found["candidates"] if not c["runnable"]]
    assert any("split_gate_up" in c["why_not"] for c in refused)
    assert any("assignment" in c["why_not"] for c in refused)
    assert found["optimizer"]["split_gate_up"] is False
    assert found["distribution"]["assignment"] == "ping_pong_numel"
    rec.build_checked([*args, *rec.overrides_of(found)])


def test_bad_input_exit_2(capsys) -> None:
    assert rec.main(["optimizer=adamw"]) == 2
    assert "optimizer='adamw': the recommendation is for Muon" in capsys.readouterr().err
    assert rec.main([*CASES["qwen3"], "engine=hf"]) == 2
    assert "parallelism.ep=8: the hf engine is data parallel only" in capsys.readouterr().err
    assert rec.main(["format=yaml"]) == 2


def test_tp_modes_searched_where_tp_shards() -> None:
    import muonbench
    from optim.configs import TP_MODE_CHOICES

    tp2 = ["parallelism.tp=2", "parallelism.world_size=16", "parallelism.nodes=4"]
    found = rec.search(muonbench.load(rec.split_args([*CASES["qwen3"], *tp2])[1]))
    cands = found["candidates"]
    assert {c["tp_mode"] for c in cands} == set(TP_MODE_CHOICES)
    best = min(c["step_time_s"] for c in cands if c["runnable"])
    pick = [c for c in cands if all(c[k] == v for k, v in {**found["distribution"], **found["optimizer"]}.items()
                                    if k in rec.SEARCHED)]
    assert pick[0]["step_time_s"] == pytest.approx(best, rel=1e-6)
    assert found["reasons"]["tp_mode"].startswith(found["distribution"]["tp_mode"] + ": optimizer step")
