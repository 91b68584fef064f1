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


COEFFS = ns_coefficients("quintic", 5)
OFFERED = ["plain_torch", "plain_sym_t128", "plain_sym_t64", "plain_sym_tma128", "plain_sym_tma256", "plain_sym_ptma128"]


def _entries(env: str, dtype: str = "torch.float32") -> dict[str, dict[str, object]]:
    """Two shapes of one class where tma128 and ptma128 lead, and one of another input dtype where t64 leads."""
    times = {"plain_torch": 3.0, "plain_sym_t128": 2.0, "plain_sym_t64": 2.5, "plain_sym_tma128": 1.0,
             "plain_sym_tma256": 1.6, "plain_sym_ptma128": 1.1}  # fmt: skip
    other = {n: (0.5 if n == "plain_sym_t64" else 2.0) for n in times}
    return {
        plan.plan_key(env, torch.empty(4, 8, 16), COEFFS, 1e-7, False, frozenset()): {"times_ms": times},
        plan.plan_key(env, torch.empty(2, 32, 64), COEFFS, 1e-7, False, frozenset()): {"times_ms": times},
        plan.plan_key(env, torch.empty(2, 32, 64, dtype=torch.bfloat16), COEFFS, 1e-7, False, frozenset()): {
            "times_ms": other
        },
    }


def test_prior_ranks_on_entries_of_the_same_problem_class():
    """A shape without an entry times the candidates that led on other shapes of its class, plus cuBLAS; another
    input dtype, another environment or Gram-NS ranks nothing."""
    entries = _entries("cpu-test")
    key = plan.plan_key("cpu-test", torch.empty(3, 24, 40), COEFFS, 1e-7, False, frozenset())
    assert plan_seed.prior_from(entries, key, OFFERED, size=2) == ["plain_torch", "plain_sym_tma128", "plain_sym_ptma128"]
    assert plan_seed.prior_from(entries, key, OFFERED, size=3)[-2:] == ["plain_sym_tma256", "plain_sym_ptma128"]
    bf16 = plan.plan_key("cpu-test", torch.empty(3, 24, 40, dtype=torch.bfloat16), COEFFS, 1e-7, False, frozenset())
    assert plan_seed.prior_from(entries, bf16, OFFERED, size=1) == ["plain_torch", "plain_sym_t64"]
    assert plan_seed.prior_from(entries, key.replace("cpu-test", "other-gpu"), OFFERED) is None
    gram = plan.plan_key("cpu-test", torch.empty(3, 24, 40), COEFFS, 1e-7, True, frozenset({2}))
    assert plan_seed.prior_from(entries, gram, OFFERED) is None
    graphs = [*OFFERED, *(n + "+graph" for n in OFFERED)]  # graph variants offered: another class
    assert plan_seed.prior_from(entries, key, graphs) is None


def test_prior_of_the_shipped_seeds_picks_within_two_percent_of_the_full_search():
    """Each shipped entry, left out of its own prior: the fastest of its PRIOR_SIZE-candidate prior (from its own
    timings) against its fastest candidate overall. Localises a seed file or a PRIOR_SIZE that makes a new model's
    cold-start plan pick a slower kernel."""
    regret = plan_seed.leave_one_out(plan_seed.seeds())
    assert len(regret) == len(plan_seed.seeds())  # every shipped class has at least two entries
    assert max(regret.values()) < 0.02, sorted(regret.items(), key=lambda kv: -kv[1])[:3]
    assert plan_seed.main(["--check-prior"]) == 0


def test_a_cold_shape_is_timed_on_the_prior_and_kept_as_complete(tmp_path, monkeypatch):
    """The planner's cold miss with no seed of its own times the prior only and records it; a later process takes
    that entry as it is; MUONBENCH_NS_PLAN=measure times every candidate of it again."""
    seed_dir = tmp_path / "seeds"
    seed_dir.mkdir()
    doc = {"provenance": {"run_id": "r2"}, "entries": _entries("cpu-test")}
    (seed_dir / "h.json").write_text(json.dumps(doc))
    monkeypatch.setattr(plan_seed, "SEED_DIR", seed_dir)
    monkeypatch.setattr(plan, "env_key", lambda device: "cpu-test")
    monkeypatch.setattr(plan, "candidate_names", lambda *a, **k: list(OFFERED))
    monkeypatch.setattr(plan, "BUDGET_MS_PER_CANDIDATE", 1.0)
    monkeypatch.setattr(plan_seed, "PRIOR_SIZE", 2)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    x = torch.randn(3, 24, 40)
    p = plan.Planner(path=tmp_path / "cache.json")
    method, key = p.choose(x, COEFFS, 1e-7, False, frozenset())
    entry = p.choices[key]
    assert entry["prior"] == ["plain_torch", "plain_sym_tma128", "plain_sym_ptma128"]
    assert set(entry["times_ms"]) | set(entry["rejected"]) == set(entry["prior"])  # Triton's fail on CPU tensors
    assert method == "plain_torch" and not plan.Planner.untried(entry, x, len(COEFFS), False)

    with monkeypatch.context() as m:
        m.setattr(plan.Planner, "measure", lambda *a, **k: pytest.fail("a prior entry was measured again"))
        assert plan.Planner(path=tmp_path / "cache.json").choose(x, COEFFS, 1e-7, False, frozenset()) == (method, key)

    monkeypatch.setenv("MUONBENCH_NS_PLAN", "measure")
    for full in (plan.Planner(path=tmp_path / "cache.json"), p):  # a new process, and the one that holds the prior
        full.choose(x, COEFFS, 1e-7, False, frozenset())
        assert "prior" not in full.choices[key]
        assert set(full.choices[key]["times_ms"]) | set(full.choices[key]["rejected"]) == set(OFFERED)


def test_a_gpu_without_seeds_of_its_name_ranks_on_seeds_of_its_compute_capability():
    """Localises the cold start of an H100 on H200 seeds timing every candidate: entries of another GPU name rank the
    prior only where their seed file names the same compute capability (and the rest of the class matches)."""
    seeded = {
        k: {**e, "seed": {"gpu": "NVIDIA H200", "compute_capability": "9.0"}}
        for k, e in _entries("NVIDIA H200|torch t|triton t|plan 5").items()
    }
    h100 = "NVIDIA H100 80GB HBM3|torch t|triton t|plan 5"
    key = plan.plan_key(h100, torch.empty(3, 24, 40), COEFFS, 1e-7, False, frozenset())
    assert plan_seed.prior_from(seeded, key, OFFERED, size=2) is None  # no capability known: time everything
    assert plan_seed.prior_from(seeded, key, OFFERED, size=2, capability="9.0") == [
        "plain_torch", "plain_sym_tma128", "plain_sym_ptma128"
    ]  # fmt: skip
    assert plan_seed.prior_from(seeded, key, OFFERED, size=2, capability="10.0") is None
    other_torch = key.replace("torch t|", "torch u|")
    assert plan_seed.prior_from(seeded, other_torch, OFFERED, size=2, capability="9.0") is None
    own = {"times_ms": {"plain_torch": 1.0, "plain_sym_t64": 2.0}}  # one entry of its own name: it alone ranks
    same_name = {**seeded, key.replace("3x24x40", "5x8x16"): own}
    assert plan_seed.prior_from(same_name, key, OFFERED, size=1, capability="9.0") == ["plain_torch"]


def test_shipped_seeds_name_their_compute_capability():
    """Without it a GPU of another name but the same chip (H100 on H200 seeds) cannot use them for its prior."""
    assert {plan_seed.capability_of(e) for e in plan_seed.seeds().values()} == {"9.0"}
