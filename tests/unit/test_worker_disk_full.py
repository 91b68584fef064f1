"""A run folder that fills up mid-run (ENOSPC) ends as `error` naming the cause: no hang, no half-written file, and
the steps written before the failure kept. On a real full disk (a small tmpfs, where mounting is allowed) and at
the product's write seam (`os.write` raising ENOSPC for the run folder only, anywhere)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import launch, worker
from bench import run as bench_run
from bench.results import record
from tests.unit._optim_fixtures import one_thread  # noqa: F401
from tests.unit._run_fixtures import write_tiny_run

pytestmark = pytest.mark.usefixtures("one_thread")


def _new_run(run_dir: Path) -> None:
    """A run record for many steps of the tiny proxy, with its space reserve (as bench.run writes them)."""
    write_tiny_run(run_dir, "bench.steps=2000", "optimizer=adamw", run_id="full")
    record.reserve_space(run_dir)


def _steps_intact(run_dir: Path) -> int:
    """Every line of steps.jsonl is a whole JSON object, steps 0, 1, ... in order; returns how many."""
    lines = (run_dir / "steps.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(len(lines)))
    return len(lines)


def _no_temp_files(run_dir: Path) -> None:
    assert not [p.name for p in run_dir.iterdir() if p.name.endswith(".tmp")]


def _close_as_launcher(run_dir: Path, stderr: str) -> dict:
    """What bench.run does when the worker exits 1: close the record from the worker's errors and exit."""
    res = launch.LaunchResult(command=["torchrun"], returncode=1, stderr_tail=stderr)
    return bench_run._closed(run_dir, lambda: bench_run._close_after_launch(run_dir, res))


def test_full_disk_mid_run_is_recorded_error_with_enospc(small_disk):
    """Localises a full disk (steps.jsonl cannot grow) leaving run.json `running`: the worker's close raised ENOSPC
    again (log.close, the error file, run.json) before anything was recorded. The run's reserve is freed for the
    closing writes; the worker's error and the launcher's closed record name ENOSPC and steps.jsonl."""
    disk = small_disk("256k")
    run_dir = disk / "run"
    _new_run(run_dir)
    page = os.statvfs(disk).f_frsize
    run_json_pages = -(-((run_dir / "run.json").stat().st_size + 2048) // page)
    free = os.statvfs(disk).f_bavail * page
    # leave room for the worker's first run.json update (a second copy for a moment) and a page of steps
    (disk / "filler").write_bytes(bytes(free - (run_json_pages + 1) * page))
    with pytest.raises(OSError) as raised:
        worker.run(run_dir)
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(run_dir / "steps.jsonl")
    steps = _steps_intact(run_dir)
    assert 0 < steps < 2000
    werr = record.read_json(run_dir / "worker_error.rank0.json")
    assert werr["type"] == "OSError" and werr["errno"] == "ENOSPC" and "steps.jsonl" in werr["message"]
    closed_by_worker = record.read_json(run_dir / "run.json")
    assert closed_by_worker["status"] == "error" and closed_by_worker["error"]["errno"] == "ENOSPC"
    rec = _close_as_launcher(run_dir, stderr="OSError: [Errno 28] No space left on device")
    assert rec == record.read_json(run_dir / "run.json")
    assert rec["status"] == "error" and rec["error"]["errno"] == "ENOSPC"
    assert rec["error"]["message"].startswith("[Errno 28] No space left on device") and rec["end_time"]
    assert rec["summary"]["num_steps"] == steps and rec["summary"]["num_steady_steps"] == steps - 1
    assert not (run_dir / record.RESERVE_NAME).exists()
    _no_temp_files(run_dir)


class FullAfter:
    """A disk that fills up for the files under `root`: the first `num_lines` writes to steps.jsonl go through,
    the next one fails, and so does every later write of the files `full` names (all of them by default)."""

    def __init__(self, root: Path, num_lines: int, full=lambda path: True) -> None:
        self.root, self.num_lines, self.full, self.lines, self.filled = str(root), num_lines, full, 0, False

    def fails(self, path: str) -> bool:
        if not path.startswith(self.root):
            return False
        if path.endswith("steps.jsonl") and not self.filled:
            self.lines += 1
            self.filled = self.lines > self.num_lines
        return self.filled and self.full(path)


@pytest.fixture
def enospc(monkeypatch):
    """`os.write` raising a real OSError(ENOSPC) where `rule["disk"].fails(path)` says so (the process's other
    writes go through)."""
    real_write = os.write
    rule: dict = {}

    def write(fd: int, data) -> int:
        disk = rule.get("disk")
        if disk is not None and disk.fails(os.readlink(f"/proc/self/fd/{fd}")):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc/self/fd to tell which file a write goes to")
    monkeypatch.setattr(os, "write", write)
    return rule


def test_enospc_at_the_write_seam_when_even_the_closing_writes_fail(tmp_path, enospc, capsys):
    """Localises the failure path raising again (ENOSPC on flush in log.close, then in the error file) and a
    half-written run.json replacing a good one. Here every write to the run folder fails once steps.jsonl has
    three lines, the reserve's included: the worker reports on stderr and re-raises its own error, run.json keeps
    its last good content, and bench.run names the cause on the terminal and in its return (for the manifest)."""
    run_dir = tmp_path / "run"
    _new_run(run_dir)
    enospc["disk"] = FullAfter(run_dir, 3)
    with pytest.raises(OSError) as raised:
        worker.run(run_dir)
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(run_dir / "steps.jsonl")
    err = capsys.readouterr().err
    assert f"bench.worker rank 0: could not record OSError: [Errno 28] No space left on device: '{run_dir}" in err
    assert _steps_intact(run_dir) == 3
    kept = (run_dir / "run.json").read_text()  # the last good record (the worker's facts in), whole
    assert json.loads(kept)["status"] == "running" and json.loads(kept)["worker"]["engine"]
    assert not (run_dir / "worker_error.rank0.json").exists()
    rec = _close_as_launcher(run_dir, stderr=err)
    assert rec["status"] == "error" and rec["error"]["errno"] == "ENOSPC"
    assert f"run.json not closed: [Errno 28] No space left on device: '{run_dir / 'run.json'}'" in (
        rec["error"]["message"]
    )
    assert f"error: {run_dir}: run.json not closed: [Errno 28]" in capsys.readouterr().err
    assert (run_dir / "run.json").read_text() == kept
    _no_temp_files(run_dir)
    enospc.clear()  # space again: the steps file is whole and a reader takes every line
    assert len(record.read_steps(run_dir)) == 3


def test_enospc_on_steps_only_is_recorded_by_the_worker(tmp_path, enospc):
    """The common case at the seam: steps.jsonl cannot grow, the small closing writes still can: the record says
    `error` with ENOSPC, the steps before it kept whole."""
    run_dir = tmp_path / "run"
    _new_run(run_dir)
    enospc["disk"] = FullAfter(run_dir, 2, full=lambda path: path.endswith("steps.jsonl"))
    with pytest.raises(OSError):
        worker.run(run_dir)
    assert _steps_intact(run_dir) == 2
    rec = record.read_json(run_dir / "run.json")
    assert rec["status"] == "error" and rec["error"]["type"] == "OSError" and rec["error"]["errno"] == "ENOSPC"
    assert (run_dir / record.RESERVE_NAME).exists()  # not needed: the closing writes had room


def test_tee_drains_the_child_when_its_log_cannot_be_written(tmp_path):
    """Localises a hang: the thread copying a worker's stderr to stderr.log died on ENOSPC, nothing drained the
    pipe, and the worker blocked on its next write until bench.timeout_s. The stream is read to its end, the
    failed log named, and the tail kept in memory."""

    class FullDisk:
        name = str(tmp_path / "stderr.log")

        def write(self, chunk: bytes) -> None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.name)

        def flush(self) -> None:
            pass

    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stderr.write('x' * 300_000 + 'END')"], stderr=subprocess.PIPE
    )
    tail, failures = launch.Tail(), []
    assert child.stderr is not None
    launch._tee(child.stderr, [FullDisk(), tail], failures)
    assert child.wait(timeout=30) == 0
    assert tail.data.endswith(b"xEND") and len(tail.data) == 4000
    assert failures == [f"{FullDisk.name}: [Errno 28] No space left on device: '{FullDisk.name}'"]
