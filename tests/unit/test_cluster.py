"""Cluster launch settings shared by the sbatch and the NeMo-Run paths (bench/slurm.py, bench/cluster.py): every
site field reaches the job, shell metacharacters are rejected before anything is queued, and a missing extra is one
line naming it. NeMo-Run's executors and experiments are built for real (`nemo-run` is in the test extra).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from bench import cli, cluster, slurm
from muonbench import compose, load

pytestmark = pytest.mark.filterwarnings("ignore")

KIMI = "experiment=gb300/kimi_k2_muon"
SITE = [
    "launcher.account=acct",
    "launcher.partition=batch",
    "launcher.qos=high",
    "launcher.constraint=gb300",
    "launcher.gres=gpu:4",
    "launcher.segment=16",
    "launcher.sbatch_args=['--reservation=r1','--comment=ab_run']",
    "launcher.srun_args=['--mpi=pmix']",
]


def test_every_site_field_reaches_the_sbatch_script(tmp_path: Path) -> None:
    cfg = load([KIMI, *SITE])
    text = slurm.write_sbatch(cfg, tmp_path / "r1", ["-m", "bench.worker", str(tmp_path / "r1")])
    for line in ("account=acct", "partition=batch", "qos=high", "constraint=gb300", "gres=gpu:4", "segment=16",
                 "reservation=r1", "comment=ab_run"):  # fmt: skip
        assert f"#SBATCH --{line}\n" in text
    assert "srun --ntasks-per-node=1 --kill-on-bad-exit=1 --mpi=pmix --container-image=" in text


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("launcher.qos='high;touch x'", "launcher.qos"),
        ("launcher.constraint='a b'", "launcher.constraint"),
        ("launcher.gres='gpu:4\n#SBATCH --x=1'", "launcher.gres"),
        ("launcher.segment=-1", "launcher.segment"),
        ("launcher.sbatch_args=['--reservation=r1 $(touch x)']", "launcher.sbatch_args"),
        ("launcher.sbatch_args=[reservation]", "launcher.sbatch_args"),
        ("launcher.srun_args=['--mpi=pmix;reboot']", "launcher.srun_args"),
        ("launcher.srun_args=[pmix]", "launcher.srun_args"),
    ],
)
def test_hostile_site_values_are_rejected_naming_the_field(override: str, field: str) -> None:
    cfg = load([KIMI, override])
    with pytest.raises(ValueError, match=rf"^{field}"):
        slurm.site_options(cfg)
        slurm.srun_args(cfg)


def test_missing_nemo_run_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "nemo_run" else real(n, *a))
    with pytest.raises(compose.ConfigError, match=r"^launcher.via='nemo_run': needs the nemo-run extra: "
                       r"pip install 'muonbench\[nemo-run\]'$"):  # fmt: skip
        compose.check_runnable(load([KIMI, "launcher.via=nemo_run"]))


def test_cluster_command_selects_nemo_run_and_the_dry_run(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []
    monkeypatch.setattr("bench.run.main", lambda: seen.append(list(__import__("sys").argv[1:])))
    monkeypatch.setenv("DRY_RUN", "1")
    assert cli.main(["cluster", KIMI]) == 0
    assert cli.main(["cluster", KIMI, "launcher.via=sbatch", "launcher.dry_run=false"]) == 0
    assert cli.main(["cluster", KIMI, "-m", "optimizer=adamw,muon"]) == 0  # Hydra's flag stays first
    assert seen == [["launcher.via=nemo_run", "launcher.dry_run=true", KIMI],
                    [KIMI, "launcher.via=sbatch", "launcher.dry_run=false"],
                    ["-m", "launcher.via=nemo_run", "launcher.dry_run=true", KIMI, "optimizer=adamw,muon"]]  # fmt: skip
    assert cli.main(["cluster", "status"]) == 2


@pytest.mark.parametrize(("value", "dry"), [("1", True), ("yes", True), ("TRUE", True), ("0", False),
                                             ("false", False), ("no", False), ("", False)])  # fmt: skip
def test_dry_run_env_says_yes_or_no(value: str, dry: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Localises `DRY_RUN=false` (or `no`) printing the script instead of submitting: only a yes is a dry run."""
    seen: list[list[str]] = []
    monkeypatch.setattr("bench.run.main", lambda: seen.append(list(__import__("sys").argv[1:])))
    monkeypatch.setenv("DRY_RUN", value)
    assert cli.main(["cluster", KIMI]) == 0
    assert ("launcher.dry_run=true" in seen[0]) is dry


def test_dry_run_env_other_values_refused(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("bench.run.main", lambda: pytest.fail("nothing may start"))
    monkeypatch.setenv("DRY_RUN", "maybe")
    assert cli.main(["cluster", KIMI]) == 2
    assert capsys.readouterr().err.startswith("error: DRY_RUN='maybe': allowed [")


needs_nemo_run = pytest.mark.skipif(importlib.util.find_spec("nemo_run") is None, reason="needs the nemo-run extra")


@needs_nemo_run
def test_slurm_executor_carries_the_launcher_config(tmp_path: Path) -> None:
    cfg = load([KIMI, *SITE, "+launcher.env.EVIL='`touch x`; rm -rf /'"])
    ex = cluster.executor(cfg, tmp_path / "r1", nproc=4, nodes=64)
    assert (ex.account, ex.partition, ex.qos, ex.constraint, ex.gres, ex.segment) == (
        "acct", "batch", "high", "gb300", "gpu:4", 16,
    )  # fmt: skip
    assert ex.additional_parameters == {"reservation": "r1", "comment": "ab_run"}
    assert (ex.nodes, ex.ntasks_per_node, ex.gpus_per_node, ex.time) == (64, 1, 4, "01:00:00")
    assert "--mpi=pmix" in ex.srun_args and ex.container_image == "nvcr.io/nvidia/nemo:26.02"
    assert ex.env_vars["EVIL"] == "'`touch x`; rm -rf /'"  # quoted for the job script
    assert ex.env_vars["NVLINK_DOMAIN_SIZE"] == "72"


@needs_nemo_run
def test_a_sweep_dry_run_writes_what_nemo_run_would_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`DRY_RUN=1 muonbench cluster -m optimizer=adamw,muon launcher=local,slurm`: four real NeMo-Run experiments,
    nothing started; each run directory holds the sbatch script NeMo-Run's SlurmExecutor would submit (every site
    field, the hostile env value quoted) or the LocalExecutor's torchrun command, both starting the bench worker on
    that run directory."""
    import json
    import sys

    monkeypatch.setenv("DRY_RUN", "1")
    # NeMo-Run's local tunnel (invoke) reads this process's stdin while it makes the job folders: not pytest's.
    devnull = open(os.devnull)  # noqa: SIM115
    monkeypatch.setattr(sys, "stdin", devnull)
    out = tmp_path / "runs"
    argv = ["cluster", "-m", "optimizer=adamw,muon", "launcher=local,slurm", "experiment=cpu/qwen3_moe_tiny_dp2",
            *SITE, "+launcher.env.EVIL='`touch x`; rm -rf /'", f"bench.out_dir={out}"]  # fmt: skip
    try:
        assert cli.main(argv) == 0
    finally:
        devnull.close()
    runs = [Path(r) for r in json.loads((out / "LATEST.json").read_text())["runs"]]
    records = [json.loads((r / "run.json").read_text()) for r in runs]
    assert sorted((c["config"]["optimizer"]["name"], c["config"]["launcher"]["name"]) for c in records) == [
        ("adamw", "local"), ("adamw", "slurm"), ("muon", "local"), ("muon", "slurm"),
    ]  # fmt: skip
    assert {c["status"] for c in records} == {"written"}
    worker = "--nnodes 1 --nproc-per-node 2 --node-rank 0 --tee 3 -m bench.worker {}"
    for run_dir, rec in zip(runs, records, strict=True):
        assert not (run_dir / "steps.jsonl").exists()  # nothing ran
        if rec["config"]["launcher"]["name"] == "local":
            (line,) = (run_dir / "job.sh").read_text().splitlines()
            assert line.startswith("# worker: torchrun ") and line.endswith(worker.format(run_dir))
            continue
        text = (run_dir / "job.sbatch").read_text()
        assert text.startswith("# submitted with: sbatch --requeue --parsable\n#!/bin/bash\n")
        sbatch = {line.split()[1] for line in text.splitlines() if line.startswith("#SBATCH ")}
        assert {"--account=acct", "--partition=batch", "--qos=high", "--constraint=gb300", "--gres=gpu:4",
                "--segment=16", "--reservation=r1", "--comment=ab_run", "--nodes=1", "--ntasks-per-node=1",
                "--gpus-per-node=2", "--time=00:30:00", "--exclusive"} <= sbatch  # fmt: skip
        assert "export EVIL='`touch x`; rm -rf /'\n" in text
        (srun,) = [line for line in text.splitlines() if line.startswith("srun ")]
        assert "--container-image nvcr.io/nvidia/nemo:26.02" in srun and " --mpi=pmix torchrun " in srun
        assert f"{out.resolve()}:{out.resolve()}" in srun  # the run directory mounted at its own path
        assert srun.endswith(worker.format(run_dir))


@needs_nemo_run
@pytest.mark.slow
def test_local_executor_runs_the_cpu_proxy_through_nemo_run(tmp_path: Path) -> None:
    """launcher=local with NeMo-Run's LocalExecutor: the same worker, record closed ok, experiment kept in the run.
    One rank: that NeMo-Run starts and waits for the job is the point, not the ranks (the 2-rank torchrun command
    of the LocalExecutor is checked by the dry run above)."""
    import json
    import subprocess
    import sys

    out = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # nemo_run wherever it is
    res = subprocess.run(
        [sys.executable, "-m", "bench.cli", "cluster", "launcher=local", "experiment=cpu/qwen3_moe_tiny_dp2",
         "bench.steps=3", "bench.warmup_steps=1", "bench.progress=false", "parallelism.world_size=1",
         "parallelism.gpus_per_node=1", "parallelism.gbs=2", f"bench.out_dir={out}"],
        capture_output=True, text=True, timeout=400, check=False, env=env,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    (run_dir,) = json.loads((out / "LATEST.json").read_text())["runs"]
    assert json.loads((Path(run_dir) / "run.json").read_text())["status"] == "ok"
    assert list((Path(run_dir) / "nemo_run" / "experiments").glob("*/*/_CONFIG"))
