"""The optimizers outside the happy path: SOAP after a huge finite gradient, SOAP on float64 parameters,
torch.compile of Muon.step / MOP.step."""

from __future__ import annotations

import warnings

import pytest
import torch

from optim import MOP, SOAP, Muon, NonFiniteWarning
from tests.unit._optim_fixtures import one_thread  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")


def test_soap_recovers_after_a_huge_finite_gradient() -> None:
    """Localises eigh failing on the overflowed factors at the huge step and at every normal step after it."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(8, 6))
    opt = SOAP([("w", w)], lr=0.01)
    w.grad = torch.randn(8, 6)
    opt.step()
    w.grad = torch.randn(8, 6) * 1e20
    before = w.detach().clone()
    with pytest.warns(NonFiniteWarning, match=r"non-finite update in w at step 2: update skipped, preconditioner"):
        opt.step()
    assert torch.equal(w, before) and opt.num_skipped_updates == 1
    assert opt.nonfinite_events == [("w", 2, "update")]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            w.grad = torch.randn(8, 6)
            opt.step()
    assert torch.isfinite(w).all() and not torch.equal(w, before) and opt.num_skipped_updates == 1
    assert all(torch.isfinite(v).all() for v in opt.state[w].values() if torch.is_tensor(v))


def test_soap_keeps_float64_state_for_float64_parameters() -> None:
    w = torch.nn.Parameter(torch.randn(4, 3, dtype=torch.float64))
    opt = SOAP([w])
    w.grad = torch.randn(4, 3, dtype=torch.float64)
    opt.step()
    assert {v.dtype for v in opt.state[w].values() if torch.is_tensor(v)} == {torch.float64}
    b = torch.nn.Parameter(torch.randn(4, 3, dtype=torch.bfloat16))
    opt = SOAP([b])
    b.grad = torch.randn(4, 3, dtype=torch.bfloat16)
    opt.step()
    assert {v.dtype for v in opt.state[b].values() if torch.is_tensor(v)} == {torch.float32}


@pytest.mark.parametrize("cls", [Muon, MOP])
def test_step_compiles(cls) -> None:  # type: ignore[no-untyped-def]
    """Localises torch.compile failing on `self.num_skipped_updates += ...` (a setattr dynamo cannot trace)."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(8, 6))
    opt = cls([("w", w)], lr=0.01)
    step = torch.compile(opt.step, backend="eager")  # dynamo's tracing is what failed; no kernel codegen needed
    for i in range(2):
        w.grad = torch.randn(8, 6)
        if i == 1:
            w.grad[0, 0] = float("nan")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NonFiniteWarning)
            step()
    assert opt.num_skipped_updates == 1 and torch.isfinite(w).all()
