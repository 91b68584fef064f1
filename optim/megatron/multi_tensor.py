"""Foreach replacements for Megatron's multi-tensor fallbacks when neither Transformer Engine nor Apex is installed.

Megatron-core's optimizers call `multi_tensor_applier(l2_norm_impl | multi_tensor_scale_impl, ...)` for the global
gradient norm, gradient clipping and the fp32 -> bf16 copy of the main params into the model. Without TE or Apex
(`megatron.core.utils.local_multi_tensor_*`) these become per-tensor Python loops: the l2 norm builds a host list
of every tensor's norm (`torch.tensor(list_of_cuda_scalars)`: one host sync per parameter, 1,582 per step on the
Qwen3 slice) and the scale runs `dst.copy_(src * scale)` (an fp32 temporary and two kernels per tensor). The syncs
leave the GPU idle for much of the optimizer phase, for every optimizer alike (docs/megatron_h200.md#te-free-pieces).

`install()` swaps those fallbacks, where they are in use, for the same math on torch's foreach kernels (no host
sync; one multi-tensor launch per dtype group): `l2_norm` returns the fp32 norm of all tensors as a 1-element
CUDA tensor (Apex's contract), `scale` writes `dst = src * scale` (in place when the lists are the same tensors).
With TE or Apex present nothing is touched. The swap applies to all three builders alike (AdamW, ours, the
built-in Muon), so it speeds the baseline as much as the others.
"""

from __future__ import annotations

from typing import Any

import torch

# The module attributes of megatron-core that hold the fallbacks (module, attribute, megatron.core.utils name).
_SITES = (
    ("megatron.core.optimizer.clip_grads", "l2_norm_impl", "local_multi_tensor_l2_norm"),
    ("megatron.core.optimizer.clip_grads", "multi_tensor_scale_impl", "local_multi_tensor_scale"),
    ("megatron.core.optimizer.optimizer", "multi_tensor_scale_impl", "local_multi_tensor_scale"),
)


def l2_norm(
    chunk_size: int,
    noop_flag: torch.Tensor,
    tensor_lists: list[list[torch.Tensor]],
    per_tensor: bool,
    *args: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Drop-in for `amp_C.multi_tensor_l2norm` through `local_multi_tensor_applier`: (total fp32 norm as a
    1-element tensor, per-tensor norms when `per_tensor` else None); no host sync."""
    del chunk_size, noop_flag, args
    tensors = tensor_lists[0]
    if not tensors:
        return torch.zeros(
            1, dtype=torch.float32, device="cuda" if torch.cuda.is_available() else "cpu"
        ), None
    norms = torch.stack(torch._foreach_norm(tensors, 2, dtype=torch.float32))
    total = torch.linalg.vector_norm(norms).reshape(1)
    return total, (norms if per_tensor else None)


def scale(
    chunk_size: int, noop_flag: torch.Tensor, tensor_lists: list[list[torch.Tensor]], factor: float
) -> None:
    """Drop-in for `amp_C.multi_tensor_scale`: dst[i] = src[i] * factor (dtype-converting copy into dst)."""
    del chunk_size, noop_flag
    src, dst = tensor_lists[0], tensor_lists[1]
    if len(src) != len(dst):
        raise ValueError(f"multi_tensor scale: {len(src)} sources vs {len(dst)} destinations")
    if not src:
        return
    if all(s is d for s, d in zip(src, dst, strict=True)):
        if factor != 1.0:
            torch._foreach_mul_(dst, factor)
        return
    torch._foreach_copy_(dst, src if factor == 1.0 else torch._foreach_mul(src, factor))


def copy_this_to_that(
    this: list[torch.Tensor], that: list[torch.Tensor], overflow_buf: torch.Tensor | None = None
) -> None:
    """Drop-in for `megatron.core.optimizer.optimizer._multi_tensor_copy_this_to_that`: that[i] <- this[i]. Megatron
    loops `that_.copy_(this_)` in bf16 runs (one launch per parameter, 1,554 on the Qwen3 slice, whether TE is
    installed or not); this is one foreach copy (dtype-converting)."""
    if overflow_buf is not None:
        overflow_buf.fill_(0)
    if len(this) != len(that):
        raise ValueError(f"multi_tensor copy: {len(this)} sources vs {len(that)} destinations")
    if this:
        torch._foreach_copy_(that, this)


_COPY_SITE = ("megatron.core.optimizer.optimizer", "_multi_tensor_copy_this_to_that")
# What install() replaced, by "module.attribute" (to restore or inspect).
ORIGINALS: dict[str, Any] = {}


def install() -> list[str]:
    """Replace Megatron's local multi-tensor fallbacks by `l2_norm` / `scale` where they are in use, and its
    per-tensor main -> model param copy by `copy_this_to_that`; returns the `module.attribute` names replaced (the
    fallbacks are left alone with TE or Apex; nothing when already installed). Idempotent."""
    import importlib

    from megatron.core import utils as mcore_utils

    replaced = []
    module_name, attr = _COPY_SITE
    module = importlib.import_module(module_name)
    current = getattr(module, attr, None)
    if current is not None and getattr(current, "__module__", None) == module_name:
        ORIGINALS[f"{module_name}.{attr}"] = current
        setattr(module, attr, copy_this_to_that)
        replaced.append(f"{module_name}.{attr}")
    ours = {"local_multi_tensor_l2_norm": l2_norm, "local_multi_tensor_scale": scale}
    for module_name, attr, fallback in _SITES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # pragma: no cover - megatron-core moved the module; nothing to patch there
            continue
        current = getattr(module, attr, None)
        if current is not None and current is getattr(mcore_utils, fallback, object()):
            ORIGINALS[f"{module_name}.{attr}"] = current
            setattr(module, attr, ours[fallback])
            replaced.append(f"{module_name}.{attr}")
    return replaced


def installed() -> bool:
    """True when no site still uses Megatron's per-tensor fallback or copy loop."""
    import importlib

    from megatron.core import utils as mcore_utils

    if getattr(importlib.import_module(_COPY_SITE[0]), _COPY_SITE[1]) is not copy_this_to_that:
        return False
    for module_name, attr, fallback in _SITES:
        module = importlib.import_module(module_name)
        if getattr(module, attr, None) is getattr(mcore_utils, fallback, object()):
            return False
    return True
