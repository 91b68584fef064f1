"""Routed experts on torch's grouped GEMM, for Megatron-core's local (Transformer-Engine-free) MoE spec.

Without TE, Megatron's local spec runs experts as `SequentialMLP`: a Python loop over the local experts, a few small
GEMMs and kernels each, per micro-batch, forward and backward: launch-bound (docs/megatron_h200.md#te-free-pieces).
A slow baseline flatters Muon, so the engine plugs this module into the MoE spec (`submodules.experts`).

- Parameters stay one 2-D tensor per expert and per projection, named like TE's grouped linear
  (`experts.linear_fc1.weight<e>`, `experts.linear_fc2.weight<e>`, Megatron out x in), so the optimizers (ours and
  Megatron's built-in Muon) see exactly the expert matrices they see with TE.
- Forward: the expert weights are stacked (one copy per call, ~1 GB per Qwen layer) and both projections run as
  one `torch.nn.functional.grouped_mm` each over the tokens sorted by expert (`offs` = cumulative tokens per
  expert); SwiGLU and the routing probabilities in between, as Megatron's MLP applies them.
- Expert tensor parallelism is not supported (ETP = 1); expert parallelism is (allreduce=False under EP > 1).
- Any device torch's grouped_mm runs on (CUDA bf16 in the runs; CPU fp32 in the unit tests).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.transformer.module import MegatronModule

try:
    from torch.nn.functional import grouped_mm as _grouped_mm
except ImportError:  # torch < 2.10 names it privately
    _grouped_mm = getattr(torch, "_grouped_mm", None)


class _ExpertWeights(torch.nn.Module):
    """`num` parameters weight0..weight<num-1> of shape (out, in) with Megatron's TP/expert attributes."""

    def __init__(
        self,
        num: int,
        out_features: int,
        in_features: int,
        *,
        partition_dim: int,
        allreduce: bool,
        init_method: Any,
        dtype: torch.dtype,
        device: Any,
    ) -> None:
        super().__init__()
        self.num = num
        for e in range(num):
            w = torch.nn.Parameter(torch.empty(out_features, in_features, dtype=dtype, device=device))
            with torch.no_grad():
                init_method(w)
            w.tensor_model_parallel = True
            w.partition_dim = partition_dim
            w.partition_stride = 1
            w.allreduce = allreduce
            self.register_parameter(f"weight{e}", w)

    def weights(self) -> list[torch.Tensor]:
        return [getattr(self, f"weight{e}") for e in range(self.num)]


class GroupedMMExperts(MegatronModule):
    """Megatron experts module (builder signature of SequentialMLP) running on `F.grouped_mm`."""

    def __init__(
        self,
        num_local_experts: int,
        config: Any,
        submodules: Any = None,
        pg_collection: Any = None,
        name: str | None = None,
    ) -> None:
        super().__init__(config=config)
        if config.expert_tensor_parallel_size != 1:
            raise ValueError(
                f"expert_tensor_parallel_size={config.expert_tensor_parallel_size}: GroupedMMExperts supports 1"
            )
        if not config.gated_linear_unit or config.add_bias_linear:
            raise ValueError(
                "GroupedMMExperts implements SwiGLU experts without biases (gated_linear_unit=True, "
                "add_bias_linear=False)"
            )
        self.num_local_experts = num_local_experts
        ffn, hidden = config.moe_ffn_hidden_size, config.hidden_size
        allreduce = config.expert_model_parallel_size == 1
        device = "cpu" if config.use_cpu_initialization else torch.cuda.current_device()
        common = {"allreduce": allreduce, "dtype": config.params_dtype, "device": device}
        self.linear_fc1 = _ExpertWeights(
            num_local_experts, 2 * ffn, hidden, partition_dim=0, init_method=config.init_method, **common
        )
        self.linear_fc2 = _ExpertWeights(
            num_local_experts,
            hidden,
            ffn,
            partition_dim=1,
            init_method=config.output_layer_init_method,
            **common,
        )

    def forward(
        self, hidden: torch.Tensor, tokens_per_expert: torch.Tensor, probs: torch.Tensor, **unused: Any
    ) -> tuple[torch.Tensor, None]:
        """hidden [T, H] sorted by expert, tokens_per_expert [E], probs [T] -> ([T, H], None)."""
        if _grouped_mm is None:
            raise RuntimeError(
                "torch.nn.functional.grouped_mm is missing: GroupedMMExperts needs torch >= 2.8"
            )
        offs = torch.cumsum(tokens_per_expert.to(hidden.device), 0, dtype=torch.int32)
        w1 = torch.stack(self.linear_fc1.weights()).transpose(1, 2)
        w2 = torch.stack(self.linear_fc2.weights()).transpose(1, 2)
        h = _ContiguousGrad.apply(_grouped_mm(hidden, w1, offs=offs))
        out = _grouped_mm(_swiglu(h, probs), w2, offs=offs)
        return _ContiguousGrad.apply(out), None

    def backward_dw(self) -> None:
        """No delayed weight-gradient computation (Megatron calls this only with delay_wgrad_compute)."""


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the incoming gradient dense: grouped_mm's backward rejects expanded
    (stride-0) gradients, e.g. the gradient of a sum (measured on torch 2.11: "Invalid strides/sizes")."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


def _swiglu(h: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """[gate; up] -> silu(gate) * up * prob, in the activation dtype (Megatron's weighted SwiGLU)."""
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up * probs.unsqueeze(-1).to(h.dtype)


def use_grouped_mm_experts(spec: Any) -> int:
    """Swap the experts of every MoE layer of a local decoder block spec for GroupedMMExperts; returns how many."""
    import dataclasses
    from functools import partial

    count = 0
    for layer in spec.layer_specs:
        mlp = layer.submodules.mlp
        sub = getattr(mlp, "keywords", {}).get("submodules") if isinstance(mlp, partial) else None
        if sub is None or not hasattr(sub, "experts"):
            continue
        layer.submodules.mlp = partial(
            mlp.func,
            *mlp.args,
            **{**mlp.keywords, "submodules": dataclasses.replace(sub, experts=GroupedMMExperts)},
        )
        count += 1
    return count
