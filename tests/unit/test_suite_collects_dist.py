"""`make test` must run the gloo tests: pytest's default norecursedirs contains "dist" and once dropped tests/dist
silently (pyproject sets norecursedirs to avoid it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_plain_pytest_collects_tests_dist() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "tests"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    collected = [line for line in out.stdout.splitlines() if line.startswith("tests/dist/")]
    on_disk = sorted(p.name for p in (ROOT / "tests" / "dist").glob("test_*.py"))
    assert on_disk, "tests/dist has no test files"
    for name in on_disk:
        assert any(line.startswith(f"tests/dist/{name}::") for line in collected), (name, out.stdout[-2000:])


def test_make_test_collects_every_experiment_test() -> None:
    """Each experiment keeps its tests next to it; `make test` (pytest tests experiments) must collect them all."""
    make = (ROOT / "Makefile").read_text()
    assert "pytest -q tests experiments" in make
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "experiments"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    on_disk = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "experiments").glob("*/test_*.py"))
    assert len(on_disk) >= 7
    for path in on_disk:
        assert f"{path}::" in out.stdout, (path, out.stdout[-2000:])
