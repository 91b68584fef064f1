"""Shared machinery of our optimizers: non-finite detection, state dtype on load, parameter naming."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any, NamedTuple

import torch


class NonFiniteError(RuntimeError):
    """A gradient or optimizer state holds NaN/Inf (nonfinite_policy="raise")."""

    def __init__(self, events: Sequence[tuple[str, int, str]]) -> None:
        self.events = list(events)
        desc = ", ".join(f"{name} ({kind}, step {step})" for name, step, kind in self.events)
        super().__init__(f"non-finite values in {desc}; weights left untouched")


class NonFiniteWarning(RuntimeWarning):
    """A parameter's update was skipped because its gradient or state was not finite."""


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
    events: list[tuple[str, int, str]], policy: str, log: list[tuple[str, int, str]]
) -> None:
    """Raise or warn about (name, step, kind) events; appends them to `log` either way."""
    if not events:
        return
    log.extend(events)
    if policy == "raise":
        raise NonFiniteError(events)
    for name, step, kind in events:
        warnings.warn(
            f"non-finite {kind} in {name} at step {step}: update skipped, state kept",
            NonFiniteWarning,
            stacklevel=3,
        )


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
