"""The one place where our Hydra optimizer schemas become `optim`'s config dataclasses.

`convert(schema)` maps `AdamWSchema | MuonSchema | MOPSchema | SOAPSchema` to (algorithm config, RoutingConfig,
AdamWConfig for the non-matrix parameters); `build(named_params, schema, naming=...)` calls
`optim.build_optimizer`. The *distribution* (`parallelism.distribution`: distributed, assignment, grad_sync, tp_mode)
is not an algorithm setting; the engines read it from the parallelism group.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from muonbench import schema as S


def optim_configs(opt: S.OptimizerSchemaBase) -> tuple[Any, Any, Any]:
    """(algorithm config, RoutingConfig | None, AdamWConfig of the non-matrix side) for the hf engine, which runs
    torch's AdamW or our optim package (the implementation policy), then `convert`."""
    match opt:
        case S.AdamWSchema() if opt.implementation != "torch":
            raise ValueError(
                f"optimizer.implementation={opt.implementation!r}: the AdamW baseline is "
                "torch.optim.AdamW; allowed: ['torch']"
            )
        case S.MatrixOptimizerSchema() if opt.implementation != "ours":
            raise ValueError(
                f"optimizer.implementation={opt.implementation!r}: this engine runs our optim package; "
                "allowed: ['ours'] (Megatron's built-in Muon runs under engine=megatron)"
            )
    if getattr(opt, "ns_overlap", False):
        raise ValueError(
            "optimizer.ns_overlap=True: engine=megatron only (its hooks live in Megatron's backward)"
        )
    return convert(opt)


def convert(opt: S.OptimizerSchemaBase) -> tuple[Any, Any, Any]:
    """Schema -> (algorithm config, RoutingConfig | None, AdamWConfig); no engine policy. For the AdamW baseline
    the algorithm config is the AdamWConfig itself and the routing is None."""
    from optim.configs import AdamWConfig, MOPConfig, MuonConfig, RoutingConfig, SOAPConfig

    adamw = AdamWConfig(
        lr=opt.lr, betas=(opt.adam_beta1, opt.adam_beta2), eps=opt.adam_eps, weight_decay=opt.weight_decay
    )
    if isinstance(opt, S.AdamWSchema):
        return adamw, None, adamw
    assert isinstance(opt, S.MatrixOptimizerSchema), type(opt)
    routing = RoutingConfig(
        router_to_matrix=opt.router_to_matrix_optimizer,
        split_qkv=opt.split_qkv,
        split_mla_kv_down=opt.split_mla,
        split_gate_up=opt.split_gate_up,
    )
    common = {"lr": opt.lr, "weight_decay": opt.weight_decay, "nonfinite_policy": opt.nonfinite_policy}
    match opt:
        case S.MuonSchema():
            algo: Any = MuonConfig(
                **common,
                momentum=opt.momentum,
                nesterov=opt.nesterov,
                scale_mode=opt.scale_mode,
                extra_scale_factor=opt.extra_scale_factor,
                coefficient_type=opt.coefficient_type,
                custom_coefficients=tuple(tuple(float(c) for c in row) for row in opt.custom_coefficients),
                num_ns_steps=opt.num_ns_steps,
                ns_precision=opt.ns_precision,
                use_gram_ns=opt.use_gram_ns,
                fused_step=opt.fused_step,
            )
        case S.MOPSchema():
            algo = MOPConfig(
                **common,
                momentum=opt.momentum,
                nesterov=opt.nesterov,
                scale_mode=opt.scale_mode,
                extra_scale_factor=opt.extra_scale_factor,
                polar_method=opt.polar_method,
                num_ns_steps=opt.num_ns_steps,
            )
        case S.SOAPSchema():
            algo = SOAPConfig(
                **common,
                betas=(opt.adam_beta1, opt.adam_beta2),
                eps=opt.adam_eps,
                shampoo_beta=opt.shampoo_beta,
                use_eigh=opt.use_eigh,
                use_kl_shampoo=opt.use_kl_shampoo,
                precondition_frequency=opt.precondition_frequency,
                max_precond_dim=opt.max_precond_dim,
                eps_eigenvalue=opt.eps_eigenvalue,
            )
        case _:
            raise NotImplementedError(f"no optim config for {type(opt).__name__}")
    return algo, routing, adamw


def build(
    named_params: Iterable[tuple[str, Any]],
    opt: S.OptimizerSchemaBase,
    *,
    naming: str = "hf",
    layout: Any = None,
) -> Any:
    """`optim.build_optimizer` for an optimizer schema (matrices to the chosen optimizer, the rest to AdamW)."""
    from optim.hybrid import build_optimizer

    algo, routing, adamw = optim_configs(opt)
    return build_optimizer(named_params, algo, naming=naming, routing=routing, layout=layout, adamw=adamw)


def is_matrix(
    named_params: Iterable[tuple[str, Any]],
    opt: S.OptimizerSchemaBase,
    *,
    naming: str = "hf",
    layout: Any = None,
) -> Any:
    """(name, tensor) -> True for the parameters the matrix optimizer takes whole (same routing as `build`)."""
    from optim.routing import route_parameters

    _, routing, _ = optim_configs(opt)
    matrix = {
        r.name
        for r in route_parameters(named_params, naming=naming, routing=routing, layout=layout)
        if r.optimizer == "matrix"
    }
    return lambda name, p: name in matrix
