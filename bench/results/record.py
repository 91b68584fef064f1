"""Run records: one directory per run holding `run.json` and `steps.jsonl`.

`run.json` (schema `RUN_SCHEMA`): resolved config and its hash, status (a `Status` value, docs/run_status.md) with
the error type and stderr tail, git SHA and dirty flag, package versions (read from metadata, nothing imported), hardware,
command lines, start/end time, the measurement protocol and the summary metrics. `steps.jsonl`: one JSON object per
optimizer step with the fixed key vocabulary of `bench.metrics` (`step_keys`). Every write is atomic (temp file + `os.replace`), so a reader
never sees half a record, and a failed run still leaves a complete `run.json`.

No torch import: collectors and reports read records on machines without torch.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import platform
import subprocess
import tempfile
import warnings
from collections.abc import Callable
from datetime import UTC, datetime
from enum import StrEnum
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from bench import metrics, nvsmi
from muonbench.compose import config_from_dict

RUN_SCHEMA = "muonbench.run/1"


class Status(StrEnum):
    """The status of a run record (`run.json` "status"); docs/run_status.md says what each means."""

    RUNNING = "running"
    """Launched and not closed yet (or its launcher died without closing it)."""
    OK = "ok"
    """Every step ran and every loss was finite."""
    DIVERGED = "diverged"
    """The run stopped training: the loss became NaN or Inf (the run stopped there), too many updates were skipped,
    or the run went dead (`divergence`: the step, its loss and the reason; `judge_training`)."""
    ERROR = "error"
    """An exception (config rule, launcher, engine or worker), recorded with its type, message and stderr tail."""
    OOM = "oom"
    """A worker raised an out-of-memory error."""
    KILLED = "killed"
    """A worker was killed by a signal it did not send itself (SIGKILL without a timeout: the kernel's
    out-of-memory killer is the likely sender); the error names the rank and the signal."""
    TIMEOUT = "timeout"
    """Killed after `bench.timeout_s` seconds."""
    SKIPPED = "skipped"
    """Not launched: the invocation's time budget `bench.budget_s` was spent before this job's turn."""
    INTERRUPTED = "interrupted"
    """Stopped by SIGINT (Ctrl-C) or SIGTERM to `bench.run`; `end_time` is when."""
    SUBMITTED = "submitted"
    """launcher=slurm: the job was submitted (its record is closed on the cluster)."""
    WRITTEN = "written"
    """launcher=slurm with dry_run (or no sbatch): the script was written, nothing submitted."""


STATUSES = tuple(Status)
NOT_FAILED = (Status.OK, Status.SUBMITTED, Status.WRITTEN)
"""Statuses of a run that did not fail (a resumed sweep reruns every other one)."""
VERSION_PACKAGES = (
    "torch",
    "megatron-core",
    "megatron-bridge",
    "transformers",
    "emerging-optimizers",
    "hydra-core",
    "omegaconf",
    "numpy",
    "triton",
    "transformer-engine",
    "quack-kernels",
    "nvidia-cutlass-dsl",
)
PROTOCOL_TEXT = (
    "warm-up steps excluded; steady window = the remaining steps; step time = median over the window, spread = IQR "
    "(p75 - p25); TFLOP/s per GPU = model FLOPs per step (Megatron formula, bench/flops.py) / median step time / GPUs; "
    "NS TFLOP/s per GPU = Newton-Schulz FLOPs this GPU executed per step (plain convention k(4m^2n + 2m^3), from the "
    "shapes of the orthogonalize calls) / median step time; GPU timing by CUDA events, CPU by time.perf_counter "
    "(wall clock; process CPU time from time.process_time is kept as cpu_s)"
)
STDERR_TAIL_CHARS = 4000


def count(n: int, noun: str) -> str:
    """`1 run`, `2 runs`: a number with its noun in the right number."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def write_all(fd: int, data: bytes, path: str | Path) -> None:
    """Write all of `data` to `fd` (`os.write` until done). On failure (a full disk) the file is cut back to where
    this write began, so no reader finds half a line, and the error names `path`."""
    start = os.lseek(fd, 0, os.SEEK_CUR)
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view) :]
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, start)
            os.lseek(fd, start, os.SEEK_SET)
        raise OSError(exc.errno, exc.strerror, str(path)) from exc


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write `data` as indented JSON to `path` via a temp file in the same directory and `os.replace`: a write that
    fails (a full disk) leaves the previous file as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=2, sort_keys=False, default=str) + "\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        try:
            write_all(fd, text.encode(), path)
        finally:
            os.close(fd)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


RESERVE_NAME = ".space_reserve"
RESERVE_BYTES = 128 * 1024
"""Space held in a run directory while the run is open (`reserve_space`), freed for the closing writes when the disk
is full (`closing_write`): the worker's error, its closing record and the launcher's final one (each under 32 KiB)."""


def reserve_space(run_dir: str | Path) -> None:
    """Hold `RESERVE_BYTES` in `run_dir` (a file of zeros) until the run's record is closed."""
    path = Path(run_dir) / RESERVE_NAME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, bytes(RESERVE_BYTES), path)
    except OSError:
        path.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)


def release_reserve(run_dir: str | Path) -> bool:
    """Free the run directory's reserve; False when there was none."""
    try:
        (Path(run_dir) / RESERVE_NAME).unlink()
    except FileNotFoundError:
        return False
    return True


def closing_write[T](run_dir: str | Path, write: Callable[[], T]) -> T:
    """`write()` (a write that closes a run: its error, its status); when it fails for a full disk, once more after
    freeing the run directory's reserve."""
    try:
        return write()
    except OSError as exc:
        if exc.errno != errno.ENOSPC or not release_reserve(run_dir):
            raise
    return write()


def errno_name(exc: BaseException) -> str | None:
    """The errno's symbol of an OSError (`ENOSPC`: the disk is full), for a run's error record; else None."""
    code = exc.errno if isinstance(exc, OSError) else None
    return errno.errorcode.get(code) if code is not None else None


def read_json(path: str | Path) -> dict[str, Any]:
    with open(path) as f:
        return json.load(f)


def update_run_json(run_dir: str | Path, **fields: Any) -> dict[str, Any]:
    """Read-modify-write `run.json` atomically (top-level keys replaced; dict values merged one level deep)."""
    path = Path(run_dir) / "run.json"
    data = read_json(path) if path.exists() else {}
    for key, value in fields.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    write_json_atomic(path, data)
    return data


class StepLog:
    """Appends one JSON line per step; each line is written whole and fsynced, so a crash loses at most the current
    step, and a failed write (a full disk) leaves the lines before it intact, with no torn line after them."""

    def __init__(self, run_dir: str | Path, *, extra_keys: tuple[str, ...] = ()) -> None:
        self.optional = (*metrics.optional_keys(), *extra_keys)
        self.path = Path(run_dir) / "steps.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def write(self, row: dict[str, Any]) -> None:
        unknown = set(row) - set(metrics.step_keys()) - set(self.optional)
        assert not unknown, f"steps.jsonl keys outside the vocabulary: {sorted(unknown)}"
        line = {k: row.get(k) for k in metrics.step_keys()} | {
            k: row[k] for k in self.optional if row.get(k) is not None
        }
        write_all(self._fd, (json.dumps(line) + "\n").encode(), self.path)
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class RecordWarning(UserWarning):
    """A broken part of a run record (unreadable line or file) that a reader skipped."""


def read_steps(run_dir: str | Path, *, problems: list[str] | None = None) -> list[dict[str, Any]]:
    """The rows of `steps.jsonl` (empty when the run died before its first step). A line that is not a JSON object
    (a torn last line, a corrupted one) is skipped alone; each is named (file:line) in `problems` if given, else
    warned as a `RecordWarning`."""
    path = Path(run_dir) / "steps.jsonl"
    if not path.exists():
        return []
    if not path.is_file():  # a FIFO or a device would block the read, a directory fail it
        msg = f"{path}: not a regular file; no step rows"
        if problems is None:
            warnings.warn(msg, RecordWarning, stacklevel=2)
        else:
            problems.append(msg)
        return []
    rows = []
    for num, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            row, why = None, f"{exc.msg} at column {exc.colno}"
        else:
            why = f"not a JSON object: {line[:60]!r}"
        if isinstance(row, dict):
            rows.append(row)
            continue
        msg = f"{path}:{num}: skipped ({why})"
        if problems is None:
            warnings.warn(msg, RecordWarning, stacklevel=2)
        else:
            problems.append(msg)
    return rows


# --------------------------------------------------------------------------------------------------------------
# provenance (no torch import)
# --------------------------------------------------------------------------------------------------------------
def package_versions() -> dict[str, str | None]:
    """Installed versions from package metadata (the packages are not imported)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in VERSION_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_info(repo: str | Path | None = None) -> dict[str, Any]:
    """Our git SHA and whether the tree has uncommitted changes (None where git or the repo is missing).

    `MUONBENCH_GIT_SHA` (and optionally `MUONBENCH_GIT_DIRTY=0|1`) overrides both: for copies of the tree without
    usable git metadata (a device machine, a container), set by whoever made the copy; recorded as `source: env`."""
    env_sha = os.environ.get("MUONBENCH_GIT_SHA")
    if env_sha:
        dirty_env = os.environ.get("MUONBENCH_GIT_DIRTY")
        dirty = None if dirty_env is None else dirty_env not in ("0", "false", "False", "")
        return {"sha": env_sha, "dirty": dirty, "source": "env"}
    cwd = Path(repo) if repo else Path(__file__).resolve().parents[2]

    def _git(*args: str) -> str | None:
        try:
            res = subprocess.run(
                ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=20, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return res.stdout.strip() if res.returncode == 0 else None

    sha = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"sha": sha, "dirty": None if status is None else bool(status)}


def host_identity() -> dict[str, str | None]:
    """Which machine ran, beyond its hostname: a hash of /etc/machine-id (stable across boots, not the id itself) and
    the boot id (one per boot), so that "same host" claims are checkable from the records."""

    def read(path: str) -> str | None:
        try:
            return Path(path).read_text().strip() or None
        except OSError:
            return None

    mid = read("/etc/machine-id")
    return {
        "machine_id_sha256": hashlib.sha256(mid.encode()).hexdigest()[:16] if mid else None,
        "boot_id": read("/proc/sys/kernel/random/boot_id"),
    }


def hardware_info() -> dict[str, Any]:
    """CPU model and count; GPU name, count, driver, UUIDs and serials from `nvidia-smi` when present (torch is not
    imported); the host's identity (`host_identity`)."""
    cpu_model = platform.processor() or None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info: dict[str, Any] = {
        "hostname": platform.node(),
        "cpu_model": cpu_model,
        "cpu_count": os.cpu_count(),
        "gpu_name": None,
        "gpu_count": 0,
        "driver": None,
        "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "gpu_uuids": [],
        "gpu_serials": [],
        **host_identity(),
    }
    rows = nvsmi.query(("name", "driver_version", "uuid", "serial"))
    if rows:
        info.update(gpu_name=rows[0][0], gpu_count=len(rows), driver=rows[0][1],
                    gpu_uuids=[r[2] for r in rows if len(r) > 2],
                    gpu_serials=[r[3] for r in rows if len(r) > 3 and r[3] not in ("[N/A]", "N/A")])
    return info


def new_run_record(
    *,
    run_id: str,
    run_dir: str | Path,
    config: dict[str, Any],
    config_hash: str | None,
    overrides: list[str],
    command: list[str],
    choices: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The initial `run.json` of a run (status `running`), written before anything is launched. `choices`: the
    option chosen in each config group (Hydra's runtime choices, e.g. optimizer -> muon_split_gate_up)."""
    bench = config.get("bench", {})
    return {
        "schema": RUN_SCHEMA,
        "run_id": run_id,
        "run_dir": str(run_dir),
        "status": Status.RUNNING.value,
        "error": None,
        "config": config,
        "config_hash": config_hash,
        "overrides": list(overrides),
        "choices": dict(choices or {}),
        "command": list(command),
        "launch_command": None,
        "start_time": now_iso(),
        "end_time": None,
        "duration_s": None,
        "git": git_info(),
        "versions": package_versions(),
        "hardware": hardware_info(),
        "env": {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "CUDA_", "OMP_", "TORCH_"))},
        "worker": None,
        "protocol": {
            "steps": bench.get("steps"),
            "warmup_steps": bench.get("warmup_steps"),
            "statistic": "median",
            "spread": "iqr",
            "text": PROTOCOL_TEXT,
        },
        "summary": None,
    }


# --------------------------------------------------------------------------------------------------------------
# status and summary
# --------------------------------------------------------------------------------------------------------------
def classify_failure(
    *,
    returncode: int | None,
    timed_out: bool,
    worker_error: dict[str, Any] | None,
    killed_by: int | None = None,
) -> Status:
    """Status of a run that did not finish cleanly: timeout, oom (a worker reported an out-of-memory error), killed
    (`killed_by`: a worker's signal number, or a returncode that says a signal) or error."""
    if timed_out:
        return Status.TIMEOUT
    if worker_error and worker_error.get("type") in (
        "OutOfMemoryError",
        "torch.OutOfMemoryError",
        "MemoryError",
    ):
        return Status.OOM
    if killed_by is not None or (returncode is not None and (returncode < 0 or returncode > 128)):
        return Status.KILLED
    return Status.ERROR


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    xs = [r[key] for r in rows if r.get(key) is not None]
    return float(np.median(xs)) if xs else None


def tflops_per_gpu(
    *, step_s: float, world_size: int, model_flops_per_step: float | None, ns_flops: float
) -> tuple[float | None, float]:
    """(model TF/s per GPU, NS TF/s per GPU) of a step time: the model FLOPs of the global batch spread over the
    GPUs (None when unknown), the NS FLOPs one GPU executed (docs/metrics.md)."""
    model_tf = model_flops_per_step / step_s / world_size / 1e12 if model_flops_per_step else None
    return model_tf, ns_flops / step_s / 1e12


def first_step(steps: list[dict[str, Any]]) -> dict[str, float | None]:
    """The run's first step, reported apart from the steady window: what a process pays once (docs/metrics.md)."""
    first = steps[0] if steps else {}
    return {"first_step_s": first.get("step_s"), "first_optim_s": first.get("optim_s")}


def summarize(
    steps: list[dict[str, Any]],
    *,
    world_size: int,
    model_flops_per_step: float | None,
    peak_tflops: float = 0.0,
) -> dict[str, Any] | None:
    """Summary metrics over the steady window (rows with `warmup` false); None when the window is empty."""
    steady = [r for r in steps if not r.get("warmup")]
    if not steady:
        return None
    times = [r["step_s"] for r in steady]
    p25, med, p75 = (float(q) for q in np.quantile(times, [0.25, 0.5, 0.75]))
    tokens = steady[-1]["tokens"]
    ns_flops = _median(steady, "ns_flops") or 0.0
    model_tf, ns_tf = tflops_per_gpu(
        step_s=med, world_size=world_size, model_flops_per_step=model_flops_per_step, ns_flops=ns_flops
    )
    out: dict[str, Any] = {
        "num_steps": len(steps),
        "num_steady_steps": len(steady),
        "step_s_median": med,
        "step_s_p25": p25,
        "step_s_p75": p75,
        "step_s_iqr": p75 - p25,
        "step_s_mean": float(np.mean(times)),
        **{f"{k}_median": _median(steady, k) for k in metrics.medians()},
        "tokens_per_step": tokens,
        "tokens_per_s": tokens / med,
        "tokens_per_s_per_gpu": tokens / med / world_size,
        **first_step(steps),
        "loss_first": steps[0].get("loss"),
        "loss_last": steps[-1].get("loss"),
        "peak_mem_bytes": max((r["peak_mem_bytes"] for r in steps if r.get("peak_mem_bytes")), default=None),
        "model_flops_per_step": model_flops_per_step,
        "ns_flops_per_gpu_per_step": ns_flops,
        "model_tflops_per_gpu": model_tf,
        "ns_tflops_per_gpu": ns_tf,
        "total_tflops_per_gpu": None if model_tf is None else model_tf + ns_tf,
        "mfu": None if (model_tf is None or peak_tflops <= 0) else model_tf / peak_tflops,
        **skipped_updates(steps),
    }
    return out


MAX_SKIPPED_STEP_FRACTION = 0.01
"""A run with skipped updates in more than this fraction of its steps is not `ok` (docs/run_status.md)."""
DEAD_STEPS = 3
"""A run whose loss sits still for this many steps after it was lower is dead (docs/run_status.md)."""
UNIFORM_LOSS_ATOL = 1e-3
"""How close to ln(vocab) a loss must be to count as the uniform prediction."""


def skipped_updates(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Parameter updates skipped over the whole run and the steps that skipped any (None where not measured)."""
    counts = [r["skipped_updates"] for r in steps if r.get("skipped_updates") is not None]
    if not counts:
        return {"skipped_updates": None, "steps_with_skipped_updates": None}
    return {"skipped_updates": int(sum(counts)), "steps_with_skipped_updates": sum(1 for c in counts if c)}


def judge_training(steps: list[dict[str, Any]], *, vocab_sizes: tuple[int, ...] = ()) -> dict[str, Any] | None:
    """Why a run whose every step ran did not train, as a `divergence` record (step, loss, reason), or None when
    it trained: skipped updates in more than `MAX_SKIPPED_STEP_FRACTION` of its steps; or dead for `DEAD_STEPS`
    steps after its loss was lower (the loss bit-identical, or within `UNIFORM_LOSS_ATOL` of the uniform
    prediction ln(vocab) for one of `vocab_sizes`), or a zero gradient norm for `DEAD_STEPS` steps."""
    skipped = skipped_updates(steps)
    bad = skipped["steps_with_skipped_updates"] or 0
    if steps and bad > MAX_SKIPPED_STEP_FRACTION * len(steps):
        first = next(r for r in steps if r.get("skipped_updates"))
        return {
            "step": first["step"],
            "loss": str(first.get("loss")),
            "reason": f"skipped updates: {skipped['skipped_updates']} parameter updates in {bad} of "
            f"{len(steps)} steps (more than {MAX_SKIPPED_STEP_FRACTION:.0%} of the steps)",
        }
    uniform = [math.log(v) for v in vocab_sizes if v > 1]

    def still(a: float, b: float) -> str | None:
        for u in uniform:
            if abs(a - u) <= UNIFORM_LOSS_ATOL and abs(b - u) <= UNIFORM_LOSS_ATOL:
                return f"loss at the uniform prediction ln(vocab) = {u:.4f}"
        return f"loss constant at {a!r}" if a == b else None

    losses = [r.get("loss") for r in steps]
    for i in range(len(steps) - DEAD_STEPS + 1):
        window = steps[i : i + DEAD_STEPS]
        norms = [r.get("grad_norm") for r in window]
        if all(n == 0.0 for n in norms):
            reason = f"dead: gradient norm 0 for {DEAD_STEPS} steps"
            return {"step": window[0]["step"], "loss": str(losses[i]), "reason": reason}
        if any(x is None or not math.isfinite(x) for x in losses[i : i + DEAD_STEPS]):
            continue
        why = {still(losses[i], x) for x in losses[i + 1 : i + DEAD_STEPS]}
        earlier = [x for x in losses[:i] if x is not None and math.isfinite(x)]
        if len(why) == 1 and None not in why and earlier and min(earlier) < losses[i] - UNIFORM_LOSS_ATOL:
            return {
                "step": window[0]["step"],
                "loss": str(losses[i]),
                "reason": f"dead: {why.pop()} for {DEAD_STEPS} steps after it was {min(earlier):.4f}",
            }
    return None


def model_flops_per_step(config: dict[str, Any]) -> float | None:
    """Model FLOPs of one global batch (Megatron formula, `bench.flops`); None for a config that cannot be typed."""
    from bench import flops

    try:
        root = config_from_dict(config)
    except (KeyError, TypeError, ValueError):
        return None
    return float(flops.model_flops_per_step(root.model, root.parallelism))


def ns_flops_enumerated(config: dict[str, Any]) -> float | None:
    """NS FLOPs of one step with every matrix orthogonalized once (`bench.flops` enumeration, plain convention);
    None for optimizers without Newton-Schulz. Compare with the per-GPU count measured from the calls."""
    from bench import flops
    from muonbench.schema import optim_configs
    from optim.registry import OPTIMIZERS

    entry = OPTIMIZERS.get((config.get("optimizer") or {}).get("name", ""))
    if entry is None or not entry.matrix:
        return None
    root = config_from_dict(config)
    algo, routing, _ = optim_configs(root.optimizer)
    ns_steps = entry.ns_steps(algo)
    if not ns_steps:
        return None
    mats = flops.enumerate_ns_matrices(
        root.model,
        split_qkv=routing.split_qkv,
        split_mla_kv_down=routing.split_mla_kv_down,
        split_gate_up=routing.split_gate_up,
        router_to_matrix=routing.router_to_matrix,
    )
    return float(flops.ns_flops_per_step(mats, ns_steps, "plain"))


def finalize(
    run_dir: str | Path,
    *,
    status: str,
    error: dict[str, Any] | None = None,
    launch_command: list[str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """Close a run record: status, error, end time, duration and the summary computed from `steps.jsonl`
    (`extra`: more top-level fields, e.g. `divergence`)."""
    status = Status(status)
    run_dir = Path(run_dir)
    rec = read_json(run_dir / "run.json")
    cfg = rec.get("config") or {}
    model_flops = model_flops_per_step(cfg)
    world = (cfg.get("parallelism") or {}).get("world_size") or 1
    peak = (cfg.get("hardware") or {}).get("peak_bf16_tflops") or 0.0
    summary = summarize(
        read_steps(run_dir), world_size=world, model_flops_per_step=model_flops, peak_tflops=peak
    )
    if summary is not None:
        summary["ns_flops_enumerated_per_step"] = ns_flops_enumerated(cfg)
    end = now_iso()
    start = rec.get("start_time")
    duration = None
    if start:
        duration = (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
    fields: dict[str, Any] = {
        "status": status.value,
        "error": error,
        "end_time": end,
        "duration_s": duration,
        "summary": summary,
    }
    if launch_command is not None:
        fields["launch_command"] = launch_command
    return closing_write(run_dir, lambda: update_run_json(run_dir, **fields, **extra))


def tail(text: str, n: int = STDERR_TAIL_CHARS) -> str:
    return text[-n:]


def find_runs(root: str | Path) -> list[Path]:
    """Every run directory (holding a run.json) under `root`, sorted by path; a report folder's run.json (its
    provenance, `bench.results.collect`) is not a run."""
    root = Path(root)
    found = [root] if (root / "run.json").exists() else sorted(p.parent for p in root.rglob("run.json"))
    return [d for d in found if not is_report(d)]


def is_report(folder: Path) -> bool:
    """The folder is a report (its run.json is a report's provenance), not a run; an unreadable run.json counts as
    a run, so the collector names it as broken instead of passing over it."""
    if not (folder / "run.json").is_file():  # never open a FIFO: the read would block
        return False
    try:
        data = read_json(folder / "run.json")
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and str(data.get("schema", "")).startswith("muonbench.report/")
