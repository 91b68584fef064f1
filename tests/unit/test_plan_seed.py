"""Shipped NS plan entries: what a cold cache adopts instead of timing every candidate (optim.kernels.plan_seed)."""

import json

import pytest
import torch

from optim.functional.newton_schulz import ns_coefficients
from optim.kernels import plan, plan_seed


def _write_seed(tmp_path, key: str, method: str) -> None:
    doc = {"provenance": {"gpu": "test", "run_id": "r1"}, "entries": {key: {"method": method, "times_ms": {}}}}
    (tmp_path / "test.json").write_text(json.dumps(doc))


def _problem():
    torch.manual_seed(0)
    x = torch.randn(2, 16, 24)
    coeffs = ns_coefficients("quintic", 5)
    key = plan.plan_key("cpu|test", x, coeffs, 1e-7, False, frozenset())
    return x, coeffs, key


def test_shipped_seeds_match_the_current_plan_version():
    """Localises a stale seed file: after PLAN_VERSION changes, no shipped key can match any process (re-seed it
    from a GPU run, or delete it)."""
    entries = plan_seed.seeds()
    assert entries, "no shipped NS plan seeds"
    for key, entry in entries.items():
        assert f"|plan {plan.PLAN_VERSION}|" in key, key
        assert entry["method"] in entry["times_ms"] and entry["seed"]["run_id"]


def test_adopt_takes_a_matching_seed_after_it_agrees_with_cublas(tmp_path):
    x, coeffs, key = _problem()
    _write_seed(tmp_path, key, "plain_torch")
    entry = plan.Planner(path=tmp_path / "cache.json").adopt(x, coeffs, 1e-7, frozenset(), key, seed_dir=tmp_path)
    assert entry is not None and entry["method"] == "plain_torch"
    assert entry["seed"]["run_id"] == "r1" and entry["plan_s"] >= 0


def test_adopt_measures_when_the_seed_cannot_run_or_is_turned_off(tmp_path, monkeypatch):
    x, coeffs, key = _problem()
    planner = plan.Planner(path=tmp_path / "cache.json")
    seeded = tmp_path / "seeds"
    seeded.mkdir()
    _write_seed(seeded, key, "no_such_candidate")  # seed files are read once per process and directory
    assert planner.adopt(x, coeffs, 1e-7, frozenset(), key + "|other", seed_dir=seeded) is None
    with pytest.warns(RuntimeWarning, match="no_such_candidate"):
        assert planner.adopt(x, coeffs, 1e-7, frozenset(), key, seed_dir=seeded) is None
    monkeypatch.setenv("MUONBENCH_NS_PLAN", "measure")
    assert plan_seed.lookup(key, seeded) is None
    monkeypatch.setenv("MUONBENCH_NS_PLAN", "sometimes")
    with pytest.raises(ValueError, match="MUONBENCH_NS_PLAN='sometimes': must be one of"):
        plan_seed.lookup(key, seeded)


def test_seed_file_from_a_committed_run_record(tmp_path, capsys):
    """`python -m optim.kernels.plan_seed RUN REPORT OUT` keeps each measured entry's choice and timings with the run's
    provenance; the shipped files made this way are what `seeds()` reads; a run without an NS plan is refused."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    report = "reports/byo_models_h200_202612"
    run = repo / report / "runs/olmoe_1b_7b/bridge/20261204_160952_olmoe_1b_7b_muon"
    out = tmp_path / "seed.json"
    assert plan_seed.main([str(run), report, str(out)]) == 0
    doc = json.loads(out.read_text())
    measured = json.loads((run / "run.json").read_text())["ns_plan"]
    assert set(doc["entries"]) == set(measured) and len(measured) == 4
    for key, entry in doc["entries"].items():
        assert set(entry) <= set(plan_seed.SEED_FIELDS) and entry["method"] == measured[key]["method"]
    assert doc["provenance"]["run_id"] == run.name and doc["provenance"]["gpu"] == "NVIDIA H200"
    shipped = repo / "optim/kernels/plan_seeds" / f"nvidia_h200__{run.name}.json"
    assert json.loads(shipped.read_text())["entries"] == doc["entries"]
    assert set(doc["entries"]) <= set(plan_seed.seeds())
    adamw = next((repo / report / "runs/olmoe_1b_7b/bridge").glob("*_adamw"))
    assert plan_seed.main([str(adamw), report, str(tmp_path / "x.json")]) == 2
    assert "has no ns_plan" in capsys.readouterr().err
