"""CPU tests of the NS timing protocol (`optim.kernels.timing`) and of what the plan offers and caches with it:
interleaving order, drift, pruning, failures, graph candidates per Muon shape, the plan version in the cache key,
and the memoized dispatch."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable

import pytest
import torch

from optim.functional.newton_schulz import ns_coefficients
from optim.kernels import plan as plan_mod
from optim.kernels.timing import interleaved_medians, interleaved_samples, rotation, wall_ms

QUINTIC = [tuple(map(float, c)) for c in ns_coefficients("quintic", 5)]


def _logging(names: list[str], log: list[str]) -> dict[str, Callable[[], object]]:
    return {n: (lambda n=n: log.append(n)) for n in names}


def test_rounds_are_rotated_round_robin() -> None:
    """Every round calls each function once, round r starting with the r-th (the warm-up round is round 0); no
    function is timed in a block of its own.

    Localises: impls timed one after another (each carrying the GPU's drift), a fixed order (one always right after
    the same neighbour)."""
    log: list[str] = []
    names = ["a", "b", "c"]
    medians, errors = interleaved_medians(
        _logging(names, log), timer=wall_ms, budget_ms=0.0, min_rounds=4, max_rounds=4
    )
    assert errors == {} and set(medians) == set(names)
    expected = [n for r in range(5) for n in rotation(names, r)]
    assert log == expected
    assert log[:6] == ["a", "b", "c", "b", "c", "a"]
    assert rotation([], 3) == []


def test_interleaving_cancels_drift() -> None:
    """Two identical calls on a clock that slows by 1% per call: interleaved, their medians agree within 1%;
    timed one after the other (the former protocol) the second would look 10% slower.

    Localises: a median taken over a block of consecutive calls of one function."""
    calls = [0]

    def drifting(fn: Callable[[], object]) -> float:
        fn()
        calls[0] += 1
        return 1.0 + 0.01 * calls[0]

    fns = {"x": lambda: None, "y": lambda: None}
    med, _ = interleaved_medians(fns, timer=drifting, budget_ms=1e9, min_rounds=10, max_rounds=10)
    assert abs(med["x"] - med["y"]) / med["x"] < 0.01
    calls[0] = 0
    blocks = {n: statistics.median(drifting(f) for _ in range(10)) for n, f in fns.items()}
    assert (blocks["y"] - blocks["x"]) / blocks["x"] > 0.09


def test_rounds_follow_budget_and_pruning_keeps_the_close_ones() -> None:
    """Rounds = budget / (one round's cost), clamped to [min_rounds, max_rounds]; with keep_within, a function
    whose fastest call is more than that fraction slower than the best median after min_rounds is not timed again,
    the close ones are."""
    cost = {"fast": 1.0, "close": 1.05, "slow": 2.0}
    count = dict.fromkeys(cost, 0)

    def timer(fn: Callable[[], object]) -> float:
        name = str(fn())
        count[name] += 1
        return cost[name]

    fns = {n: (lambda n=n: n) for n in cost}
    med, _ = interleaved_medians(fns, timer=timer, budget_ms=4.05 * 6 + 0.1, min_rounds=2, max_rounds=50)
    assert count == dict.fromkeys(cost, 7)  # warm-up + budget / round (6 rounds of 4.05 ms)
    assert med == cost
    count.update(dict.fromkeys(cost, 0))
    med, _ = interleaved_medians(
        fns, timer=timer, budget_ms=1000.0, min_rounds=3, max_rounds=10, keep_within=0.1
    )
    assert count == {"fast": 11, "close": 11, "slow": 4}  # slow: warm-up + 3 rounds, then dropped
    assert med["slow"] == 2.0
    with pytest.raises(ValueError, match="min_rounds"):
        interleaved_medians(fns, timer=timer, budget_ms=1.0, min_rounds=3, max_rounds=2)


def test_pruning_keeps_a_function_whose_fastest_call_is_close() -> None:
    """A function whose first rounds ran slow (a clock change) but which had one call as fast as the leader is
    timed to the end, and its median over all rounds is its steady time; one whose every call is far behind is
    dropped, and the samples count the calls each was timed.

    Localises: pruning on a median of a few rounds (the H200 plan dropped QuACK's default NS on 6 x 2048 x 7168 at a
    3-round median of 7.02 ms; the plan that followed timed it at 5.87 ms, fastest of the plain bodies)."""
    costs = {"lead": [1.0] * 20, "noisy": [1.0, 1.3, 1.0, 1.3] + [0.98] * 16, "slow": [1.2] * 20}
    calls = dict.fromkeys(costs, 0)

    def timer(fn: Callable[[], object]) -> float:
        name = str(fn())
        calls[name] += 1
        return costs[name][calls[name] - 1]

    fns = {n: (lambda n=n: n) for n in costs}
    samples, errors = interleaved_samples(
        fns, timer=timer, budget_ms=1000.0, min_rounds=3, max_rounds=10, keep_within=0.1
    )
    assert errors == {}
    # the warm-up call is not a sample: "noisy" samples start at its second call
    assert samples["noisy"][:3] == [1.3, 1.0, 1.3] and statistics.median(samples["noisy"][:3]) > 1.1
    assert {n: len(s) for n, s in samples.items()} == {"lead": 10, "noisy": 10, "slow": 3}
    assert statistics.median(samples["noisy"]) < statistics.median(samples["lead"])


def test_a_function_that_raises_is_dropped_and_named() -> None:
    """A call that fails while timed (out of memory) is reported with its error and timed no further; the others
    get their medians."""
    log: list[str] = []

    def boom() -> None:
        log.append("boom")
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    fns = {"ok": lambda: log.append("ok"), "boom": boom}
    med, errors = interleaved_medians(fns, timer=wall_ms, budget_ms=0.0, min_rounds=3, max_rounds=3)
    assert set(med) == {"ok"} and errors["boom"].startswith("OutOfMemoryError")
    assert log.count("boom") == 1 and log.count("ok") == 4


def test_wall_timer_orders_a_slow_call_after_a_fast_one() -> None:
    """The CPU timer measures the call: a 5 ms sleep has the larger median."""
    med, _ = interleaved_medians(
        {"sleep": lambda: time.sleep(0.005), "noop": lambda: None},
        timer=wall_ms,
        budget_ms=0.0,
        min_rounds=3,
        max_rounds=3,
    )
    assert med["sleep"] >= 5.0 > med["noop"]


# bench.tools.ns_kernels.SHAPES whose plan offers CUDA-graph variants
GRAPHED = {
    "qwen_q", "qwen_kv", "qwen_o", "qwen_router",
    "k2_q_down", "k2_q_up", "k2_kv_down", "k2_kv_up", "k2_router",
}  # fmt: skip


def test_graph_candidates_for_every_launch_sensitive_muon_shape() -> None:
    """Graph variants for every single matrix of Qwen3-30B-A3B and Kimi K2 up to 12288 x 1536 (1536 x 7168 was
    host-bound on the H200 without them), not for the expert batches, K2's attention out and dense MLP or 8192^2;
    every body has its graph twin where offered.

    Localises: a threshold that leaves a launch-bound shape without graphs, or graphs every large problem
    (their copies cost memory and plan time for nothing)."""
    from bench.tools.ns_kernels import SHAPES

    offered = set()
    for name, rows, cols, batch, _, _ in SHAPES:
        m, n = min(rows, cols), max(rows, cols)
        names = plan_mod.candidate_names(batch, m, n, 5, use_gram=True, triton_ok=True, quack_ok=True)
        graphs = [x for x in names if x.endswith("+graph")]
        if graphs:
            offered.add(name)
            assert sorted(graphs) == sorted(x + "+graph" for x in names if not x.endswith("+graph")), name
    assert offered == GRAPHED
    assert plan_mod.launch_sensitive(1, 1536, 12288, 5) and not plan_mod.launch_sensitive(1, 7168, 8192, 5)
    # the bound scales with the launches of a call: 1.48 plain TFLOP at 5 steps
    assert 1.45e12 < plan_mod.plain_flops(1, 2048, 16384, 5) < 1.48e12
    assert plan_mod.launch_sensitive(1, 2048, 16384, 5) and not plan_mod.launch_sensitive(1, 2048, 16384, 6)


def test_plan_version_in_the_key_invalidates_older_entries(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """An entry written under the former key (no plan version: candidates timed one after another) is not
    reused: `choose` measures the problem again under the current key and writes it beside the old one.

    Localises: a cache from the former timing protocol silently deciding today's methods."""
    monkeypatch.setenv("MUONBENCH_CACHE", str(tmp_path))
    env = plan_mod.env_string("NVIDIA H200", "2.11.0", "3.6.0", "0.6.5")
    assert env == f"NVIDIA H200|torch 2.11.0|triton 3.6.0|quack 0.6.5|plan {plan_mod.PLAN_VERSION}"
    bare = plan_mod.env_string("GPU", "t", "tr", None)
    assert bare == f"GPU|torch t|triton tr|plan {plan_mod.PLAN_VERSION}"
    x = torch.randn(2, 8, 16)
    old_env = "NVIDIA H200|torch 2.11.0|triton 3.6.0|quack 0.6.5"
    old_key = plan_mod.plan_key(old_env, x, QUINTIC, 1e-7, False, frozenset({2}))
    stale = {"method": "plain_sym_t64", "times_ms": {"plain_sym_t64": 0.001}, "plan_s": -1.0}
    (tmp_path / "ns_plan.json").write_text(json.dumps({old_key: stale}))
    monkeypatch.setattr(plan_mod, "env_key", lambda device: env)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    p = plan_mod.Planner()
    method, key = p.choose(x, QUINTIC, 1e-7, False, frozenset({2}))
    assert key != old_key and key.startswith(env + "|")
    # measured here (Triton cannot run on CPU)
    assert method == "plain_torch" and p.choices[key]["plan_s"] > 0
    on_disk = json.loads((tmp_path / "ns_plan.json").read_text())
    assert on_disk[old_key] == stale and on_disk[key]["method"] == "plain_torch"


def test_plan_times_the_survivors_and_picks_the_lowest_median(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """On CPU tensors every Triton and graph candidate fails its first call (rejected with the reason); the
    cuBLAS-body ones (plain and Gram) are timed and the lower median is the method."""
    monkeypatch.setenv("MUONBENCH_CACHE", str(tmp_path))
    x = torch.randn(3, 16, 40)
    entry = plan_mod.Planner().measure(x, QUINTIC, 1e-7, True, frozenset({2}), "k")
    times = entry["times_ms"]
    assert isinstance(times, dict) and set(times) == {"plain_torch", "gram_torch"}
    assert entry["method"] == min(times, key=times.__getitem__)
    rounds = entry["rounds"]
    assert isinstance(rounds, dict) and set(rounds) == set(times)
    assert all(plan_mod.MIN_ROUNDS <= n <= 25 for n in rounds.values()), rounds
    rejected = entry["rejected"]
    assert isinstance(rejected, dict) and "plain_torch+graph" in rejected and "gram_sym_t128" in rejected


def test_pick_takes_the_graph_twin_within_the_preference() -> None:
    """The fastest median wins, except that its graph twin within GRAPH_PREFERENCE takes its place; a graph
    further behind, another candidate's graph, or a graph that is itself fastest are handled as plain medians.

    Localises: a plan that takes a plain call of a launch-sensitive problem for a 2% edge (12288 x 1536 on the
    H200: timed at 1.26 ms plain, 1.29 ms as a graph; the plain call then took 2.11 ms)."""
    pref = plan_mod.GRAPH_PREFERENCE
    assert 0 < pref < 0.1
    q_up = {"plain_sym_tma128s5": 1.258, "plain_sym_tma128s5+graph": 1.287, "plain_torch+graph": 1.400}
    assert plan_mod.pick(q_up) == "plain_sym_tma128s5+graph"
    far = {"a": 1.0, "a+graph": 1.0 + pref + 0.01, "b+graph": 1.001}
    assert plan_mod.pick(far) == "a"
    assert plan_mod.pick({"a": 1.0, "b+graph": 1.01}) == "a"  # not a's twin
    assert plan_mod.pick({"a": 1.0, "a+graph": 0.9}) == "a+graph"
    assert plan_mod.pick({"plain_quack_all": 19.2}) == "plain_quack_all"
    with pytest.raises(ValueError, match="times_ms is empty"):
        plan_mod.pick({})


def test_dispatch_memoizes_the_planned_call(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """`dispatch` plans a problem once and then returns the same call without looking at the plan again; a
    different problem (coefficients) is planned apart; the stand-in used inside a capture before any plan is not
    memoized (the problem is planned on the first call outside it).

    Localises: per-call host work (key strings, cache checks) in the timed path of `orthogonalize`."""
    monkeypatch.setenv("MUONBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(plan_mod, "env_key", lambda device: "cpu-test")
    capturing = [True]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    p = plan_mod.Planner()
    x = torch.randn(2, 8, 24)
    p.dispatch(x, QUINTIC, 1e-7, False, frozenset({2}))
    assert p.fast == {} and p.choices == {}
    capturing[0] = False
    fn = p.dispatch(x, QUINTIC, 1e-7, False, frozenset({2}))
    assert len(p.fast) == 1 and len(p.choices) == 1
    chosen: list[str] = []
    monkeypatch.setattr(
        plan_mod.Planner, "choose", lambda *a, **k: chosen.append("called") or ("plain_torch", "k")
    )
    assert p.dispatch(x, QUINTIC, 1e-7, False, frozenset({2})) is fn and chosen == []
    other = [(3.4445, -4.775, 2.0315)] * 5
    p.dispatch(x, other, 1e-7, False, frozenset({2}))
    assert chosen == ["called"]
    out = fn(x)
    assert out.shape == x.shape and torch.isfinite(out).all()


def test_benchmark_times_the_impls_of_a_shape_interleaved(monkeypatch: pytest.MonkeyPatch) -> None:
    """bench.tools.ns_kernels: each implementation's first call (compilation, plan) comes first, then the timed calls
    alternate between implementations, and a failing one keeps its error while the others get times.

    Localises: impls timed one after another (the 2026-12 H200 table compared times taken seconds apart)."""
    from bench.tools import ns_kernels_measure as runner

    log: list[str] = []

    def impl(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
        def fn(x: torch.Tensor) -> torch.Tensor:
            log.append(name)
            return x

        return fn

    def broken(x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("no kernel for this shape")

    monkeypatch.setattr(runner, "ns_impls", lambda dev: {"a": impl("a"), "b": impl("b"), "c": broken})
    row = runner.measure_shape(("t", 8, 16, 1, "m", "r"), "cpu", False, lambda msg: None)
    assert log == ["a", "b", "a", "b", "b", "a"]  # first calls, warm-up round, one rotated round
    assert row["impls"]["a"]["ms"] >= 0 and row["impls"]["b"]["ms"] >= 0
    assert "ms" not in row["impls"]["c"] and "no kernel" in row["impls"]["c"]["note"]


def test_pick_prefers_quacks_default_general_product_within_the_preference() -> None:
    """An explicit QuACK general-product config replaces QuACK's default (`plain_quack_all`) only where it is faster
    by more than DEFAULT_PREFERENCE; symmetric-product configs and other candidates are picked by their medians.

    Localises: a plan that takes an explicit config for a 0.9% edge on an idle GPU (Kimi K2's 7168 x 8192 on the
    H200: 13.10 against 13.21 ms in the plan, then 13.87 against 13.50 ms in the benchmark's rounds)."""
    pref = plan_mod.DEFAULT_PREFERENCE
    assert 0 < pref < 0.1
    k2_o = {
        "plain_quack_all": 13.213,
        "plain_quack_all_coop128x256_cl2x1": 13.098,
        "plain_quack_all_coop256x208_cl1x2": 13.63,
    }
    assert plan_mod.pick(k2_o) == "plain_quack_all"
    clear = {"plain_quack_all": 1.0 + pref + 0.01, "plain_quack_all_coop128x256_cl2x1": 1.0}
    assert plan_mod.pick(clear) == "plain_quack_all_coop128x256_cl2x1"
    # a symmetric-product config is not an explicit general-product config
    sym = {"plain_quack_all": 1.01, "plain_quack_all_sym128paired": 1.0}
    assert plan_mod.pick(sym) == "plain_quack_all_sym128paired"
    # without the default timed (skipped or failed), the explicit config stands
    assert plan_mod.pick({"plain_quack_all_coop128x256_cl2x1": 1.0, "plain_torch": 1.2}).endswith("cl2x1")
