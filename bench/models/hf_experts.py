"""Mixed-precision grouped GEMM for the experts of a transformers MoE model with fp32 weights.

transformers' `grouped_mm` experts path casts the tokens to the weights' dtype and is not autocast-enabled
(pytorch/pytorch#174763), so under bf16 autocast with fp32 master weights the expert GEMMs run in fp32 (on CUDA the
grouped GEMM kernel is bf16-only, and other dtypes take a per-expert loop). `use_autocast_grouped_experts` gives
every experts module a forward that, under autocast, casts tokens and weights to the autocast dtype (as autocast
does for `nn.Linear`) and runs both projections as one `torch.nn.functional.grouped_mm` each; outside autocast
it calls the module's own forward unchanged.

Layout (transformers Qwen3-MoE / Mixtral family): gate_up_proj (experts, 2 x inter, hidden) = [gate; up],
down_proj (experts, hidden, inter); router top-k indices and weights per token.
"""

from __future__ import annotations

import types
from typing import Any


def grouped_experts_forward(self: Any, hidden_states, top_k_index, top_k_weights, *, fallback):
    """(tokens, hidden), (tokens, k), (tokens, k) -> (tokens, hidden) in hidden_states' dtype."""
    import torch
    import torch.nn.functional as F

    dev = hidden_states.device.type
    if not torch.is_autocast_enabled(dev):
        return fallback(hidden_states, top_k_index, top_k_weights)
    dtype = torch.get_autocast_dtype(dev)
    num_tokens, hidden = hidden_states.shape
    k = top_k_index.size(-1)
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    # histc, not bincount: bincount's output size depends on the data, which costs a device sync
    counts = torch.histc(
        flat.float() if dev == "cpu" else flat.int(), bins=self.num_experts, min=0, max=self.num_experts - 1
    )
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    with torch.autocast(dev, enabled=False):
        x = hidden_states[order // k].to(dtype)
        h = F.grouped_mm(x, self.gate_up_proj.to(dtype).transpose(-2, -1), offs=offs)
        gate, up = h.chunk(2, dim=-1)
        h = self.act_fn(gate) * up
        y = F.grouped_mm(h, self.down_proj.to(dtype).transpose(-2, -1), offs=offs)
        y = y * top_k_weights.reshape(-1)[order].to(dtype).unsqueeze(-1)
        out = torch.empty_like(y).index_copy(0, order, y)
        return out.view(num_tokens, k, hidden).float().sum(1).to(hidden_states.dtype)


def use_autocast_grouped_experts(model: Any) -> int:
    """Give every experts module of `model` (one with gate_up_proj and down_proj stacks) the autocast grouped
    forward; returns how many modules were changed."""
    n = 0
    for module in model.modules():
        # experts with biases (gpt-oss: interleaved, clamped gate/up) keep their own forward
        if type(module).__name__.endswith("Experts") and hasattr(module, "gate_up_proj") and not hasattr(
            module, "gate_up_proj_bias"
        ):
            original = module.forward
            module.forward = types.MethodType(
                lambda self, h, i, w, _orig=original: grouped_experts_forward(self, h, i, w, fallback=_orig),
                module,
            )
            n += 1
    return n
