"""The NS plan's on-disk cache under stress: processes saving at once, a corrupt file, a directory that cannot be
written. The measurement is the plan's own, on CPU tensors (the timer of CPU tensors is host wall time)."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest
import torch

from optim.kernels import plan as plan_mod

COEFFS = [(3.4445, -4.7750, 2.0315)] * 5


@pytest.fixture
def cpu_planning(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan's key asks CUDA for the GPU name; a CPU test names its environment itself."""
    monkeypatch.setattr(plan_mod, "env_key", lambda device: "cpu-test")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(plan_mod, "BUDGET_MS_PER_CANDIDATE", 1.0)  # a few rounds: the test is of the cache


def _choose(p: plan_mod.Planner) -> tuple[str, str]:
    return p.choose(torch.randn(2, 8, 16), COEFFS, 1e-7, False, frozenset())


def _save_many(path: str, tag: str, n: int) -> None:
    for i in range(n):  # a new Planner per entry: each save is one process's read-merge-replace
        p = plan_mod.Planner(path=Path(path))
        p.choices[f"{tag}{i}"] = {"method": "plain_torch", "times_ms": {"plain_torch": float(i)}}
        p._save()


def test_processes_saving_at_once_keep_every_entry(tmp_path: Path) -> None:
    """Two processes merging their plans into one file at the same time lose none of each other's entries."""
    path = tmp_path / "ns_plan.json"
    n = 60
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_save_many, args=(str(path), tag, n)) for tag in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    data = json.loads(path.read_text())
    assert set(data) == {f"{t}{i}" for t in "ab" for i in range(n)}
    assert not list(tmp_path.glob("*.tmp*"))  # every temporary file was renamed into place


def test_a_plan_measured_by_another_process_is_taken_not_measured_again(tmp_path, cpu_planning) -> None:  # type: ignore[no-untyped-def]
    """A process that loaded the cache before another one saved a plan takes that plan from disk on its miss."""
    path = tmp_path / "ns_plan.json"
    first = plan_mod.Planner(path=path)
    method, key = _choose(first)  # measured on CPU, saved
    later = plan_mod.Planner(path=tmp_path / "ns_plan.json")
    later.loaded = True  # it loaded before `first` saved
    entry = json.loads(path.read_text())[key] | {"plan_s": 1234.0}
    path.write_text(json.dumps({key: entry}))
    assert _choose(later) == (method, key)
    assert later.choices[key]["plan_s"] == 1234.0


@pytest.mark.parametrize("content", ['{"cpu-test|2x8x16": {"method": "plain_to', '["not", "an", "object"]'])
def test_a_corrupt_cache_file_is_measured_again_with_a_warning(tmp_path, cpu_planning, content: str) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "ns_plan.json"
    path.write_text(content)
    p = plan_mod.Planner(path=path)
    with pytest.warns(RuntimeWarning, match="ns_plan.json is (corrupt|not a JSON object).*measured again"):
        method, key = _choose(p)
    assert p.choices[key]["times_ms"]  # measured here
    assert json.loads(path.read_text())[key]["method"] == method  # the file is whole again


def test_a_malformed_entry_is_measured_again_with_a_warning(tmp_path, cpu_planning) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "ns_plan.json"
    key = _choose(plan_mod.Planner(path=path))[1]
    path.write_text(json.dumps({key: "plain_torch", "other": {"method": "plain_torch"}}))
    p = plan_mod.Planner(path=path)
    with pytest.warns(RuntimeWarning, match="1 malformed entries ignored"):
        _choose(p)
    data = json.loads(path.read_text())
    assert isinstance(data[key], dict) and data[key]["times_ms"] and "other" in data


def _unwritable(tmp_path: Path, how: str) -> Path:
    if how == "read-only directory":
        if os.geteuid() == 0:
            pytest.skip("root writes into a read-only directory")
        d = tmp_path / "ro"
        d.mkdir()
        d.chmod(0o555)
        return d / "ns_plan.json"
    (tmp_path / "file").write_text("")  # the cache directory's path is a file
    return tmp_path / "file" / "ns_plan.json"


@pytest.mark.parametrize("how", ["read-only directory", "directory is a file"])
def test_an_unwritable_cache_keeps_the_plan_in_memory_with_a_warning(tmp_path, cpu_planning, how: str) -> None:  # type: ignore[no-untyped-def]
    p = plan_mod.Planner(path=_unwritable(tmp_path, how))
    with pytest.warns(RuntimeWarning, match="cannot be written.*kept in memory only"):
        method, key = _choose(p)
    assert p.memory_only and p.choices[key]["method"] == method
    assert _choose(p) == (method, key)  # from memory: no second measurement, no second warning
