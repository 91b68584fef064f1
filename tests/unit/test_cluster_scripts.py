"""Both Slurm job writers (bench/slurm.py's sbatch script, NeMo-Run's through bench/cluster.py) share one quoting
layer: hostile image, mounts, run directory and account values parse with `shlex` to the intended argv or are refused
before anything is written; the job runs the run's copy of our packages on the image's stack, never a venv's
site-packages; a refused submission is recorded `error` with sbatch's message; `cluster status` tells the record.
NeMo-Run's experiments are built for real (`nemo-run` is in the test extra); sbatch and sacct are stubs on PATH.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import stat
import sys
from pathlib import Path

import pytest

from bench import cli, cluster, slurm, sweep
from muonbench import load

pytestmark = [
    pytest.mark.filterwarnings("ignore"),
    pytest.mark.skipif(importlib.util.find_spec("nemo_run") is None, reason="needs the nemo-run extra"),
]

CPU = ["experiment=cpu/qwen3_moe_tiny_dp2", "launcher=slurm"]
IMAGE = "img;echo INJECTED"
MOUNTS = ["/data/a b:/data", "/x;reboot:/y"]
PATHS = ("sbatch", "nemo_run")


@pytest.fixture(autouse=True)
def _stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    """NeMo-Run's local tunnel (invoke) reads this process's stdin while it makes the job folders: not pytest's."""
    devnull = open(os.devnull)  # noqa: SIM115
    monkeypatch.setattr(sys, "stdin", devnull)
    yield
    devnull.close()


def _script(via: str, out: Path, *overrides: str) -> tuple[str, Path]:
    """The job script `via` writes for a dry run of the CPU proxy under `out`, and its run directory."""
    cfg = load([*CPU, "launcher.dry_run=true", f"bench.out_dir={out}", *overrides])
    run_dir = out / "r1"
    run_dir.mkdir(parents=True)
    if via == "sbatch":
        return slurm.write_sbatch(cfg, run_dir, ["-m", "bench.worker", str(run_dir)]), run_dir
    cluster.launch_run(cfg, run_dir, nproc=2, nodes=1)
    return (run_dir / "job.sbatch").read_text(), run_dir


def _worker_srun(text: str) -> list[str]:
    """The argv of the srun that starts the worker; `;`, `&`, `|` and the like are separate tokens unless quoted."""
    joined = text.replace("\\\n", " ")
    (line,) = [ln for ln in joined.splitlines() if ln.startswith("srun ") and "bench.worker" in ln]
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    return list(lex)


def _option(argv: list[str], name: str) -> list[str]:
    """Every value of `name` in argv, as `--name value` or `--name=value`."""
    out = [argv[i + 1] for i, a in enumerate(argv) if a == name]
    return out + [a.split("=", 1)[1] for a in argv if a.startswith(name + "=")]


@pytest.mark.parametrize("via", PATHS)
def test_hostile_image_and_mounts_parse_to_the_intended_argv(via: str, tmp_path: Path) -> None:
    """Localises NeMo-Run's script writing `--container-image img;echo INJECTED` (a second command) and mounts
    unquoted, `--container-workdir` twice, and, without an account, `#SBATCH --account=''` and the job name
    `-.worker`: the image and every mount are one word each, one working directory, no account line, the job
    named as on the sbatch path."""
    out = tmp_path / "runs"
    text, _ = _script(via, out, f"launcher.container_image='{IMAGE}'", f"launcher.container_mounts='{','.join(MOUNTS)}'")
    sbatch = [ln.split()[1] for ln in text.splitlines() if ln.startswith("#SBATCH ")]
    assert not [s for s in sbatch if s.startswith("--account")]
    assert "--job-name=muonbench-cpu_qwen3_moe_tiny_dp2" in sbatch
    argv = _worker_srun(text)
    assert not {";", "&", "|", "&&"} & set(argv), argv
    assert _option(argv, "--container-image") == [IMAGE]
    (mounts,) = _option(argv, "--container-mounts")
    assert mounts.split(",")[:3] == [f"{out}:{out}", *MOUNTS]
    assert len(_option(argv, "--container-workdir")) == 1
    assert argv[-3:] == ["bench.worker", str(out / "r1")] or argv[-2:] == ["bench.worker", str(out / "r1")]


@pytest.mark.parametrize(
    ("via", "override", "field"),
    [("nemo_run", "bench.out_dir='{tmp}/a b'", "bench.out_dir"), ("sbatch", "bench.out_dir='{tmp}/a;b'", "bench.out_dir"),
     ("nemo_run", "bench.out_dir='{tmp}/a,b'", "bench.out_dir"),
     ("sbatch", "launcher.account='acct;touch x'", "launcher.account"),
     ("nemo_run", "launcher.account='a b'", "launcher.account")],
)  # fmt: skip
def test_hostile_run_directory_and_account_refused_before_anything_is_written(
    via: str, override: str, field: str, tmp_path: Path
) -> None:
    """A run directory NeMo-Run names unquoted (its job folders, `#SBATCH --output`) or an account sbatch reads
    from an `#SBATCH` line: one error naming the field at pre-flight, on both paths."""
    job = [*CPU, f"launcher.via={via}", f"bench.out_dir={tmp_path / 'runs'}", override.format(tmp=tmp_path)]
    (err,) = sweep.preflight([job])
    assert err.startswith(f"{field}=") and "\n" not in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("via", PATHS)
def test_an_installed_wheel_job_mounts_and_runs_nothing_of_its_venv(
    via: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Localises a wheel install's job mounting the venv's site-packages into the container and starting there
    (the container then imported the login node's torch and Megatron): our packages are copied into the job's
    working directory, and the install location appears nowhere in the script."""
    site = tmp_path / "venv" / "lib" / "python3.12" / "site-packages"
    for name in ("bench", "optim", "muonbench", "recipes"):
        shutil.copytree(slurm.CODE_ROOT / name, site / name, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(slurm, "CODE_ROOT", site)
    text, run_dir = _script(via, tmp_path / "runs")
    assert str(tmp_path / "venv") not in text
    (workdir,) = _option(_worker_srun(text), "--container-workdir")
    if via == "sbatch":
        assert workdir == str(run_dir / slurm.CODE_DIR)
        assert (run_dir / slurm.CODE_DIR / "bench" / "worker.py").is_file()
        assert (run_dir / slurm.CODE_DIR / "muonbench" / "conf" / "config.yaml").is_file()
    else:  # NeMo-Run's working directory, the job folder's `code`, which its packager fills
        assert workdir == "/nemo_run/code"
        from bench.cluster_code import CodePackager

        assert CodePackager().package(Path(), str(tmp_path / "job"), "worker") == ""
        assert (tmp_path / "job" / "code" / "bench" / "worker.py").is_file()


def _stub(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


REFUSED = "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified"


@pytest.mark.parametrize("via", PATHS)
def test_a_refused_submission_is_recorded_error_with_sbatchs_message(
    via: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Localises a NeMo-Run submission sbatch refused: a traceback, run.json and LATEST.json `running` for ever
    (and on the sbatch path `worker exited without a structured error`)."""
    _stub(tmp_path / "bin", "sbatch", f"echo '{REFUSED}' >&2\nexit 1\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("DRY_RUN", raising=False)
    out = tmp_path / "runs"
    assert cli.main(["cluster", *CPU, f"launcher.via={via}", f"bench.out_dir={out}"]) == 1
    latest = json.loads((out / "LATEST.json").read_text())
    (run_dir,) = latest["runs"]
    rec = json.loads((Path(run_dir) / "run.json").read_text())
    assert rec["status"] == latest["statuses"][run_dir] == "error"
    assert rec["error"]["message"] == f"sbatch failed (exit 1): {REFUSED}"
    printed = capsys.readouterr()
    assert "Traceback" not in printed.out + printed.err
    assert [ln for ln in printed.err.splitlines() if ln.startswith("error:")] == [f"error: {rec['error']['message']}"]


def test_no_sbatch_is_an_error_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NeMo-Run's submission without sbatch on PATH: the same one-line ValueError (the record: above)."""
    if shutil.which("sbatch", path="/usr/bin:/bin"):
        pytest.skip("this machine has sbatch")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    cfg = load([*CPU, f"bench.out_dir={tmp_path}"])
    (tmp_path / "r1").mkdir()
    with pytest.raises(ValueError, match=r"^sbatch failed \(exit 127\): .*sbatch: command not found$"):
        cluster.launch_run(cfg, tmp_path / "r1", nproc=2, nodes=1)


def test_submitted_run_names_our_status_command_which_works_without_nemorun_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Localises NeMo-Run's closing hint (`nemo experiment status <id>`, which looks in NEMORUN_HOME, not in the run
    directory): the hint is ours, and it works with NEMORUN_HOME unset."""
    _stub(tmp_path / "bin", "sbatch", "echo 4242\n")
    _stub(tmp_path / "bin", "sacct", "echo 'JobID|State|'; echo '4242|PENDING|'\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("NEMORUN_HOME", raising=False)
    monkeypatch.delenv("DRY_RUN", raising=False)
    out = tmp_path / "runs"
    assert cli.main(["cluster", *CPU, f"bench.out_dir={out}"]) == 0
    printed = capsys.readouterr().out
    (run_dir,) = json.loads((out / "LATEST.json").read_text())["runs"]
    assert f"muonbench cluster status|logs|cancel {run_dir}" in printed and "nemo experiment" not in printed
    assert cli.main(["cluster", "status", run_dir]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith(f"{run_dir}: submitted (run.json)\n") and "Job id: 4242" in shown


def test_status_of_a_closed_record_is_the_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Localises `cluster status` saying SUBMITTED for a local run whose record says ok: a closed record is the
    answer (NeMo-Run is not asked)."""
    (tmp_path / "nemo_run" / "experiments" / "t" / "t_1").mkdir(parents=True)
    (tmp_path / "nemo_run" / "experiments" / "t" / "t_1" / "_CONFIG").write_text("not a NeMo-Run config")
    (tmp_path / "run.json").write_text(json.dumps({"status": "ok", "config": {"launcher": {"name": "local"}}}))
    assert cli.main(["cluster", "status", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"{tmp_path}: ok (run.json)\n"
