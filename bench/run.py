"""Hydra entry of a benchmark run or sweep.

    python -m bench.run experiment=cpu/qwen3_moe_tiny_dp2 optimizer=muon optimizer.num_ns_steps=6
    python -m bench.run -m optimizer=adamw,muon experiment=cpu/qwen3_moe_tiny_dp2

Each (sweep) job composes the config, converts it once to typed dataclasses, validates it, writes `run.json`
(status `running`) into its own run directory and hands it to the launcher (`bench.launch`). A job that fails
(config rule, launch, or the run itself) still closes its record with the status and error, and the sweep goes on.
Run directories: `<bench.out_dir>/<time>_<model>_<optimizer>/` for one run, `<bench.out_dir>/<time>_<model>/<n>_<optimizer>/`
for a sweep; `<bench.out_dir>/LATEST.json` lists the runs of the latest invocation for `bench.collect`.
The process exits 1 when any run of the invocation did not end `ok`.

No torch import here (the parent only composes, validates and launches).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import config
from bench import launch, record
from config import schema

HYDRA_DEFAULTS = {
    "hydra.run.dir": "${bench.out_dir}/${now:%Y%m%d_%H%M%S}_${model.name}_${optimizer.name}",
    "hydra.sweep.dir": "${bench.out_dir}/${now:%Y%m%d_%H%M%S}_${model.name}",
    "hydra.sweep.subdir": "${hydra.job.num}_${optimizer.name}",
    "hydra.job.chdir": "false",
}
"""Run-directory layout; each can be overridden on the command line (the key is then left alone)."""

LAUNCHED_OK = ("ok", "submitted", "written")
"""Statuses of a run that did not fail: finished ok, or a Slurm job submitted / its script written (dry run)."""

_INVOCATION: dict[str, Any] = {"id": time.strftime("%Y%m%d_%H%M%S"), "argv": [], "runs": []}


def with_hydra_defaults(argv: list[str]) -> list[str]:
    """`argv` plus the run-directory settings the user did not give."""
    given = {a.split("=", 1)[0].lstrip("+~") for a in argv if "=" in a}
    return argv + [f"{k}={v}" for k, v in HYDRA_DEFAULTS.items() if k not in given]


def _note_run(out_dir: Path, run_dir: Path, status: str, report_name: str) -> None:
    """Add a run to `<out_dir>/LATEST.json` (the manifest of this invocation)."""
    _INVOCATION["runs"].append({"run_dir": str(run_dir), "status": status})
    record.write_json_atomic(
        out_dir / "LATEST.json",
        {
            "invocation": _INVOCATION["id"],
            "command": ["python", "-m", "bench.run", *_INVOCATION["argv"]],
            "report_name": report_name,
            "runs": [r["run_dir"] for r in _INVOCATION["runs"]],
        },
    )


def _worker_error(run_dir: Path) -> dict[str, Any] | None:
    """The structured error of the lowest failing rank, if any rank wrote one."""
    files = sorted(run_dir.glob("worker_error.rank*.json"), key=lambda p: int(p.stem.rsplit("rank", 1)[1]))
    return record.read_json(files[0]) if files else None


def _close_after_launch(run_dir: Path, res: launch.LaunchResult) -> dict[str, Any]:
    """Final status from torchrun's exit code, the timeout flag and the workers' structured errors."""
    if res.returncode == 0 and not res.timed_out:
        rec = record.read_json(run_dir / "run.json")
        if rec["status"] == "ok":
            return record.update_run_json(run_dir, launch_command=res.command)
    werr = _worker_error(run_dir)
    status = record.classify_failure(returncode=res.returncode, timed_out=res.timed_out, worker_error=werr)
    error = {
        "type": (werr or {}).get("type") or ("Timeout" if res.timed_out else f"exit code {res.returncode}"),
        "message": (werr or {}).get("message")
        or ("killed after bench.timeout_s" if res.timed_out else "worker exited without a structured error"),
        "traceback": (werr or {}).get("traceback"),
        "returncode": res.returncode,
        "stderr_tail": res.stderr_tail,
    }
    return record.finalize(run_dir, status=status, error=error, launch_command=res.command)


def _fail_early(run_dir: Path, exc: Exception) -> dict[str, Any]:
    """Close a record whose run never started (config rule, launcher or device check)."""
    print(f"error: {exc}", file=sys.stderr)
    error = {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": None,
        "returncode": None,
        "stderr_tail": record.tail(str(exc)),
    }
    return record.finalize(run_dir, status="error", error=error)


def execute(cfg: Any) -> str:
    """One Hydra job: record, launch, close the record. Returns the run status."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir).resolve()
    out_dir = Path(str(cfg.bench.out_dir)).resolve()
    overrides = list(hc.overrides.task)
    command = ["python", "-m", "bench.run", *_INVOCATION["argv"]]
    run_id = str(run_dir.relative_to(out_dir)) if run_dir.is_relative_to(out_dir) else run_dir.name
    try:
        root = config.to_typed(cfg)
        cfg_dict, chash = config.as_dict(root), config.config_hash(root)
    except ValueError as exc:
        raw = OmegaConf.to_container(cfg, resolve=True)
        assert isinstance(raw, dict)
        record.write_json_atomic(
            run_dir / "run.json",
            record.new_run_record(
                run_id=run_id,
                run_dir=run_dir,
                config=raw,
                config_hash=None,
                overrides=overrides,
                command=command,
            ),
        )
        rec = _fail_early(run_dir, exc)
        _note_run(out_dir, run_dir, rec["status"], str(cfg.bench.report_name))
        return rec["status"]
    record.write_json_atomic(
        run_dir / "run.json",
        record.new_run_record(
            run_id=run_id,
            run_dir=run_dir,
            config=cfg_dict,
            config_hash=chash,
            overrides=overrides,
            command=command,
        ),
    )
    print(f"== run {run_id}: {' '.join(overrides) or '(defaults)'}", file=sys.stderr, flush=True)
    try:
        res = launch.launch(root, run_dir)
    except ValueError as exc:
        rec = _fail_early(run_dir, exc)
    else:
        if root.launcher.name == "slurm" and res.returncode in (0, None):
            rec = record.update_run_json(run_dir, launch_command=res.command)
            status = "submitted" if res.submitted else "written"
            print(f"== {run_id}: {'submitted' if res.submitted else 'script written (not submitted)'}")
            _note_run(out_dir, run_dir, status, root.bench.report_name)
            return status
        rec = _close_after_launch(run_dir, res)
    _note_run(out_dir, run_dir, rec["status"], root.bench.report_name)
    print(summary_line(rec), flush=True)
    return rec["status"]


def summary_line(rec: dict[str, Any]) -> str:
    """One line per run for the terminal."""
    s = rec.get("summary") or {}
    opt = (rec.get("config") or {}).get("optimizer", {}).get("name", "?")
    head = f"== {rec['run_id']} [{opt}] {rec['status']}"
    if rec["status"] != "ok":
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
        f"model {f('model_tflops_per_gpu')} + NS {f('ns_tflops_per_gpu')} TFLOP/s per GPU, "
        f"loss {f('loss_first', fmt='.4f')} -> {f('loss_last', fmt='.4f')}"
    )


def main() -> None:
    import hydra

    _INVOCATION["argv"] = list(sys.argv[1:])
    sys.argv = [sys.argv[0], *with_hydra_defaults(sys.argv[1:])]
    schema.register_configs()
    task = hydra.main(config_path=str(config.CONF_DIR), config_name="config", version_base="1.3")(execute)
    task()
    runs = _INVOCATION["runs"]
    bad = [r for r in runs if r["status"] not in LAUNCHED_OK]
    if runs:
        counts = {st: sum(r["status"] == st for r in runs) for st in LAUNCHED_OK}
        head = ", ".join(f"{n} {st}" for st, n in counts.items() if n) or "0 ok"
        tail = "; not ok: " + ", ".join(f"{r['run_dir']} ({r['status']})" for r in bad) if bad else ""
        print(f"== {len(runs)} runs: {head}{tail}")
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
