"""Muon and MOP weights after a few steps at a fixed seed against values saved from the code before the step was
recomposed into the reference step plus fused / TP parts (tests/unit/data/muon_reference_steps.json).

Covers the multi-tensor step (two groups, tall and wide matrices, a split fused matrix, a 3-D expert stack, a bf16
parameter, Nesterov, a NaN gradient skipped), the fused step's torch reference on CPU, single-process TP shards in
every mode, and MOP (SVD and Polar Express). The saved values were bitwise equal to the recomposed step's on the
machine that saved them; the tolerance admits another CPU's BLAS rounding, which five Newton-Schulz iterations
amplify (up to 3e-5 relative seen between two x86 CPUs), and nothing larger: a changed scale, coefficient or skip rule
moves the weights by 1e-3 or more. Regenerate (only for an intended
change of the math): `python -m tests.unit.test_muon_reference --write`.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from optim.configs import MOPConfig, MuonConfig
from optim.distributed.tp_orthogonalize import TPMode
from optim.functional.split import RowSplit
from optim.optimizers import MOP, Muon
from optim.optimizers.tp import TPSpec

DATA = Path(__file__).parent / "data" / "muon_reference_steps.json"
SHAPES = [(8, 12), (12, 8), (8, 12), (2, 8, 12), (12, 20), (6, 6)]
SPLIT = RowSplit(num_groups=2, sizes=(2, 2, 2))  # the (12, 20) matrix


def _params() -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(s, generator=gen) * 0.1) for s in SHAPES]
    ps[5] = torch.nn.Parameter(ps[5].detach().bfloat16())
    return ps


def _steps(opt: torch.optim.Optimizer, ps: list[torch.nn.Parameter], steps: int = 3) -> list[list[float]]:
    gen = torch.Generator().manual_seed(1)
    for k in range(steps):
        for i, p in enumerate(ps):
            g = torch.randn(p.shape, generator=gen)
            if k == 1 and i == 2:
                g[0, 0] = float("nan")
            p.grad = g.to(p.dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            opt.step()
    return [p.detach().float().flatten().tolist() for p in ps]


def _groups(ps: list[torch.nn.Parameter]) -> list[dict[str, Any]]:
    return [{"params": ps[:3], "lr": 0.05, "momentum": 0.9}, {"params": ps[3:], "weight_decay": 0.0}]


def case_muon(fused: bool = False) -> list[list[float]]:
    ps = _params()
    cfg = MuonConfig(lr=0.02, nesterov=True, weight_decay=0.1, ns_precision="fp32")
    return _steps(Muon(_groups(ps), cfg, splits={ps[4]: SPLIT}), ps)


def case_muon_tp() -> list[list[float]]:
    ps = _params()
    modes = [TPMode.DUPLICATED, TPMode.DISTRIBUTED, TPMode.BLOCKWISE]
    tp = {ps[i]: TPSpec(partition_dim=i % 2, mode=modes[i]) for i in range(3)}
    cfg = MuonConfig(lr=0.02, weight_decay=0.1, ns_precision="fp32", scale_mode="shape_scaling")
    return _steps(Muon(_groups(ps), cfg, splits={ps[4]: SPLIT}, tp=tp), ps)


def case_mop(method: str) -> list[list[float]]:
    ps = _params()
    return _steps(MOP(_groups(ps), MOPConfig(lr=0.02, polar_method=method)), ps)


CASES = {
    "muon": case_muon,
    "muon_tp": case_muon_tp,
    "mop_svd": lambda: case_mop("svd"),
    "mop_polar_express": lambda: case_mop("polar_express"),
}


def _fused_case(monkeypatch: pytest.MonkeyPatch | None) -> list[list[float]]:
    if monkeypatch is not None:
        monkeypatch.setattr(Muon, "_fused_available", lambda self: True)
        return case_muon()
    real = Muon._fused_available
    Muon._fused_available = lambda self: True  # type: ignore[method-assign]
    try:
        return case_muon()
    finally:
        Muon._fused_available = real  # type: ignore[method-assign]


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("name", [*CASES, "muon_fused"])
def test_steps_equal_the_saved_reference(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Localises a recomposition of the step that changed the math (op order, grouping, scale, skip rules)."""
    saved = json.loads(DATA.read_text())[name]
    got = _fused_case(monkeypatch) if name == "muon_fused" else CASES[name]()
    for i, (g, s) in enumerate(zip(got, saved, strict=True)):
        torch.testing.assert_close(
            torch.tensor(g), torch.tensor(s), rtol=1e-4, atol=1e-5, msg=lambda m, i=i: f"{i}: {m}"
        )


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    torch.set_num_threads(1)
    out = {name: fn() for name, fn in CASES.items()} | {"muon_fused": _fused_case(None)}
    DATA.write_text(json.dumps(out) + "\n")
    print(f"wrote {DATA}")
