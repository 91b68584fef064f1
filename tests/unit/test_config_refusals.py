"""Values that cannot run are refused before launch, naming the field: non-finite floats, unknown keys added with
`+`, model sizes, a GPU-only job on a machine without one."""

from __future__ import annotations

import pytest

from bench import launch, sweep
from muonbench import ConfigError, load


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (["optimizer.momentum=nan"], "optimizer.momentum"),
        (["optimizer.lr=inf"], "optimizer.lr"),
        (["optimizer.min_lr=-inf"], "optimizer.min_lr"),
        (["optimizer.weight_decay=nan"], "optimizer.weight_decay"),
        (["optimizer.adam_beta2=nan"], "optimizer.adam_beta2"),
        (["optimizer=adamw", "optimizer.adam_eps=nan"], "optimizer.adam_eps"),
        (["optimizer=soap_rekls", "optimizer.shampoo_beta=nan"], "optimizer.shampoo_beta"),
        (["optimizer.clip_grad=nan"], "optimizer.clip_grad"),
        (["model.norm_eps=nan"], "model.norm_eps"),
        (["optimizer.coefficient_type=custom", "optimizer.custom_coefficients=[[3.4,nan,2.0]]"],
         "optimizer.custom_coefficients[0][1]"),
    ],
)
def test_nonfinite_floats_are_refused_naming_the_field(overrides: list[str], field: str) -> None:
    """Localises NaN passing every range check (`momentum=nan` skipped every Muon update and was recorded ok)."""
    with pytest.raises(ConfigError) as info:
        load(overrides)
    assert str(info.value).startswith(f"{field}=") and "finite" in str(info.value), str(info.value)


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("+model.hiddn_size=128", "model.hiddn_size"),
        ("++optimizer.momentun=0.9", "optimizer.momentun"),
        ("+parallelism.distribution.tp_mod=blockwise", "parallelism.distribution.tp_mod"),
        ("+seed=3", "seed"),
    ],
)
def test_unknown_keys_are_refused_also_when_added(override: str, field: str) -> None:
    """Localises `+model.hiddn_size=128` running ok with the typo dropped."""
    with pytest.raises(ConfigError, match=rf"^{field.replace('.', '[.]')}: no such field in \w+; its fields: "):
        load([override])


def test_gpu_only_job_is_refused_in_the_preflight_on_a_machine_without_gpus(monkeypatch, tmp_path) -> None:
    """Localises a GPU-only experiment on a CPU machine failing only after its run folder was written."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    job = ["experiment=h200/qwen3_30b_a3b_slice_muon_1gpu", f"bench.out_dir={tmp_path}"]
    errors = sweep.preflight([job])
    assert len(errors) == 1 and "needs a CUDA GPU, and this machine has none" in errors[0], errors
    assert not any(tmp_path.iterdir())
    launch.check_launchable(load([]))  # a CPU job passes
