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


@pytest.mark.parametrize("command", [c for c, (kind, _) in COMMANDS.items() if kind == CPU_RUN])
def test_readme_cpu_command_runs(command, scratch):
    """Localises a README example that fails (e.g. the MOP run of the 4-optimizer sweep)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "VIRTUAL_ENV")}
    # a newcomer's shell: no venv on PATH unless the README's own setup lines before the command put it there
    venv_bin = str(ROOT / ".venv" / "bin")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    res = subprocess.run(
        ["bash", "-c", " && ".join([*setup_before(command), command])],
        cwd=scratch,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert res.returncode == 0, f"{command}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    if "bench.run" in command or command == "make bench":
        latest = json.loads((scratch / "runs" / "LATEST.json").read_text())
        assert latest["state"] == "complete", latest
    if command == "make bench":  # the report goes next to the runs; the committed reports/ is not touched
        assert (Path(latest["sweep_dir"]) / "report" / "report.md").exists()
        assert not (scratch / "reports").exists()
