"""The torch-user surface of Muon, MOP and SOAP: keyword hyperparameters as torch.optim takes them, clean rejection
of parameters they cannot step, and the hybrid's AdamW side guarded against NaN/Inf like the matrix side."""

from __future__ import annotations

import inspect
import re
import warnings

import pytest
import torch

from optim import MOP, SOAP, Muon, MuonConfig, NonFiniteError, NonFiniteWarning, build_optimizer
from optim.configs import MOPConfig, SOAPConfig

OPTIMIZERS = [(Muon, MuonConfig), (MOP, MOPConfig), (SOAP, SOAPConfig)]


@pytest.fixture
def weight():
    torch.manual_seed(0)
    return torch.nn.Parameter(torch.randn(8, 4))


@pytest.mark.parametrize(("cls", "cfg_cls"), OPTIMIZERS)
def test_keyword_hyperparameters_like_torch_optim(cls, cfg_cls, weight):
    """Localises `Opt(params, lr=0.02)` raising TypeError (only a config object was accepted)."""
    opt = cls([weight], lr=0.02, weight_decay=0.0)
    assert opt.config == cfg_cls(lr=0.02, weight_decay=0.0)
    assert cls([weight], 0.02).config.lr == 0.02  # torch's second positional argument is lr
    over = cls([weight], cfg_cls(lr=0.1, weight_decay=0.2), lr=0.3)
    assert over.config.lr == 0.3 and over.config.weight_decay == 0.2  # keywords replace the config's fields
    with pytest.raises(TypeError, match=r"unknown hyperparameters \['lrr'\]; allowed: \[.*'lr'"):
        cls([weight], lrr=0.02)
    with pytest.raises(ValueError, match=r"lr=-1.0 is not in \[0.0, inf\]"):
        cls([weight], lr=-1.0)


def test_muon_takes_torch_optim_muons_keyword_names(weight):
    """Every keyword torch.optim.Muon and our MuonConfig share is accepted with torch's meaning of the name."""
    torch_names = set(inspect.signature(torch.optim.Muon).parameters) - {"params"}
    shared = torch_names & set(MuonConfig.__dataclass_fields__)
    assert shared >= {"lr", "weight_decay", "momentum", "nesterov", "eps"}
    values = {"lr": 0.05, "weight_decay": 0.1, "momentum": 0.9, "nesterov": True, "eps": 1e-6}
    opt = Muon([weight], **{k: values[k] for k in shared})
    assert all(getattr(opt.config, k) == values[k] for k in shared)


@pytest.mark.parametrize(("cls", "cfg_cls"), OPTIMIZERS)
def test_zero_size_parameter_rejected_by_name_before_any_state(cls, cfg_cls, weight):
    """Localises a (0, 5) parameter failing inside step() after other parameters' state was written."""
    empty = torch.nn.Parameter(torch.zeros(0, 5))
    with pytest.raises(ValueError, match=r"^empty: shape \(0, 5\) has a 0-size dimension"):
        cls([("w", weight), ("empty", empty)], cfg_cls())


def _hybrid(policy: str):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.LayerNorm(6))
    opt = build_optimizer(model.named_parameters(), MuonConfig(lr=0.01, nonfinite_policy=policy), naming="hf")
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    norm_w = model[1].weight
    norm_w.grad[0] = float("nan")
    return model, opt, norm_w


def test_hybrid_skips_nonfinite_adamw_grads_like_the_matrix_side():
    """Localises a NaN gradient of a norm weight (AdamW side) silently turning the weight NaN."""
    model, opt, norm_w = _hybrid("skip")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.warns(NonFiniteWarning, match=r"non-finite grad in 1.weight at step 1"):
        opt.step()
    assert torch.equal(norm_w, before["1.weight"]) and norm_w.grad is not None  # untouched, grad put back
    assert not torch.equal(model[1].bias, before["1.bias"])  # the finite AdamW parameters still stepped
    assert not torch.equal(model[0].weight, before["0.weight"])  # and the matrix side
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert opt.nonfinite_events == [("1.weight", 1, "grad")]


def test_hybrid_raise_policy_raises_before_any_parameter_changes():
    model, opt, _ = _hybrid("raise")
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(NonFiniteError, match=r"1.weight \(grad, step 1\)"):
        opt.step()
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))


def test_adamw_baseline_stays_torchs_adamw():
    """The all-AdamW baseline is not guarded (it is torch.optim.AdamW as is)."""
    from optim.configs import AdamWConfig

    model = torch.nn.Linear(3, 3)
    opt = build_optimizer(model.named_parameters(), AdamWConfig(), naming="hf")
    assert opt.nonfinite_policy is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.weight.grad = torch.ones_like(model.weight)
        opt.step()


NONFINITE = [float("nan"), float("inf"), float("-inf")]
SCALAR_FIELDS = {
    Muon: ("lr", "weight_decay", "momentum", "eps", "extra_scale_factor"),
    MOP: ("lr", "weight_decay", "momentum", "eps"),
    SOAP: ("lr", "weight_decay", "eps", "shampoo_beta"),
}


@pytest.mark.parametrize(("cls", "cfg_cls"), OPTIMIZERS)
@pytest.mark.parametrize("value", NONFINITE)
def test_nonfinite_hyperparameters_rejected_by_name(cls, cfg_cls, value, weight):
    """Localises NaN passing every range check (NaN compares false with both bounds) and inf passing [0, inf]:
    `Muon(params, lr=nan)` was accepted and every update then skipped. torch.optim rejects it too."""
    for field in SCALAR_FIELDS[cls]:
        with pytest.raises(ValueError, match=rf"^{field}={value!r} is not a finite number in [\[(]"):
            cls([weight], **{field: value})
        with pytest.raises(ValueError, match=rf"^{field}={value!r} is not a finite number"):
            cfg_cls(**{field: value})
    if cls is SOAP:
        with pytest.raises(ValueError, match=rf"betas\[1\]={value!r} is not a finite number in \[0.0, 1.0\)"):
            cls([weight], betas=(0.9, value))
    with pytest.raises(ValueError, match=rf"^param group 1: lr={value!r} is not a finite number"):
        cls([{"params": [weight]}, {"params": [torch.nn.Parameter(torch.ones(3, 3))], "lr": value}])


@pytest.mark.parametrize("value", NONFINITE)
def test_adamw_config_rejects_nonfinite(value):
    from optim.configs import AdamWConfig

    for field in ("lr", "weight_decay", "eps"):
        with pytest.raises(ValueError, match=rf"^{field}={value!r} is not a finite number"):
            AdamWConfig(**{field: value})
    with pytest.raises(ValueError, match=r"^betas\[0\]"):
        AdamWConfig(betas=(value, 0.95))


@pytest.mark.parametrize(("cls", "cfg_cls"), OPTIMIZERS)
def test_add_param_group_runs_the_constructors_checks(cls, cfg_cls, weight):
    """Localises `add_param_group` skipping the constructor's checks: a 1-D parameter failed mid-step with an unpack
    error, a complex one was cast to real, and a group option the optimizer ignores (nesterov) passed silently. A
    refused group leaves the optimizer as it was."""
    opt = cls([weight], cfg_cls())
    bias = torch.nn.Parameter(torch.zeros(4))
    with pytest.raises(ValueError, match=r"^group1.param0: .* takes 2-D or 3-D tensors .* got shape \(4,\)"):
        opt.add_param_group({"params": [bias]})
    with pytest.raises(ValueError, match=r"^bias: .* takes 2-D or 3-D tensors"):
        cls([("w", weight), ("bias", bias)], cfg_cls())
    cplx = torch.nn.Parameter(torch.randn(4, 4, dtype=torch.complex64))
    with pytest.raises(ValueError, match=r"real floating-point tensors .* got torch.complex64"):
        opt.add_param_group({"params": [cplx]})
    with pytest.raises(ValueError, match=r"real floating-point tensors"):
        cls([cplx], cfg_cls())
    other = torch.nn.Parameter(torch.randn(3, 5))
    with pytest.raises(ValueError, match=r"^param group 1: nesterov=True is not a per-group option .*; per-group"):
        opt.add_param_group({"params": [other], "nesterov": True})
    with pytest.raises(ValueError, match=r"weight_decya=0.1 .*did you mean 'weight_decay'"):
        opt.add_param_group({"params": [other], "weight_decya": 0.1})
    assert len(opt.param_groups) == 1
    # keys the optimizer does not own (an LR scheduler's, Megatron's) pass through
    opt.add_param_group({"params": [other], "lr": 0.5, "max_lr": 0.5, "wd_mult": 1.0, "initial_lr": 0.5})
    assert len(opt.param_groups) == 2 and opt.param_groups[1]["lr"] == 0.5


@pytest.mark.parametrize(("cls", "cfg_cls"), OPTIMIZERS)
@pytest.mark.parametrize(("key", "hint"), [("lr_mul", " (did you mean 'lr_mult'?)"), ("lr_scale", "")])
def test_unknown_param_group_keys_are_refused_naming_the_allowed_set(cls, cfg_cls, weight, key, hint):
    """Localises an unknown param-group key (a typo of Megatron's `lr_mult`, a made-up scale) passing in silence,
    through the constructor's groups and `add_param_group`: the optimizer never reads it."""
    name = cls.__name__
    msg = (
        rf"^param group 1: {key}=0.5 is not a key of a {name} param group{re.escape(hint)}; per-group options: "
        rf"\[.*'lr'.*\]; also accepted \(read by Megatron-Core's scheduler or torch's LR schedulers, not by "
        rf"{name}\): \[.*'initial_lr', 'is_decoupled_lr', .*'lr_mult', 'max_lr', .*'wd_mult'\]$"
    )
    other = torch.nn.Parameter(torch.randn(3, 5))
    with pytest.raises(ValueError, match=msg):
        cls([{"params": [weight]}, {"params": [other], key: 0.5}], cfg_cls())
    opt = cls([weight], cfg_cls())
    with pytest.raises(ValueError, match=msg):
        opt.add_param_group({"params": [other], key: 0.5})
    assert len(opt.param_groups) == 1


@pytest.mark.parametrize(("cls", "cfg_cls"), OPTIMIZERS)
def test_sparse_gradient_named(cls, cfg_cls, weight):
    """Localises a sparse gradient (nn.Embedding(sparse=True)) failing with a raw aten error inside the step."""
    emb = torch.nn.Embedding(10, 4, sparse=True)
    opt = cls([("emb.weight", emb.weight), ("w", weight)], cfg_cls())
    emb(torch.tensor([1, 2])).sum().backward()
    weight.grad = torch.ones_like(weight)
    before = weight.detach().clone()
    with pytest.raises(ValueError, match=r"^emb.weight: .* takes dense gradients, got a torch.sparse_coo one"):
        opt.step()
    assert torch.equal(weight.detach(), before)


@pytest.mark.parametrize(("cls", "cfg_cls"), OPTIMIZERS)
def test_num_skipped_updates_counts_each_skipped_parameter_update(cls, cfg_cls):
    """Localises skipped updates being visible only as warnings: the run record needs their count."""
    a, b = torch.nn.Parameter(torch.randn(4, 6)), torch.nn.Parameter(torch.randn(6, 4))
    opt = cls([("a", a), ("b", b)], cfg_cls(nonfinite_policy="skip"))
    assert opt.num_skipped_updates == 0
    for step in range(3):
        a.grad = torch.randn(4, 6)
        b.grad = torch.full((6, 4), float("nan")) if step > 0 else torch.randn(6, 4)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NonFiniteWarning)
            opt.step()
    assert opt.num_skipped_updates == 2 and [e[:2] for e in opt.nonfinite_events] == [("b", 2), ("b", 3)]


def test_hybrid_num_skipped_updates_sums_both_sides():
    model, opt, _ = _hybrid("skip")
    model[0].weight.grad[0, 0] = float("nan")  # the matrix side too
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonFiniteWarning)
        opt.step()
    assert opt.optimizers["matrix"].num_skipped_updates == 1 and opt.num_skipped_updates == 2


def test_run_record_counts_the_hybrids_adamw_side_too():
    """Localises the harness counting only the matrix side of a hybrid (its AdamW-side skips live on the hybrid)."""
    from bench.engines.base import count_skipped_updates

    _, opt, _ = _hybrid("skip")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonFiniteWarning)
        opt.step()
    assert opt.num_skipped_updates == 1 and count_skipped_updates([opt]) == 1
