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


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.num_layers=0", "model.num_layers=0: must be >= 1"),
        ("model.num_experts=0", "model.num_experts=0: must be >= 1: model.family='qwen3_moe' is a mixture"),
        ("model.hidden_size=0", "model.hidden_size=0: must be >= 1"),
        ("model.hidden_size=-64", "model.hidden_size=-64: must be >= 1"),
        ("model.vocab_size=0", "model.vocab_size=0: must be >= 1"),
        ("model.seq_length=0", "model.seq_length=0: must be >= 1"),
        ("model.moe_ffn_hidden_size=0", "model.moe_ffn_hidden_size=0: must be >= 1"),
        ("model.kv_channels=15", "model.kv_channels=15: must be even"),
    ],
)
def test_model_sizes_are_refused_naming_the_field(override: str, message: str) -> None:
    """Localises model sizes that reached the workers and died there with tracebacks."""
    with pytest.raises(ConfigError) as info:
        load([override])
    assert str(info.value).startswith(message), str(info.value)


def test_a_model_beyond_the_memory_is_refused_before_launch_or_warned_with_the_flag() -> None:
    """Localises a model far beyond the hardware's memory running until the out-of-memory killer: a GPU config
    against `hardware.memory_gib`, a CPU one against this machine's memory; every committed experiment fits."""
    from bench import memory

    gpu = ["model=kimi_k2", "engine=megatron", "hardware=h200", "launcher=slurm", "parallelism=single_gpu"]
    with pytest.raises(ValueError, match=r"^model=kimi_k2: needs \d+\.\d GiB per rank \(predicted peak\).* than 131\.3 GiB"):
        launch.check_launchable(load(gpu))
    cpu = load(["model=qwen3_30b_a3b"])
    need = memory.estimate(cpu)["total"]
    assert need > 30e9 * 4 * 2  # fp32 weights and gradients of ~30B parameters at least
    if need > memory.capacity(cpu)[0]:
        with pytest.raises(ValueError, match="this machine's"):
            memory.check(cpu)
    with pytest.warns(UserWarning, match="predicted peak"):
        launch.check_launchable(load([*gpu, "bench.allow_oversize=true"]))
    for name in ("gb300/kimi_k2_adamw", "h200/qwen3_30b_a3b_slice_adamw_1gpu"):  # the largest per GPU
        cfg = load([f"experiment={name}"])
        cap = memory.capacity(cfg)
        assert cap is None or memory.peak(cfg)[0] < cap[0], name


def test_a_setting_of_one_optimizer_applies_only_when_it_runs() -> None:
    """Localises `-m optimizer=adamw,muon optimizer.num_ns_steps=6` failing on AdamW with no other way in."""
    muon_only = "+bench.optimizer_overrides.muon.num_ns_steps=6"
    assert load(["optimizer=muon", muon_only]).optimizer.num_ns_steps == 6
    assert load(["optimizer=muon_split_gate_up", muon_only]).optimizer.num_ns_steps == 6
    adamw = load(["optimizer=adamw", muon_only, "+bench.optimizer_overrides.adamw.lr=0.001"])
    assert type(adamw.optimizer).__name__ == "AdamWSchema" and adamw.optimizer.lr == 0.001
    with pytest.raises(ConfigError, match=r"^optimizer\.num_ns_steps: no such field in AdamWSchema"):
        load(["optimizer=adamw", "optimizer.num_ns_steps=6"])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("+bench.optimizer_overrides.muon.num_ns_step=6", "bench.optimizer_overrides.muon.num_ns_step: no such field"),
        ("+bench.optimizer_overrides.moun.lr=1", "bench.optimizer_overrides.moun={'lr': 1}: no such optimizer"),
        ("+bench.optimizer_overrides.muon.num_ns_steps=six", "bench.optimizer_overrides.muon: Value 'six'"),
        ("+bench.optimizer_overrides.muon.momentum=nan", "optimizer.momentum=nan: must be a finite number"),
    ],
)
def test_per_optimizer_settings_are_checked_even_for_the_optimizer_not_run(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(["optimizer=adamw", override] if "six" not in override and "nan" not in override else [override])
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize(
    ("overrides", "field", "rule"),
    [
        (
            [
                "parallelism.tp=2",
                "parallelism.world_size=4",
                "parallelism.nodes=2",
                "parallelism.distribution.tp_mode=duplicated",
            ],
            "parallelism.distribution.tp_mode='duplicated'",
            "the layer-wise optimizer at DP x CP = 2 > 1",
        ),
        (["parallelism.world_size=2", "optimizer.ns_overlap=true"], "optimizer.ns_overlap=True", "DP x CP = 1"),
        (
            ["parallelism.pp=2", "parallelism.world_size=2", "optimizer.ns_overlap=true"],
            "optimizer.ns_overlap=True",
            "PP = 1",
        ),
    ],
)
def test_what_build_ours_refuses_in_a_rank_is_refused_before_launch(
    overrides: list[str], field: str, rule: str
) -> None:
    """Localises a TP mode the layer-wise optimizer cannot run at DP > 1, or NS overlap where the gradients are not
    final at its hooks, failing only inside the ranks after launch (`muonbench.check_runnable`, as bench.run)."""
    from muonbench import check_runnable

    base = ["engine=megatron", "optimizer=muon", "parallelism.gbs=8", "model.num_layers=4"]
    root = load([*base, *overrides])
    with pytest.raises(ConfigError) as info:
        check_runnable(root)
    assert str(info.value).startswith(field) and rule in str(info.value), str(info.value)
    fine = [o for o in overrides if "tp_mode" not in o and "ns_overlap" not in o]
    check_runnable(load([*base, *fine]))  # the same layout with the defaults runs
