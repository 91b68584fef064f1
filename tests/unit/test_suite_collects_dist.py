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


def test_loadgroup_keeps_an_xdist_group_on_one_worker(tmp_path: Path) -> None:
    """`make test` runs `--dist loadgroup` so that the gloo suite's tests (`xdist_group`) share one worker and spawn
    their ranks once; with pytest 9 and xdist 3.8 the group was silently dropped unless tests/conftest.py restores
    it. Six grouped tests run under this suite's conftest on two workers must all report the same worker."""
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (tmp_path / "test_toy.py").write_text(
        "import os\nimport pytest\n\n\n@pytest.mark.xdist_group('g')\n@pytest.mark.parametrize('i', range(6))\n"
        "def test_grouped(i):\n    print('WORKER', os.environ['PYTEST_XDIST_WORKER'])\n\n\n"
        "@pytest.mark.parametrize('i', range(4))\ndef test_free(i):\n    pass\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider",
         "-o", "addopts=", "--rootdir", str(tmp_path), str(tmp_path / "test_toy.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    passed = [line for line in out.stdout.splitlines() if "PASSED" in line and "test_grouped" in line]
    workers = {line.split("]")[0] for line in passed}
    assert len(passed) == 6 and len(workers) == 1 and all(w.startswith("[gw") for w in workers), out.stdout[-2000:]
