"""Refused before launch, naming the field: data the engine cannot read or that is not there, and custom
Newton-Schulz coefficients that are not finite (a, b, c) triples; the Python API's type checks."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import muonbench
from muonbench import ConfigError
from optim.configs import AdamWConfig, MuonConfig, RoutingConfig, SOAPConfig

CPU = ["experiment=cpu/qwen3_moe_tiny_dp2"]


def _runnable(*overrides: str) -> None:
    muonbench.check_runnable(muonbench.load([*CPU, *overrides]))


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["bench.data=text:/nonexistent"], r"bench.data='text:/nonexistent': no such file: /nonexistent"),
        (["bench.data=indexed:/x"], r"bench.data='indexed:/x': the hf engine reads \['mock', 'text:<file>'\]"),
        (["bench.data=text:"], r"the hf engine reads"),
        (["bench.data=mock:x"], r"the hf engine reads"),
    ],
)
def test_data_the_engine_cannot_read_is_refused_before_launch(overrides: list[str], match: str) -> None:
    """Localises these failing inside every rank after launch (a ~20-line traceback per rank)."""
    with pytest.raises(ConfigError, match=match):
        _runnable(*overrides)


def test_a_text_file_that_exists_passes_and_a_short_one_does_not(tmp_path: Path) -> None:
    text = tmp_path / "corpus.txt"
    text.write_bytes(b"x" * 10)
    with pytest.raises(ConfigError, match=r"the file has 10 bytes, needs > model.seq_length"):
        _runnable(f"bench.data=text:{text}", "model.vocab_size=256")
    text.write_bytes(b"x" * 100_000)
    _runnable(f"bench.data=text:{text}", "model.vocab_size=256")


@pytest.mark.parametrize(
    ("coefficients", "match"),
    [
        ("[[3.4,-4.7],[2.0,-1.5]]", r"optimizer.custom_coefficients\[0\]=\(3.4, -4.7\)"),
        ("[[3.4,-4.7,2.0,1.0]]", r"custom_coefficients\[0\]"),
        ("[[1e30,-4.7,2.0]]", r"custom_coefficients\[0\]=\(1e\+30"),
    ],
)
def test_custom_coefficients_must_be_finite_triples_at_compose(coefficients: str, match: str) -> None:
    """Localises a list of pairs passing compose and failing in every rank, and 1e30 accepted."""
    with pytest.raises(ConfigError, match=match + r".*\(a, b, c\) triples"):
        muonbench.load(
            [*CPU, "optimizer=muon", "optimizer.coefficient_type=custom", f"optimizer.custom_coefficients={coefficients}"]
        )


@pytest.mark.parametrize("bad", [math.nan, math.inf, 1e30])
def test_the_api_refuses_nan_or_huge_custom_coefficients(bad: float) -> None:
    """Localises weights silently turning NaN with num_skipped_updates 0."""
    with pytest.raises(ValueError, match=r"custom_coefficients\[1\]"):
        MuonConfig(coefficient_type="custom", custom_coefficients=((3.0, -3.0, 1.0), (bad, 0.0, 0.0)))


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: MuonConfig(num_ns_steps=5.5), r"num_ns_steps=5.5 must be an int"),
        (lambda: MuonConfig(num_ns_steps=True), r"num_ns_steps=True must be an int"),
        (lambda: MuonConfig(nesterov="false"), r"nesterov='false' must be a bool"),
        (lambda: MuonConfig(lr="0.01"), r"lr='0.01' must be a number"),
        (lambda: MuonConfig(use_gram_ns=True, gram_restart_iterations=(2.0,)), r"gram_restart_iterations\[0\]"),
        (lambda: SOAPConfig(precondition_frequency=1.5), r"precondition_frequency=1.5 must be an int"),
        (lambda: SOAPConfig(max_precond_dim=8192.0), r"max_precond_dim=8192.0 must be an int"),
        (lambda: SOAPConfig(use_eigh=1), r"use_eigh=1 must be a bool"),
        (lambda: AdamWConfig(lr=None), r"lr=None must be a number"),
        (lambda: RoutingConfig(split_qkv="no"), r"split_qkv='no' must be a bool"),
    ],
)
def test_api_types_are_checked_by_field(build, match: str) -> None:  # type: ignore[no-untyped-def]
    """Localises num_ns_steps=5.5 failing in islice, True running 1 step, nesterov="false" turning Nesterov on,
    float SOAP counts accepted, and lr="0.01" failing without the field's name."""
    with pytest.raises(ValueError, match=match):
        build()
