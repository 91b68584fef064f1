"""`--config-dir`: the user's file wins over a shipped one of the same name, every tool takes the flag, and a
YAML syntax error there is one line naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import cli
from muonbench import compose

MUON3 = "defaults:\n  - base_muon\n  - _self_\nnum_ns_steps: 3\n"


@pytest.fixture
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(compose, "USER_CONFIG_DIRS", [])
    (tmp_path / "optimizer").mkdir()
    (tmp_path / "optimizer" / "muon.yaml").write_text(MUON3)
    return tmp_path


def test_a_user_file_shadows_the_shipped_one(user_dir: Path) -> None:
    """Localises Hydra's search path preferring conf/optimizer/muon.yaml (num_ns_steps 5) to the user's (3)."""
    assert compose.load(["optimizer=muon"]).optimizer.num_ns_steps == 5
    assert compose.load(["--config-dir", str(user_dir), "optimizer=muon"]).optimizer.num_ns_steps == 3


def test_every_tool_takes_config_dir(user_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Localises `bench.tools.flops --config-dir ...` failing (only bench.run took the flag)."""
    assert cli.main(["flops", "--config-dir", str(user_dir), "optimizer=muon", "format=json"]) == 0
    assert json.loads(capsys.readouterr().out)["ns_options"]["num_ns_steps"] == 3


def test_a_yaml_syntax_error_is_one_line(user_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (user_dir / "optimizer" / "broken.yaml").write_text("num_ns_steps: [3\n")
    assert cli.main(["flops", f"--config-dir={user_dir}", "optimizer=broken"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{user_dir / 'optimizer' / 'broken.yaml'}: line 2, column 1: YAML" in err
