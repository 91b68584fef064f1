"""Shared machinery of our optimizers: non-finite detection, state dtype on load, parameter naming."""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import fields, replace
from typing import Any, NamedTuple

import torch

from optim.configs import AdamWConfig, MOPConfig, MuonConfig, SOAPConfig


class NonFiniteError(RuntimeError):
    """A gradient or optimizer state holds NaN/Inf (nonfinite_policy="raise")."""

    def __init__(self, events: Sequence[tuple[str, int, str]]) -> None:
        self.events = list(events)
        desc = ", ".join(f"{name} ({kind}, step {step})" for name, step, kind in self.events)
        super().__init__(f"non-finite values in {desc}; weights left untouched")


class NonFiniteWarning(RuntimeWarning):
    """A parameter's update was skipped because its gradient or state was not finite."""


def config_from[C](cls: type[C], config: C | float | None, hyperparameters: dict[str, Any]) -> C:
    """The algorithm config of an optimizer built as `Opt(params, config)`, `Opt(params, lr=0.02, momentum=...)`
    (keyword hyperparameters, as torch.optim's optimizers take them) or `Opt(params, 0.02)` (lr, as torch's second
    positional argument); keywords given with a config replace its fields. Unknown names are a TypeError naming
    the allowed ones; values are checked by the config."""
    if isinstance(config, (int, float)) and not isinstance(config, bool):
        if "lr" in hyperparameters:
            raise TypeError(f"lr given twice: positionally ({config!r}) and as lr={hyperparameters['lr']!r}")
        config, hyperparameters = None, {"lr": config, **hyperparameters}
    if config is not None and not isinstance(config, cls):
        raise TypeError(f"config={config!r}: expected {cls.__name__} or a learning rate")
    allowed = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(hyperparameters) - allowed)
    if unknown:
        raise TypeError(f"{cls.__name__}: unknown hyperparameters {unknown}; allowed: {sorted(allowed)}")
    base = config if config is not None else cls()
    return replace(base, **hyperparameters) if hyperparameters else base  # type: ignore[type-var]


# Option names of our configs and of torch.optim's optimizers: a param-group key among them that an optimizer does
# not take per group is an option it would silently ignore; a near-miss of them is called a typo.
KNOWN_OPTIONS = frozenset(
    {f.name for c in (MuonConfig, MOPConfig, SOAPConfig, AdamWConfig) for f in fields(c)}
    | {"amsgrad", "maximize", "foreach", "capturable", "differentiable", "dampening", "ns_steps"}
    | {"ns_coefficients", "adjust_lr_fn", "decoupled_weight_decay", "alpha", "centered", "rho"}
)
MEGATRON_GROUP_KEYS = frozenset(
    {"max_lr", "min_lr", "lr_mult", "wd_mult", "start_wd", "end_wd", "optimizer"}
    | {"is_expert_parallel", "is_decoupled_lr", "default_config"}
)
"""Keys Megatron-Core puts into a param group (`megatron.core.optimizer._get_param_groups` and its
`ParamGroupOverride`) and `optim.megatron.megatron_group` sets: read by Megatron's LR / weight-decay scheduler and
its checkpoint loader, not by the optimizer, so they are accepted and ignored here."""
CALLER_GROUP_KEYS = MEGATRON_GROUP_KEYS | {"initial_lr"}
"""Group keys that belong to the caller: Megatron's, and torch.optim.lr_scheduler's `initial_lr`."""


def check_param_group[C](
    owner: str, group: dict[str, Any], index: int, ndims: tuple[int, ...], config: C, options: tuple[str, ...]
) -> None:
    """Reject, naming the parameter or the key, what the optimizer cannot step or would ignore in one param group.

    Parameters: another rank than `ndims`, a 0-size dimension (nothing to orthogonalize or precondition), or not
    a real floating-point tensor (complex ones would be cast to real). Keys: anything but the per-group `options`
    and the caller's keys (`CALLER_GROUP_KEYS`): an optimizer option set per group (e.g. `nesterov`, a
    config-wide setting), a typo, an unknown name. Values: the per-group options are checked by the config's own
    ranges (NaN / inf included)."""
    given = group.get("param_names")
    for i, p in enumerate(group["params"]):
        name = given[i] if given else f"group{index}.param{i}"
        if p.ndim not in ndims:
            raise ValueError(
                f"{name}: {owner} takes {' or '.join(f'{n}-D' for n in ndims)} tensors "
                f"(3-D: experts, out, in), got shape {tuple(p.shape)}; route it to AdamW"
            )
        if p.numel() == 0:
            raise ValueError(
                f"{name}: shape {tuple(p.shape)} has a 0-size dimension; {owner} cannot step it "
                "(leave it out, or route it to AdamW)"
            )
        if not p.is_floating_point():
            raise ValueError(
                f"{name}: {owner} takes real floating-point tensors (float32, bfloat16, float16, float64), got "
                f"{p.dtype}"
            )
    allowed = sorted(options)
    for key, value in group.items():
        # torch.optim's own keys (its load_state_dict adds differentiable=False to the defaults)
        if key in options or key in CALLER_GROUP_KEYS or key in ("params", "param_names"):
            continue
        if (key, value) == ("differentiable", False):
            continue
        close = difflib.get_close_matches(key, [*options, *CALLER_GROUP_KEYS], n=1, cutoff=0.8)
        if key in KNOWN_OPTIONS:
            why = f"is not a per-group option of {owner} (set it in the config, for every group)"
        else:
            why = f"is not a key of a {owner} param group"
            why += f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(
            f"param group {index}: {key}={value!r} {why}; per-group options: {allowed}; also accepted "
            f"(read by Megatron-Core's scheduler or torch's LR schedulers, not by {owner}): "
            f"{sorted(CALLER_GROUP_KEYS)}"
        )
    try:
        replace(config, **{k: group[k] for k in options if k in group})  # type: ignore[type-var]
    except ValueError as e:
        raise ValueError(f"param group {index}: {e}") from e


def reject_sparse_grads(owner: str, params: list[torch.Tensor], param_groups: list[dict[str, Any]]) -> None:
    """A sparse gradient (nn.Embedding(sparse=True)) named, instead of an aten error inside the step."""
    for p in params:
        if p.grad is not None and p.grad.layout != torch.strided:
            name = param_names(param_groups).get(id(p), "a parameter")
            raise ValueError(
                f"{name}: {owner} takes dense gradients, got a {p.grad.layout} one (use a dense embedding, or "
                "route the parameter to an optimizer that takes sparse gradients)"
            )


def param_names(param_groups: list[dict[str, Any]]) -> dict[int, str]:
    """id(param) -> name: from torch's named-parameter groups when given, else `group<g>.param<i>`."""
    names: dict[int, str] = {}
    for g, group in enumerate(param_groups):
        given = group.get("param_names")
        for i, p in enumerate(group["params"]):
            names[id(p)] = given[i] if given else f"group{g}.param{i}"
    return names


def state_dtype(p: torch.Tensor) -> torch.dtype:
    """fp32 state for low-precision parameters, else the parameter dtype."""
    return torch.float32 if p.dtype in (torch.bfloat16, torch.float16) else p.dtype


def host_flags(flags: list[torch.Tensor]) -> list[bool]:
    """0-d boolean device tensors -> Python bools with a single host sync."""
    if not flags:
        return []
    return [bool(f) for f in torch.stack(flags).tolist()]


def finite_flags(tensors: Iterable[torch.Tensor]) -> list[bool]:
    """isfinite(t).all() for each tensor with a single host sync."""
    return host_flags([torch.isfinite(t).all() for t in tensors])


def handle_nonfinite(
    events: list[tuple[str, int, str]],
    policy: str,
    log: list[tuple[str, int, str]],
    *,
    state: str = "state kept",
) -> int:
    """Raise or warn about (name, step, kind) events; appends them to `log` either way. Returns the number of
    parameter updates skipped (each event, under "skip"), which the optimizers add to `num_skipped_updates`.
    `state`: what became of the parameter's optimizer state, for the warning."""
    if not events:
        return 0
    log.extend(events)
    if policy == "raise":
        raise NonFiniteError(events)
    for name, step, kind in events:
        warnings.warn(
            f"non-finite {kind} in {name} at step {step}: update skipped, {state}",
            NonFiniteWarning,
            stacklevel=3,
        )
    return len(events)


def keep_state_dtypes(opt: torch.optim.Optimizer, state_dict: dict[str, Any]) -> None:
    """Undo torch's cast of floating state to the parameter dtype after `load_state_dict`.

    torch.optim casts every floating state tensor to the parameter's dtype on load, which would turn our fp32
    momentum of bf16 parameters into bf16. Re-copy the saved tensors with their saved dtypes.
    """
    saved_ids = [pid for g in state_dict["param_groups"] for pid in g["params"]]
    params = [p for g in opt.param_groups for p in g["params"]]
    for pid, p in zip(saved_ids, params, strict=True):
        for key, value in state_dict["state"].get(pid, {}).items():
            if torch.is_tensor(value) and value.is_floating_point():
                opt.state[p][key] = value.to(device=p.device, copy=True)


class Entry(NamedTuple):
    """One parameter's step: its group, the new momentum and the orthogonalization input."""

    p: torch.Tensor
    group: dict[str, Any]
    new_buf: torch.Tensor
    m: torch.Tensor


def bucket[T](items: Iterable[T], key: Callable[[T], Hashable]) -> list[list[T]]:
    """Items grouped by key, groups in first-seen order, items in input order."""
    out: dict[Hashable, list[T]] = {}
    for it in items:
        out.setdefault(key(it), []).append(it)
    return list(out.values())
