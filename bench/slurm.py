"""Slurm job of one run: an sbatch script (pyxis/enroot container, srun + torchrun per node) and its submission.

`write_sbatch(cfg, run_dir, command)` returns the script text: `#SBATCH` nodes x GPUs, time, partition and
account; the process environment of the published runs (`launcher.env`, one comment per variable); one `srun` task
per node in the container, each starting `torchrun --nproc_per_node=<gpus>` with a c10d rendezvous on the first
node; then one task that collects the run and writes the report (`bench.results.collect`, `bench.results.report`), so the report
exists when the job ends without anyone waiting on the login node. For engine=bridge the recipe plan is built first
(`check_bridge_plan`): an unsupported combination or an unknown Bridge field fails before the job is queued.

The job runs the image's stack: our packages (`CODE_PACKAGES`) are copied into the run directory (`copy_code`) and
the container starts there; nothing else of this machine's Python (a venv's site-packages) is mounted.

Both job writers (this sbatch script and NeMo-Run's, `bench.cluster`) take their values from the functions here, one
quoting layer: a value on a command line is one shell word (`shell_word`); an `#SBATCH` value (read by sbatch, where
quoting does not protect a newline) and a path a writer puts in a shell line unquoted (the run directory: NeMo-Run's
job folders) must match a strict character set; env var names must be identifiers; else ValueError naming the field
(`check_job`, before anything is written). No torch import: this runs on a login node.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from bench.results import collect, record, report
from muonbench import engines
from muonbench.schema import RootConfig

CODE_ROOT = Path(__file__).resolve().parent.parent
"""The folder this process imports `bench` from: a checkout, or a venv's site-packages for an installed wheel."""
CODE_PACKAGES = ("bench", "optim", "muonbench", "recipes", "experiments")
"""What a job imports from us (`experiments`: the probes, where the checkout has them); everything else, torch and
Megatron included, comes from the image."""
CODE_DIR = "code"
"""Folder of the run directory that holds the job's copy of `CODE_PACKAGES` (its working directory)."""
RDZV_PORT = 29500

ENV_DOCS: dict[str, str] = {
    "TORCH_NCCL_HIGH_PRIORITY": "run NCCL work on high-priority CUDA streams (MB COMMON_PERF_ENV_VARS)",
    "CUDA_DEVICE_MAX_CONNECTIONS": "hardware work queues per GPU; MB perf recipes use 32 for these layouts",
    "NCCL_GRAPH_REGISTER": "no NCCL user-buffer registration during CUDA-graph capture",
    "PYTORCH_CUDA_ALLOC_CONF": "caching allocator options (expandable segments: less fragmentation)",
    "TORCH_NCCL_AVOID_RECORD_STREAMS": "free NCCL tensors without recordStream (1) or keep it (0, graph capture)",
    "NCCL_NVLS_ENABLE": "NVLink SHARP collectives off, as in the published runs",
    "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": "HybridEP dispatcher: expert-parallel ranks per NVLink domain",
    "NUM_OF_TOKENS_PER_CHUNK_COMBINE_API": "HybridEP dispatcher: tokens per combine chunk",
    "NVLINK_DOMAIN_SIZE": "HybridEP dispatcher: GPUs per NVLink domain (GB300 NVL72: 72)",
    "USE_MNNVL": "HybridEP dispatcher: multi-node NVLink (one NVL72 domain spans several compute trays)",
    "NVTE_FWD_LAYERNORM_SM_MARGIN": "SMs Transformer Engine's forward norm kernels leave free for communication",
    "NVTE_BWD_LAYERNORM_SM_MARGIN": "SMs Transformer Engine's backward norm kernels leave free for communication",
    "NVTE_NORM_FWD_USE_CUDNN": "cuDNN forward norm kernels in Transformer Engine",
    "NVTE_NORM_BWD_USE_CUDNN": "cuDNN backward norm kernels in Transformer Engine",
    "CUDNNFE_CLUSTER_OVERLAP_MARGIN": "cuDNN frontend: SM margin for cluster-overlapped kernels",
    "NVTE_CUTEDSL_FUSED_GROUPED_MLP": "Transformer Engine CuTe-DSL fused grouped-MLP kernel",
    "NVTE_USE_FAST_MATH": "Transformer Engine fast-math path (NVFP4 recipes)",
}
"""Why each variable of the published runs is set (MB 0.6.2 perf_recipes/*/gb300/*.py)."""

_SBATCH_SAFE = re.compile(r"[A-Za-z0-9_.:,@%+/=-]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
TIME = re.compile(r"(\d+-)?\d{1,2}:\d{2}:\d{2}")


def _sbatch_value(field: str, value: str) -> str:
    """A value for an `#SBATCH` line; sbatch does not honour shell quoting there, so only a safe set passes."""
    if not _SBATCH_SAFE.fullmatch(value):
        raise ValueError(
            f"{field}={value!r}: an #SBATCH value may only contain letters, digits and _.:,@%+/=-"
        )
    return value


def shell_word(value: str) -> str:
    """`value` as one word of a shell command line (what both job writers put after an option)."""
    return shlex.quote(str(value))


def run_path(run_dir: Path) -> Path:
    """The run directory, which both writers name in shell lines they do not quote (`#SBATCH --output`, NeMo-Run's
    job folders) and in pyxis mounts (comma separated): the #SBATCH character set without a comma."""
    if "," in str(run_dir) or not _SBATCH_SAFE.fullmatch(str(run_dir)):
        raise ValueError(
            f"bench.out_dir={str(run_dir)!r}: a cluster run directory may only contain letters, digits and "
            "_.:@%+/=- (the job script names it unquoted)"
        )
    return run_dir


def job_name(cfg: RootConfig) -> str:
    base = cfg.experiment_name or f"{cfg.model.name}_{cfg.optimizer.name}"
    return "muonbench-" + re.sub(r"[^A-Za-z0-9_.-]", "_", base)


def sbatch_header(cfg: RootConfig, run_dir: Path) -> list[str]:
    """The `#SBATCH` directives: one task per node (torchrun), all GPUs of the node, exclusive."""
    la, par = cfg.launcher, cfg.parallelism
    nodes = la.nodes or par.nodes
    gpus = la.nproc_per_node or par.gpus_per_node
    check_job(cfg, run_dir)
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name(cfg)}",
        f"#SBATCH --nodes={int(nodes)}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={int(gpus)}",
        f"#SBATCH --time={la.time_limit}",
        "#SBATCH --exclusive",
        f"#SBATCH --output={run_path(run_dir)}/slurm-%j.out",
    ]
    lines += [f"#SBATCH --{name}={value}" for name, value in site_options(cfg).items()]
    return lines


_SBATCH_ARG = re.compile(r"--([a-z][a-z0-9-]*)=(.+)", re.DOTALL)
SITE_FIELDS = ("partition", "account", "qos", "constraint", "gres")


def site_options(cfg: RootConfig) -> dict[str, str]:
    """The site's sbatch options, name -> value: partition, account, qos, constraint, gres, segment and
    `launcher.sbatch_args`, each value checked against the #SBATCH character set (both launch paths read this)."""
    la = cfg.launcher
    out = {name: _sbatch_value(f"launcher.{name}", getattr(la, name)) for name in SITE_FIELDS if getattr(la, name)}
    if la.segment < 0:
        raise ValueError(f"launcher.segment={la.segment}: must be >= 0 (nodes per NVLink segment; 0 = not set)")
    if la.segment:
        out["segment"] = str(int(la.segment))
    for arg in la.sbatch_args:
        m = _SBATCH_ARG.fullmatch(arg)
        if m is None:
            raise ValueError(f"launcher.sbatch_args: {arg!r}: use --name=value (name: lower case, digits, -)")
        out[m.group(1)] = _sbatch_value("launcher.sbatch_args", m.group(2))
    return out


def srun_args(cfg: RootConfig) -> list[str]:
    """`launcher.srun_args`, each an option (`-x` or `--name[=value]`) of the #SBATCH character set."""
    for arg in cfg.launcher.srun_args:
        if not arg.startswith("-"):
            raise ValueError(f"launcher.srun_args: {arg!r}: an srun option starts with -")
        _sbatch_value("launcher.srun_args", arg)
    return list(cfg.launcher.srun_args)


def check_env_name(name: str) -> str:
    """`name` when it is an identifier (what a shell `export` accepts), else ValueError naming the key."""
    if not _ENV_NAME.fullmatch(str(name)):
        raise ValueError(
            f"launcher.env key {name!r}: an environment variable name must match [A-Za-z_][A-Za-z0-9_]*"
        )
    return str(name)


def env_lines(env: dict[str, str]) -> list[str]:
    """`export NAME=value` lines, each after a comment saying why (values quoted, names checked)."""
    lines = ["# Process environment of the published runs (launcher.env)."]
    for name, value in env.items():
        check_env_name(name)
        lines.append(f"# {ENV_DOCS.get(name, 'set in launcher.env')}")
        lines.append(f"export {name}={shell_word(value)}")
    return lines


def _out_root(cfg: RootConfig, run_dir: Path) -> Path:
    """Root of the run directories: bench.out_dir when it holds `run_dir`, else the run directory's parent."""
    out_root = Path(cfg.bench.out_dir).resolve()
    return out_root if run_dir.is_relative_to(out_root) else run_dir.parent


def container_image(cfg: RootConfig) -> str:
    """launcher.container_image, which must be set (the job runs in a container)."""
    if not cfg.launcher.container_image:
        raise ValueError(
            "launcher.container_image is empty: the job runs in a container (e.g. nvcr.io/nvidia/nemo:26.02)"
        )
    return cfg.launcher.container_image


def container_mounts(cfg: RootConfig, run_dir: Path) -> list[str]:
    """The run directories' root at its own path (it holds the run's copy of our code), then
    `launcher.container_mounts`; nothing of this machine's Python."""
    out_root = run_path(_out_root(cfg, run_dir))
    return [f"{out_root}:{out_root}", *(m for m in cfg.launcher.container_mounts.split(",") if m)]


def code_files() -> Iterator[tuple[Path, Path]]:
    """(source, path relative to the copy) of every file of `CODE_PACKAGES` under `CODE_ROOT`, links followed (a
    checkout's `muonbench/conf`), bytecode left out."""
    for name in CODE_PACKAGES:
        for folder, dirs, files in os.walk(CODE_ROOT / name, followlinks=True):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for file in sorted(files):
                yield Path(folder) / file, Path(folder, file).relative_to(CODE_ROOT)


def copy_code(dest: Path) -> Path:
    """Copy our packages into `dest` (the job's working directory): a queued job runs the code of its submission,
    and imports nothing else from this machine."""
    for src, rel in code_files():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)
    return dest


def container_args(cfg: RootConfig, run_dir: Path) -> list[str]:
    """pyxis flags: the image, the run directories' root mounted at its own path, workdir the run's code copy."""
    return [
        f"--container-image={shell_word(container_image(cfg))}",
        f"--container-mounts={shell_word(','.join(container_mounts(cfg, run_dir)))}",
        f"--container-workdir={shell_word(str(run_dir / CODE_DIR))}",
    ]


def check_job(cfg: RootConfig, run_dir: Path) -> None:
    """Every value a job script of launcher=slurm takes from the config, checked before anything is written: the
    time limit, site options, srun options, env names, the image and the run directory's path."""
    if not TIME.fullmatch(cfg.launcher.time_limit):
        raise ValueError(f"launcher.time_limit={cfg.launcher.time_limit!r}: use [D-]HH:MM:SS")
    site_options(cfg)
    srun_args(cfg)
    for name in cfg.launcher.env:
        check_env_name(name)
    container_image(cfg)
    run_path(run_dir)
    container_mounts(cfg, run_dir)


def check_bridge_plan(cfg: RootConfig, run_dir: Path) -> None:
    """engine=bridge: build the recipe plan now (a bad combination fails before the job queues), check its fields
    against the Megatron-Bridge source when it is installed here, and keep it as `<run_dir>/bridge_plan.json`."""
    import json

    from recipes.fields import bridge_version
    from recipes.overrides import build_plan, unknown_fields

    plan = build_plan(cfg)
    if bridge_version() is not None and (bad := unknown_fields(plan)):
        raise ValueError(f"engine=bridge: overrides unknown to megatron-bridge {bridge_version()}: {bad}")
    run_dir.mkdir(parents=True, exist_ok=True)
    doc = {"metadata": plan.metadata, "base_recipe": plan.base_recipe, "overrides": plan.overrides}
    (run_dir / "bridge_plan.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")


def write_sbatch(cfg: RootConfig, run_dir: str | Path, command: list[str]) -> str:
    """The sbatch script running `python <command>` (e.g. `-m bench.worker <run_dir>`) under torchrun on every node.

    Args:
        cfg: the typed config (launcher=slurm).
        run_dir: run directory on a file system shared by the login and compute nodes.
        command: python arguments after `torchrun ... `, e.g. `["-m", "bench.worker", "<run_dir>"]`.
    """
    run_dir = Path(run_dir).resolve()
    la, par = cfg.launcher, cfg.parallelism
    check_job(cfg, run_dir)
    if engines.spec(cfg.engine.name).plans_bridge:
        check_bridge_plan(cfg, run_dir)
    gpus = la.nproc_per_node or par.gpus_per_node
    copy_code(run_dir / CODE_DIR)
    container = " ".join(container_args(cfg, run_dir))
    torchrun = [
        "python",
        "-m",
        "torch.distributed.run",
        '--nnodes="$SLURM_NNODES"',
        f"--nproc_per_node={int(gpus)}",
        "--rdzv_backend=c10d",
        '--rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT"',
        '--rdzv_id="$SLURM_JOB_ID"',
    ]
    report_args = " ".join(shell_word(a) for a in ("report", str(_out_root(cfg, run_dir)), cfg.bench.report_name))
    lines = [
        *sbatch_header(cfg, run_dir),
        "",
        "set -uo pipefail",
        *env_lines(dict(la.env)),
        "",
        "# Rendezvous on the first node of the allocation.",
        'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        f"MASTER_PORT={RDZV_PORT}",
        "export MASTER_ADDR MASTER_PORT",
        "",
        f"# {int(la.nodes or par.nodes)} nodes x {int(gpus)} GPUs = world size {par.world_size}: one torchrun per node.",
        " ".join(["srun --ntasks-per-node=1 --kill-on-bad-exit=1", *map(shell_word, srun_args(cfg)), container])
        + " \\",
        f"  {' '.join(torchrun)} \\",
        f"  {' '.join(shell_word(a) for a in command)}",
        "status=$?",
        "",
        "# Collect every run of this report (e.g. the AdamW and the Muon job) and write the report, whatever the status.",
        f"srun --nodes=1 --ntasks=1 {container} \\",
        f"  python -m bench.slurm {report_args}",
        'exit "$status"',
    ]
    return "\n".join(lines) + "\n"


def collect_and_report(out_root: str | Path, report_name: str) -> int:
    """Collect the runs under `out_root` whose `bench.report_name` is `report_name`, then write that report."""
    runs = [
        d
        for d in record.find_runs(out_root)
        if record.read_json(d / "run.json").get("config", {}).get("bench", {}).get("report_name")
        == report_name
    ]
    if not runs:
        print(f"error: no run of report {report_name!r} under {out_root}", file=sys.stderr)
        return 2
    rc = collect.main(["--runs", *map(str, runs), "--name", report_name])
    return rc or report.main(["--name", report_name])


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.slurm report <out_root> <report_name>` (the last step of every job script)."""
    args = sys.argv[1:] if argv is None else argv
    if args in (["-h"], ["--help"]):
        print("usage: python -m bench.slurm report <out_root> <report_name>  (the last step of a job script)")
        return 0
    if len(args) != 3 or args[0] != "report":
        print("usage: python -m bench.slurm report <out_root> <report_name>", file=sys.stderr)
        return 2
    return collect_and_report(args[1], args[2])


def submit(script_path: str | Path, *, dry_run: bool = False) -> str | None:
    """Submit with sbatch; returns the job id. Dry run, or no sbatch here: print the script and say why, None."""
    script = Path(script_path)
    sbatch = shutil.which("sbatch")
    if dry_run or sbatch is None:
        print(script.read_text())
        why = "dry run" if dry_run else "sbatch is not on PATH (not a Slurm login node)"
        print(
            f"# not submitted ({why}); submit later with: sbatch {shlex.quote(str(script))}", file=sys.stderr
        )
        return None
    res = subprocess.run([sbatch, "--parsable", str(script)], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"sbatch {script} failed ({res.returncode}): {res.stderr.strip()}")
    return res.stdout.strip().split(";")[0]


if __name__ == "__main__":
    raise SystemExit(main())
