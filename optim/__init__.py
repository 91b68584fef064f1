"""muonbench optim: our Muon, MOP and SOAP-REKLS, parameter routing, and the hybrid (matrix + AdamW) optimizer.

Public API (resolved lazily, so `import optim.distributed.assignment` or `optim.configs` does not pull in torch):

- `Muon(params, config=MuonConfig(), *, splits=None)`, `MOP(params, config=MOPConfig(), *, splits=None)`,
  `SOAP(params, config=SOAPConfig())`: torch.optim.Optimizer subclasses.
- `build_optimizer(model_or_named_params, config, *, naming="hf", routing=None, layout=None, adamw=None,
  model=None) -> HybridOptimizer`.
- `TPSpec(partition_dim=, group=, mode=)`: a tensor-parallel shard for Muon/MOP (`tp={param: spec}`, `tp_mode_fn`).
- Configs: MuonConfig, MOPConfig, SOAPConfig, AdamWConfig, RoutingConfig; SplitLayout; NonFiniteError,
  NonFiniteWarning, RoutingWarning; `newton_schulz`, `ns_coefficients`.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Muon": "optim.optimizers.muon",
    "MOP": "optim.optimizers.mop",
    "SOAP": "optim.optimizers.soap",
    "TPSpec": "optim.optimizers.tp",
    "NonFiniteError": "optim.optimizers.base",
    "NonFiniteWarning": "optim.optimizers.base",
    "build_optimizer": "optim.hybrid",
    "HybridOptimizer": "optim.hybrid",
    "route_parameters": "optim.routing",
    "SplitLayout": "optim.routing",
    "ParamRoute": "optim.routing",
    "RoutingWarning": "optim.routing",
    "newton_schulz": "optim.functional.newton_schulz",
    "ns_coefficients": "optim.functional.newton_schulz",
    "MuonConfig": "optim.configs",
    "MOPConfig": "optim.configs",
    "SOAPConfig": "optim.configs",
    "AdamWConfig": "optim.configs",
    "RoutingConfig": "optim.configs",
}

__all__ = [
    "MOP",
    "SOAP",
    "AdamWConfig",
    "HybridOptimizer",
    "MOPConfig",
    "Muon",
    "MuonConfig",
    "NonFiniteError",
    "NonFiniteWarning",
    "ParamRoute",
    "RoutingConfig",
    "RoutingWarning",
    "SOAPConfig",
    "SplitLayout",
    "build_optimizer",
    "newton_schulz",
    "ns_coefficients",
    "route_parameters",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'optim' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return __all__
