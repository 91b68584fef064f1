"""`python -m bench.run` on the tiny Qwen3-MoE proxy when a run goes wrong: a failing worker, SIGTERM and resume,
`kill -9` of bench.run, a full disk (one rank each: none of these is about the ranks).

The main path (a 2-rank AdamW/Muon sweep, then `bench.results.collect` and `bench.results.report`) is checked on
`make bench`'s own run: tests/dist/test_readme_commands.py::test_make_bench_closes_every_run_and_reports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist

COMMON = [
    "experiment=cpu/qwen3_moe_tiny_dp2",
    "bench.steps=3",
    "bench.warmup_steps=1",
    "bench.progress=false",
]
ONE_RANK = ["parallelism.world_size=1", "parallelism.gpus_per_node=1", "parallelism.gbs=2"]


def _cli(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_a_missing_data_file_is_refused_before_launch(tmp_path):
    """A missing data file used to fail inside the worker; it is now one line before anything launches, naming the
    field, and no record is written. A worker-side failure is recorded `error` in
    test_disk_full_mid_run_is_recorded_error_naming_enospc (and a killed rank in tests/dist/test_rank_killed.py)."""
    out = tmp_path / "runs"
    res = _cli(
        "bench.run",
        "optimizer=adamw",
        "bench.data=text:/nonexistent/corpus.txt",
        *COMMON,
        *ONE_RANK,
        f"bench.out_dir={out}",
        cwd=tmp_path,
    )
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "error: bench.data='text:/nonexistent/corpus.txt': no such file: /nonexistent/corpus.txt"
    ]
    assert not list(out.rglob("run.json"))


def test_sigterm_closes_the_record_as_interrupted_and_resume_reruns_it(tmp_path):
    """Localises SIGTERM leaving run.json at `running` with no end time, LATEST.json still naming the previous
    sweep (so bench.results.collect reports that one), and no way to rerun only what is missing."""
    import signal
    import time

    out = tmp_path / "runs"
    record = out / "LATEST.json"
    args = [*COMMON, *ONE_RANK]
    slow = [a if a != "bench.steps=3" else "bench.steps=100000" for a in args]
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.run", "-m", "optimizer=adamw,muon", *slow, f"bench.out_dir={out}"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:  # wait until the first run has written steps
        steps = list(out.rglob("steps.jsonl"))
        if steps and steps[0].stat().st_size > 0:
            break
        time.sleep(0.5)
    latest = json.loads(record.read_text())
    assert latest["state"] == "running" and len(latest["runs"]) == 1  # LATEST names this sweep while it runs
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    (path,) = out.rglob("run.json")
    rec = json.loads(path.read_text())
    assert rec["status"] == "interrupted" and rec["end_time"] and rec["duration_s"] >= 0
    latest = json.loads(record.read_text())
    assert latest["state"] == "interrupted" and latest["statuses"] == {str(path.parent): "interrupted"}

    # resume the recorded command: with the slow steps it would run again, so resume a copy of the manifest whose
    # command has the short protocol; the ok job of a resumed sweep is skipped
    fast = {**latest, "argv": ["-m", "optimizer=adamw,muon", *args, f"bench.out_dir={out}"]}
    (tmp_path / "m.json").write_text(json.dumps(fast))
    res = _cli("bench.run", f"bench.resume={tmp_path / 'm.json'}", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    first = json.loads(record.read_text())
    assert (
        first["state"] == "complete" and len(first["runs"]) == 2 and set(first["statuses"].values()) == {"ok"}
    )
    again = _cli("bench.run", f"bench.resume={record}", cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stderr.count("== skip ") == 2 and "== run " not in again.stderr
    assert json.loads(record.read_text())["runs"] == first["runs"]


def test_kill_9_of_a_live_bench_run_is_closed_by_the_next_one(tmp_path):
    """Localises `kill -9` of a live `bench.run` leaving LATEST.json, its sweep and its run `running` forever: the
    next invocation into the same root records the dead sweep and its run `killed` (naming the process) and runs
    its own job."""
    import signal
    import time

    out = tmp_path / "runs"
    args = ["-m", "optimizer=adamw", *COMMON, *ONE_RANK, f"bench.out_dir={out}"]
    slow = [a if a != "bench.steps=3" else "bench.steps=100000" for a in args]
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.run", *slow],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    run_json: list[Path] = []
    while time.monotonic() < deadline and not run_json:  # its run is launched: run.json says running
        run_json = [p for p in out.glob("*/0_adamw/run.json") if p.stat().st_size and "running" in p.read_text()]
        time.sleep(0.2)
    assert run_json, "bench.run did not launch its run"
    latest = json.loads((out / "LATEST.json").read_text())
    assert latest["state"] == "running" and latest["pid"] == proc.pid
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)

    res = _cli("bench.run", *args, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"== bench.run (pid {proc.pid} on " in res.stderr and "recorded killed (1 run closed)" in res.stderr
    dead = json.loads(run_json[0].read_text())
    assert dead["status"] == "killed" and dead["end_time"]
    assert f"bench.run (pid {proc.pid} on " in dead["error"]["message"]
    dead_sweep = json.loads((run_json[0].parent.parent / "sweep.json").read_text())
    assert dead_sweep["state"] == "killed" and dead_sweep["statuses"] == {str(run_json[0].parent): "killed"}
    latest = json.loads((out / "LATEST.json").read_text())
    assert latest["state"] == "complete" and latest["pid"] != proc.pid
    (new,) = latest["runs"]
    assert new != str(run_json[0].parent) and latest["statuses"][new] == "ok"


def test_disk_full_mid_run_is_recorded_error_naming_enospc(tmp_path, small_disk):
    """Localises a full disk under a live `bench.run` (another process takes the last byte mid-run) leaving the
    run `running`, a worker blocked on a log pipe nobody drains, or a half-written record: the run ends `error`
    naming ENOSPC and steps.jsonl, its steps before the failure whole, the manifest closed, nothing left behind."""
    import time

    out = small_disk("1m")
    args = [a if a != "bench.steps=3" else "bench.steps=100000" for a in COMMON]
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.run", "-m", "optimizer=adamw", *args, *ONE_RANK, f"bench.out_dir={out}"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:  # the run is stepping
            steps = list(out.rglob("steps.jsonl"))
            if steps and steps[0].stat().st_size > 0:
                break
            time.sleep(0.2)
        with open(out / "filler", "wb", buffering=0) as filler, pytest.raises(OSError, match="No space left"):
            while True:  # the disk is full
                filler.write(bytes(4096))
        out_text, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err
    (run_dir,) = [p.parent for p in out.rglob("run.json")]
    rec = json.loads((run_dir / "run.json").read_text())
    assert rec["status"] == "error" and rec["error"]["errno"] == "ENOSPC", rec["error"]
    assert "No space left on device" in rec["error"]["message"] and "steps.jsonl" in rec["error"]["message"]
    lines = (run_dir / "steps.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == list(range(len(lines)))
    assert rec["summary"]["num_steps"] == len(lines)
    assert f"[adamw] error: OSError: [Errno 28] No space left on device: '{run_dir / 'steps.jsonl'}'" in out_text
    latest = json.loads((out / "LATEST.json").read_text())
    assert latest["state"] == "complete" and latest["statuses"] == {str(run_dir): "error"}
    assert not [p.name for p in run_dir.iterdir() if p.name.endswith(".tmp") or p.name == ".space_reserve"]
