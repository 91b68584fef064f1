"""A worker rank killed with SIGKILL mid-training: the other rank exits, nothing hangs, and the run is recorded
`killed` naming the rank (the out-of-memory killer does exactly this to one rank of a job)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist


def _worker_pid(rank: int, parent: int) -> int | None:
    """The pid of the bench worker with RANK=rank among the descendants of `parent`."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
            cmd = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and b"bench.worker" in cmd and f"MUONBENCH_TEST_PARENT={parent}".encode() in env:
            return int(proc.name)
    return None


def test_sigkill_of_one_rank_is_recorded_killed_with_the_rank(tmp_path):
    out = tmp_path / "runs"
    env = {**os.environ, "MUONBENCH_TEST_PARENT": str(os.getpid())}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.run", "experiment=cpu/qwen3_moe_tiny_dp2", "bench.steps=100000",
         "bench.warmup_steps=1", "bench.progress=false", f"bench.out_dir={out}"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 240
        pid = None
        while time.monotonic() < deadline:  # wait until rank 1 trains: a step is in steps.jsonl
            pid = _worker_pid(1, os.getpid())
            if pid and any(p.stat().st_size for p in out.rglob("steps.jsonl")):
                break
            time.sleep(0.5)
        assert pid, "rank 1 never started training"
        os.kill(pid, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=120)  # the other rank must not hang
    finally:
        if proc.poll() is None:
            proc.kill()
    recs = [json.loads(p.read_text()) for p in out.rglob("run.json")]
    assert len(recs) == 1, stdout + stderr
    rec = recs[0]
    assert rec["status"] == "killed", (rec["status"], rec.get("error"))
    assert "rank 1" in str(rec.get("error")) and "SIGKILL" in str(rec.get("error")), rec.get("error")
    assert proc.returncode != 0
