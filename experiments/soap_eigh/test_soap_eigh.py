"""experiments.soap_eigh: the factor census comes from the real SOAP-REKLS on the quality model; every variant
returns the batched eigenvalues."""

from __future__ import annotations

import pytest
import torch


def test_census_of_the_tiny_quality_model() -> None:
    """Counted per expert from the optimizer's own parameters: the tiny model's expert stacks dominate."""
    from bench.tools.quality import run
    from bench.tools.quality.config import parse_cli
    from experiments.soap_eigh.soap_eigh import factor_census

    census = factor_census("tiny")
    cfg = parse_cli(["profile=tiny", "device=cpu"])
    model = run.build_model(cfg, cfg.vocab_size)
    stacks = [p for n, p in model.named_parameters() if p.ndim == 3]
    assert stacks, "the tiny quality model has expert stacks"
    per_expert = sum(p.shape[0] * 2 for p in stacks)  # two sides per expert matrix
    assert sum(census.values()) >= per_expert
    assert all(k <= 8192 for k in census)


def test_variants_agree_with_batched_eigh(capsys: pytest.CaptureFixture[str]) -> None:
    """Every variant, the optimizer's own `eigh_descending` (`product`) included, gives the batched eigenvalues;
    with `show`, the header and every row are printed."""
    from experiments.soap_eigh.soap_eigh import HEADER, measure, table_row

    rows = measure({16: 6, 8: 3}, "cpu", [2, 3], repeats=1, show=True)
    threads = max(2, torch.get_num_threads())
    variants = {"batched", "streams=2", "streams=3", "host", f"host_threads={threads}", "product"}
    assert {r["variant"] for r in rows} == variants
    assert len(rows) == 2 * len(variants)
    assert all(r["rel_err"] < 1e-5 for r in rows)
    assert all(r["s"] > 0 for r in rows)
    assert capsys.readouterr().out.splitlines() == [*HEADER.splitlines(), *(table_row(r) for r in rows)]


def test_unknown_argument_names_the_allowed_keys() -> None:
    from experiments.soap_eigh.soap_eigh import parse_args

    with pytest.raises(ValueError, match=r"key in \['profile', 'device', 'streams', 'repeats', 'out'\]"):
        parse_args(["precondition=10"])
    assert parse_args(["streams=4"])["streams"] == "4"
    assert parse_args([])["repeats"] == "1"
    assert torch.get_num_threads() >= 1
