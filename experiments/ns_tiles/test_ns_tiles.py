"""experiments.ns_tiles: the NS problems it sweeps come from a plan file's keys."""

from __future__ import annotations

import pytest
import torch


def test_ns_tiles_reads_the_problems_of_a_plan_file() -> None:
    """experiments.ns_tiles.ns_tiles takes its NS problems from a plan file's keys (plain, bf16 input and iterate), distinct."""
    from experiments.ns_tiles.ns_tiles import parse_args, problems_from_plan
    from optim.kernels.plan import plan_key

    env = "NVIDIA H200|torch 2.11.0+cu130|triton 3.6.0"
    coeffs = [(3.4445, -4.775, 2.0315)] * 5
    x = torch.empty(768, 1536, 2048, dtype=torch.bfloat16, device="meta")
    keys = [
        plan_key(env, x, coeffs, 1e-7, False, frozenset()),
        plan_key(env, x, coeffs, 1e-7, False, frozenset(), torch.float16),  # fp16 iterate: same problem
        plan_key(env, x, coeffs, 1e-7, True, frozenset({2})),  # Gram-NS: not a plain problem
        plan_key(env, x.float(), coeffs, 1e-7, False, frozenset()),  # fp32 input
        plan_key(
            env,
            torch.empty(6, 128, 2048, dtype=torch.bfloat16, device="meta"),
            coeffs,
            1e-7,
            False,
            frozenset(),
        ),
    ]
    probs = problems_from_plan(keys)
    assert [(p["batch"], p["rows"], p["cols"]) for p in probs] == [(768, 1536, 2048), (6, 128, 2048)]
    assert probs[0]["coeffs"] == tuple(coeffs) and probs[0]["eps"] == 1e-7
    # the parsed problem gives back its key (so the bench measures exactly the plan's entry)
    assert plan_key(env, x, probs[0]["coeffs"], probs[0]["eps"], False, frozenset()) == keys[0]
    with pytest.raises(ValueError, match="plan=FILE"):
        parse_args([])
    with pytest.raises(ValueError, match="allowed|key in"):
        parse_args(["plan=a", "shape=1"])
