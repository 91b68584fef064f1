"""The one Megatron-core adapter: parameter classification, optimizer builders, version differences.

Every `megatron.core` import of `optim/` lives in this package (lazily, inside functions), so `optim` itself imports
with torch alone. Three builders, all returning a Megatron `MegatronOptimizer` that Megatron's training loop drives
(`zero_grad`, `step() -> (ok, grad_norm, zeros)`, `state_dict` / `load_state_dict` for checkpoints):

- `build_ours`: our Muon / MOP / SOAP on the matrices, torch fused AdamW on the rest, each wrapped in Megatron's
  `Float16OptimizerWithFloat16Params` (fp32 main params from the bf16 model, grads from DDP's main_grad, global-norm
  clipping) and chained (`ChainedOptimizer`), the way Megatron chains Muon with Adam.
- `build_megatron_muon`: Megatron's built-in Muon (`get_megatron_optimizer` with optimizer "muon" ->
  `TensorParallelMuon` + `LayerWiseDistributedOptimizer`, legacy ping-pong path, as Megatron-Bridge runs it).
  Needs emerging-optimizers (0.3.x) importable.
- `build_megatron_adamw`: AdamW through Megatron's `DistributedOptimizer` (or Float16 wrapper without it). Without
  Transformer Engine or Apex, Megatron falls back to `torch.optim.AdamW` in for-each mode; `fuse_torch_adam` switches
  it to torch's fused kernel so the baseline is not artificially slow.

Routing follows Megatron's parameter attributes, not only names: `is_embedding_or_output_parameter` and ndim != 2
go to AdamW; `allreduce=False` marks expert-parallel parameters (reduced over expert-DP); names with "experts" but not
"shared" are experts (MCore's test, needed at EP=1 where experts keep allreduce=True); `partition_dim` is the TP
sharded dim; the fused `linear_qkv` is split per query group into Q, K, V (MCore `_get_qkv_split_shapes`); MLA's
`linear_kv_down_proj` ([latent; rope] rows) and gated `linear_fc1` ([gate; up]) are split on request.

Submodules (everything is re-exported here; `from optim import megatron as om; om.<name>`):

- `routing`: `ParamRoute`, `classify` / `classify_parameter`, `qkv_split`, `tp_specs`, `matrix_shapes`.
- `config`: Megatron's `OptimizerConfig` (`megatron_optimizer_config`, version differences), `ddp_config`,
  `megatron_group`, `process_groups`; `MatrixConfig` and our matrix optimizer for it.
- `builders`: `build_ours`, `build_megatron_muon`, `build_megatron_adamw`, `fuse_torch_adam`.
- `layerwise`: `MegatronLayerWise` (our layer-wise distributed optimizer in Megatron's loop),
  `disable_ddp_grad_sync`.
- `overlap`: `NSOverlap` / `install_ns_overlap`: each layer's Newton-Schulz started in the last micro-batch's
  backward on a side stream (speculative; the step uses it when clipping leaves the gradients unchanged).

Monkeypatching a name here affects only callers that look it up on `optim.megatron`; code inside the package calls
the submodule's binding (patch `optim.megatron.<submodule>.<name>` for those).
"""

from __future__ import annotations

from optim.megatron.builders import _inner_torch_optimizers as _inner_torch_optimizers
from optim.megatron.builders import (
    build_megatron_adamw,
    build_megatron_muon,
    build_ours,
    fuse_torch_adam,
    megatron_adamw_config,
    megatron_muon_config,
)
from optim.megatron.config import (
    IMPLEMENTATIONS,
    TP_MODES,
    MatrixConfig,
    ddp_config,
    megatron_group,
    megatron_optimizer_config,
    process_groups,
)
from optim.megatron.layerwise import MegatronLayerWise, disable_ddp_grad_sync
from optim.megatron.layerwise import _owned_optimizer as _owned_optimizer
from optim.megatron.overlap import NSOverlap
from optim.megatron.overlap import install as install_ns_overlap
from optim.megatron.routing import (
    ParamRoute,
    classify,
    classify_parameter,
    matrix_shapes,
    qkv_split,
    tp_specs,
)

__all__ = [
    "IMPLEMENTATIONS",
    "TP_MODES",
    "MatrixConfig",
    "MegatronLayerWise",
    "NSOverlap",
    "ParamRoute",
    "build_megatron_adamw",
    "build_megatron_muon",
    "build_ours",
    "classify",
    "classify_parameter",
    "ddp_config",
    "disable_ddp_grad_sync",
    "fuse_torch_adam",
    "install_ns_overlap",
    "matrix_shapes",
    "megatron_adamw_config",
    "megatron_group",
    "megatron_muon_config",
    "megatron_optimizer_config",
    "process_groups",
    "qkv_split",
    "tp_specs",
]
