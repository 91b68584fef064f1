"""experiments.soap_step on the CPU: the real SOAP-REKLS on the tiny quality model, every part labelled."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.soap_step.soap_step import PARTS, REFRESH, labelled_parts, run


def test_breakdown_of_the_tiny_model(tmp_path: Path) -> None:
    """Refresh steps are told apart and hold the eigh (a wall-clock comparison of single CPU steps flipped under
    load); every SOAP part shows up under its label; the JSON is written."""
    out = tmp_path / "soap_step.json"
    args = [
        "profile=tiny",
        "device=cpu",
        "steps=4",
        "precondition_frequency=2",
        "profile_refresh=1",
        "profile_steps=4",
    ]
    res = run([*args, f"out={out}"])
    assert json.loads(out.read_text())["profile"] == res["profile"]
    # warm-up: steps 1-3; timed: steps 4-7, of which 5 and 7 refresh (step s refreshes when (s - 1) % 2 == 0)
    assert len(res["step_ms"]) == 4 and res["refresh_step_ms"] == [res["step_ms"][1], res["step_ms"][3]]
    assert res["plain_step_ms_median"] in (res["step_ms"][0], res["step_ms"][2])
    parts = res["profile"]["parts"]
    assert set(parts) == set(PARTS) | {REFRESH}
    assert parts[REFRESH]["host_ms_per_step"] >= parts["eigh_descending"]["host_ms_per_step"] > 0  # eigh inside
    # one refresh every 2 steps: half the steps call eigh, once per factor (two per SOAP tensor)
    assert parts["eigh_descending"]["calls_per_step"] == res["soap_tensors"]
    assert parts["finite_flags"]["calls_per_step"] == 2
    assert res["profiled_steps"] == [3 + 4 + 1, 3 + 4 + 4]


def test_profile_skips_refresh_steps_unless_asked(capsys) -> None:  # type: ignore[no-untyped-def]
    """By default the profiled steps avoid the refresh (skipped steps are printed), so no eigh is profiled."""
    res = run(["profile=tiny", "device=cpu", "steps=2", "precondition_frequency=3", "profile_steps=2"])
    assert "eigh_descending" not in res["profile"]["parts"]
    lo, hi = res["profiled_steps"]
    assert all((s - 1) % 3 != 0 for s in range(lo, hi + 1))
    assert "(refresh)" in capsys.readouterr().out


def test_labels_are_removed_afterwards() -> None:
    from optim.functional import soap_math
    from optim.optimizers import soap

    before = soap_math.rotate, soap.SOAP._refresh, soap.finite_flags
    with labelled_parts():
        assert soap_math.rotate is not before[0]
    assert (soap_math.rotate, soap.SOAP._refresh, soap.finite_flags) == before
