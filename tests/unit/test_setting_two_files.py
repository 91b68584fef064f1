"""A setting added to Muon touches two files: the optimizer config in `optim` and its YAML default.

Adds a field to MuonConfig and to conf/optimizer/muon.yaml in a copy of the packages, then composes with an override
in a fresh interpreter: the value must reach the `optim` config the engines hand to the optimizer, and a run record
must rebuild it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import muonbench
from muonbench import schema
root = muonbench.load(["optimizer=muon"])
assert schema.algorithm_config(root.optimizer).probe_knob == 0.25, root.optimizer
root = muonbench.load(["optimizer=muon", "optimizer.probe_knob=0.75"])
algo, _, _ = schema.optim_configs(root.optimizer)
assert algo.probe_knob == 0.75, algo
assert muonbench.config_from_dict(muonbench.as_dict(root)) == root
try:
    muonbench.load(["optimizer=muon", "optimizer.probe_knob=2.0"])
except muonbench.ConfigError as exc:
    assert "optimizer.probe_knob=2.0" in str(exc), exc
else:
    raise AssertionError("the new field's range check did not run at compose time")
print("ok")
"""


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


def test_a_muon_setting_added_in_two_files_reaches_the_optim_config(tmp_path: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__")
    for name in ("optim", "muonbench", "conf"):
        shutil.copytree(ROOT / name, tmp_path / name, symlinks=True, ignore=ignore)
    _edit(
        tmp_path / "optim" / "configs.py",
        "    fused_step: bool = True\n",
        '    probe_knob: float = 0.5\n    """A new setting."""\n    fused_step: bool = True\n',
    )
    _edit(
        tmp_path / "optim" / "configs.py",
        '        _range("eps", self.eps, 0.0, 1.0, lo_open=True)\n        bad = ',
        '        _range("eps", self.eps, 0.0, 1.0, lo_open=True)\n'
        '        _range("probe_knob", self.probe_knob, 0.0, 1.0)\n        bad = ',
    )
    (tmp_path / "conf" / "optimizer" / "muon.yaml").write_text(
        (ROOT / "conf" / "optimizer" / "muon.yaml").read_text() + "probe_knob: 0.25\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-3000:]
