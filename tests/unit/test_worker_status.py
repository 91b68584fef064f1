"""bench.worker closes its own record: `diverged` at the first non-finite loss (one process, the hf engine)."""

from __future__ import annotations

import math

import pytest

from bench import worker
from bench.results import record
from tests.unit._run_fixtures import write_tiny_run


@pytest.fixture(autouse=True)
def one_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_nonfinite_loss_closes_the_run_as_diverged(tmp_path):
    """Localises a run whose loss became NaN being recorded `ok` (a huge learning rate on the AdamW baseline)."""
    write_tiny_run(
        tmp_path,
        "bench.steps=8",
        "optimizer=adamw",
        "optimizer.lr=1e12",
        "optimizer.lr_warmup_steps=0",
        run_id="diverge",
    )
    worker.run(tmp_path)
    rec = record.read_json(tmp_path / "run.json")
    losses = [s["loss"] for s in record.read_steps(tmp_path)]
    assert rec["status"] == "diverged" and rec["end_time"]
    first_bad = next(i for i, x in enumerate(losses) if not math.isfinite(x))
    assert rec["divergence"] == {"step": first_bad, "loss": str(losses[first_bad]), "reason": "non-finite loss"}
    assert len(losses) == first_bad + 1 < 8  # stopped there
    assert all(math.isfinite(x) for x in losses[:first_bad])


def test_ns_plan_of_the_process_is_recorded(tmp_path, monkeypatch):
    """The NS plan entries a process ran (`optim.kernels.plans_in_use`) land in its run.json as `ns_plan`: complete
    entries only, with method, candidate times and the backend that ran; nothing is written when no NS was planned."""
    from optim import kernels
    from optim.kernels.plan import Planner

    record.write_json_atomic(tmp_path / "run.json", {"run_id": "plan"})
    monkeypatch.setattr(kernels, "_PLANNER", None)
    worker._record_ns_plan(tmp_path)
    assert "ns_plan" not in record.read_json(tmp_path / "run.json")
    planner = Planner()
    planner.loaded = True
    planner.choices = {
        "k_used": {
            "method": "plain_quack_all",
            "times_ms": {"plain_quack_all": 1.0, "plain_torch": 1.4},
            "x": 1,
        },
        "k_half": {"method": "plain_torch"},
    }
    planner.complete = {"k_used"}
    monkeypatch.setattr(kernels, "_PLANNER", planner)
    worker._record_ns_plan(tmp_path)
    assert record.read_json(tmp_path / "run.json")["ns_plan"] == {
        "k_used": {
            "method": "plain_quack_all",
            "times_ms": {"plain_quack_all": 1.0, "plain_torch": 1.4},
            "backend": "QuACK",
        }
    }
