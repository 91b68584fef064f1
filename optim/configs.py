"""Algorithm configs of the optimizers (frozen, keyword-only). Defaults follow emerging-optimizers 0.3.0.

Which algorithm runs is the config's class (MuonConfig, MOPConfig, SOAPConfig, AdamWConfig); how parameters are
routed and split is RoutingConfig; the parallel layout is not configured here.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

WEIGHT_DECAY_METHODS = ("decoupled", "independent", "l2")
MUON_SCALE_MODES = ("spectral", "shape_scaling", "unit_rms_norm")
MOP_SCALE_MODES = ("nuclear_norm", *MUON_SCALE_MODES)
COEFFICIENT_TYPES = ("simple", "quintic", "polar_express", "aol", "cans", "deepseekv4", "custom")
NS_PRECISIONS = ("bf16", "fp16", "fp32")
NONFINITE_POLICIES = ("skip", "raise")
POLAR_METHODS = ("svd", "polar_express")


class TPMode(StrEnum):
    """How NS runs on a tensor-parallel sharded matrix (`optim.distributed.tp_orthogonalize`)."""

    DUPLICATED = "duplicated"
    DISTRIBUTED = "distributed"
    DISTRIBUTED_GRAM = "distributed_gram"
    BLOCKWISE = "blockwise"


TP_MODES: tuple[str, ...] = tuple(TPMode)
TP_MODE_CHOICES: tuple[str, ...] = (*TP_MODES, "auto")
"""`parallelism.distribution.tp_mode`: a mode, or `auto` (the cost model's choice per matrix, `optim.cost`)."""

WeightDecayMethod = Literal["decoupled", "independent", "l2"]
NonfinitePolicy = Literal["skip", "raise"]


class ConfigFieldError(ValueError):
    """A config value outside its allowed set or range; `field`, `value` and `rule` for callers that prefix a path."""

    def __init__(self, field: str, value: object, rule: str) -> None:
        super().__init__(f"{field}={value!r} {rule}")
        self.field, self.value, self.rule = field, value, rule


def _choice(field: str, value: object, allowed: tuple[object, ...]) -> None:
    if value not in allowed:
        raise ConfigFieldError(field, value, f"is not one of {allowed}")


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _int(field: str, value: object) -> None:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise ConfigFieldError(field, value, "must be an int")


def _bools(cfg: object, *names: str) -> None:
    """Each named field is a bool (a string "false" would be truthy)."""
    for name in names:
        value = getattr(cfg, name)
        if not isinstance(value, bool):
            raise ConfigFieldError(name, value, "must be a bool (True or False)")


MAX_CUSTOM_COEFFICIENT = 1e3
"""Largest |a|, |b|, |c| of a custom Newton-Schulz triple (the shipped sets stay below 30): beyond it the
iteration overflows in bf16 and the weights turn NaN."""


def _check_custom(coefficients: object) -> None:
    rule = f"must be a list of (a, b, c) triples of finite numbers with |x| <= {MAX_CUSTOM_COEFFICIENT:g}"
    if not isinstance(coefficients, list | tuple):
        raise ConfigFieldError("custom_coefficients", coefficients, rule)
    for i, t in enumerate(coefficients):
        ok = isinstance(t, list | tuple) and len(t) == 3 and all(_is_number(x) for x in t)
        if not ok or not all(math.isfinite(x) and abs(x) <= MAX_CUSTOM_COEFFICIENT for x in t):
            raise ConfigFieldError(f"custom_coefficients[{i}]", t, rule)


def _range(
    field: str, value: float, lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False
) -> None:
    """`value` a number within the interval and finite (NaN fails every comparison, so it is rejected by name)."""
    lb, rb = "(" if lo_open else "[", ")" if hi_open else "]"
    if not _is_number(value):
        raise ConfigFieldError(field, value, f"must be a number in {lb}{lo}, {hi}{rb}")
    if not math.isfinite(value):
        raise ConfigFieldError(field, value, f"is not a finite number in {lb}{lo}, {hi}{rb}")
    bad = value < lo or value > hi or (lo_open and value == lo) or (hi_open and value == hi)
    if bad:
        raise ConfigFieldError(field, value, f"is not in {lb}{lo}, {hi}{rb}")


def _check_common(cfg: MuonConfig | MOPConfig) -> None:
    _range("lr", cfg.lr, 0.0, float("inf"))
    _range("momentum", cfg.momentum, 0.0, 1.0, hi_open=True)
    _range("weight_decay", cfg.weight_decay, 0.0, float("inf"))
    _choice("weight_decay_method", cfg.weight_decay_method, WEIGHT_DECAY_METHODS)
    _choice("nonfinite_policy", cfg.nonfinite_policy, NONFINITE_POLICIES)
    _choice("ns_precision", cfg.ns_precision, NS_PRECISIONS)
    _int("num_ns_steps", cfg.num_ns_steps)
    _range("num_ns_steps", cfg.num_ns_steps, 1, 100)
    _bools(cfg, "nesterov")
    _range("extra_scale_factor", cfg.extra_scale_factor, 0.0, float("inf"), lo_open=True)


@dataclass(frozen=True, kw_only=True, slots=True)
class MuonConfig:
    """Muon: EMA momentum, Newton-Schulz orthogonalization, shape-dependent scale."""

    lr: float = 3e-4
    """Learning rate."""
    momentum: float = 0.95
    """EMA coefficient beta: buf <- buf + (1 - beta) (g - buf)."""
    nesterov: bool = False
    """Orthogonalize g + beta (buf - g) instead of buf (EO default False; MCore TensorParallelMuon True)."""
    weight_decay: float = 0.01
    """Decay coefficient; see weight_decay_method."""
    weight_decay_method: WeightDecayMethod = "decoupled"
    """decoupled: p -= lr*wd*p; independent: p -= wd*p; l2: g += wd*p."""
    scale_mode: str = "spectral"
    """spectral sqrt(max(out, in)) | shape_scaling sqrt(max(1, out/in)) | unit_rms_norm sqrt(out/in)."""
    extra_scale_factor: float = 1.0
    """Multiplies the scale (0.2 with spectral matches AdamW's update RMS, arXiv 2502.16982)."""
    coefficient_type: str = "quintic"
    """Newton-Schulz coefficient set, see optim.functional.newton_schulz."""
    custom_coefficients: tuple[tuple[float, float, float], ...] = ()
    """The (a, b, c) list when coefficient_type is custom."""
    num_ns_steps: int = 5
    """Newton-Schulz iterations."""
    ns_precision: str = "bf16"
    """bf16 iterate (MCore fp32_matmul_prec "medium"), fp16 (~8x more accurate than bf16 at the same GEMM rate;
    the batched CUDA path folds a I into the NS polynomial, `optim.kernels.ns_batched`) or fp32 ("highest")."""
    use_gram_ns: bool = False
    """Gram-NS: iterate on the short-side Gram matrix."""
    gram_restart_iterations: tuple[int, ...] = (2,)
    """Gram-NS restarts (iterations before which X is re-formed)."""
    eps: float = 1e-7
    """Lower clamp of the Frobenius norm in Newton-Schulz."""
    nonfinite_policy: NonfinitePolicy = "skip"
    """skip: warn and leave that parameter and its momentum untouched this step; raise: NonFiniteError."""
    fused_step: bool = True
    """On CUDA with bf16 NS: step whole fp32 2-D matrices (not split, not TP-sharded) with the fused momentum-pack
    and update kernels (`optim.kernels.fused_step`; bf16 rounding of the NS input before normalization, decay and
    update in one multiply-add). False: the multi-tensor torch path everywhere. No effect on CPU."""

    def __post_init__(self) -> None:
        _check_common(self)
        _choice("scale_mode", self.scale_mode, MUON_SCALE_MODES)
        _choice("coefficient_type", self.coefficient_type, COEFFICIENT_TYPES)
        if (self.coefficient_type == "custom") != bool(self.custom_coefficients):
            raise ValueError(
                f"custom_coefficients={self.custom_coefficients!r} must be non-empty exactly when "
                f"coefficient_type='custom' (got coefficient_type={self.coefficient_type!r})"
            )
        _check_custom(self.custom_coefficients)
        _bools(self, "use_gram_ns", "fused_step")
        for i, it in enumerate(self.gram_restart_iterations):
            _int(f"gram_restart_iterations[{i}]", it)
        _range("eps", self.eps, 0.0, 1.0, lo_open=True)
        bad = [i for i in self.gram_restart_iterations if not 0 < i < self.num_ns_steps]
        if self.use_gram_ns and bad:
            raise ValueError(
                f"gram_restart_iterations={self.gram_restart_iterations!r} must lie in [1, num_ns_steps)"
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class MOPConfig:
    """MOP: momentum orthogonalized by its polar factor (exact SVD, or Polar Express iterations)."""

    lr: float = 3e-4
    """Learning rate."""
    momentum: float = 0.95
    """EMA coefficient of the momentum (as Muon)."""
    nesterov: bool = False
    """Nesterov input g + beta (buf - g) (as Muon)."""
    weight_decay: float = 0.01
    """Decay coefficient; see weight_decay_method."""
    weight_decay_method: WeightDecayMethod = "decoupled"
    """decoupled | independent | l2 (as Muon)."""
    scale_mode: str = "nuclear_norm"
    """nuclear_norm (sum of singular values, PolarGrad arXiv 2505.21799) or a Muon mode."""
    extra_scale_factor: float = 1.0
    """Multiplies the scale."""
    polar_method: str = "svd"
    """svd: exact U V^T; polar_express: Newton-Schulz with the Polar Express coefficients."""
    num_ns_steps: int = 8
    """Iterations when polar_method is polar_express."""
    ns_precision: str = "fp32"
    """Iterate precision when polar_method is polar_express (EO runs MOP at "highest")."""
    eps: float = 1e-7
    """Lower clamp of the Frobenius norm in Newton-Schulz."""
    nonfinite_policy: NonfinitePolicy = "skip"
    """skip | raise (as Muon)."""

    def __post_init__(self) -> None:
        _check_common(self)
        _choice("scale_mode", self.scale_mode, MOP_SCALE_MODES)
        _choice("polar_method", self.polar_method, POLAR_METHODS)
        _range("eps", self.eps, 0.0, 1.0, lo_open=True)


@dataclass(frozen=True, kw_only=True, slots=True)
class SOAPConfig:
    """SOAP / REKLS: Adam in the eigenbasis of Kronecker factors L = E[G G^T], R = E[G^T G].

    Defaults are REKLS (use_eigh and use_kl_shampoo). SOAP proper: use_eigh=False, use_kl_shampoo=False.
    """

    lr: float = 3e-4
    """Learning rate."""
    betas: tuple[float, float] = (0.9, 0.95)
    """Inner Adam (beta1, beta2)."""
    shampoo_beta: float = 0.95
    """EMA coefficient of L and R."""
    eps: float = 1e-8
    """Inner Adam epsilon."""
    eps_eigenvalue: float = 1e-8
    """Clamp of the eigenvalue estimates in the KL-Shampoo correction (EO uses eps)."""
    weight_decay: float = 0.01
    """Decay coefficient; see weight_decay_method."""
    weight_decay_method: WeightDecayMethod = "decoupled"
    """decoupled | independent | l2."""
    use_eigh: bool = True
    """True: eigh every refresh (REKLS); False: one QR power step per refresh (SOAP); the first is always eigh."""
    use_kl_shampoo: bool = True
    """KL-Shampoo factor updates (arXiv 2509.03378)."""
    precondition_frequency: int = 1
    """Refresh the eigenbasis every this many steps (EO: every step)."""
    power_iter_steps: int = 1
    """Power iterations per QR refresh."""
    max_precond_dim: int = 8192
    """A side longer than this keeps the identity basis (no factor, no eigh)."""
    correct_bias: bool = True
    """Adam bias correction and shampoo_beta bias correction."""
    nesterov: bool = False
    """Nesterov variant of the inner Adam momentum."""
    nonfinite_policy: NonfinitePolicy = "skip"
    """skip | raise: a NaN/Inf gradient (checked before any state changes)."""

    def __post_init__(self) -> None:
        _range("lr", self.lr, 0.0, float("inf"))
        for i, b in enumerate(self.betas):
            _range(f"betas[{i}]", b, 0.0, 1.0, hi_open=True)
        if len(self.betas) != 2:
            raise ValueError(f"betas={self.betas!r} must have 2 entries")
        _range("shampoo_beta", self.shampoo_beta, 0.0, 1.0, hi_open=True)
        _range("eps", self.eps, 0.0, 1.0, lo_open=True)
        _range("eps_eigenvalue", self.eps_eigenvalue, 0.0, 1.0, lo_open=True)
        _range("weight_decay", self.weight_decay, 0.0, float("inf"))
        _choice("weight_decay_method", self.weight_decay_method, WEIGHT_DECAY_METHODS)
        for name in ("precondition_frequency", "power_iter_steps", "max_precond_dim"):
            _int(name, getattr(self, name))
            _range(name, getattr(self, name), 1, float("inf"))
        _choice("nonfinite_policy", self.nonfinite_policy, NONFINITE_POLICIES)
        _bools(self, "use_eigh", "use_kl_shampoo", "correct_bias", "nesterov")


@dataclass(frozen=True, kw_only=True, slots=True)
class AdamWConfig:
    """torch.optim.AdamW for the non-matrix parameters, and the AdamW baseline."""

    lr: float = 3e-4
    """Learning rate."""
    betas: tuple[float, float] = (0.9, 0.95)
    """(beta1, beta2); MB recipes use 0.95 for beta2."""
    eps: float = 1e-8
    """Denominator epsilon."""
    weight_decay: float = 0.01
    """Decoupled decay of the decay group (no_decay_1d parameters get 0)."""
    fused: bool | None = None
    """None: fused on CUDA, foreach otherwise."""

    def __post_init__(self) -> None:
        _range("lr", self.lr, 0.0, float("inf"))
        if len(self.betas) != 2:
            raise ValueError(f"betas={self.betas!r} must have 2 entries")
        for i, b in enumerate(self.betas):
            _range(f"betas[{i}]", b, 0.0, 1.0, hi_open=True)
        _range("eps", self.eps, 0.0, 1.0, lo_open=True)
        _range("weight_decay", self.weight_decay, 0.0, float("inf"))
        if self.fused is not None:
            _bools(self, "fused")


@dataclass(frozen=True, kw_only=True, slots=True)
class RoutingConfig:
    """Which parameters the matrix optimizer gets and how fused matrices are split (MCore defaults)."""

    router_to_matrix: bool = True
    """MoE router weight to the matrix optimizer (MCore does so); False sends it to AdamW."""
    split_qkv: bool = True
    """Megatron fused linear_qkv: orthogonalize Q, K, V separately (per query group layout)."""
    split_mla_kv_down: bool = False
    """MLA kv_down (latent rows + rope rows): orthogonalize the two row blocks separately (MCore: joint)."""
    split_gate_up: bool = False
    """Fused [gate; up] fc1 (Megatron linear_fc1, HF experts.gate_up_proj): separately (MCore: joint)."""
    no_decay_1d: bool = True
    """AdamW side: no weight decay on 1-D parameters (norms, biases), as MCore's default."""

    def __post_init__(self) -> None:
        _bools(self, "router_to_matrix", "split_qkv", "split_mla_kv_down", "split_gate_up", "no_decay_1d")
