"""The Slurm script of the published Kimi K2 Muon run (bench/slurm.py): layout and environment as text, valid bash,
and no config value can inject a command (the script is executed with stub srun/scontrol to prove it).
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from bench.slurm import ENV_DOCS, submit, write_sbatch
from muonbench import load

pytestmark = pytest.mark.filterwarnings("ignore")

KIMI = "experiment=gb300/kimi_k2_muon"


def _script(tmp_path: Path, *overrides: str) -> str:
    cfg = load([KIMI, *overrides])
    run_dir = tmp_path / "runs" / "r1"
    return write_sbatch(cfg, run_dir, ["-m", "bench.worker", str(run_dir)])


def test_kimi_k2_layout_and_environment(tmp_path: Path) -> None:
    text = _script(tmp_path, "launcher.partition=batch", "launcher.account=acct")
    assert "#SBATCH --nodes=64\n" in text and "#SBATCH --gpus-per-node=4\n" in text
    assert "#SBATCH --ntasks-per-node=1\n" in text and "#SBATCH --time=01:00:00\n" in text
    assert "#SBATCH --partition=batch\n" in text and "#SBATCH --account=acct\n" in text
    assert "--nproc_per_node=4" in text and "world size 256" in text
    assert "--container-image=nvcr.io/nvidia/nemo:26.02" in text and "--container-mounts=" in text
    lines = text.splitlines()
    for name, value in [
        ("CUDA_DEVICE_MAX_CONNECTIONS", "32"),
        ("NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN", "64"),
        ("NVLINK_DOMAIN_SIZE", "72"),
        ("NVTE_FWD_LAYERNORM_SM_MARGIN", "20"),
        ("NCCL_NVLS_ENABLE", "0"),
        ("TORCH_NCCL_HIGH_PRIORITY", "1"),
    ]:
        i = lines.index(f"export {name}={value}")
        assert lines[i - 1] == f"# {ENV_DOCS[name]}"  # every variable carries its reason
    assert f"python -m bench.slurm report {tmp_path / 'runs'} gb300_kimi_k2" in text
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def _stub(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_injection_attempts_stay_literal(tmp_path: Path) -> None:
    """Hostile values in image, mounts, env and report name reach srun as literal arguments and run nothing."""
    marker = tmp_path / "pwned"
    evil = f"$(touch {marker})"
    text = _script(
        tmp_path,
        f"launcher.container_image='img; touch {marker}'",
        f"launcher.container_mounts='/data:/data,{evil}'",
        f"+launcher.env.EVIL='`touch {marker}`; rm -rf /'",
        f"bench.report_name='r; touch {marker}'",
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.jsonl"
    _stub(
        bin_dir,
        "srun",
        'python3 -c \'import json,os,sys; print(json.dumps([os.environ.get("EVIL"), '
        f'*sys.argv[1:]]))\' "$@" >> {calls}\n',
    )
    _stub(bin_dir, "scontrol", "echo node001\n")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_NNODES": "64",
        "SLURM_JOB_NODELIST": "node[001-064]",
        "SLURM_JOB_ID": "7",
    }
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    subprocess.run(["bash", str(script)], env=env, check=False, cwd=tmp_path)
    assert not marker.exists()
    envs, argvs = zip(*((row[0], row[1:]) for row in map(json.loads, calls.read_text().splitlines())))
    assert f"--container-image=img; touch {marker}" in argvs[0]
    mounts = next(a for a in argvs[0] if a.startswith("--container-mounts="))
    assert mounts.endswith(f",/data:/data,{evil}")
    assert "--rdzv_endpoint=node001:29500" in argvs[0]
    assert argvs[1][-1] == f"r; touch {marker}"  # bench.slurm report <out_root> <literal name>
    assert envs[0] == f"`touch {marker}`; rm -rf /"  # exported verbatim, never executed


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("launcher.partition='a\nb'", "launcher.partition"),
        ("launcher.account='x y'", "launcher.account"),
        ("launcher.time_limit='1 hour'", "launcher.time_limit"),
        ("launcher.container_image=''", "container_image"),
    ],
)
def test_unsafe_directive_values_raise(tmp_path: Path, override: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _script(tmp_path, override)


def test_env_names_must_be_identifiers(tmp_path: Path) -> None:
    cfg = load([KIMI])
    cfg.launcher.env["A;touch x;B"] = "1"
    with pytest.raises(ValueError, match="launcher.env key"):
        write_sbatch(cfg, tmp_path / "r", ["-m", "bench.worker", str(tmp_path / "r")])


def test_submit_dry_run_and_with_sbatch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text(_script(tmp_path))
    assert submit(script, dry_run=True) is None
    out = capsys.readouterr()
    assert "#SBATCH --nodes=64" in out.out and "dry run" in out.err
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _stub(bin_dir, "sbatch", 'test "$1" = --parsable && echo "4242;cluster"\n')
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    assert submit(script) == "4242"
    assert re.search(r"^#SBATCH --job-name=muonbench-gb300_kimi_k2_muon$", script.read_text(), re.MULTILINE)


def test_bridge_plan_checked_and_kept_before_queueing(tmp_path: Path) -> None:
    """engine=bridge: the recipe plan is built at write time (records the A/B mode); a bad combination fails here."""
    _script(tmp_path)
    plan = json.loads((tmp_path / "runs" / "r1" / "bridge_plan.json").read_text())
    assert plan["metadata"]["ab_mode"] == "published"
    assert plan["overrides"]["optimizer"]["optimizer"] == "dist_muon"
    with pytest.raises(ValueError, match="MOP"):
        _script(tmp_path, "optimizer=mop", "optimizer.implementation=megatron")


def test_job_end_collects_only_runs_of_its_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The last job step collects the AdamW and Muon runs of one report, not other reports' runs."""
    from bench.results import collect, report
    from bench.slurm import collect_and_report

    for name, rep in [("a", "gb300_kimi_k2"), ("b", "gb300_kimi_k2"), ("c", "other")]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_text(json.dumps({"config": {"bench": {"report_name": rep}}}))
    calls: list[list[str]] = []
    monkeypatch.setattr(collect, "main", lambda argv: calls.append(argv) or 0)
    monkeypatch.setattr(report, "main", lambda argv: calls.append(argv) or 0)
    assert collect_and_report(tmp_path, "gb300_kimi_k2") == 0
    assert calls == [
        ["--runs", str(tmp_path / "a"), str(tmp_path / "b"), "--name", "gb300_kimi_k2"],
        ["--name", "gb300_kimi_k2"],
    ]
    assert collect_and_report(tmp_path, "missing") == 2
