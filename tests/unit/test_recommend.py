"""`bench.tools.recommend`: the recommended Muon settings are the fastest runnable ones the cost model prices, they
compose and run through the product's own checks, their optimizer builds on a CPU slice, settings that change the
update are kept unless allowed, and the scaling curve is written as CSV and PNG."""

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
    assert set(res["reasons"]) == set(res["settings"]) == set(rec.SEARCHED)  # one reason per choice
    assert res["settings"]["ns_overlap"] is False  # DP > 1: NS overlap does not run there
    assert res["built"].startswith(f"MuonConfig built and stepped on a CPU slice of {root.model.name}")


@pytest.mark.parametrize("name", list(CASES))
def test_recommendation_is_the_fastest_runnable_candidate(results, name: str) -> None:
    """Among the candidates with the configured numerics (numerics=keep) the pick is the fastest; the layout
    product was priced whole (TP 1: assignment x split gate/up; split QKV only with numerics=allow)."""
    res, _ = results[name]
    conf = {
        "split_qkv": True,
        "ns_precision": "bf16",
        "use_gram_ns": False,
        "coefficient_type": "quintic",
        "num_ns_steps": 5,
    }
    same = [c for c in res["candidates"] if all(c[k] == v for k, v in conf.items())]
    ok = [c for c in same if c["runnable"]]
    layouts = {(c["assignment"], c["split_gate_up"]) for c in ok}
    assert len(layouts) == 3 * 2
    best = min(c["step_time_s"] for c in ok)
    assert best <= res["muon_step_s"] <= best * (1 + rec.TIE_REL)
    assert all(res["settings"][k] == v for k, v in conf.items())
    assert res["ratio"] == pytest.approx(res["adamw_step_s"] / res["muon_step_s"])
    assert 0.5 < res["ratio"] < 1.05
    assert 0 < res["ns_s_per_gpu"] < res["optimizer_step_s_per_gpu"] < res["muon_step_s"]
    assert 0 < res["state_memory_gib_per_gpu"] < res["memory_gib"]


@pytest.mark.parametrize("name", list(CASES))
def test_scaling_csv_and_png(results, name: str) -> None:
    _, written = results[name]
    csv_path, png_path, json_path = written
    rows = list(csv.DictReader(csv_path.open()))
    assert [int(r["dp"]) for r in rows] == list(rec.DP_SIZES)  # 8 .. 1024
    for r in rows:
        assert float(r["ratio"]) == pytest.approx(float(r["adamw_step_s"]) / float(r["muon_step_s"]))
        assert 0 < float(r["muon_ns_s"]) < float(r["muon_optimizer_step_s"])
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
    assert any("ns_precision" in c["why_not"] for c in refused)  # Megatron's Muon has no fp16 iterate
    assert found["optimizer"]["split_gate_up"] is False
    assert found["distribution"]["assignment"] == "ping_pong_numel"
    rec.build_checked([*args, *rec.overrides_of(found)])


def test_bad_input_exit_2(capsys) -> None:
    assert rec.main(["optimizer=adamw"]) == 2
    assert "optimizer='adamw': the recommendation is for Muon" in capsys.readouterr().err
    assert rec.main([*CASES["qwen3"], "engine=hf"]) == 2
    assert "parallelism.ep=8: the hf engine is data parallel only" in capsys.readouterr().err
    assert rec.main(["format=yaml"]) == 2


def test_tp_modes_the_layerwise_optimizer_cannot_run_are_refused_and_not_picked(qwen3_root) -> None:
    """At TP 2 and DP 8 the layer-wise optimizer orthogonalizes each TP shard alone: every TP mode is tried, the
    others are refused before pricing (the front check bench.run makes), blockwise is picked."""
    import muonbench
    from optim.configs import TP_MODE_CHOICES

    tp2 = ["parallelism.tp=2", "parallelism.world_size=16", "parallelism.nodes=4"]
    found = rec.search(muonbench.load(rec.split_args([*CASES["qwen3"], *tp2])[1]))
    cands = found["candidates"]
    assert {c["tp_mode"] for c in cands} == set(TP_MODE_CHOICES)
    for c in cands:
        assert c["runnable"] is (c["tp_mode"] == "blockwise" and not c["ns_overlap"]), c
        if c["tp_mode"] != "blockwise":
            assert c["why_not"].startswith(f"parallelism.distribution.tp_mode={c['tp_mode']!r}: the layer-wise")
    assert found["distribution"]["tp_mode"] == "blockwise"
    assert "duplicated: not runnable" in found["reasons"]["tp_mode"]
    # the values as the config names them, the reason whole (no enum reprs, nothing cut at 100 characters)
    assert all(type(c["tp_mode"]) is str and type(c["assignment"]) is str for c in cands)
    assert "<" not in found["reasons"]["tp_mode"] and "allowed: ['blockwise']" in found["reasons"]["tp_mode"]


def test_project_and_recommend_default_to_the_same_engine_and_keep_an_experiments() -> None:
    """Localises `project` pricing engine=hf (the config's default) where `recommend` priced megatron, and
    `recommend` overriding the engine an experiment names."""
    import muonbench
    from bench.tools import project

    def recommend_engine(overrides: list[str]) -> str:
        return muonbench.load(rec.split_args(overrides)[1]).engine.name

    assert project.project(CASES["qwen3"])["config"]["engine"] == recommend_engine(CASES["qwen3"]) == "megatron"
    bridge = "experiment=h200/qwen3_30b_a3b_slice_flops_bridge_1gpu"
    assert project.project([bridge])["config"]["engine"] == recommend_engine([bridge]) == "bridge"


def test_output_folder_is_keyed_by_engine() -> None:
    """Localises the bridge recommendation overwriting the megatron one in the same folder."""
    config = {"model": "m", "parallelism": "p", "hardware": "h"}
    assert rec.default_out(config | {"engine": "bridge"}) != rec.default_out(config | {"engine": "megatron"})


@pytest.fixture(scope="module")
def qwen3_root():
    import muonbench

    return muonbench.load(rec.split_args(CASES["qwen3"])[1])


def test_numerics_kept_unless_allowed(qwen3_root) -> None:
    """Gram-NS prices faster on the H200 kernel table, but changes the update: kept off by default (the reason says
    what it would save), picked with numerics=allow; quintic x 5 stays (4 steps leave singular values 0.145 from 1,
    wider than 5 steps' 0.060)."""
    kept = rec.search(qwen3_root)
    allowed = rec.search(qwen3_root, allow_numerics=True)
    assert kept["optimizer"]["use_gram_ns"] is False
    assert "numerics=allow searches it" in kept["reasons"]["use_gram_ns"]
    assert "True: step -" in kept["reasons"]["use_gram_ns"]
    assert allowed["optimizer"]["use_gram_ns"] is True
    assert kept["optimizer"]["split_qkv"] is True and "numerics=allow searches it" in kept["reasons"]["split_qkv"]
    assert allowed["optimizer"]["ns_precision"] == "bf16"  # fp16 costs the same: the configured value stays
    for found in (kept, allowed):
        assert (found["optimizer"]["coefficient_type"], found["optimizer"]["num_ns_steps"]) == ("quintic", 5)
    assert "4 steps: step -" in kept["reasons"]["num_ns_steps"] and "0.145" in kept["reasons"]["num_ns_steps"]


def test_fewer_steps_only_where_the_band_holds(qwen3_root) -> None:
    """Polar Express at 8 steps has converged: with numerics=allow 6 steps end within 1% of 1 and cost less, so they
    are picked; 5 steps (0.12 from 1) never are; without numerics=allow the 8 steps stay."""
    from bench.tools.recommend_checks import band_error, keeps_quality

    root = rec.apply(qwen3_root, {"coefficient_type": "polar_express", "num_ns_steps": 8})
    assert band_error("polar_express", 6) < 0.01 < band_error("polar_express", 5)
    assert not keeps_quality("quintic", 4, baseline=("quintic", 5))
    allowed = rec.search(root, allow_numerics=True)
    assert (allowed["optimizer"]["coefficient_type"], allowed["optimizer"]["num_ns_steps"]) == ("polar_express", 6)
    assert rec.search(root)["optimizer"]["num_ns_steps"] == 8


def test_ns_precision_fp32_is_priced_slower(qwen3_root) -> None:
    """fp32 NS runs at the fp32 rate (no tensor cores): priced ~15x the bf16 NS on the same layout."""
    s = rec.Search(qwen3_root, allow_numerics=True)
    bf16 = s.price(rec.settings_of(qwen3_root))
    fp32 = s.price({**rec.settings_of(qwen3_root), "ns_precision": "fp32"})
    assert fp32["ns_s"] > 10 * bf16["ns_s"] and fp32["step_time_s"] > bf16["step_time_s"]


def test_build_on_cpu_steps_the_chosen_optimizer(qwen3_root) -> None:
    """The check builds the real optimizer of the chosen settings on a 2-layer CPU slice (experts kept, 4 of them)
    and steps it."""
    from bench.tools.recommend_checks import build_on_cpu, slice_of

    tiny = slice_of(qwen3_root.model)
    assert (tiny.num_layers, tiny.hidden_size, tiny.num_experts, tiny.family) == (2, 64, 4, "qwen3_moe")
    root = rec.apply(qwen3_root, {"split_gate_up": True, "ns_precision": "fp16"})
    assert "parameters to the matrix optimizer" in build_on_cpu(root)


def test_a_layout_whose_state_alone_cannot_fit_is_refused(capsys, tmp_path) -> None:
    """Localises `recommend` printing "459.9 GiB of 74" for a model beyond the GPUs and exiting 0: the weights,
    gradients and optimizer state alone refuse it, in one line, before any search, nothing written."""
    out = tmp_path / "out"
    assert rec.main(["model=kimi_k2", "parallelism=dp8", "hardware=h100", f"out={out}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: parallelism=dp8: model=kimi_k2 needs ") and "more than 74.5 GiB" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


@pytest.mark.parametrize("name", list(CASES))
def test_recommendation_states_its_peak_memory_and_calibration(results, name: str) -> None:
    """The predicted peak is flagged where it exceeds the GPU (the activations push it over), and the text says what
    the prediction rests on (not calibrated where nothing was fitted)."""
    res, written = results[name]
    assert res["fits"] is (res["peak_memory_gb"] * 1e9 <= res["memory_gib"] * 2**30)
    text = rec.format_text(res, written)
    assert ("does not fit" in text) is (res["fits"] is False)
    assert res["engine_calibration"] in text
    if res["config"]["hardware"] == "gb300":
        assert "not calibrated" in res["engine_calibration"]
