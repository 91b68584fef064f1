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
