"""optim.cost: the one NS FLOP count and the TP-mode choice the optimizer and the performance model share."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from optim import cost


def test_ns_flops_plain_formula_and_orientation() -> None:
    """k (4 m^2 n + 2 m^3) with m the short side; a transposed matrix costs the same."""
    m, n, k = 512, 2048, 5
    assert cost.ns_flops(m, n, k) == k * (4 * m * m * n + 2 * m**3)
    assert cost.ns_flops(n, m, k) == cost.ns_flops(m, n, k)
    assert cost.ns_flops(m, n, k, "gram") == 6 * m * m * n + 14 * m**3
    with pytest.raises(ValueError, match="convention='cubic'"):
        cost.ns_flops(m, n, k, "cubic")


def test_engine_choice_equals_performance_model_on_every_hardware_row() -> None:
    """The megatron engine's tp_mode=auto picks with optim.cost from the config's hardware row; the performance
    model predicts with its own rates and links: they must agree, or the report explains a choice the run never
    made."""
    from bench.engines.megatron_optim import tp_mode_fn
    from bench.tools.perfmodel.nscost import choose_tp_mode, load_hardware

    seen = set()
    for name in ("h200", "h100", "b200", "gb300"):
        hw = load_hardware(name)
        pick = tp_mode_fn(SimpleNamespace(hardware=hw))
        for rows, cols in ((4096, 4096), (16384, 4096), (512, 256), (7168, 2048)):
            for tp in (2, 4, 8):
                for dim in (0, 1):
                    got = pick(rows, cols, tp, dim)
                    want = choose_tp_mode(rows, cols, tp, hw, partition_dim=dim)
                    assert got == want, (name, rows, cols, tp, dim)
                    seen.add(got)
    assert seen == {"duplicated", "distributed"}
