"""Cluster jobs through NeMo-Run: the typed launcher config becomes a `SlurmExecutor` (or, for launcher=local, a
`LocalExecutor` on this machine) and one `Experiment` per run, as Megatron-Bridge's performance scripts launch.

`muonbench cluster` (bench/cli.py) is `bench.run` with `launcher.via=nemo_run`: the same preflight, run directory
and record as any run; the task is the same worker (`python -m bench.worker <run_dir>` under torchrun), so the versions
check of the imported stack still runs on the compute node. Every value comes from `bench.slurm`'s quoting layer:
NeMo-Run 0.11.1 writes the srun options and env values of its script verbatim, so it is handed shell words
(`bench.slurm.shell_word`), site values checked against the #SBATCH character set, and a run directory NeMo-Run can
name unquoted. The job's working directory, NeMo-Run's `/nemo_run/code`, holds the run's copy of our packages
(`CodePackager`); nothing of this machine's Python is mounted. A submission sbatch refuses is a ValueError with
sbatch's message (the run's record is closed `error`). docs/cluster.md.
No torch import; `nemo_run` is imported when a job is built (the `nemo-run` extra).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench import slurm
from muonbench import engines
from muonbench.schema import RootConfig

EXTRA = "nemo-run"
MANAGE = ("status", "logs", "cancel")
"""What `muonbench cluster <action> <run dir>` does with a submitted run (`manage`); the command is in bench/cli.py."""


def _nemo_run() -> Any:
    try:
        import nemo_run
    except ImportError:
        raise ValueError(f"launcher.via=nemo_run needs the {EXTRA} extra: pip install 'muonbench[{EXTRA}]'") from None
    return nemo_run


def task(cfg: RootConfig, run_dir: Path) -> Any:
    """The NeMo-Run task of a run: the bench worker as a module, started by NeMo-Run's torchrun launcher."""
    run = _nemo_run()
    return run.Script(path="bench.worker", args=[str(run_dir)], entrypoint="python", m=True)


def env_vars(cfg: RootConfig) -> dict[str, str]:
    """`launcher.env`, names checked (`bench.slurm.check_env_name`), values shell-quoted for the job script."""
    return {slurm.check_env_name(k): slurm.shell_word(v) for k, v in cfg.launcher.env.items()}


def executor(cfg: RootConfig, run_dir: Path, *, nproc: int, nodes: int) -> Any:
    """`SlurmExecutor` for launcher=slurm, `LocalExecutor` for launcher=local, `nproc` processes on each of `nodes`
    nodes (`bench.launch.nproc_per_node`, `num_nodes`); the job's files in `<run_dir>/nemo_run/`."""
    run = _nemo_run()
    from bench.cluster_code import CodePackager

    la = cfg.launcher
    if la.name == "local":  # torchrun of this interpreter, also when its bin/ is not on PATH
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        env = {k: str(v) for k, v in la.env.items()} | {"PATH": path}
        return run.LocalExecutor(ntasks_per_node=nproc, launcher="torchrun", env_vars=env)
    slurm.check_job(cfg, run_dir)
    site = slurm.site_options(cfg)
    known = {k: site.pop(k) for k in (*slurm.SITE_FIELDS, "segment") if k in site}
    from nemo_run.core.execution.slurm import SlurmJobDetails

    name = slurm.job_name(cfg)
    return run.SlurmExecutor(
        account=known.get("account"),  # None: no --account line (NeMo-Run writes every field that is not None)
        job_name_prefix=f"{name}.",  # NeMo-Run's default prefix is made of the account
        job_details=SlurmJobDetails(job_name=name),  # the sbatch job name, as the sbatch path's
        partition=known.get("partition"),
        qos=known.get("qos"),
        constraint=known.get("constraint"),
        gres=known.get("gres"),
        segment=int(known["segment"]) if "segment" in known else None,
        additional_parameters=site or None,
        time=la.time_limit,
        nodes=nodes,
        ntasks_per_node=1,  # one torchrun per node, as the sbatch path
        gpus_per_node=nproc,
        torchrun_nproc_per_node=nproc,
        exclusive=True,
        container_image=slurm.shell_word(slurm.container_image(cfg)),
        container_mounts=[slurm.shell_word(m) for m in slurm.container_mounts(cfg, run_dir)],
        srun_args=[slurm.shell_word(a) for a in slurm.srun_args(cfg)],
        env_vars=env_vars(cfg),
        launcher="torchrun",
        packager=CodePackager(),  # the working directory NeMo-Run mounts (/nemo_run/code) gets our code
        # the experiment's own folder (Experiment base_dir/experiments/<title>/<id>), so the script's paths exist
        tunnel=run.LocalTunnel(job_dir=str(run_dir / "nemo_run" / "experiments")),
    )


def launch_run(cfg: RootConfig, run_dir: Path, *, nproc: int, nodes: int) -> tuple[str | None, int | None]:
    """Build the experiment of one run and dry-run it (launcher.dry_run), submit it (Slurm: returns at once) or run
    it (local: waits). Returns (experiment id or None for a dry run, exit code of a local run or None).

    NeMo-Run's console output goes to `<run_dir>/launch.log`; its closing hint (`nemo experiment status`, which
    looks in NEMORUN_HOME, not in the run directory) is off: `submitted_line` says how to follow the run."""
    run = _nemo_run()
    from invoke.exceptions import UnexpectedExit

    if engines.spec(cfg.engine.name).plans_bridge and cfg.launcher.name == "slurm":
        slurm.check_bridge_plan(cfg, run_dir)
    ex = executor(cfg, run_dir, nproc=nproc, nodes=nodes)
    local = cfg.launcher.name == "local"
    with open(run_dir / "launch.log", "a") as log, contextlib.redirect_stdout(log), _root_logging_kept():
        exp = run.Experiment(
            slurm.job_name(cfg), executor=ex, base_dir=str(run_dir / "nemo_run"), log_level="WARN",
            enable_goodbye_message=False,
        )  # fmt: skip
        with exp:
            exp.add(task(cfg, run_dir), executor=ex, name="worker")
            if cfg.launcher.dry_run:
                exp.dryrun(log=False)
            else:
                try:
                    exp.run(detach=not local, sequential=True, tail_logs=False)
                except UnexpectedExit as exc:  # sbatch refused the job, or there is none: its own words
                    res = exc.result
                    said = "; ".join(line for line in (res.stderr or res.stdout).splitlines() if line.strip())
                    raise ValueError(f"{res.command.split()[0]} failed (exit {res.exited}): {said}") from None
                except (OSError, RuntimeError) as exc:  # closed as this run's error, the sweep goes on
                    raise ValueError(f"NeMo-Run could not start the run: {type(exc).__name__}: {exc}") from exc
    if cfg.launcher.dry_run:
        script = run_dir / ("job.sh" if local else "job.sbatch")
        script.write_text(dry_run_text(exp))
        print(script.read_text())
        print(f"# not submitted (launcher.dry_run=true); script: {script}", file=sys.stderr)
        return None, None
    if not local:
        print(submitted_line(exp._id, run_dir))
        return exp._id, None
    state = exp.status(return_dict=True) or {}  # after the block, which waits for a local run to end
    ok = all(str(t.get("status", "")).endswith("SUCCEEDED") for t in state.values()) and bool(state)
    return exp._id, 0 if ok else 1


@contextlib.contextmanager
def _root_logging_kept() -> Iterator[None]:
    """The root logger's handlers and level as they were: a NeMo-Run `Experiment` replaces them (`basicConfig` with
    force), which would leave this process's logging (Hydra's, for the next job of a sweep) writing through
    NeMo-Run's console."""
    import logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def submitted_line(exp_id: str, run_dir: Path) -> str:
    """What the terminal says after a submission: the experiment and how to follow it by its run directory."""
    where = slurm.shell_word(str(run_dir))
    return f"== submitted NeMo-Run experiment {exp_id}: muonbench cluster status|logs|cancel {where}"


def dry_run_text(exp: Any) -> str:
    """What a dry-run experiment would start: the sbatch script NeMo-Run would submit (Slurm), or each replica's
    command (local). Read from the jobs' dry-run info, which `Experiment.dryrun` keeps on each job."""
    parts = []
    for job in exp.jobs:
        request = job._dryrun_info.request
        if hasattr(request, "materialize"):  # SlurmBatchRequest: the script and the command that submits it
            parts.append(f"# submitted with: {shlex.join(request.launch_cmd)}\n{request.materialize().rstrip()}")
        else:  # torchx PopenRequest of the LocalExecutor
            parts += [
                f"# {role}: {shlex.join(replica.args)}"
                for role, replicas in request.role_params.items()
                for replica in replicas
            ]
    return "\n".join(parts) + "\n"


def manage(action: str, run_dir: str) -> int:
    """`status`, `logs` or `cancel` of the experiment of a run directory (its NeMo-Run files: `<run_dir>/nemo_run`).

    `status` says the run record's status first: a record closed by its run (ok, error, ...; a local run always
    is) is the answer; only a Slurm run still `submitted` or `running` adds the scheduler's view of its job."""
    from bench.results.record import Status, read_json

    home = Path(run_dir) / "nemo_run"
    found = sorted((home / "experiments").glob("*/*/_CONFIG")) if home.is_dir() else []
    if not found:
        raise ValueError(f"{run_dir}: no NeMo-Run experiment under {home} (give the run directory of a cluster run)")
    if action == "status":
        rec = read_json(Path(run_dir) / "run.json")
        print(f"{run_dir}: {rec['status']} (run.json)")
        still_open = rec["status"] in (Status.SUBMITTED, Status.RUNNING)
        if not still_open or rec["config"]["launcher"]["name"] == "local":
            return 0
    run = _nemo_run()
    from nemo_run.config import set_nemorun_home

    set_nemorun_home(str(home))
    exp = run.Experiment.from_id(found[-1].parent.name)
    if action == "status":
        exp.status()
    elif action == "logs":
        for job in exp.jobs:
            exp.logs(job.id)
    else:
        for job in exp.jobs:
            exp.cancel(job.id)
    return 0
