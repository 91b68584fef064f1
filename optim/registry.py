"""The optimizer registry: one entry per `optimizer.name`, read by every consumer.

An entry names the algorithm's config dataclass (`optim.configs`; the Hydra schema of `optimizer=<name>` is generated
from its fields), the torch optimizer that steps the hidden matrices, how many Newton-Schulz iterations it runs per
matrix and step (the FLOP counts), and the Megatron-Core `OptimizerConfig` fields of Megatron's own implementation
where one exists. Classes and Megatron adapters are named `module:attribute` and imported when built, so the
registry imports no torch: a login node composes and validates with it.

Adding an optimizer: its config and class in its own file (`optim/optimizers/<name>.py`), one entry here, and its
YAML under `conf/optimizer/`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from optim.configs import AdamWConfig, MOPConfig, MuonConfig, SOAPConfig


def _no_ns(config: Any) -> int:
    return 0


@dataclass(frozen=True, kw_only=True, slots=True)
class OptimizerSpec:
    """One optimizer: its config and its builders."""

    config: type
    """Its algorithm config class (frozen dataclass; `__post_init__` checks the values)."""
    optimizer: str = ""
    """`module:Class` of the torch optimizer over the hidden matrices, built as `Class(params, config, **kw)`;
    '' for the AdamW baseline (every parameter on torch's AdamW)."""
    tensor_parallel: bool = False
    """The class orthogonalizes and takes `splits`, `tp` and `tp_mode_fn`; False: built as `Class(params, config)`,
    and a TP mode other than blockwise at TP > 1 is refused."""
    ns_steps: Callable[[Any], int] = _no_ns
    """Newton-Schulz iterations per matrix per step under a config (0: none), for the NS FLOP counts."""
    to_megatron: str = ""
    """`module:function` -> `(config, routing, adamw, tp_mode) -> dict`: the Megatron-Core `OptimizerConfig` fields
    (its `optimizer` name included) of Megatron's own implementation (`optimizer.implementation=megatron`); '' for
    none."""
    no_megatron: str = "Megatron-Core has no implementation of it"
    """Why `to_megatron` is empty (the refusal names it)."""
    refresh_every: str = ""
    """The config field whose number of steps its per-step work repeats after (SOAP-REKLS refreshes its eigenbases
    every `precondition_frequency` steps); '' for the same work every step."""

    @property
    def matrix(self) -> bool:
        """A matrix optimizer (the hidden matrices on it, the rest on AdamW), not the AdamW baseline."""
        return bool(self.optimizer)


OPTIMIZERS: dict[str, OptimizerSpec] = {
    "adamw": OptimizerSpec(config=AdamWConfig),
    "muon": OptimizerSpec(
        config=MuonConfig,
        optimizer="optim.optimizers.muon:Muon",
        tensor_parallel=True,
        ns_steps=lambda c: c.num_ns_steps,
        to_megatron="optim.megatron.config:megatron_muon_section",
    ),
    "mop": OptimizerSpec(
        config=MOPConfig,
        optimizer="optim.optimizers.mop:MOP",
        tensor_parallel=True,
        ns_steps=lambda c: c.num_ns_steps if c.polar_method == "polar_express" else 0,
        no_megatron="Megatron-Core's generic emerging-optimizer path passes betas, which EO's MOP rejects",
    ),
    "soap_rekls": OptimizerSpec(
        config=SOAPConfig,
        optimizer="optim.optimizers.soap:SOAP",
        refresh_every="precondition_frequency",
        to_megatron="optim.megatron.config:megatron_soap_section",
    ),
}
"""`optimizer.name` -> its entry."""


def load(path: str) -> Any:
    """The attribute a `module:attribute` path names (imported now)."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def spec(name: str) -> OptimizerSpec:
    """The entry of `optimizer.name`; ValueError naming the value and the registered names."""
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer.name={name!r}: no such optimizer; allowed: {list(OPTIMIZERS)}")
    return OPTIMIZERS[name]


def spec_of(config: Any) -> OptimizerSpec:
    """The entry whose config class `config` is; NotImplementedError naming the class otherwise."""
    for entry in OPTIMIZERS.values():
        if type(config) is entry.config:
            return entry
    raise NotImplementedError(f"no optimizer registered for config class {type(config).__name__}")


def name_of(config: Any) -> str:
    """The `optimizer.name` of an algorithm config."""
    entry = spec_of(config)
    return next(name for name, e in OPTIMIZERS.items() if e is entry)


def build_matrix(
    params: Any, config: Any, *, splits: Any = None, tp: Any = None, tp_mode_fn: Any = None
) -> Any:
    """The registered torch optimizer of `config` over the hidden matrices `params` (a list of named parameters or
    param groups). `splits`, `tp` and `tp_mode_fn` go to an orthogonalizing optimizer; one without a TP mode
    refuses a non-empty `tp`."""
    entry = spec_of(config)
    if not entry.optimizer:
        raise NotImplementedError(
            f"{type(config).__name__} is the AdamW baseline: it has no matrix optimizer"
        )
    cls = load(entry.optimizer)
    if entry.tensor_parallel:
        return cls(params, config, splits=splits, tp=tp, tp_mode_fn=tp_mode_fn)
    if tp:
        raise ValueError(
            f"tp_mode other than 'blockwise' at TP > 1: {name_of(config)} has no tensor-parallel mode"
        )
    return cls(params, config)
