"""`make test` must run the gloo tests: pytest's default norecursedirs contains "dist" and once dropped tests/dist
silently (pyproject sets norecursedirs to avoid it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAKE_TEST_ARGS = ("tests", "experiments")


@pytest.fixture(scope="module")
def collected() -> str:
    """`pytest --collect-only` of `make test`'s arguments, in one process for both checks below. The folders of
    tests/ other than dist are left out (--ignore): importing their modules is most of a collection's time and
    neither check reads them; pytest still recurses from tests/ into tests/dist under the configured
    norecursedirs."""
    skip = [f"--ignore={p}" for p in sorted((ROOT / "tests").iterdir()) if p.is_dir() and p.name != "dist"]
    collect = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    out = subprocess.run(
        [*collect, *skip, *MAKE_TEST_ARGS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return out.stdout


@pytest.mark.xdist_group("collect_only")
def test_plain_pytest_collects_tests_dist(collected: str) -> None:
    lines = [line for line in collected.splitlines() if line.startswith("tests/dist/")]
    on_disk = sorted(p.name for p in (ROOT / "tests" / "dist").glob("test_*.py"))
    assert on_disk, "tests/dist has no test files"
    for name in on_disk:
        assert any(line.startswith(f"tests/dist/{name}::") for line in lines), (name, collected[-2000:])


@pytest.mark.xdist_group("collect_only")
def test_make_test_collects_every_experiment_test(collected: str) -> None:
    """Each experiment keeps its tests next to it; `make test` (pytest tests experiments) must collect them all."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    (test,) = [line for line in lines if " -m pytest " in line and " gpu " not in line]
    assert test.endswith(" " + " ".join(MAKE_TEST_ARGS)), test
    on_disk = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "experiments").glob("*/test_*.py"))
    assert len(on_disk) >= 7
    for path in on_disk:
        assert f"{path}::" in collected, (path, collected[-2000:])


def test_selecting_the_gpu_tests_without_cuda_fails_loudly() -> None:
    """`make test-gpu` without CUDA skipped all its tests and exited 0; now pytest refuses with the reason. (On a
    GPU machine the same command runs them: the check is for CUDA, not for this host.)"""
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available: -m gpu runs the GPU tests here")
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "tests/gpu/test_soap_gpu.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode != 0, out.stdout[-2000:]
    assert "selects the GPU tests and CUDA is not available here" in out.stderr
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import selects_gpu

    assert selects_gpu("gpu") and selects_gpu("gpu and not slow") and selects_gpu("(dist or gpu)")
    assert not selects_gpu("") and not selects_gpu("not gpu") and not selects_gpu("dist and not gpu")
