"""Cache folders: the NS plan and the quality corpus live under platformdirs' user cache folder, so XDG_CACHE_HOME
is honoured (they were fixed to ~/.cache/muonbench), and MUONBENCH_CACHE still overrides it."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.tools.quality import data
from optim.cache import cache_root


def test_xdg_cache_home_is_honoured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from optim.kernels.plan import cache_path

    monkeypatch.delenv("MUONBENCH_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "muonbench"
    assert cache_path() == tmp_path / "xdg" / "muonbench" / "ns_plan.json"
    assert data.cache_dir() == tmp_path / "xdg" / "muonbench" / "quality"


def test_muonbench_cache_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("MUONBENCH_CACHE", str(tmp_path / "mine"))
    assert data.cache_dir() == tmp_path / "mine" / "quality"
