"""Megatron configs and process groups: `OptimizerConfig`, DDP config and param groups from ours, version
differences handled once; the `OptimizerConfig` sections of Megatron's own Muon and SOAP (`optim.registry`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from optim.configs import AdamWConfig, ConfigFieldError, MuonConfig, RoutingConfig, SOAPConfig, TPMode

MatrixConfig = Any
"""The config of a registered matrix optimizer (`optim.registry.OPTIMIZERS`)."""
IMPLEMENTATIONS = ("ours", "megatron")
TP_MODES: tuple[str, ...] = (TPMode.BLOCKWISE, TPMode.DUPLICATED, TPMode.DISTRIBUTED)
"""The TP modes of Megatron-core's TensorParallelMuon (no Gram variant)."""


def process_groups() -> dict[str, Any]:
    """Megatron's groups an optimizer needs: tp, expert tp, dp x cp, expert dp (parallel_state must be set up)."""
    from megatron.core import parallel_state as ps

    return {
        "tp": ps.get_tensor_model_parallel_group(),
        "expt_tp": ps.get_expert_tensor_parallel_group(),
        "dp_cp": ps.get_data_parallel_group(with_context_parallel=True),
        "expt_dp": ps.get_expert_data_parallel_group(),
    }


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _unsupported(rows: tuple[tuple[str, Any, bool, str], ...]) -> None:
    for name, value, bad, why in rows:
        if bad:
            rule = f"is not available in Megatron-Core, which {why}; use implementation=ours"
            raise ConfigFieldError(name, value, rule)


def check_megatron_routing(routing: RoutingConfig) -> None:
    """ConfigFieldError for a routing Megatron-core's matrix optimizers (Muon, SOAP) cannot follow."""
    _unsupported(
        (
            ("split_mla_kv_down", True, routing.split_mla_kv_down, "orthogonalises MLA projections whole"),
            ("split_gate_up", True, routing.split_gate_up, "orthogonalises fc1 [gate; up] jointly"),
            (
                "router_to_matrix",
                False,
                not routing.router_to_matrix,
                "routes the MoE router to the matrix side",
            ),
        )
    )


def megatron_muon_fields(muon: MuonConfig, routing: RoutingConfig, tp_mode: str) -> dict[str, Any]:
    """The `muon_*` fields of Megatron-core's OptimizerConfig for `muon` (newest names: `muon_nesterov`), the one
    mapping used by the megatron engine and the Bridge recipes. ConfigFieldError names a setting Megatron-core's
    Muon cannot follow (it would change the run silently); the field is `tp_mode` or one of `muon` / `routing`."""
    if tp_mode not in TP_MODES:
        raise ConfigFieldError("tp_mode", tp_mode, f"is not one of {list(TP_MODES)} in Megatron-Core's Muon")
    check_megatron_routing(routing)
    _unsupported(
        (
            (
                "coefficient_type",
                "custom",
                muon.coefficient_type == "custom",
                "takes a named coefficient set",
            ),
            ("use_gram_ns", True, muon.use_gram_ns, "has no Gram Newton-Schulz"),
            ("ns_precision", "fp16", muon.ns_precision == "fp16", "iterates in bf16 or fp32 only"),
        )
    )
    return {
        "muon_momentum": muon.momentum,
        "muon_nesterov": muon.nesterov,
        "muon_scale_mode": muon.scale_mode,
        "muon_extra_scale_factor": muon.extra_scale_factor,
        "muon_fp32_matmul_prec": "medium" if muon.ns_precision == "bf16" else "highest",
        "muon_coefficient_type": muon.coefficient_type,
        "muon_num_ns_steps": muon.num_ns_steps,
        "muon_tp_mode": tp_mode,
        "muon_split_qkv": routing.split_qkv,
    }


def megatron_muon_section(
    muon: MuonConfig, routing: RoutingConfig, adamw: AdamWConfig, tp_mode: str
) -> dict[str, Any]:
    """Megatron-Core's Muon as `OptimizerConfig` fields (`optim.registry`'s `to_megatron` of muon): the `muon_*`
    fields, the scalar parameters on Adam."""
    return {
        "optimizer": "muon",
        **megatron_muon_fields(muon, routing, tp_mode),
        "muon_scalar_optimizer": "adam",
    }


def megatron_soap_section(
    soap: SOAPConfig, routing: RoutingConfig, adamw: AdamWConfig, tp_mode: str
) -> dict[str, Any]:
    """Megatron-Core's SOAP as `OptimizerConfig` fields (`optim.registry`'s `to_megatron` of soap_rekls).
    ConfigFieldError names a setting it cannot follow: it has no eigh-every-step (REKLS) switch and takes its
    betas and eps from Adam's."""
    _unsupported((("use_eigh", True, soap.use_eigh, "has no eigh-every-step (REKLS) switch"),))
    if (tuple(soap.betas), soap.eps) != (tuple(adamw.betas), adamw.eps):
        raise ConfigFieldError(
            "betas",
            soap.betas,
            "is not available in Megatron-Core, whose SOAP takes its betas and eps from adam_beta1, adam_beta2 "
            "and adam_eps; set them equal or use implementation=ours",
        )
    check_megatron_routing(routing)
    return {
        "optimizer": "soap",
        "soap_shampoo_beta": soap.shampoo_beta,
        "soap_precondition_frequency": soap.precondition_frequency,
        "soap_use_kl_shampoo": soap.use_kl_shampoo,
    }


def megatron_optimizer_config(
    *,
    optimizer: str,
    adamw: AdamWConfig,
    clip_grad: float,
    use_distributed_optimizer: bool,
    bf16: bool = True,
    muon: MuonConfig | None = None,
    routing: RoutingConfig | None = None,
    tp_mode: str = "blockwise",
) -> Any:
    """Megatron `OptimizerConfig` for adam (baseline, or the Adam side of ours) or Megatron's built-in muon.

    Version differences: `muon_nesterov` (core >= 0.18) was `muon_use_nesterov`; layer-wise Muon is
    `optimizer="muon"` + `use_layer_wise_distributed_optimizer` (core >= 0.18) or `optimizer="dist_muon"` before.
    """
    from megatron.core.optimizer import OptimizerConfig

    have = _fields(OptimizerConfig)
    kw: dict[str, Any] = {
        "optimizer": "adam",
        "lr": adamw.lr,
        "min_lr": adamw.lr,
        "weight_decay": adamw.weight_decay,
        "adam_beta1": adamw.betas[0],
        "adam_beta2": adamw.betas[1],
        "adam_eps": adamw.eps,
        "clip_grad": clip_grad,
        "bf16": bf16,
        "params_dtype": torch.bfloat16 if bf16 else torch.float32,
        "use_distributed_optimizer": use_distributed_optimizer,
    }
    if optimizer == "muon":
        if muon is None or routing is None:
            raise ValueError("optimizer='muon' needs the muon and routing configs")
        fields = megatron_muon_fields(muon, routing, tp_mode)
        if "muon_nesterov" not in have:
            fields["muon_use_nesterov"] = fields.pop("muon_nesterov")
        kw.update(
            lr=muon.lr,
            min_lr=muon.lr,
            weight_decay=muon.weight_decay,
            use_distributed_optimizer=False,
            **fields,
        )
        if "use_layer_wise_distributed_optimizer" in have:
            kw.update(optimizer="muon", use_layer_wise_distributed_optimizer=True)
        else:
            kw["optimizer"] = "dist_muon"
    elif optimizer != "adam":
        raise ValueError(f"optimizer={optimizer!r} is not one of ('adam', 'muon')")
    unknown = set(kw) - have
    if unknown:
        raise ValueError(
            f"megatron-core's OptimizerConfig lacks {sorted(unknown)}: unsupported megatron-core version"
        )
    return OptimizerConfig(**kw)


def ddp_config(
    *, kind: str, distributed: bool, overlap_grad_reduce: bool, grad_reduce_in_fp32: bool = True
) -> Any:
    """Megatron DDP settings matching the optimizer `kind` (adamw | ours | megatron): the distributed optimizer's
    reduce-scatter only for AdamW; Megatron's legacy layer-wise Muon and ours all-reduce gradients (every rank holds
    full main grads and steps the matrices it owns). `grad_reduce_in_fp32=False` keeps the main-grad buffer in the
    parameters' dtype (each optimizer casts its gradients to fp32 at the step)."""
    from megatron.core.distributed import DistributedDataParallelConfig

    if kind not in ("adamw", *IMPLEMENTATIONS):
        raise ValueError(f"kind={kind!r} is not one of {('adamw', *IMPLEMENTATIONS)}")
    return DistributedDataParallelConfig(
        grad_reduce_in_fp32=grad_reduce_in_fp32,
        overlap_grad_reduce=overlap_grad_reduce,
        use_distributed_optimizer=distributed and kind == "adamw",
        check_for_nan_in_grad=False,
    )


def megatron_group(
    params: list[torch.Tensor], names: list[str], *, lr: float, weight_decay: float, wd_mult: float
) -> dict[str, Any]:
    """A param group with the keys Megatron reads: its checkpoint loader matches saved groups to current ones by
    (max_lr, min_lr, wd_mult, lr_mult, is_expert_parallel, ...), so groups that differ only in weight decay would
    collide without `wd_mult`; its LR scheduler reads max_lr / min_lr / lr_mult and multiplies wd by wd_mult."""
    return {
        "params": params,
        "param_names": names,
        "weight_decay": weight_decay,
        "wd_mult": wd_mult,
        "lr_mult": 1.0,
        "max_lr": lr,
        "min_lr": lr,
        "is_expert_parallel": False,
        "is_decoupled_lr": False,
        "default_config": True,
    }


def _model_parallel_group() -> Any:
    from megatron.core import parallel_state as ps

    return ps.get_model_parallel_group()
