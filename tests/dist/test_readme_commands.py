"""Every command in README.md's code blocks is listed here with what it is, and the ones a CPU can run do run, as
written, in a scratch copy of the checkout (its own runs/ and reports/), so a README example cannot silently break.

When the README changes, `test_readme_and_list_agree` names the commands to add to or remove from `COMMANDS`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from readme_commands import ROOT, readme_commands

pytestmark = pytest.mark.dist

CPU_RUN = "cpu-run"
"""Runs here as written; must exit 0."""
COVERED = "covered"
"""Runs as part of another listed cpu-run command (the reason names it)."""
GPU_OR_CLUSTER = "gpu-or-cluster"
"""Needs a GPU, a Slurm cluster or Docker."""
NOT_A_RUN = "not-a-run"
"""A template with placeholders, or the test suite itself."""
SETUP = "setup"
"""Prepares the shell (activates the venv): every command the README shows after it runs after it here too."""

COMMANDS: dict[str, tuple[str, str]] = {
    "make test": (NOT_A_RUN, "the test suite that runs this test"),
    "make bench": (CPU_RUN, ""),
    "make bench-hf CONFIG=tests/unit/fixtures/hf_configs/llama3_8b/config.json": (CPU_RUN, ""),
    "make compare ARGS=\"experiment=h200/qwen3_moe_short_megatron_1gpu\"": (
        GPU_OR_CLUSTER,
        "the megatron engine on one GPU, runs until +-0.5% (about 10 minutes); tests/unit/test_compare.py runs the "
        "same command A/A on 2 gloo ranks",
    ),
    "make help": (CPU_RUN, ""),
    "source .venv/bin/activate": (SETUP, "puts the suite's Python on PATH for the python -m commands after it"),
    "python -m bench.run optimizer=muon optimizer.num_ns_steps=6 optimizer.coefficient_type=polar_express": (
        CPU_RUN,
        "",
    ),
    "python -m bench.run -m optimizer=adamw,muon experiment=h200/qwen3_30b_a3b_slice_flops_muon_1gpu": (
        GPU_OR_CLUSTER,
        "the megatron engine on one H200 (about 3 minutes per optimizer)",
    ),
    "python -m bench.run -m optimizer=adamw,muon +bench.optimizer_overrides.muon.num_ns_steps=6": (
        COVERED,
        "make bench runs this adamw,muon sweep on CPU; each job's composition with the override is checked by "
        "tests/unit/test_config_refusals.py::test_a_setting_of_one_optimizer_applies_only_when_it_runs",
    ),
}
"""README command -> (kind, reason). Keep in the README's order."""

SCRATCH_LINKS = (
    ".venv",
    ".python-version",
    "Makefile",
    "pyproject.toml",
    "bench",
    "conf",
    "optim",
    "recipes",
    "config",
    "tools",
    "experiments",
    "docs",
    "tests",  # tests/requirements-bridge.txt is an input of make's install stamp
)
"""What a scratch checkout links to the real one; runs/ and reports/ are its own."""


def test_readme_and_list_agree():
    """Localises a README command nobody classified (or a listed one the README dropped)."""
    readme = readme_commands()
    missing = [c for c in readme if c not in COMMANDS]
    stale = [c for c in COMMANDS if c not in readme]
    assert not missing and not stale, f"add to COMMANDS: {missing}; remove from COMMANDS: {stale}"
    assert all(reason for kind, reason in COMMANDS.values() if kind != CPU_RUN)


def test_extractor_reads_blocks_as_a_shell_would():
    text = (
        "intro `python -m not.a.block`\n\n```\nmake bench    # comment\n== output line\n"
        "MUONBENCH_GIT_SHA=$(git rev-parse --short HEAD) bash x.sh\n"
        "python -m bench.run \\\n   optimizer=muon   # tail\n  help   List targets\n```\n"
    )
    assert readme_commands(text) == [
        "make bench",
        "MUONBENCH_GIT_SHA=$(git rev-parse --short HEAD) bash x.sh",
        "python -m bench.run optimizer=muon",
    ]


def setup_before(command: str) -> list[str]:
    """The README's setup lines (`SETUP`) above `command`, in order."""
    readme = readme_commands()
    return [c for c in readme[: readme.index(command)] if COMMANDS[c][0] == SETUP]


def test_python_commands_follow_the_activation_step():
    """`python -m bench.run ...` as the README's first command failed for a newcomer (ModuleNotFoundError:
    omegaconf): the venv's Python is on PATH only after the README says how."""
    readme = readme_commands()
    for command in readme:
        if command.split()[0] in ("python", "python3"):
            assert "source .venv/bin/activate" in setup_before(command), command


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkout")
    for name in SCRATCH_LINKS:
        if (ROOT / name).exists():
            (root / name).symlink_to(ROOT / name)
    return root


MAKE_BENCH = "make bench"
"""Run by `test_make_bench_closes_every_run_and_reports`, which also checks the records and report it leaves (one
sweep serves both checks)."""


def run_readme_command(command: str, scratch: Path) -> subprocess.CompletedProcess[str]:
    """`command` as written, in the scratch checkout, after the README's setup lines above it."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "VIRTUAL_ENV")}
    # a newcomer's shell: no venv on PATH unless the README's own setup lines before the command put it there
    venv_bin = str(ROOT / ".venv" / "bin")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    return subprocess.run(
        ["bash", "-c", " && ".join([*setup_before(command), command])],
        cwd=scratch,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )


@pytest.mark.parametrize(
    "command", [c for c, (kind, _) in COMMANDS.items() if kind == CPU_RUN and c != MAKE_BENCH]
)
def test_readme_cpu_command_runs(command, scratch):
    """Localises a README example that fails (e.g. the MOP run of the 4-optimizer sweep)."""
    res = run_readme_command(command, scratch)
    assert res.returncode == 0, f"{command}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    if "bench.run" in command:
        latest = json.loads((scratch / "runs" / "LATEST.json").read_text())
        assert latest["state"] == "complete", latest


def test_make_bench_closes_every_run_and_reports(scratch):
    """The README's `make bench` runs as written, and it is the product's main path end to end (AdamW/Muon sweep
    with 2 gloo ranks under torchrun, then bench.results.collect and bench.results.report): every job leaves a
    closed record with its steps, LATEST.json and sweep.json list them, and the report lands next to the runs,
    not in the committed reports/."""
    assert COMMANDS[MAKE_BENCH][0] == CPU_RUN
    res = run_readme_command(MAKE_BENCH, scratch)
    assert res.returncode == 0, f"{MAKE_BENCH}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    latest = json.loads((scratch / "runs" / "LATEST.json").read_text())
    sweep_dir = Path(latest["sweep_dir"])
    dest = sweep_dir / "report"  # next to the runs, not in reports/; it keeps a run.json of its own
    runs = [p for p in sweep_dir.glob("*/run.json") if p.parent != dest]
    recs = {p.parent.name: json.loads(p.read_text()) for p in runs}
    assert sorted(recs) == ["0_adamw", "1_muon"]
    ok = {name: r for name, r in recs.items() if r["status"] == "ok"}
    assert sorted(ok) == ["0_adamw", "1_muon"]
    assert recs["1_muon"]["choices"]["optimizer"] == "muon"
    assert latest["state"] == "complete" and latest["runs"] == [
        recs[n]["run_dir"] for n in ("0_adamw", "1_muon")
    ]
    assert json.loads((sweep_dir / "sweep.json").read_text()) == latest
    for rec in ok.values():
        steps = [json.loads(x) for x in (Path(rec["run_dir"]) / "steps.jsonl").read_text().splitlines()]
        bench = rec["config"]["bench"]
        assert bench["steps"] > bench["warmup_steps"] > 0
        assert [s["warmup"] for s in steps] == [i < bench["warmup_steps"] for i in range(bench["steps"])]
        assert all(s["tokens"] == 8 * 64 and s["step_s"] > 0 and s["comm_s"] > 0 for s in steps)
        assert "--nproc_per_node=2" in rec["launch_command"]
        assert rec["worker"]["timer"] == "perf_counter" and rec["summary"]["model_tflops_per_gpu"] > 0
    muon = ok["1_muon"]["summary"]
    assert (
        muon["ns_s_median"] > 0
        and 0 < muon["ns_flops_per_gpu_per_step"] <= muon["ns_flops_enumerated_per_step"]
    )
    assert ok["0_adamw"]["summary"]["ns_s_median"] is None
    assert "layerwise" in ok["1_muon"]["worker"]["engine"]["optimizer_distribution"]

    # bench.results.report's table on make's stdout
    assert "model-only ratio" in res.stdout and "total = model + NS" in res.stdout
    assert (dest / "report.md").exists() and (dest / "loss.png").stat().st_size > 5000
    assert not (scratch / "reports").exists()
