"""Assignment strategies of whole matrices to data-parallel ranks (pure shapes -> ranks)."""

from __future__ import annotations

import json
import random

import pytest

from optim.distributed.assignment import (
    CostModel,
    Strategy,
    assign,
    canonical,
    imbalance,
    lpt_cost,
    ns_flops,
    ping_pong_numel,
    rank_loads,
    round_robin,
)


def test_round_robin_deals_in_order() -> None:
    """Localises an off-by-one in the blog's round-robin deal."""
    assert round_robin([(2, 2)] * 7, 3) == [0, 1, 2, 0, 1, 2, 0]


def test_ping_pong_matches_megatron_legacy() -> None:
    """MCore legacy: ascending numel, dealt 0..N-1 then N-1..0 (stable sort keeps model order on ties)."""
    shapes = [(8, 8), (1, 1), (4, 4), (2, 2), (3, 3), (5, 5), (6, 6)]
    # ascending: (1,1)#1 (2,2)#3 (3,3)#4 (4,4)#2 (5,5)#5 (6,6)#6 (8,8)#0 -> ranks 0 1 2 | 2 1 0 | 0
    assert ping_pong_numel(shapes, 3) == [0, 0, 2, 1, 2, 1, 0]


def test_ns_flops_matches_anchor_table() -> None:
    """Plain count of docs/references.md#ns-flops: K2 o_proj 7168x8192 = 12.10 TFLOP, Qwen expert fc2 2048x768 = 0.0287."""
    assert ns_flops((7168, 8192)) == pytest.approx(12.10e12, rel=2e-3)
    assert ns_flops((2048, 768)) == pytest.approx(0.0287e12, rel=5e-3)
    assert canonical((2048, 768)) == (768, 2048)


def test_lpt_cost_beats_published_strategies_on_mixed_shapes() -> None:
    """One big matrix per layer plus small ones: LPT balances NS time, numel ping-pong and round robin do not."""
    layer = [(7168, 8192), (1536, 7168), (12288, 1536), (576, 7168), (16384, 512), (4096, 7168), (7168, 2048)]
    shapes = layer * 15
    model = CostModel()
    results = {
        s: imbalance(rank_loads(shapes, assign(shapes, 8, s, cost_model=model), 8, cost_model=model))
        for s in Strategy
    }
    assert results[Strategy.LPT_COST] <= 1.05
    assert results[Strategy.LPT_COST] < results[Strategy.ROUND_ROBIN]
    assert results[Strategy.LPT_COST] < results[Strategy.PING_PONG_NUMEL]


def test_lpt_colocates_same_shape_small_matrices() -> None:
    """Launch-bound shapes: batching on one rank pays fixed_ms once; LPT must not spread 8 tiny matrices over 4 ranks
    when that costs more than stacking them (each extra rank holding the shape pays another fixed_ms)."""
    model = CostModel(table={(8, 8): (1.0, 0.01)})
    owners = lpt_cost([(8, 8)] * 8 + [(4096, 4096)], 2, cost_model=model)
    small = set(owners[:8])
    assert len(small) == 1 and owners[8] not in small


def test_lpt_is_deterministic_and_respects_initial_loads() -> None:
    rng = random.Random(0)
    shapes = [(rng.choice([64, 128, 512]), rng.choice([256, 1024])) for _ in range(200)]
    a = assign(shapes, 5, "lpt_cost")
    assert a == assign(list(shapes), 5, Strategy.LPT_COST)
    loaded = lpt_cost(shapes, 2, initial_loads=[1e6, 0.0])
    assert set(loaded) == {1}


def test_cost_table_overrides_model(tmp_path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps([{"rows": 2048, "cols": 768, "fixed_ms": 0.5, "per_matrix_ms": 0.07}]))
    model = CostModel.from_table(path)
    assert model.group_ms((768, 2048), 128) == pytest.approx(0.5 + 128 * 0.07)
    assert model.group_ms((4096, 2048), 1) == CostModel().group_ms((2048, 4096), 1)
    assert model.group_ms((768, 2048), 0) == 0.0


def test_cost_model_tracks_h200_batched_measurements() -> None:
    """docs/references.md#h200-baseline: 128 x 1536x2048 batched 32.6 ms, 128 x 2048x768 9.76 ms, 8 x 2048x7168 9.72 ms."""
    model = CostModel()
    assert model.group_ms((1536, 2048), 128) == pytest.approx(32.6, rel=0.15)
    assert model.group_ms((2048, 768), 128) == pytest.approx(9.76, rel=0.15)
    assert model.group_ms((2048, 7168), 8) == pytest.approx(9.72, rel=0.15)


def test_errors_name_value_and_choices() -> None:
    with pytest.raises(ValueError, match="strategy='greedy'.*round_robin"):
        assign([(2, 2)], 2, "greedy")
    with pytest.raises(ValueError, match="num_ranks=0"):
        assign([(2, 2)], 0, "round_robin")
    with pytest.raises(ValueError, match="initial_loads"):
        lpt_cost([(2, 2)], 2, initial_loads=[0.0])
    with pytest.raises(ValueError, match="CostModel.num_ns_steps=0"):
        CostModel(num_ns_steps=0)


def test_imbalance() -> None:
    assert imbalance([1.0, 1.0]) == 1.0
    assert imbalance([3.0, 1.0]) == 1.5
    assert imbalance([0.0, 0.0]) == 1.0
