"""What `bench.run` does around Hydra's jobs: check every job before any starts, claim run directories, keep the
invocation's manifest (`<bench.out_dir>/LATEST.json`) current from its first job on, and resume a sweep.

- `expand(argv)`: the override list of each job of an invocation (Hydra's own sweep expansion).
- `preflight(jobs)`: compose, validate and check every job against its engine; the errors, one line each (no run
  directory is created).
- `claim_run_dir(path)`: a run directory no other `bench.run` holds (exclusive create of its `run.json`).
- `Manifest`: `LATEST.json` (and `<sweep dir>/sweep.json`): the command, the state (`running`, `complete`,
  `interrupted`) and every run with its status, rewritten as each job starts and ends.
- `resume_plan(path)`: the recorded command of a manifest and the runs that need no rerun.
- `hold_out_dir(out_dir)`: the invocation's exclusive hold on its output root (one manifest, one writer), and the
  closing of an earlier invocation that died without closing its manifest (`kill -9`): state and runs `killed`.

No torch import.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import muonbench
from bench import launch
from bench.results import record
from muonbench import engines

RESUME_KEY = "bench.resume"
HYDRA_FLAGS = ("-m", "--multirun")


def is_multirun(argv: list[str]) -> bool:
    return any(a in HYDRA_FLAGS for a in argv)


def job_key(overrides: list[str]) -> tuple[str, ...]:
    """What identifies a job of a sweep: its overrides, without `bench.resume` and Hydra's own settings."""
    return tuple(o for o in overrides if not o.lstrip("+~").startswith((RESUME_KEY + "=", "hydra.")))


def expand(argv: list[str]) -> list[list[str]]:
    """The overrides of each job `python -m bench.run <argv>` runs (one job unless -m; sweeps expanded by Hydra's
    basic sweeper, in its order)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = [a for a in argv if not a.startswith("-")]
    muonbench.compose.check_syntax(overrides)
    if not is_multirun(argv):
        return [overrides]
    parsed = OverridesParser.create().parse_overrides(overrides)
    return [list(job) for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def preflight(jobs: list[list[str]]) -> list[str]:
    """Compose and validate every job, and check that its output directory can be written; one message per
    distinct failure (field, value, rule) with the jobs it hits, empty when all pass."""
    errors: dict[str, list[str]] = {}
    for job in jobs:
        try:
            cfg = muonbench.load(list(job_key(job)))
            muonbench.check_runnable(cfg)
            engines.preflight(cfg)
            launch.check_launchable(cfg)
            check_out_dir(cfg.bench.out_dir)
        except ValueError as exc:
            errors.setdefault(str(exc), []).append(" ".join(job_key(job)) or "(defaults)")
    if len(jobs) == 1:
        return list(errors)
    return [f"{msg}  [{'job' if len(ls) == 1 else 'jobs'}: {'; '.join(ls)}]" for msg, ls in errors.items()]


def check_out_dir(out_dir: str) -> None:
    """Raises ValueError naming `bench.out_dir` when records could not be written under it: a path that is (or
    lies under) a file, or a directory this process cannot create files in. Creates nothing that stays."""
    p = Path(out_dir).resolve()
    existing = next(a for a in (p, *p.parents) if a.exists())
    if not existing.is_dir():
        where = "is a file" if existing == p else f"lies under a file ({existing})"
        raise ValueError(f"bench.out_dir={out_dir}: {where}; give a directory")
    try:
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as exc:
        raise ValueError(
            f"bench.out_dir={out_dir}: cannot write in {existing} ({exc.strerror or exc}); give a writable directory"
        ) from None


def claim_run_dir(path: Path) -> Path:
    """`path`, or `path.2`, `path.3`, ... : the first whose `run.json` this process creates exclusively, so two
    `bench.run` started in the same second never share a run directory."""
    for k in range(1, 1000):
        cand = path if k == 1 else path.with_name(f"{path.name}.{k}")
        cand.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(cand / "run.json", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            continue
        os.close(fd)
        return cand
    raise RuntimeError(f"no free run directory next to {path}")


@dataclass
class Manifest:
    """The manifest of one `bench.run` invocation, written to `<out_dir>/LATEST.json` whenever it changes."""

    out_dir: Path
    argv: list[str]
    report_name: str = ""
    invocation: str = field(default_factory=lambda: time.strftime("%Y%m%d_%H%M%S"))
    state: str = "running"
    sweep_dir: str | None = None
    runs: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "invocation": self.invocation,
            "state": self.state,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": ["python", "-m", "bench.run", *self.argv],
            "argv": self.argv,
            "report_name": self.report_name,
            "sweep_dir": self.sweep_dir,
            "runs": [r["run_dir"] for r in self.runs],
            "statuses": {r["run_dir"]: r["status"] for r in self.runs},
        }

    def write(self) -> None:
        """LATEST.json (and sweep.json). A write that fails (a full disk) is one stderr line and leaves the
        previous file whole; the next change writes the whole manifest again."""
        data = self.as_dict()
        paths = [self.out_dir / "LATEST.json", *([Path(self.sweep_dir) / "sweep.json"] if self.sweep_dir else [])]
        for path in paths:
            try:
                record.write_json_atomic(path, data)
            except OSError as exc:
                print(f"error: manifest not written: {exc}", file=sys.stderr, flush=True)

    def note(self, run_dir: Path, status: str, report_name: str = "") -> None:
        """Add or update a run (called when a job starts and when it ends)."""
        self.report_name = self.report_name or report_name
        for r in self.runs:
            if r["run_dir"] == str(run_dir):
                r["status"] = str(status)
                break
        else:
            self.runs.append({"run_dir": str(run_dir), "status": str(status)})
        self.write()

    def finish(self, state: str) -> None:
        self.state = state
        self.write()


def _manifest_path(path: str) -> Path:
    p = Path(path)
    if p.is_dir():
        for name in ("sweep.json", "LATEST.json"):
            if (p / name).exists():
                return p / name
        if (p / "run.json").exists():
            raise ValueError(
                f"{RESUME_KEY}={path!r}: a run directory; give its sweep directory or runs/LATEST.json"
            )
    if p.is_file():
        return p
    raise ValueError(
        f"{RESUME_KEY}={path!r}: no manifest there (a sweep directory with sweep.json, or LATEST.json)"
    )


def resume_plan(path: str) -> tuple[list[str], dict[tuple[str, ...], list[Path]]]:
    """(the recorded argv of the invocation, job key -> run directories of the runs that need no rerun, in the
    manifest's order: a job repeated in the sweep, e.g. `optimizer=adamw,muon,muon,adamw`, has one per ok run)."""
    manifest = _manifest_path(path)
    try:
        data = record.read_json(manifest)
    except (OSError, ValueError) as exc:  # an empty or torn file, a directory named like one
        raise ValueError(f"{RESUME_KEY}={path!r}: {manifest} is not a readable manifest ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{RESUME_KEY}={path!r}: {manifest} is not a manifest (a JSON object)")  # noqa: TRY004 - a user error
    if "argv" not in data:
        raise ValueError(
            f"{manifest}: written by an older bench.run without the command's argv; rerun the sweep"
        )
    done: dict[tuple[str, ...], list[Path]] = {}
    for run_dir in data.get("runs", []):
        try:
            rec = record.read_json(Path(run_dir) / "run.json")
        except (OSError, ValueError):
            continue  # missing or unreadable: rerun
        if rec.get("status") in record.NOT_FAILED:
            done.setdefault(job_key(rec.get("overrides") or []), []).append(Path(run_dir))
    argv = [a for a in data["argv"] if not a.startswith(RESUME_KEY + "=")]
    return argv, done


LOCK_NAME = ".bench_run.lock"


def hold_out_dir(out_dir: Path) -> Any:
    """Takes `<out_dir>/.bench_run.lock` for this invocation (an open file: the kernel releases it when the
    process ends, however it ends). A second `bench.run` into the same root while one runs would share its
    LATEST.json (the last writer wins, the other's runs vanish from the default report): it is refused with a
    ValueError naming the holder. Then closes a manifest left `running` by an invocation that died (`close_dead`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    lock = open(out_dir / LOCK_NAME, "a+")  # noqa: SIM115 - held open for the invocation's lifetime
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        lock.close()
        raise ValueError(
            f"bench.out_dir={out_dir}: another bench.run is writing there ({holder}); wait for it to end or "
            "give another bench.out_dir"
        ) from None
    lock.seek(0)
    lock.truncate()
    lock.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}")
    lock.flush()
    atexit.register(lock.close)  # held to the end; closed before the interpreter would warn about it
    close_dead(out_dir)
    return lock


def close_dead(out_dir: Path) -> list[str]:
    """With the root's lock held, a LATEST.json still `running` belongs to an invocation that died without
    closing it (`kill -9`, a lost node): its state and its runs still `running` are recorded `killed`, naming
    the process. Returns the run directories closed."""
    latest = out_dir / "LATEST.json"
    try:
        data = record.read_json(latest)
    except (OSError, ValueError):
        return []
    if data.get("state") != "running":
        return []
    who = f"bench.run (pid {data.get('pid', '?')} on {data.get('host', '?')}, invocation {data.get('invocation')})"
    closed = []
    for run_dir in data.get("runs", []):
        try:
            rec = record.read_json(Path(run_dir) / "run.json")
        except (OSError, ValueError):
            continue
        if rec.get("status") == record.Status.RUNNING:
            message = f"{who} ended without closing this run (killed, e.g. kill -9); found by the next bench.run"
            error = {"type": "Killed", "message": message, "traceback": None}
            record.finalize(run_dir, status=record.Status.KILLED, error=error)
            record.release_reserve(run_dir)
            data.setdefault("statuses", {})[run_dir] = record.Status.KILLED.value
            closed.append(run_dir)
    data["state"] = "killed"
    record.write_json_atomic(latest, data)
    if data.get("sweep_dir") and Path(data["sweep_dir"]).is_dir():
        record.write_json_atomic(Path(data["sweep_dir"]) / "sweep.json", data)
    print(f"== {who} died while running: recorded killed ({record.count(len(closed), 'run')} closed)", file=sys.stderr)
    return closed
