"""experiments.soap_eigh: the factor census comes from the real SOAP-REKLS on the quality model; every variant
returns the batched eigenvalues."""

from __future__ import annotations

import pytest
import torch


def test_census_of_the_tiny_quality_model() -> None:
    """Counted per expert from the optimizer's own parameters: the tiny model's expert stacks dominate."""
    from experiments.soap_eigh.soap_eigh import factor_census
    from tools.quality import run
    from tools.quality.config import parse_cli

    census = factor_census("tiny")
    cfg = parse_cli(["profile=tiny", "device=cpu"])
    model = run.build_model(cfg, cfg.vocab_size)
    stacks = [p for n, p in model.named_parameters() if p.ndim == 3]
    assert stacks, "the tiny quality model has expert stacks"
    per_expert = sum(p.shape[0] * 2 for p in stacks)  # two sides per expert matrix
    assert sum(census.values()) >= per_expert
    assert all(k <= 8192 for k in census)


def test_variants_agree_with_batched_eigh() -> None:
    from experiments.soap_eigh.soap_eigh import measure

    rows = measure({16: 6, 8: 3}, "cpu", [2, 3], repeats=1)
    threads = max(2, torch.get_num_threads())
    assert {r["variant"] for r in rows} == {"batched", "streams=2", "streams=3", "host", f"host_threads={threads}"}
    assert all(r["rel_err"] < 1e-5 for r in rows)
    assert all(r["s"] > 0 for r in rows)


def test_unknown_argument_names_the_allowed_keys() -> None:
    from experiments.soap_eigh.soap_eigh import parse_args

    with pytest.raises(ValueError, match=r"key in \['profile', 'device', 'streams', 'repeats', 'out'\]"):
        parse_args(["precondition=10"])
    assert parse_args(["streams=4"])["streams"] == "4"
    assert torch.get_num_threads() >= 1
