"""`pip install '.[bridge]'` as docs/install.md gives it: the extra resolves with the suite's pins on the platform the
document names, and the step before it builds a fast-hadamard-transform that the pinned Bridge accepts."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "install.md"


def _extra(name: str) -> list[Requirement]:
    return [Requirement(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
            ["optional-dependencies"][name]]  # fmt: skip


def test_bridge_extra_resolves_with_the_suites_pins(tmp_path: Path) -> None:
    """Localises a pin that Bridge's requirements exclude (numpy 2.4 against mistral-common's <2.4 made the extra
    unsatisfiable), resolved for the platform docs/install.md names."""
    platform = re.search(r"--python-platform (\S+)`", DOC.read_text())
    assert platform is not None, "docs/install.md names the platform the extra is resolved for"
    res = subprocess.run(
        [sys.executable, "-m", "uv", "pip", "compile", "--quiet", "--no-header", "--python-version", "3.12",
         "--python-platform", platform.group(1), "--extra", "bridge", "--output-file", str(tmp_path / "lock.txt"),
         str(ROOT / "pyproject.toml")],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    pinned = {Requirement(line.split(" ")[0]).name: line.split(" ")[0]
              for line in (tmp_path / "lock.txt").read_text().splitlines() if "==" in line and not line[0].isspace()}  # fmt: skip
    (bridge,) = _extra("bridge")
    assert pinned["megatron-bridge"] == str(bridge)
    base = [
        Requirement(r)
        for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    ]
    assert all(pinned[r.name] == str(r) for r in base), [r for r in base if pinned.get(r.name) != str(r)]


def test_bridge_prebuild_step_fits_the_pinned_bridge() -> None:
    """The extra pins the Bridge the Makefile installs for the tests, and the fast-hadamard-transform that
    docs/install.md builds first is one that Bridge's requirement accepts."""
    (bridge,) = _extra("bridge")
    make = re.search(r"^BRIDGE_VERSION := (\S+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert (
        bridge.name == "megatron-bridge"
        and make is not None
        and str(bridge.specifier) == f"=={make.group(1)}"
    )
    installed = importlib.metadata.version("megatron-bridge")
    assert installed in bridge.specifier, (
        f"test venv has megatron-bridge {installed}, the extra pins {bridge}"
    )
    needs = {
        Requirement(r).name: Requirement(r) for r in importlib.metadata.requires("megatron-bridge") or []
    }
    built = re.findall(r"pip install --no-build-isolation fast-hadamard-transform==(\S+)", DOC.read_text())
    assert built and all(v in needs["fast-hadamard-transform"].specifier for v in built), (built, needs)
