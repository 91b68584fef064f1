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

COMMANDS: dict[str, tuple[str, str]] = {
    "make test": (NOT_A_RUN, "the test suite that runs this test"),
    "make bench": (CPU_RUN, ""),
    ".venv/bin/python -m bench.run -m optimizer=adamw,muon experiment=cpu/qwen3_moe_tiny_dp2": (
        COVERED,
        "printed by `make bench`, which runs it",
    ),
    ".venv/bin/python -m bench.report": (COVERED, "printed by `make bench`, which runs it"),
    ".venv/bin/python -m bench.run optimizer=muon optimizer.num_ns_steps=6 optimizer.coefficient_type=polar_express": (
        CPU_RUN,
        "",
    ),
    ".venv/bin/python -m bench.run -m optimizer=adamw,muon,mop,soap_rekls experiment=cpu/qwen3_moe_tiny_dp2": (
        CPU_RUN,
        "",
    ),
    ".venv/bin/python -m bench.run experiment=gb300/kimi_k2_muon launcher.dry_run=true": (CPU_RUN, ""),
    ".venv/bin/python -m tools.flops model=qwen3_30b_a3b parallelism=dp8_ep8 format=json": (CPU_RUN, ""),
    ".venv/bin/python -m tools.balance model=kimi_k2 parallelism=pp4_dp64_ep64": (CPU_RUN, ""),
    ".venv/bin/python -m tools.project model=kimi_k2 parallelism=pp4_dp64_ep64 hardware=gb300 precision=fp8_mx "
    "engine=bridge profile=ours": (CPU_RUN, ""),
    'make bench-cluster EXPERIMENT=gb300/kimi_k2_adamw ARGS="launcher.partition=P launcher.account=A"': (
        GPU_OR_CLUSTER,
        "submits a 256-GPU Slurm job",
    ),
    'make bench-cluster EXPERIMENT=gb300/kimi_k2_muon ARGS="..."': (
        NOT_A_RUN,
        "template: ARGS is a placeholder",
    ),
    'make bench-cluster EXPERIMENT=gb300/qwen3_30b_a3b_adamw ARGS="..."': (
        NOT_A_RUN,
        "template: ARGS is a placeholder",
    ),
    'make bench-cluster EXPERIMENT=gb300/qwen3_30b_a3b_muon ARGS="..."': (
        NOT_A_RUN,
        "template: ARGS is a placeholder",
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
    "docs",
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
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    res = subprocess.run(
        ["bash", "-c", command],
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
