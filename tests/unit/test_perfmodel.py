"""Performance model (bench.tools.perfmodel, bench.tools.project): calibration, monotonicity, a hand-checked case, the CLI."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from bench.tools.perfmodel import calibrate, compute, links, nscost
from bench.tools.perfmodel import constants as C
from bench.tools.perfmodel.model import predict
from muonbench import load
from muonbench.schema import HardwareConfig, ModelConfig, ParallelismConfig, PrecisionConfig, RootConfig


@pytest.fixture(scope="module")
def table1() -> dict[str, RootConfig]:
    return {row.experiment: calibrate.load_row(row) for row in calibrate.TABLE1}


def test_calibration_reproduces_table1_within_3pct(table1: dict[str, RootConfig]) -> None:
    """Localises a model change that breaks the published GB300 numbers (profile `published`)."""
    rows = calibrate.calibration(table1)
    assert len(rows) == 4
    for r in rows:
        assert abs(float(r["rel_error"])) <= calibrate.TOLERANCE, r


def test_committed_fit_is_the_minimax_fit() -> None:
    """The one fitted GB300 value in constants.py must be what the fit procedure returns."""
    fit, worst = calibrate.fit_gb300_hbm(iters=25)
    assert fit == pytest.approx(C.GB300_HBM_FIT, abs=0.01)
    assert worst <= calibrate.TOLERANCE
    for row, eff in C.FITTED.items():  # at most one fitted efficiency per hardware row and engine (and Muon's step)
        fitted = [e for e in eff.__slots__ if getattr(eff, e) is not None and "FITTED" in getattr(eff, e).source]
        expected = {"gb300": ["hbm"], "h200": ["hbm", "optimizer_hbm", "hbm_bridge"]}.get(row, [])
        assert fitted == expected, (row, fitted)


def test_committed_bridge_fit_is_the_minimax_fit() -> None:
    """The H200 row's Bridge fraction is what the fit on the committed Bridge runs returns, and it fits them."""
    fit, worst = calibrate.fit_h200_bridge_hbm(iters=25)
    assert fit == pytest.approx(C.H200_BRIDGE_HBM_FIT, abs=0.01) and worst < 0.01


def test_muon_costs_time_and_ours_beats_published(table1: dict[str, RootConfig]) -> None:
    """Published Muon is slower than AdamW by about the blog's delta; ours is between them."""
    for adamw, muon, delta in (
        ("gb300/kimi_k2_adamw", "gb300/kimi_k2_muon", 0.27),
        ("gb300/qwen3_30b_a3b_adamw", "gb300/qwen3_30b_a3b_muon", 0.33),
    ):
        t_a = predict(table1[adamw], "published").step_time_s
        t_pub = predict(table1[muon], "published").step_time_s
        t_ours = predict(table1[muon], "ours").step_time_s
        assert t_a < t_ours < t_pub
        assert t_pub - t_a == pytest.approx(delta, abs=0.3)


def _scaled(cfg: RootConfig, factor: float, field: str) -> RootConfig:
    return replace(cfg, hardware=replace(cfg.hardware, **{field: getattr(cfg.hardware, field) * factor}))


@pytest.mark.parametrize("field", ["nvlink_gbps", "network_gbps", "hbm_tbps"])
@pytest.mark.parametrize("profile", ["published", "ours"])
def test_more_bandwidth_never_slows_a_step(table1: dict[str, RootConfig], field: str, profile: str) -> None:
    for cfg in table1.values():
        times = [predict(_scaled(cfg, f, field), profile).step_time_s for f in (0.5, 1.0, 2.0, 4.0)]
        assert all(b <= a + 1e-12 for a, b in itertools.pairwise(times)), (field, times)


@pytest.mark.parametrize("profile", ["published", "ours"])
def test_more_ns_steps_never_speed_a_step(table1: dict[str, RootConfig], profile: str) -> None:
    for exp in ("gb300/kimi_k2_muon", "gb300/qwen3_30b_a3b_muon"):
        cfg = table1[exp]
        times = [
            predict(replace(cfg, optimizer=replace(cfg.optimizer, num_ns_steps=k)), profile).step_time_s
            for k in (3, 4, 5, 6, 8, 10)
        ]
        assert all(b >= a - 1e-12 for a, b in itertools.pairwise(times)), (exp, times)
        assert times[-1] > times[0]


def test_split_gate_up_shortens_ours_muon_step_only(table1: dict[str, RootConfig]) -> None:
    """gate / up orthogonalized apart: the same parameters in twice as many half-height matrices, ~2.3x fewer NS
    FLOPs (Qwen3-30B-A3B's fc1 1536 x 2048 -> 2 x 768 x 2048). Ours (batched NS) gets a shorter optimizer step; the
    published path (one NS call per matrix, its measured per-shape times) a longer one, since a 768 x 2048 NS costs it
    more than half of a 1536 x 2048 one. The forward-backward is unchanged."""
    cfg = table1["gb300/qwen3_30b_a3b_muon"]
    split_cfg = replace(cfg, optimizer=replace(cfg.optimizer, split_gate_up=True))
    joint, split = predict(cfg, "ours"), predict(split_cfg, "ours")
    assert split.breakdown["optimizer_step"] < 0.9 * joint.breakdown["optimizer_step"]
    assert split.step_time_s < joint.step_time_s
    pub_joint, pub_split = predict(cfg, "published"), predict(split_cfg, "published")
    assert pub_split.breakdown["optimizer_step"] > pub_joint.breakdown["optimizer_step"]
    fwd_bwd = [k for k in joint.breakdown if k.startswith("fwd_bwd_")]
    assert fwd_bwd and all(split.breakdown[k] == joint.breakdown[k] for k in fwd_bwd)


def test_hand_checked_roofline_and_collectives() -> None:
    """Hand arithmetic: 1024^3 bf16 GEMM at 1 PF/s and 1 TB/s is memory-bound: 3 x 2 MiB operands x 2 B = 6.29 MB
    -> 6.291456 us (compute: 2.147 us). Ring all-reduce of 1 GB over 8 ranks at 100 GB/s, 10 us per hop:
    2 x (7/8 x 10 ms + 7 x 10 us) = 17.64 ms."""
    r = compute.Rates(gemm_flops=1e15, expert_gemm_flops=1e15, bf16_flops=1e15, attention_flops=1e15, hbm=1e12, operand_bytes=2.0)
    assert compute.gemm_time(1024, 1024, 1024, r, operand_bytes=2.0, out_bytes=2.0) == pytest.approx(
        6.291456e-6
    )
    link = links.Link(bandwidth=100e9, latency=10e-6, kind="network")
    assert links.all_reduce(1e9, 8, link) == pytest.approx(0.01764)
    assert links.reduce_scatter(1e9, 1, link) == 0.0


def test_hand_checked_tiny_step() -> None:
    """2-layer dense GQA model, one GPU, AdamW, bf16, on an H200 row with near-infinite bandwidth so only FLOPs
    count. Per token (h 256, q = kv-width 256, ffn 1024 non-gated, vocab 1024, seq 512): attention linear
    6 (256 x 768 + 256 x 256) = 1,572,864 and MLP 6 x 2 x 256 x 1024 = 3,145,728 per layer, logits
    6 x 256 x 1024 = 1,572,864: 11,010,048 GEMM FLOP/token; core attention 6 x 256 x 512 = 786,432 per layer.
    GBS 4 x 512 = 2,048 tokens: GEMMs 2.2548578e10 FLOP at 701 TF/s = 32.166 us; attention 3.2212e9 FLOP at
    0.5 x 989 TF/s = 6.514 us."""
    model = ModelConfig(
        name="tiny",
        family="qwen3_moe",
        num_layers=2,
        hidden_size=256,
        num_attention_heads=4,
        attention="gqa",
        num_query_groups=4,
        kv_channels=64,
        ffn_hidden_size=1024,
        gated_linear_unit=False,
        vocab_size=1024,
        seq_length=512,
    )
    par = ParallelismConfig(name="one", world_size=1, mbs=2, gbs=4)
    hw = HardwareConfig(
        name="h200",
        peak_bf16_tflops=989.0,
        peak_fp8_tflops=1979.0,
        hbm_tbps=1e9,
        nvlink_gbps=450.0,
        nvlink_domain=8,
        network_gbps=50.0,
        source="test",
    )
    cfg = RootConfig(
        model=model,
        parallelism=par,
        hardware=hw,
        precision=PrecisionConfig(name="bf16"),
        optimizer=load(["optimizer=adamw"], validate_=False).optimizer,
        engine=load(["engine=megatron"], validate_=False).engine,
        launcher=None,
    )  # type: ignore[arg-type]
    pred = predict(cfg, "published")
    assert pred.breakdown["fwd_bwd_gemm"] == pytest.approx(11_010_048 * 2048 / 701e12, rel=1e-6)
    assert pred.breakdown["fwd_bwd_attention"] == pytest.approx(2 * 786_432 * 2048 / (0.5 * 989e12), rel=1e-6)
    assert pred.step_time_s == pytest.approx(32.1656e-6 + 6.5142e-6, rel=1e-3)
    assert pred.tflops_per_gpu_ns == 0.0


def test_choose_tp_mode() -> None:
    """Small matrices: duplicated (the Gram all-reduces cost more than the duplicated compute); big ones on fast
    links: distributed; slow links push big ones back to duplicated."""
    gb300 = nscost.load_hardware("gb300")
    assert nscost.choose_tp_mode(512, 2048, 4, gb300) == "duplicated"
    assert nscost.choose_tp_mode(4096, 2048, 2, "gb300") == "distributed"
    assert nscost.choose_tp_mode(4096, 2048, 1, gb300) == "duplicated"
    slow = replace(gb300, nvlink_latency_us=2000.0)
    assert nscost.choose_tp_mode(4096, 2048, 2, slow) == "duplicated"
    t = nscost.tp_mode_times(7168, 8192, 8, gb300, partition_dim=1)
    assert set(t) == {"duplicated", "distributed"} and all(v > 0 for v in t.values())


def test_ns_curve_matches_h200_measurements() -> None:
    """The per-shape NS curve reproduces the GPU-bound H200 anchor points (docs/references.md#h200-baseline) within 10%."""
    h200 = nscost.load_hardware("h200")
    for (rows, cols), ms in {
        (4096, 2048): 0.822,
        (7168, 8192): 18.16,
        (36864, 7168): 65.0,
        (8192, 8192): 25.03,
        (2048, 7168): 1.267,
    }.items():
        assert nscost.gpu_ms(rows, cols, h200) == pytest.approx(ms, rel=0.10)


def test_project_json_cli(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.tools import project

    assert project.main(["experiment=gb300/qwen3_30b_a3b_muon", "profile=ours", "format=json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("tflops_per_gpu_model", "tflops_per_gpu_ns", "step_time_s", "breakdown"):
        assert key in out
    assert out["step_time_s"] == pytest.approx(sum(out["breakdown"].values()))
    assert out["tflops_per_gpu_ns"] > 0 and out["profile"] == "ours"
    assert (
        project.main(
            [
                "experiment=gb300/qwen3_30b_a3b_muon",
                "parallelism.tp=2",
                "parallelism.world_size=16",
                "parallelism.nodes=4",
                "parallelism.distribution.tp_mode=auto",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "tp_mode=auto" in text and "->" in text


@pytest.mark.parametrize(
    "engine,hardware,calibrated",
    [
        ("megatron", "h200", True),
        ("bridge", "h200", True),
        ("bridge", "b200", False),
        ("hf", "h200", False),
        ("megatron", "h100", False),  # no H100 run was ever fitted
        ("megatron", "b200", False),
        ("megatron", "gb300", False),  # Table 1 is Bridge's throughput
        ("bridge", "gb300", True),
    ],
)
def test_projection_says_whether_its_engine_is_calibrated(engine: str, hardware: str, calibrated: bool) -> None:
    """A projection says what it rests on: the Megatron-core engine's fit, the row's Bridge fit (H200 only), or no
    calibration for its engine; a report it names exists."""
    from bench.tools import project

    res = project.project(
        ["experiment=h200/qwen3_30b_a3b_slice_flops_bridge_1gpu", f"engine={engine}", f"hardware={hardware}"]
    )
    assert res["config"]["engine"] == engine
    assert res["engine_calibration"].startswith("calibrated" if calibrated else "not calibrated")
    assert f"engine             {engine} (" in project.format_text(res)
    for path in re.findall(r"reports/\w+|docs/\w+\.md", res["engine_calibration"]):
        assert (Path(__file__).resolve().parents[2] / path).exists(), path


def test_project_rejects_bad_cli_values() -> None:
    from bench.tools import project

    with pytest.raises(ValueError, match="format"):
        project.split_args(["format=yaml"])
    with pytest.raises(ValueError, match="profile"):
        project.project(["experiment=gb300/kimi_k2_muon"], profile="fast")
    with pytest.raises(ValueError, match="hardware.name='cpu'"):
        project.project(["optimizer=adamw"])
    assert project.main(["experiment=gb300/kimi_k2_muon", "optimizer=mop"]) == 2
    cli, rest = project.split_args(["profile=ours", "format=json", "model=kimi_k2"])
    assert cli == {"profile": "ours", "format": "json"} and rest == ["model=kimi_k2"]


def test_perfmodel_imports_no_torch() -> None:
    code = "import sys, bench.tools.project, bench.tools.perfmodel.model, bench.tools.perfmodel.report; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_kernel_results_parsing(tmp_path) -> None:
    """ns_data reads the kernel benchmark's results.json: batched calls lose one host cost, times are rescaled from
    the run's GEMM ceiling to 701 TF/s, both orientations of a shape are averaged, EO keeps the lowest host cost."""
    shapes = [
        {
            "name": "tiny",
            "rows": 128,
            "cols": 2048,
            "batch": 1,
            "impls": {"ours": {"ms": 0.1}, "eo_plain": {"ms": 0.5}},
        },
        {
            "name": "fc1",
            "rows": 1536,
            "cols": 2048,
            "batch": 10,
            "impls": {"ours": {"ms": 3.1}, "ours_gram": {"ms": 2.6}, "eo_plain": {"ms": 4.0}},
        },
        {
            "name": "q",
            "rows": 4096,
            "cols": 2048,
            "batch": 1,
            "impls": {"ours": {"ms": 1.1}, "eo_plain": {"ms": 1.0}},
        },
        {
            "name": "o",
            "rows": 2048,
            "cols": 4096,
            "batch": 1,
            "impls": {"ours": {"ms": 0.9}, "eo_plain": {"ms": 1.0}},
        },
    ]
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"ceiling_tflops": 1402.0, "device_name": "test", "shapes": shapes}))
    ours = nscost.ns_data("ours", path)
    assert ours.host_ms == pytest.approx(0.1)
    assert ours.table[(1536, 2048)] == pytest.approx((2.6 - 0.1) / 10 * 2.0)  # 1402 / 701 = 2
    assert ours.table[(2048, 4096)] == pytest.approx(((1.1 - 0.1) + (0.9 - 0.1)) / 2 * 2.0)
    eo = nscost.ns_data("published", path)
    assert eo.host_ms == pytest.approx(C.NS_CALL_HOST_MS.value)  # the measured 0.330 ms is lower than 0.5
    assert eo.table[(1536, 2048)] == pytest.approx((4.0 - 0.33) / 10 * 2.0)
    h200 = nscost.load_hardware("h200")
    assert nscost.gpu_ms(2048, 1536, h200, table=ours.table) == pytest.approx(0.5)
    assert nscost.ns_data("ours", tmp_path / "missing.json").table == {}


def test_h200_comparison_reads_collect_rows(tmp_path) -> None:
    """The single-H200 check re-composes each run from its experiment and batch columns and reports the error."""
    from bench.tools.perfmodel import h200

    assert "Pending" in h200.compare(tmp_path)
    cfg = load(["experiment=h200/qwen3_30b_a3b_slice_muon_1gpu", "parallelism.mbs=2", "parallelism.gbs=8"])
    pred = predict(cfg, "ours")
    cols = [
        "experiment",
        "status",
        "implementation",
        "optimizer",
        "mbs",
        "gbs",
        "seq_length",
        "step_s_median",
        "optim_s_median",
        "hardware_name",
    ]
    with (tmp_path / "results.csv").open("w") as f:
        f.write(",".join(cols) + "\n")
        f.write(f"h200/qwen3_30b_a3b_slice_muon_1gpu,ok,ours,muon,2,8,4096,{pred.step_time_s * 1.25},,h200\n")
        f.write("h200/qwen3_30b_a3b_slice_adamw_1gpu,oom,torch,adamw,2,8,4096,,,h200\n")
    rows = h200.comparisons(tmp_path)
    assert len(rows) == 1 and rows[0]["profile"] == "ours"
    assert rows[0]["step_rel_error"] == pytest.approx(1 / 1.25 - 1)
    assert "0 of 1 predicted runs within 10%" in h200.compare(tmp_path)


def test_layer_step_hand_checked() -> None:
    """One Qwen3 layer's standalone fused AdamW step on H200: 622,854,144 params x 30 B / (4.8 TB/s x 0.72) =
    5.407 ms; the published Muon loop is at least one host-bound NS call per matrix (260 matrices x 0.33 ms)."""
    from bench.tools.perfmodel import validate

    model = load(["model=qwen3_30b_a3b"], validate_=False).model
    items = validate.layer_items(model, 1, router=False)
    assert len(items) == 260 and sum(it.rows * it.cols for it in items) == 622_854_144
    h200 = nscost.load_hardware("h200")
    with calibrate.hbm_fraction("h200", 0.72):
        adamw = validate.predict_layer_ms(model, 1, h200, "adamw", "published", router=False)
    assert adamw == pytest.approx(622_854_144 * 30 / (4.8e12 * 0.72) * 1e3, rel=1e-9)
    eo = validate.predict_layer_ms(model, 1, h200, "muon", "published", router=False)
    ours = validate.predict_layer_ms(model, 1, h200, "muon", "ours", router=False)
    assert eo >= 260 * C.NS_CALL_HOST_MS.value and ours < eo


def test_h200_comparison_reads_run_records(tmp_path) -> None:
    """Run records (run.json with the resolved config and a summary) are predicted from their own config."""
    from bench.tools.perfmodel import h200
    from muonbench import as_dict

    cfg = load(["experiment=h200/qwen3_30b_a3b_slice_adamw_1gpu"])
    pred = predict(cfg, "published")
    run = tmp_path / "runs" / "a"
    run.mkdir(parents=True)
    rec = {
        "status": "ok",
        "run_id": "a",
        "config": as_dict(cfg),
        "summary": {"step_s_median": pred.step_time_s / 0.95, "optim_s_median": None},
    }
    (run / "run.json").write_text(json.dumps(rec))
    rows = h200.comparisons(tmp_path)
    assert len(rows) == 1 and rows[0]["step_rel_error"] == pytest.approx(-0.05)
    assert "1 of 1 predicted runs within 10%" in h200.compare(tmp_path)


def test_single_h200_megatron_runs_predicted_within_10pct() -> None:
    """The committed Megatron H200 runs (reports/megatron_h200_202611): the H200 row's one fitted value reproduces
    the run it is fitted on, and every other in-scope run is predicted within 10% on the step time."""
    from bench.tools.perfmodel import h200

    fit, err = calibrate.fit_h200_hbm(iters=20)
    assert fit == pytest.approx(C.H200_HBM_FIT, abs=0.01) and abs(err) < 0.01
    rows = h200.comparisons()
    predicted = [r for r in rows if not r.get("fit") and not r.get("scope")]
    assert len(predicted) >= 3
    for r in predicted:
        assert abs(r["step_rel_error"]) <= h200.TOLERANCE, r


def test_calibration_data_files_carry_provenance_and_the_source_reports_numbers() -> None:
    """The model's measured inputs are versioned data files naming their source report, commit, date and command;
    the single-H200 runs file predicts exactly what its source report's run records predict."""
    import ast
    from pathlib import Path

    from bench.tools.perfmodel import calibration, h200

    files = sorted(calibration.DATA.glob("*.json"))
    assert {p.name for p in files} >= {
        calibration.NS_KERNELS.name,
        calibration.MEGATRON_RUNS.name,
        calibration.FLOPS_RUNS.name,
    }
    for p in files:
        prov = json.loads(p.read_text())["provenance"]
        assert set(prov) == {"source", "commit", "date", "command"} and all(prov.values()), p.name
        derived = ("python -m bench.tools.perfmodel.memfit", "python -m bench.tools.perfmodel.intervals")
        assert prov["command"].startswith(("python -m bench.tools.perfmodel.extract ", *derived)), p.name
    source = Path(json.loads(calibration.MEGATRON_RUNS.read_text())["provenance"]["source"])
    repo = Path(__file__).resolve().parents[2]
    if (repo / source).is_dir():
        assert h200.comparisons(calibration.MEGATRON_RUNS) == h200.comparisons(repo / source)
    # no perfmodel module builds a path into reports/ (a dated report folder is never an input)
    for mod in sorted(Path(calibration.__file__).parent.glob("*.py")):
        consts = [n.value for n in ast.walk(ast.parse(mod.read_text())) if isinstance(n, ast.Constant)]
        assert "reports" not in consts, mod.name


def test_extract_writes_a_data_file_the_model_reads_like_the_run_records(tmp_path) -> None:
    """`python -m bench.tools.perfmodel.extract runs` keeps successful H200 runs (config once per hash) and the
    model predicts the same from the data file as from the folder; a folder without runs is a user error."""
    from bench.tools.perfmodel import extract, h200
    from muonbench import as_dict, config_hash

    cfg = load(["experiment=h200/qwen3_30b_a3b_slice_adamw_1gpu"])
    base = {"config": as_dict(cfg), "config_hash": config_hash(cfg), "git": {"sha": "abc1234"}}
    for name, status, step in (("a", "ok", 1.5), ("b", "ok", 1.6), ("c", "oom", None)):
        run = tmp_path / "report" / "sweep" / name
        run.mkdir(parents=True)
        summary = {"step_s_median": step, "optim_s_median": 0.1}
        (run / "run.json").write_text(json.dumps({**base, "status": status, "summary": summary}))
    out = tmp_path / "data.json"
    assert extract.main(["runs", str(tmp_path / "report"), str(out)]) == 0
    data = json.loads(out.read_text())
    assert [r["run"] for r in data["runs"]] == ["sweep/a", "sweep/b"] and len(data["configs"]) == 1
    assert h200.comparisons(out) == h200.comparisons(tmp_path / "report")
    with pytest.raises(SystemExit) as exc:
        extract.main(["runs", str(tmp_path / "missing"), str(out)])
    assert exc.value.code == 2
