"""The installed suite: the wheel carries the Hydra tree and the `muonbench` command, and runs away from the checkout.

The wheel is built from a copy of the sources, installed with `--no-deps` into a fresh venv whose dependencies are
this interpreter's site-packages (a path line in a .pth file: no download, and the checkout's editable-install hook
is not run), then `muonbench run` (AdamW vs Muon on the CPU proxy, TensorBoard sink on), `collect` and `report` run
from a temporary directory with a user's own experiment file given by `--config-dir`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from bench import cli
from muonbench import compose

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "optim", "muonbench", "bench", "recipes", "conf")
USER_PARALLELISM = """\
defaults:
  - base_parallelism
name: cpu_one
world_size: 1
mbs: 2
gbs: 2
"""
USER_EXPERIMENT = """\
# @package _global_
defaults:
  - override /model: qwen3_moe_tiny
  - override /parallelism: cpu_one
  - override /hardware: cpu
  - override /engine: hf
experiment_name: mine/tiny
bench:
  steps: 3
  warmup_steps: 1
  prewarm: false
  progress: false
  logger: tensorboard
  report_name: mine_tiny
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        p = ROOT / name
        if p.is_dir():
            shutil.copytree(p, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "local"))
        else:
            shutil.copy2(p, src / name)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(src)],
        check=True,
        cwd=src,
    )
    (whl,) = out.glob("muonbench-*.whl")
    return whl


def test_wheel_ships_the_config_tree_and_the_command(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    conf = sorted(str(p.relative_to(ROOT / "conf")) for p in (ROOT / "conf").rglob("*.yaml") if "local" not in p.parts)
    assert conf and [c for c in conf if f"muonbench/conf/{c}" not in names] == []
    assert not {n for n in names if n.split("/")[0] in ("config", "tools", "experiments", "tests")}
    (ep,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert "muonbench = bench.cli:main" in zipfile.ZipFile(wheel).read(ep).decode()


@pytest.mark.slow
def test_installed_command_runs_the_cpu_proxy_from_anywhere(wheel: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # no checkout on the path, pip's included
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", str(wheel)],
        check=True,
        env=env,
        cwd=tmp_path,
    )
    site = Path(subprocess.check_output([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        text=True).strip())
    (site / "_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    work = tmp_path / "work"
    (work / "my_conf" / "experiment" / "mine").mkdir(parents=True)
    (work / "my_conf" / "experiment" / "mine" / "tiny.yaml").write_text(USER_EXPERIMENT)
    (work / "my_conf" / "parallelism").mkdir()
    (work / "my_conf" / "parallelism" / "cpu_one.yaml").write_text(USER_PARALLELISM)

    def sh(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, check=False, cwd=work, env=env, capture_output=True, text=True, timeout=300)

    where = sh(str(py), "-c", "import bench, muonbench; print(bench.__file__); print(muonbench.CONF_DIR)")
    assert where.returncode == 0, where.stderr
    bench_file, conf_dir = where.stdout.split()
    assert Path(bench_file).is_relative_to(venv) and Path(conf_dir).is_relative_to(venv), where
    muonbench = str(venv / "bin" / "muonbench")
    assert "ns-kernels" in sh(muonbench, "--help").stdout
    for name in ("model", "crossover"):  # the tools' own help, through the console script, naming it
        res = sh(muonbench, name, "--help")
        assert res.returncode == 0 and f"usage: muonbench {name}" in res.stdout, res.stdout + res.stderr
    run = sh(muonbench, "run", "-m", "--config-dir", "my_conf", "experiment=mine/tiny", "optimizer=adamw,muon")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 runs: 2 ok" in run.stdout, run.stdout
    latest = json.loads((work / "runs" / "LATEST.json").read_text())
    assert [json.loads((Path(r) / "run.json").read_text())["config"]["bench"]["steps"] for r in latest["runs"]] == [
        3,
        3,
    ]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for run_dir in latest["runs"]:  # every step reached the sink through the installed worker
        acc = EventAccumulator(str(Path(run_dir) / "tensorboard")).Reload()
        assert [e.step for e in acc.Scalars("lm loss")] == [0, 1, 2]
        assert all(e.value > 0 for e in acc.Scalars("throughput/tflops/device"))
    for sub in ("collect", "report"):
        res = sh(muonbench, sub)
        assert res.returncode == 0, res.stdout + res.stderr
    assert (Path(latest["sweep_dir"]) / "report" / "report.md").is_file()


def test_config_dir_adds_the_users_files_to_every_compose(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compose, "USER_CONFIG_DIRS", [])
    (tmp_path / "experiment" / "mine").mkdir(parents=True)
    (tmp_path / "experiment" / "mine" / "tiny.yaml").write_text(USER_EXPERIMENT)
    (tmp_path / "parallelism").mkdir()
    (tmp_path / "parallelism" / "cpu_one.yaml").write_text(USER_PARALLELISM)
    with pytest.raises(compose.ConfigError, match="experiment=mine/tiny: no such option"):
        compose.load(["experiment=mine/tiny"])
    rest = compose.take_config_dirs(["-m", "--config-dir", str(tmp_path), "optimizer=adamw,muon"])
    assert rest == ["-m", "optimizer=adamw,muon"]
    root = compose.load(["experiment=mine/tiny"])
    assert (root.experiment_name, root.parallelism.world_size, root.bench.steps) == ("mine/tiny", 1, 3)
    assert "cpu_one" in compose.available_options("parallelism")


@pytest.mark.parametrize("argv", [["--config-dir", "/no/such/dir"], ["-cd"], ["--config-dir=relative/missing"]])
def test_config_dir_must_exist(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compose, "USER_CONFIG_DIRS", [])
    with pytest.raises(compose.ConfigError, match=r"^(--config-dir|-cd)=.*must name an existing directory"):
        compose.take_config_dirs(argv)


def test_cli_lists_every_entry_point_and_rejects_an_unknown_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    listed = capsys.readouterr().out
    assert all(f"  {name} " in listed for name in cli.SUBCOMMANDS)
    assert cli.main(["fly"]) == 2
    assert "invalid choice: 'fly'" in capsys.readouterr().err
    assert cli.main([]) == 2
    assert "usage: muonbench" in capsys.readouterr().err
    assert cli.main(["crossover", "--no-such-flag"]) == 2


def test_every_subcommand_resolves_to_a_callable_entry_point() -> None:
    """Localises a table entry naming a module without its function (`muonbench quality` ran
    `bench.tools.quality.run.main`, which does not exist): every entry imports and is callable."""
    for name in cli.SUBCOMMANDS:
        assert callable(cli.entry(name)), name


@pytest.mark.parametrize(
    ("argv", "shown"),
    [(["run"], "usage: muonbench run "), (["flops"], "usage: muonbench flops "), (["model"], "usage: muonbench model "),
     (["crossover"], "usage: muonbench crossover"), (["collect"], "usage: muonbench collect"),
     (["report"], "usage: muonbench report")],
)  # fmt: skip
def test_help_names_the_command_as_invoked(argv: list[str], shown: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Localises `muonbench run --help` (and its hints) saying `python -m bench.run`: under `muonbench` the help
    names `muonbench <subcommand>`, under `python -m` the module."""
    from muonbench import cli_help

    assert cli.main([*argv, "--help"]) == 0
    out = capsys.readouterr().out
    assert shown in out and "python -m bench" not in out, out
    assert cli_help.command("bench.run") == "python -m bench.run"  # outside the muonbench command
    assert cli_help.run_usage().startswith("usage: python -m bench.run ")


def test_model_and_crossover_subcommands_run_their_tools(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`muonbench model hf:<config>` prints a conf/model YAML that, selected from `--config-dir`, composes the same
    model; `muonbench crossover <runs>` reads the runs folder it is given."""
    from dataclasses import replace

    import muonbench

    monkeypatch.setattr(compose, "USER_CONFIG_DIRS", [])
    fixture = ROOT / "tests" / "unit" / "fixtures" / "hf_configs" / "qwen3_8b"
    assert cli.main(["model", f"hf:{fixture}", "model.num_layers=4"]) == 0
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "mine.yaml").write_text(capsys.readouterr().out)
    compose.take_config_dirs(["--config-dir", str(tmp_path)])
    mine = muonbench.load(["model=mine"]).model
    read = muonbench.load([f"model=hf:{fixture}", "model.num_layers=4"]).model
    assert mine.num_layers == 4 and mine == replace(read, source="", trust_remote_code=False)
    assert cli.main(["model", "qwen3_8b"]) == 2
    assert "the first argument is hf:" in capsys.readouterr().err
    (tmp_path / "runs").mkdir()  # the analysis itself: tests/unit/test_crossover.py
    assert cli.main(["crossover", str(tmp_path / "runs")]) == 2
    assert capsys.readouterr().err == f"error: no ok run under {tmp_path / 'runs'}\n"


def test_make_install_with_uv_compiles_bytecode(tmp_path: Path) -> None:
    """Localises a venv installed without bytecode: uv, unlike pip, compiles none unless asked, and where none is
    written (PYTHONDONTWRITEBYTECODE) every process of the suite then compiles torch & co. from source again."""
    if shutil.which("make") is None:
        pytest.skip("no make here")
    dry = subprocess.run(
        ["make", "-n", "install", f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    uv = [cmd for line in dry.splitlines() for cmd in line.split("&&") if "uv pip install" in cmd]
    assert uv and all("--compile-bytecode" in cmd for cmd in uv), dry


def test_make_bench_hf_reports_from_the_folder_it_writes(tmp_path: Path) -> None:
    """`OUT_DIR` reaches bench.run, collect and report alike; `bench.out_dir` in ARGS, which the report step would
    not read (it looked for runs/LATEST.json after a sweep written elsewhere), stops make before anything runs."""
    if shutil.which("make") is None:
        pytest.skip("no make here")

    def dry(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = ["make", "-n", "bench-hf", "CONFIG=c.json", f"VENV={tmp_path / 'venv'}", *args]
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)

    ok = dry(f"OUT_DIR={tmp_path / 'o'}")
    assert ok.returncode == 0, ok.stderr
    assert f"bench.out_dir={tmp_path / 'o'}" in ok.stdout and ok.stdout.count(f"--out-dir {tmp_path / 'o'}") == 2
    bad = dry(f"ARGS=optimizer.lr=0.01 bench.out_dir={tmp_path / 'o'}")
    assert bad.returncode != 0 and "pass OUT_DIR=DIR instead" in bad.stderr and "bench.run" not in bad.stdout


@pytest.mark.parametrize("target", ["bench-hf", "bench"])
def test_make_bench_reports_nothing_when_bench_run_refused(target: str, tmp_path: Path) -> None:
    """Localises `make bench-hf` with a config bench.run refuses (and a second `make bench` whose out_dir another
    sweep holds) going on to collect and report: an older sweep's report was printed, or written into the
    sweep that holds the folder. bench.run exits 2 and make stops there."""
    import fcntl
    import hashlib

    if shutil.which("make") is None:
        pytest.skip("no make here")
    venv, out = tmp_path / "venv", tmp_path / "runs"
    pins = b"".join((ROOT / p).read_bytes() for p in ("pyproject.toml", "tests/requirements-bridge.txt"))
    venv.mkdir()
    (venv / f".installed-{hashlib.sha256(pins).hexdigest()[:16]}").touch()  # the install is up to date
    out.mkdir()
    args = ["make", "-s", target, f"VENV={venv}", f"PY={sys.executable}", f"OUT_DIR={out}"]
    with open(out / ".bench_run.lock", "a+") as lock:
        if target == "bench-hf":
            args.append(f"CONFIG={tmp_path / 'missing.json'}")
        else:  # another sweep holds the folder
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        res = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=False, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "error: " in res.stderr and "LATEST.json" not in res.stderr, res.stderr
    assert sorted(p.name for p in out.iterdir()) == [".bench_run.lock"]
