"""bench.probes: the one way diagnostics reach the engine (names from experiments/, arguments, errors)."""

from __future__ import annotations

import pytest

from bench import probes


def test_available_lists_experiment_probes() -> None:
    names = probes.available()
    assert {"gpu_energy", "idle_before_step", "malloc_trim", "microbatch_times", "moe_load"} <= set(names)
    assert "ns_tiles" not in names  # an experiment without a probe.py is not a probe


def test_parse_spec() -> None:
    assert probes.parse_spec("gpu_energy") == ("gpu_energy", {})
    assert probes.parse_spec("idle_before_step:seconds=0.3, mode=gpu_spin") == (
        "idle_before_step",
        {"seconds": "0.3", "mode": "gpu_spin"},
    )
    with pytest.raises(ValueError, match="key=value"):
        probes.parse_spec("idle_before_step:0.3")


def test_unknown_probe_names_the_allowed_set() -> None:
    with pytest.raises(ValueError, match=r"no probe 'energy'; allowed: \[.*'gpu_energy'"):
        probes.load(["energy"])


def test_keys_in_list_order_without_repeats() -> None:
    keys = probes.keys(["moe_load", "gpu_energy", "moe_load"])
    assert (
        keys[0] == "moe_load_max_mean" and keys.count("moe_load_max_mean") == 1 and "energy_optim_j" in keys
    )
