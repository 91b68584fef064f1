"""A run whose every step ran is `ok` only if it trained: skipped updates and dead runs close it `diverged` with the
reason (bench.results.record.judge_training, docs/run_status.md)."""

from __future__ import annotations

import math
import warnings

import pytest

from bench import worker
from bench.results import record
from tests.unit._run_fixtures import write_tiny_run

LN_V = math.log(512)


def _rows(losses, *, skipped=None, grad_norm=1.0):
    return [
        {"step": i, "loss": x, "grad_norm": grad_norm, "skipped_updates": None if skipped is None else skipped[i]}
        for i, x in enumerate(losses)
    ]


def test_a_training_run_is_judged_ok():
    assert record.judge_training(_rows([6.3, 6.1, 5.9, 5.8, 5.75, 5.7]), vocab_sizes=(512,)) is None
    assert record.judge_training(_rows([6.3, 6.1, 5.9], skipped=[0, 0, 0]), vocab_sizes=(512,)) is None
    # a fresh model starts at the uniform loss; that alone is not dead
    assert record.judge_training(_rows([LN_V, LN_V + 1e-4, LN_V - 2e-4, 6.0]), vocab_sizes=(512,)) is None


@pytest.mark.parametrize(
    ("rows", "step", "reason"),
    [
        (_rows([6.3, 6.2, 6.1, 6.0], skipped=[0, 0, 14, 0]), 2, "skipped updates: 14 parameter updates in 1 of 4"),
        (_rows([6.3, 5.0, 6.2403, 6.2403, 6.2403, 6.2403]), 2, "dead: loss constant at 6.2403 for 3 steps"),
        (_rows([6.3, 5.0, 7e6, LN_V + 4e-4, LN_V - 3e-4, LN_V]), 3, "dead: loss at the uniform prediction ln(vocab)"),
        (_rows([6.3, 6.1, 6.0, 6.05], grad_norm=0.0), 0, "dead: gradient norm 0 for 3 steps"),
    ],
)
def test_runs_that_did_not_train_are_judged_with_the_reason(rows, step, reason):
    """Localises runs that collapsed (loss sitting at ln(vocab) after lr=1e6) or skipped every update being `ok`."""
    got = record.judge_training(rows, vocab_sizes=(512,))
    assert got is not None and got["step"] == step and got["reason"].startswith(reason), got


def test_skipped_updates_are_counted_and_the_run_is_not_ok(tmp_path, monkeypatch):
    """Localises `optimizer.momentum=nan` (every Muon update skipped under nonfinite_policy=skip) recorded `ok`:
    the count lands in steps.jsonl, the summary and the status. Validation and the optimizer refuse that value now,
    so NaN gradients of every matrix stand in for it."""
    import torch

    from optim.optimizers.muon import Muon

    real_step = Muon.step

    def nan_grads_step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.fill_(float("nan"))
        return real_step(self, closure)

    monkeypatch.setattr(Muon, "step", nan_grads_step)
    torch.set_num_threads(1)
    write_tiny_run(tmp_path, "bench.steps=3", "optimizer=muon", run_id="skip")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one NonFiniteWarning per matrix and step
        worker.run(tmp_path)
    rec = record.read_json(tmp_path / "run.json")
    per_step = [s["skipped_updates"] for s in record.read_steps(tmp_path)]
    assert len(per_step) == 3 and all(n > 0 for n in per_step)
    assert rec["status"] == "diverged"
    assert rec["divergence"]["reason"].startswith(f"skipped updates: {sum(per_step)} parameter updates in 3 of 3")
    assert rec["summary"]["skipped_updates"] == sum(per_step)
    assert rec["summary"]["steps_with_skipped_updates"] == 3
