"""Hydra entry of a benchmark run or sweep.

    python -m bench.run experiment=cpu/qwen3_moe_tiny_dp2 optimizer=muon optimizer.num_ns_steps=6
    python -m bench.run -m optimizer=adamw,muon experiment=cpu/qwen3_moe_tiny_dp2
    python -m bench.run bench.resume=runs/LATEST.json      # rerun the jobs of the last sweep that did not end ok

Before any job starts, every job of the invocation is composed and validated (`bench.sweep.preflight`): a bad value
or an engine that cannot run the config is one error line naming the field, the value and the rule, and nothing is
created. Each job then converts its config once to typed dataclasses, claims its own run directory, writes `run.json`
(status `running`) and hands it to the launcher (`bench.launch`); the record is closed with the run's status
(`bench.results.record.Status`, docs/run_status.md), and the sweep goes on after a failed job. SIGINT or SIGTERM closes the
running job's record as `interrupted` and stops the sweep. With `bench.budget_s=S` no job starts later than S seconds
after `bench.run` started: each later job gets its run directory and a record with status `skipped`.
A sweep may repeat a value to alternate runs (crossover order, so a drift of the machine over time falls on both
sides): `python -m bench.run -m experiment=h200/qwen3_30b_a3b_slice_flops_muon_1gpu optimizer=adamw,muon,muon,adamw`
runs four jobs in that order, each in its own directory (`<n>_<optimizer>`, n = the job's number).
For the megatron engine with our matrix optimizer, `bench.prewarm` (on by default) runs one untimed step of the same
launch before the first timed job of each workload (`bench.launch.prewarm_local`).
Run directories: `<bench.out_dir>/<time>_<model>_<optimizer>/` for one run, `<bench.out_dir>/<time>_<model>/<n>_<optimizer>/`
for a sweep; `<bench.out_dir>/LATEST.json` (and `<sweep dir>/sweep.json`) lists the runs of this invocation from its
first job on, for `bench.results.collect` and `bench.resume`.
The process exits 1 when any run of the invocation did not end `ok`, 2 on a config error, 130 when interrupted.

No torch import here (the parent only composes, validates and launches).
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import muonbench
from bench import launch, sweep
from bench.results import record
from bench.results.record import Status
from muonbench import compose
from muonbench.cli_help import command

HYDRA_DEFAULTS = {
    "hydra.run.dir": "${bench.out_dir}/${now:%Y%m%d_%H%M%S}_${model.name}_${hydra:runtime.choices.optimizer}",
    "hydra.sweep.dir": "${bench.out_dir}/${now:%Y%m%d_%H%M%S}_${model.name}",
    "hydra.sweep.subdir": "${hydra.job.num}_${hydra:runtime.choices.optimizer}",
    "hydra.job.chdir": "false",
}
"""Run-directory layout; each can be overridden on the command line (the key is then left alone). Named by the
optimizer config chosen (`muon_split_gate_up`), not its `name` field, which several configs share (`muon`)."""

LAUNCHED_OK = tuple(s.value for s in record.NOT_FAILED)
"""Statuses of a run that did not fail: finished ok, or a Slurm job submitted / its script written (dry run)."""

_STATE: dict[str, Any] = {"manifest": None, "done": {}, "start": 0.0, "prewarmed": set(), "lock": None}
"""This invocation's manifest; when resuming, job key -> run directories of the jobs not to rerun (a key repeated in
a sweep has one directory per run that ended ok, each used once); `time.monotonic()` when `main` started; the
config hashes of the workloads prewarmed so far (`bench.launch.launch`); the hold on the output root
(`bench.sweep.hold_out_dir`)."""


INSPECT_FLAGS = {"--cfg": "value", "-c": "value", "--package": "value", "-p": "value", "--info": "choice",
                 "-i": "choice", "--resolve": None, "--hydra-help": None}  # fmt: skip
"""Hydra's inspection flags (no job runs) and what follows each: a value, an optional choice, or nothing."""
INFO_CHOICES = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")


def flags_first(argv: list[str]) -> list[str]:
    """`argv` with Hydra's inspection flags (and their values) before the overrides, a bare `--info` after them:
    Hydra's parser takes no override after a flag's value, so `bench.run experiment=X --cfg job` would otherwise be
    an argparse error, and a bare `--info` before an override would take it for its choice."""
    flags, rest, last = split_flags(argv)
    return flags + rest + last


def split_flags(argv: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(inspection flags with their values, the overrides, a bare trailing `--info`) of `argv`."""
    flags: list[str] = []
    rest: list[str] = []
    last: list[str] = []
    it = iter(range(len(argv)))
    for i in it:
        kind = INSPECT_FLAGS.get(argv[i], "other")
        if kind == "other":
            rest.append(argv[i])
            continue
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if nxt is not None and (kind == "value" or (kind == "choice" and nxt in INFO_CHOICES)):
            flags += [argv[i], nxt]
            next(it)
        else:
            (last if kind == "choice" else flags).append(argv[i])
    return flags, rest, last


def with_hydra_defaults(argv: list[str]) -> list[str]:
    """`argv` plus the run-directory settings the user did not give."""
    given = {a.split("=", 1)[0].lstrip("+~") for a in argv if "=" in a}
    return argv + [f"{k}={v}" for k, v in HYDRA_DEFAULTS.items() if k not in given]


def _manifest() -> sweep.Manifest:
    m = _STATE["manifest"]
    assert m is not None, "bench.run.main() sets the manifest before Hydra runs a job"
    return m


def _worker_errors(run_dir: Path) -> dict[int, dict[str, Any]]:
    """The structured error of each rank that wrote one, by rank."""
    out = {}
    for p in run_dir.glob("worker_error.rank*.json"):
        out[int(p.stem.rsplit("rank", 1)[1])] = record.read_json(p)
    return dict(sorted(out.items()))


def _close_after_launch(run_dir: Path, res: launch.LaunchResult) -> dict[str, Any]:
    """Final status from torchrun's exit code, the timeout flag, a signal that killed a rank (torchrun's failure
    report) and the workers' structured errors; a status the worker closed itself (ok, diverged) is kept."""
    if res.returncode == 0 and not res.timed_out:
        rec = record.read_json(run_dir / "run.json")
        if rec["status"] != Status.RUNNING:
            return record.closing_write(
                run_dir, lambda: record.update_run_json(run_dir, launch_command=res.command)
            )
    werrs = _worker_errors(run_dir)
    werr = next(iter(werrs.values()), None)
    killed = (
        None if res.timed_out else launch.killed_rank(res.stderr_tail, ranks_with_errors=frozenset(werrs))
    )
    status = record.classify_failure(
        returncode=res.returncode,
        timed_out=res.timed_out,
        worker_error=None if killed else werr,
        killed_by=killed.signum if killed else None,
    )
    if killed is not None:
        message = killed.headline()
        if werr:
            message += (
                f" (then rank {werr.get('rank')}: {werr.get('type')}: {str(werr.get('message'))[:200]})"
            )
        error_type, traceback = f"killed by {killed.signal_name}", None
    else:
        error_type = (werr or {}).get("type") or (
            "Timeout" if res.timed_out else f"exit code {res.returncode}"
        )
        message = (werr or {}).get("message") or (
            "killed after bench.timeout_s" if res.timed_out else "worker exited without a structured error"
        )
        traceback = (werr or {}).get("traceback")
    if res.log_errors:  # the run folder could not take the worker's output (a full disk): name it
        message += f"; writing the run's logs failed: {'; '.join(res.log_errors)}"
    error = {
        "type": error_type,
        "message": message,
        "traceback": traceback,
        "returncode": res.returncode,
        "stderr_tail": res.stderr_tail,
    }
    if werr and werr.get("errno") and killed is None:
        error["errno"] = werr["errno"]
    return record.finalize(run_dir, status=status, error=error, launch_command=res.command)


def _closed(run_dir: Path, close: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`close()` (a write that closes the run's record), then the run's space reserve freed. When run.json cannot
    be written (the disk is full even after the reserve was freed: `record.closing_write`), its previous content
    stays as it was and the run's status, error, naming the cause, goes to the terminal and the manifest."""
    try:
        return close()
    except OSError as exc:
        error = {"type": type(exc).__name__, "message": f"run.json not closed: {exc}", "traceback": None}
        if record.errno_name(exc):
            error["errno"] = record.errno_name(exc)
        print(f"error: {run_dir}: {error['message']}", file=sys.stderr, flush=True)
        try:
            rec = record.read_json(run_dir / "run.json")
        except (OSError, ValueError):
            rec = {"run_id": run_dir.name}
        return {**rec, "status": Status.ERROR.value, "error": error, "summary": None}
    finally:
        record.release_reserve(run_dir)


def _fail_early(run_dir: Path, exc: Exception) -> dict[str, Any]:
    """Close a record whose run never started (launcher or device check)."""
    print(f"error: {exc}", file=sys.stderr)
    error = {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": None,
        "returncode": None,
        "stderr_tail": record.tail(str(exc)),
    }
    return record.finalize(run_dir, status=Status.ERROR, error=error)


def _skip(run_dir: Path, *, budget_s: float, spent_s: float) -> dict[str, Any]:
    """Close the record of a job not launched because the invocation's time budget is spent."""
    message = f"not started: bench.budget_s={budget_s:g} s spent ({spent_s:.0f} s since bench.run started)"
    error = {"type": "Skipped", "message": message, "traceback": None}
    return record.finalize(run_dir, status=Status.SKIPPED, error=error)


def _interrupted(run_dir: Path) -> dict[str, Any]:
    error = {"type": "Interrupted", "message": "bench.run received SIGINT or SIGTERM", "traceback": None}
    return record.finalize(run_dir, status=Status.INTERRUPTED, error=error)


def execute(cfg: Any) -> str:
    """One Hydra job: record, launch, close the record. Returns the run status."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    manifest = _manifest()
    out_dir = Path(str(cfg.bench.out_dir)).resolve()
    overrides = list(hc.overrides.task)
    if hc.mode == RunMode.MULTIRUN and manifest.sweep_dir is None:
        manifest.sweep_dir = str(Path(hc.sweep.dir).resolve())
    done_dirs = _STATE["done"].get(sweep.job_key(overrides))
    if done_dirs:
        done = done_dirs.pop(0)
        rec = record.read_json(done / "run.json")
        print(f"== skip {' '.join(sweep.job_key(overrides))}: {rec['status']} in {done}", file=sys.stderr)
        manifest.note(done, rec["status"], str(cfg.bench.report_name))
        return str(rec["status"])
    root = muonbench.to_typed(cfg, overrides=overrides)  # validated by the preflight: a ConfigError here is a bug, not a user error
    run_dir = sweep.claim_run_dir(Path(hc.runtime.output_dir).resolve())
    run_id = str(run_dir.relative_to(out_dir)) if run_dir.is_relative_to(out_dir) else run_dir.name
    record.write_json_atomic(
        run_dir / "run.json",
        record.new_run_record(
            run_id=run_id,
            run_dir=run_dir,
            config=muonbench.as_dict(root),
            config_hash=muonbench.config_hash(root),
            overrides=overrides,
            command=["python", "-m", "bench.run", *manifest.argv],
            choices={str(k): str(v) for k, v in hc.runtime.choices.items() if not str(k).startswith("hydra")},
        ),
    )
    manifest.note(run_dir, Status.RUNNING, root.bench.report_name)
    spent = time.monotonic() - _STATE["start"]
    if root.bench.budget_s and spent > root.bench.budget_s:
        rec = _skip(run_dir, budget_s=root.bench.budget_s, spent_s=spent)
        manifest.note(run_dir, rec["status"])
        print(summary_line(rec), flush=True)
        return str(rec["status"])
    print(f"== run {run_id}: {' '.join(overrides) or '(defaults)'}", file=sys.stderr, flush=True)
    try:
        if root.launcher.name == "local":
            record.reserve_space(run_dir)  # freed for the closing writes should the disk fill up
        res = launch.launch(root, run_dir, prewarmed=_STATE["prewarmed"])
    except (ValueError, OSError) as exc:  # OSError: the run folder cannot even take the reserve (a full disk)
        rec = _closed(run_dir, lambda err=exc: _fail_early(run_dir, err))
    except KeyboardInterrupt:
        rec = _closed(run_dir, lambda: _interrupted(run_dir))
        manifest.note(run_dir, rec["status"])
        print(summary_line(rec), flush=True)
        raise
    else:
        # Submitted or printed (a dry run, a cluster job): the run's own status comes from its job.
        if res.returncode is None or (root.launcher.name == "slurm" and res.returncode == 0):
            status = Status.SUBMITTED if res.submitted else Status.WRITTEN
            record.update_run_json(run_dir, launch_command=res.command, status=status.value)
            print(f"== {run_id}: {'submitted' if res.submitted else 'script written (not submitted)'}")
            manifest.note(run_dir, status)
            return status.value
        rec = _closed(run_dir, lambda: _close_after_launch(run_dir, res))
    manifest.note(run_dir, rec["status"])
    print(summary_line(rec), flush=True)
    return str(rec["status"])


def summary_line(rec: dict[str, Any]) -> str:
    """One line per run for the terminal."""
    s = rec.get("summary") or {}
    opt = (rec.get("choices") or {}).get("optimizer") or (rec.get("config") or {}).get("optimizer", {}).get(
        "name", "?"
    )
    head = f"== {rec['run_id']} [{opt}] {rec['status']}"
    if rec["status"] == Status.DIVERGED:
        div = rec.get("divergence") or {}
        head += f" at step {div.get('step')} (loss {div.get('loss')}; {div.get('reason', 'non-finite loss')})"
    elif rec["status"] != Status.OK:
        err = rec.get("error") or {}
        return f"{head}: {err.get('type')}: {str(err.get('message'))[:300]}"
    if not s:
        return f"{head}: no steady-window steps"

    def f(key: str, scale: float = 1.0, fmt: str = ".4g") -> str:
        v = s.get(key)
        return "n/a" if v is None else format(v * scale, fmt)

    return (
        f"{head}: step {f('step_s_median', 1e3)} ms (IQR {f('step_s_iqr', 1e3)}), "
        f"optimizer {f('optim_s_median', 1e3)} ms (NS {f('ns_s_median', 1e3)}), "
        f"first step {f('first_step_s', fmt='.3g')} s (optimizer {f('first_optim_s', fmt='.3g')} s), "
        f"model {f('model_tflops_per_gpu')} + NS {f('ns_tflops_per_gpu')} TFLOP/s per GPU, "
        f"loss {f('loss_first', fmt='.4f')} -> {f('loss_last', fmt='.4f')}"
    )


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main() -> None:
    import logging

    import hydra

    # multistorageclient's Hydra plugin (installed with Megatron-Bridge) logs a traceback for its own msc:// source
    # whenever a search path (`--config-dir`) is added; that source is not used here.
    logging.getLogger("multistorageclient.contrib.hydra").setLevel(logging.CRITICAL)
    argv = list(sys.argv[1:])
    if any(a in ("-h", "--help") for a in argv):
        from muonbench.cli_help import run_usage

        print(run_usage())
        return
    if any(a in INSPECT_FLAGS for a in argv):
        try:
            rest = compose.expand_hf(compose.take_config_dirs(argv))  # Hydra's inspection flags: no job runs
            compose.check_syntax([a for a in split_flags(rest)[1] if a not in sweep.HYDRA_FLAGS])
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)
        sys.argv = [sys.argv[0], *flags_first(with_hydra_defaults(rest))]
        compose.register_configs()
        hydra.main(config_path=str(compose.config_dir()), config_name="config", version_base="1.3")(execute)()
        return
    resume = [a.split("=", 1)[1] for a in argv if a.startswith(sweep.RESUME_KEY + "=")]
    try:
        overrides = compose.take_config_dirs(argv)  # the recorded argv keeps `--config-dir` for a resume
        if resume:
            if len(overrides) != 1:
                raise ValueError(
                    f"{sweep.RESUME_KEY}={resume[0]!r}: reruns the recorded command; give it alone "
                    f"(also given: {[a for a in overrides if not a.startswith(sweep.RESUME_KEY)]})"
                )
            recorded, _STATE["done"] = sweep.resume_plan(resume[0])
            argv = [*recorded, overrides[0]]
            overrides = compose.take_config_dirs(argv)
        overrides = compose.expand_hf(overrides)
        jobs = sweep.expand(overrides)
        errors = sweep.preflight(jobs)
    except ValueError as exc:
        errors = [str(exc)]
    if errors:
        for e in errors:
            print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    sys.argv = [sys.argv[0], *with_hydra_defaults(overrides)]
    compose.register_configs()
    task = hydra.main(config_path=str(compose.config_dir()), config_name="config", version_base="1.3")(execute)
    out_dir = Path(muonbench.load(list(sweep.job_key(jobs[0]))).bench.out_dir).resolve()
    try:
        _STATE["lock"] = sweep.hold_out_dir(out_dir)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    manifest = sweep.Manifest(out_dir=out_dir, argv=argv)
    _STATE["manifest"] = manifest
    manifest.write()  # LATEST.json points at this invocation before its first job starts
    _STATE["start"] = time.monotonic()
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        task()
    except KeyboardInterrupt:
        manifest.finish("interrupted")
        print(
            f"== interrupted; resume with: {command('bench.run')} {sweep.RESUME_KEY}={out_dir / 'LATEST.json'}"
        )
        sys.exit(130)
    finally:
        signal.signal(signal.SIGTERM, previous)
    manifest.finish("complete")
    runs = manifest.runs
    bad = [r for r in runs if r["status"] not in LAUNCHED_OK]
    if runs:
        counts = {st: sum(r["status"] == st for r in runs) for st in LAUNCHED_OK}
        head = ", ".join(f"{n} {st}" for st, n in counts.items() if n) or "0 ok"
        tail = "; not ok: " + ", ".join(f"{r['run_dir']} ({r['status']})" for r in bad) if bad else ""
        print(f"== {record.count(len(runs), 'run')}: {head}{tail}")
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    from bench import entry

    raise SystemExit(entry.run(main))
