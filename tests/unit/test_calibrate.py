"""Hardware profiles (`bench.tools.perfmodel.hwprofile`) and the bookkeeping of `muonbench calibrate`, on CPU: the
schema, selection by hardware group and GPU name, predictions naming their profile and using its numbers, bad
profiles refused with one line. The measuring itself: tests/gpu/test_calibrate_gpu.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.tools import calibrate, project
from bench.tools.perfmodel import constants as C
from bench.tools.perfmodel import hwprofile

H100 = ["model=qwen3_30b_a3b_slice", "parallelism=single_gpu", "hardware=h100", "optimizer=muon"]
MEASURED = {
    "dense": [{"m": 8, "n": 8, "k": 8, "ms": 1.0, "flop": 4e11}, {"m": 8, "n": 8, "k": 8, "ms": 3.0, "flop": 4e11}],
    "grouped": [{"groups": 2, "m": 8, "n": 8, "k": 8, "ms": 2.0, "flop": 6e11}],
    "attention": [{"ms": 4.0, "flop": 8e11}],
    "hbm_gbps": {"copy": 3000.0, "adamw": 2412.0},
    "ns_plan_ms": {"NVIDIA H100 80GB HBM3|torch|1x2048x4096|torch.bfloat16|q|gram=False|restarts=-|eps=1e-07": 2.5},
}


def doc(hardware: str = "h100", gpu: str = "NVIDIA H100 80GB HBM3", date: str = "2026-12-01T00:00:00+00:00",
        **measured: object) -> dict[str, object]:  # fmt: skip
    return calibrate.profile_doc(
        hardware=hardware,
        gpu={"name": gpu, "compute_capability": "9.0", "driver": "570", "torch": "2.11", "cuda": "13.0"},
        measured={**MEASURED, **measured},
        model="qwen3_30b_a3b_slice",
        command="muonbench calibrate model=qwen3_30b_a3b_slice hardware=h100",
        date=date,
    )


@pytest.fixture
def user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty user profile folder and no shipped profiles."""
    monkeypatch.setenv(hwprofile.ENV_DIR, str(tmp_path / "user"))
    monkeypatch.setattr(hwprofile, "SHIPPED_DIR", tmp_path / "shipped")
    hwprofile.clear()
    yield tmp_path / "user"
    hwprofile.clear()


def write(folder: Path, name: str, content: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(content))
    hwprofile.clear()
    return path


def test_profile_doc_round_trips_with_class_rates_as_total_flop_over_total_time() -> None:
    prof = hwprofile.parse(doc(), Path("p.json"))
    assert prof.tflops == pytest.approx({"dense": 200.0, "grouped": 300.0, "attention": 200.0})  # 8e11 / 4 ms
    assert prof.hardware == "h100" and prof.name == "nvidia_h100_80gb_hbm3" and len(prof.ns_plan_ms) == 1


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("hardware", "h300", "hardware='h300'"),
        ("schema_version", 2, "schema_version=2"),
        ("tflops", {"dense": -1.0}, "tflops.dense=-1.0"),
        ("tflops", {"dense": 1.0, "sparse": 2.0}, "tflops.sparse=2.0"),
        ("hbm_gbps", {"adamw": "fast"}, "hbm_gbps.adamw='fast'"),
        ("gpu", {"name": "x"}, "gpu="),
    ],
)
def test_a_bad_profile_is_refused_with_one_line_naming_the_field(
    user: Path, field: str, value: object, named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A profile `project` cannot trust must stop it before it predicts, not be skipped silently."""
    path = write(user, "bad", {**doc(), field: value})
    assert project.main(H100) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(path) in err and named in err, err


def test_selection_by_hardware_group_gpu_name_and_date(user: Path, tmp_path: Path) -> None:
    assert hwprofile.select("h100") is None
    write(tmp_path / "shipped", "shipped_h100", doc(date="2027-01-01T00:00:00+00:00"))
    assert hwprofile.select("h100").shipped  # type: ignore[union-attr]
    write(user, "old", doc(date="2026-01-01T00:00:00+00:00"))
    write(user, "new", doc(date="2026-06-01T00:00:00+00:00"))
    write(user, "pcie", doc(gpu="NVIDIA H100 PCIe", date="2026-03-01T00:00:00+00:00"))
    write(user, "h200", doc(hardware="h200", gpu="NVIDIA H200", date="2026-09-01T00:00:00+00:00"))
    assert hwprofile.select("h100").path.name == "new.json"  # type: ignore[union-attr]  # a user's, newest
    assert hwprofile.select("h100", "NVIDIA H100 PCIe").path.name == "pcie.json"  # type: ignore[union-attr]
    assert hwprofile.select("h200").path.name == "h200.json"  # type: ignore[union-attr]
    assert hwprofile.select("b200") is None


def test_prediction_names_its_profile_and_rests_on_its_numbers(user: Path) -> None:
    bare = project.project(H100, "ours")
    assert bare["hardware_profile"].startswith("not calibrated: no hardware profile for h100")
    assert "not calibrated" in project.format_text(bare)
    peak = 989.0  # conf/hardware/h100.yaml
    path = write(user, "mine", doc(dense=[{"ms": 1.0, "flop": peak / 2 * 1e9}]))
    res = project.project(H100, "ours")
    assert str(path) in res["hardware_profile"] and str(path) in project.format_text(res)
    from muonbench.schema import HardwareConfig

    eff = hwprofile.effective(HardwareConfig(name="h100", peak_bf16_tflops=peak, hbm_tbps=3.35, source="t"))
    assert eff.gemm_bf16.value == pytest.approx(0.5)  # measured over datasheet, not the H200 ceiling fraction
    scale = 2412.0 / 3350.0 / C.HBM_EFFICIENCY.value
    assert eff.hbm.value == pytest.approx(C.FITTED["h100"].hbm.value * scale)
    assert res["breakdown"]["fwd_bwd_gemm"] > bare["breakdown"]["fwd_bwd_gemm"] * 1.2
    assert res["breakdown"]["fwd_bwd_attention"] != bare["breakdown"]["fwd_bwd_attention"]


def test_profile_ns_plan_times_replace_the_h200_table_for_their_shapes(user: Path) -> None:
    """A shape the profile's NS plan timed costs what it measured there (less the host cost of the call)."""
    from bench.tools.perfmodel import nscost

    hw = nscost.load_hardware("h100")
    key = "G|torch|1x2048x4096|torch.bfloat16|q|gram=False|restarts=-|eps=1e-07"
    write(user, "mine", doc(dense=[{"ms": 1.0, "flop": 6e14}], ns_plan_ms={key: 9.0}))
    table = nscost.hardware_table(hw, "ours")
    host = nscost.ns_data("ours").host_ms
    assert nscost.gpu_ms(2048, 4096, hw, table=table) == pytest.approx(9.0 - host)
    assert nscost.hardware_table(hw, "published") == nscost.measured_table("published")


def test_workload_takes_the_models_shapes() -> None:
    import muonbench

    cfg = muonbench.load(["model=qwen3_30b_a3b", "parallelism=single_gpu", "optimizer=muon"])
    w = calibrate.workload(cfg)
    tokens = cfg.parallelism.mbs * cfg.model.seq_length
    assert {(m, n, k) for m, n, k in w["dense"]} >= {(tokens, 2048, 4096)}  # attention output projection
    assert {g for g, *_ in w["grouped"]} == {128}  # every expert on one GPU
    assert w["attention"]["kv_heads"] == 4 and w["attention"]["seq"] == cfg.model.seq_length
    assert (128, 768, 2048) in w["ns"]  # the expert fc2 stack, as the Muon step batches it


@pytest.mark.parametrize(("arg", "named"), [("budget_s=5", "budget_s='5'"), ("slice=hf", "slice='hf'")])
def test_calibrate_refuses_bad_arguments_before_measuring(
    arg: str, named: str, user: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert calibrate.main([*H100, arg]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and named in err
    assert not user.exists()


def test_a_shape_the_plan_never_timed_costs_its_nearest_planned_shapes_rate() -> None:
    """Our NS kernels' cost off the planned shapes comes from the plan's measured neighbours, not the analytic curve
    (whose m / (m + 600) fit misses our kernels' rate at mid-size shapes)."""
    from bench.tools.perfmodel import nscost
    from optim import cost

    table = nscost.measured_table("ours")
    near = (2048, 4096)
    assert near in table.planned and (2000, 4000) not in dict(table)  # type: ignore[attr-defined]
    rate = cost.ns_flops(*near) / table.planned[near]  # type: ignore[attr-defined]
    assert table[(2000, 4000)] == pytest.approx(cost.ns_flops(2000, 4000) / rate)
    hw = nscost.load_hardware("h200")
    curve = nscost.gpu_ms(2000, 4000, hw, table={})
    assert nscost.gpu_ms(2000, 4000, hw, table=table) != pytest.approx(curve, rel=0.02)


def test_compare_records_each_arms_prediction_with_its_profile(user: Path) -> None:
    """`muonbench compare` keeps what the model predicted beside the runs (the calibration check reads it)."""
    import muonbench
    from bench.tools import compare

    path = write(user, "mine", doc(hardware="h200", gpu="NVIDIA H200"))
    cfgs = {arm: muonbench.load(["experiment=h200/qwen3_moe_short_megatron_1gpu", f"optimizer={opt}"])
            for arm, opt in (("A", "adamw"), ("B", "muon"))}  # fmt: skip
    pred = compare.predicted(cfgs)
    assert pred["B"]["profile"] == "ours" and pred["A"]["profile"] == "published"
    assert all(str(path) in p["hardware_profile"] and p["step_time_s_interval"][0] < p["step_time_s"] for p in pred.values())
