"""Quality bench configuration: profiles, tuning grids and the `key=value` command line.

Each optimizer is `conf/optimizer/<name>.yaml` composed as every other command composes it (`muonbench.load`),
with the trial's hyperparameters (`bench.tools.quality.tuning.Hparams`), the profile's precisions, and
`OPTIMIZER_OVERRIDES`: the bench's only departures from the YAML. A profile is a complete set of defaults:
`compute_optimal` (a dense 10.3 M-parameter model for 20 tokens per parameter, every optimizer tuned the same way,
3 seeds; one H100 / H200, docs/quality.md), `compute_optimal_tiny` (its pipeline at toy size on a CPU), `cpu` (the
stdlib learning-rate sweep on a laptop CPU), `gpu` (the Qwen3-MoE 123 M learning-rate sweep, 0.13 tokens per
parameter, on one H200) and `tiny` (the gpu profile's pipeline at toy size). Every key but the grids can be
overridden on the command line; `lr_grids` and `grids` come from the profile only, so every optimizer keeps the
same number of points per dimension.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from optim.configs import NS_PRECISIONS, POLAR_METHODS

DIMS = ("lr", "adamw_lr", "warmup_frac", "weight_decay", "beta2")
"""Every tunable dimension, in the order a trial id names them."""

OPTIMIZERS = ("adamw", "muon", "muon_split_gate_up", "mop", "soap_rekls")
"""`optimizer=` names of conf/optimizer/ the bench sweeps."""
CORPORA = ("stdlib", "python_packages")

# Peak learning rates per optimizer; each grid has the same number of points (fair sweep). Muon and MOP use the
# spectral scale x 0.2 (AdamW-matched update RMS), so AdamW's grid is the natural starting point for theirs.
LR_GRIDS: dict[str, tuple[float, ...]] = {
    "adamw": (1e-3, 3e-3, 1e-2, 3e-2),
    "muon": (1e-3, 3e-3, 1e-2, 3e-2),
    "mop": (1e-3, 3e-3, 1e-2, 3e-2),
    "soap_rekls": (1e-3, 3e-3, 1e-2, 3e-2),
}
# The gpu profile: the cpu sweep's best points (AdamW and SOAP-REKLS 3e-3, Muon and MOP 1e-2) one grid step from
# each edge, so an optimum that moves by one x3 step with the larger model stays inside the grid.
LR_GRIDS_GPU: dict[str, tuple[float, ...]] = {
    "adamw": (3e-4, 1e-3, 3e-3, 1e-2),
    "muon": (1e-3, 3e-3, 1e-2, 3e-2),
    "mop": (1e-3, 3e-3, 1e-2, 3e-2),
    "soap_rekls": (3e-4, 1e-3, 3e-3, 1e-2),
}
VARIANTS: dict[str, str] = {
    # fused [gate; up] fc1 (HF experts.gate_up_proj) orthogonalized as two halves (Moonlight / HF layout);
    # plain "muon" keeps the joint matrix (Megatron-core's default).
    "muon_split_gate_up": "muon",
}
"""Optimizer entries that are a routing variant of another (its own YAML): they share the base's LR grid, so the
sweep stays fair."""
# compute_optimal: x2 steps around the usual optimum of a 10 M model at this batch (AdamW 2e-3 to 4e-3; Muon and MOP
# at AdamW-matched update RMS a step higher); a best point on an edge extends the grid (`max_lr_extensions`).
LR_GRIDS_OPTIMAL: dict[str, tuple[float, ...]] = {
    "adamw": (1e-3, 2e-3, 4e-3, 8e-3),
    "muon": (2e-3, 4e-3, 8e-3, 1.6e-2),
    "mop": (2e-3, 4e-3, 8e-3, 1.6e-2),
    "soap_rekls": (1e-3, 2e-3, 4e-3, 8e-3),
}
LR_GRIDS_OPTIMAL_TINY: dict[str, tuple[float, ...]] = {name: g[:3] for name, g in LR_GRIDS_OPTIMAL.items()}
for _grids in (LR_GRIDS, LR_GRIDS_GPU, LR_GRIDS_OPTIMAL, LR_GRIDS_OPTIMAL_TINY):
    _grids |= {name: _grids[base] for name, base in VARIANTS.items()}
GRIDS_OPTIMAL: dict[str, tuple[float, ...]] = {
    "adamw_lr": (1e-3, 3e-3, 1e-2),
    "warmup_frac": (0.02, 0.05, 0.1),
    "weight_decay": (0.0, 0.1, 0.2),
    "beta2": (0.9, 0.95, 0.99),
}
"""The other dimensions' grids (every optimizer the same); each profile default is a point of its grid."""
GRIDS_OPTIMAL_TINY: dict[str, tuple[float, ...]] = {
    "adamw_lr": (3e-3, 1e-2),
    "warmup_frac": (0.05, 0.1),
    "weight_decay": (0.0, 0.1),
    "beta2": (0.95, 0.99),
}

OPTIMIZER_OVERRIDES: dict[str, tuple[str, ...]] = {
    # spectral scale x 0.2 (AdamW-matched update RMS): one LR grid serves Muon, MOP and AdamW alike
    "muon": ("optimizer.extra_scale_factor=0.2",),
    "mop": ("optimizer.scale_mode=spectral", "optimizer.extra_scale_factor=0.2"),
}
"""Per base optimizer: where the quality bench departs from its conf/optimizer YAML."""
PROFILE_OPTIMIZER_KEYS: dict[str, tuple[str, ...]] = {
    "muon": ("ns_precision",),
    "mop": ("polar_method",),
    "soap_rekls": ("precondition_frequency",),
}
"""Per base optimizer: the QualityConfig keys that set the same-named optimizer field."""


def base_optimizer(name: str) -> str:
    return VARIANTS.get(name, name)


def optimizer_overrides(name: str, cfg: QualityConfig) -> list[str]:
    """The `muonbench.load` overrides of `name`'s trials (the peak LR is set per trial)."""
    base = base_optimizer(name)
    keys = ("weight_decay", *PROFILE_OPTIMIZER_KEYS.get(base, ()))
    return [
        f"optimizer={name}",
        *(f"optimizer.{k}={getattr(cfg, k)}" for k in keys),
        *OPTIMIZER_OVERRIDES.get(base, ()),
    ]


PROFILES: dict[str, dict[str, Any]] = {
    # 2 cores, under 30 minutes for 4 optimizers x 4 learning rates.
    "cpu": {
        "device": "cpu",
        "model": "qwen3_moe_tiny",
        "vocab_size": 2048,
        "seq_len": 128,
        "batch_size": 16,
        "steps": 400,
        "eval_every": 25,
        "val_batches": 8,
        "hidden_size": 128,
        "num_layers": 2,
        "price_per_hour": 0.0,
    },
    # One H200, ~7 minutes for 22 trials: 122.8 M total / 34.7 M active parameters (conf/model/qwen3_moe_125m),
    # 240 steps of 128 x 512 tokens = 15.7 M tokens per trial, 25 evaluations. Throughput estimate: 169.9 MFLOP
    # per token (bench.flops) at 25-40% of the 989 TFLOP/s bf16 peak = 1.5-2.3 M tokens/s, 7-11 s of training
    # per trial; 128 MB of source encoded (~40 M tokens), the BPE trained on 32 MB of it.
    "gpu": {
        "device": "cuda",
        "model": "qwen3_moe_125m",
        "vocab_size": 16384,
        "seq_len": 512,
        "batch_size": 128,
        "steps": 240,
        "eval_every": 10,
        "val_batches": 4,
        "hidden_size": 512,
        "num_layers": 8,
        "price_per_hour": 3.5,
        "lr_grids": LR_GRIDS_GPU,
        "corpus": "python_packages",
        "corpus_max_mb": 128.0,
        "tokenizer_train_mb": 32.0,
        "optimizers": OPTIMIZERS,
        "best_lr_seeds": 2,
        "ns_precision": "bf16",
        "polar_method": "polar_express",
        "precondition_frequency": 10,
        "prewarm_steps": 3,
    },
    # The gpu profile's pipeline (package corpus, seeds, resumable trials) at toy size on a CPU (~2 minutes).
    "tiny": {
        "device": "cpu",
        "model": "qwen3_moe_tiny",
        "vocab_size": 512,
        "seq_len": 32,
        "batch_size": 4,
        "steps": 24,
        "eval_every": 3,
        "val_batches": 2,
        "hidden_size": 32,
        "num_layers": 2,
        "corpus": "python_packages",
        "corpus_max_mb": 2.0,
        "tokenizer_train_mb": 1.0,
        "optimizers": OPTIMIZERS,
        "best_lr_seeds": 2,
        "polar_method": "polar_express",
        "precondition_frequency": 2,
        "prewarm_steps": 1,
    },
    # Compute-optimal on one H100 / H200 (docs/quality.md has the arithmetic): a dense Qwen3 of 10.33 M
    # non-embedding parameters, 1576 steps of 256 x 512 tokens = 206.6 M tokens (20.0 per non-embedding parameter);
    # 87.9 MFLOP per token, 1.82e16 FLOP per trial: 122 s at 15% of an H100's 989 TFLOP/s bf16 peak.
    "compute_optimal": {
        "device": "cuda",
        "model": "qwen3_dense_10m",
        "vocab_size": 8192,
        "seq_len": 512,
        "batch_size": 256,
        "steps": 1576,
        "eval_every": 50,
        "val_batches": 4,
        "hidden_size": 384,
        "num_layers": 6,
        "price_per_hour": 3.5,
        "corpus": "python_packages",
        "tokenizer_train_mb": 64.0,
        "optimizers": ("adamw", "muon", "mop", "soap_rekls"),
        "seed_optimizers": ("adamw", "muon", "mop", "soap_rekls"),
        "best_lr_seeds": 3,
        "tune": DIMS,
        "max_lr_extensions": 2,
        "adamw_lr": 3e-3,
        "warmup_frac": 0.05,
        "weight_decay": 0.1,
        "beta2": 0.95,
        "lr_grids": LR_GRIDS_OPTIMAL,
        "grids": GRIDS_OPTIMAL,
        "ns_precision": "bf16",
        "polar_method": "polar_express",
        "precondition_frequency": 10,
        "prewarm_steps": 3,
    },
    # The compute_optimal protocol (every stage, extensions, 3 seeds, summary.json) at toy size on a CPU.
    "compute_optimal_tiny": {
        "device": "cpu",
        "model": "qwen3_dense_10m",
        "vocab_size": 512,
        "seq_len": 32,
        "batch_size": 4,
        "steps": 12,
        "eval_every": 3,
        "val_batches": 2,
        "hidden_size": 32,
        "num_layers": 2,
        "corpus": "python_packages",
        "corpus_max_mb": 2.0,
        "tokenizer_train_mb": 1.0,
        "optimizers": ("adamw", "muon", "mop", "soap_rekls"),
        "seed_optimizers": ("adamw", "muon", "mop", "soap_rekls"),
        "best_lr_seeds": 3,
        "tune": DIMS,
        "max_lr_extensions": 1,
        "adamw_lr": 3e-3,
        "warmup_frac": 0.05,
        "weight_decay": 0.1,
        "beta2": 0.95,
        "lr_grids": LR_GRIDS_OPTIMAL_TINY,
        "grids": GRIDS_OPTIMAL_TINY,
        "polar_method": "polar_express",
        "precondition_frequency": 2,
    },
}
# Keys that do not change what a trial computes: they may differ between the pieces of one sweep.
RESUMABLE_KEYS = (
    "out",
    "budget_s",
    "cache",
    "optimizers",
    "best_lr_seeds",
    "seed_optimizers",
    "price_per_hour",
)


@dataclass(kw_only=True)
class QualityConfig:
    profile: str = "cpu"
    device: str = "cpu"
    model: str = "qwen3_moe_tiny"
    vocab_size: int = 2048
    seq_len: int = 128
    batch_size: int = 16
    steps: int = 400
    warmup_frac: float = 0.05
    """Linear warm-up, as a fraction of the steps (a tuned dimension under `tune`: its starting value)."""
    min_lr_frac: float = 0.1
    eval_every: int = 25
    val_batches: int = 8
    hidden_size: int = 128
    num_layers: int = 2
    seed: int = 1234
    weight_decay: float = 0.01
    """Decoupled weight decay of every optimizer, both sides (tuned: the starting value)."""
    beta2: float = 0.95
    """AdamW's second-moment decay (tuned: the starting value); the matrix optimizers keep their YAML's."""
    adamw_lr: float = 0.0
    """Peak LR of the AdamW-stepped non-matrix parameters (embeddings, output layer, norms) of Muon, MOP and
    SOAP-REKLS (tuned: the starting value); 0 where untuned = the trial's matrix LR, as the cpu and gpu profiles
    ran (the report says so)."""
    tune: tuple[str, ...] = ("lr",)
    """Dimensions tuned one after another (`bench.tools.quality.tuning`), `lr` first; each optimizer takes those
    that apply to it."""
    max_lr_extensions: int = 0
    """A learning-rate grid whose best point is on an edge grows by one step that way, at most this many times."""
    price_per_hour: float = 0.0
    optimizers: tuple[str, ...] = ("adamw", "muon", "mop", "soap_rekls")
    out: str = "runs/quality"
    """The sweep's folder; a rerun with the same `out` resumes. Not given: a fresh `runs/quality_<profile>_<time>`
    (`fresh_out`), so a default run never resumes or rewrites another run's or a committed report's files."""
    corpus: str = "stdlib"
    """stdlib: top-level stdlib modules, every 10th held out; python_packages: every `.py` file of site-packages
    and the stdlib, deduplicated, held out by path hash (bench.tools.quality.corpus)."""
    corpus_roots: tuple[str, ...] = ()
    """python_packages: the directories to read; empty = this interpreter's site-packages and stdlib."""
    corpus_max_mb: float = 0.0
    """python_packages: encode at most this many MB of training files (in path-hash order); 0 = all."""
    tokenizer_train_mb: float = 0.0
    """Train the BPE on at most this many MB of training files (in split order); 0 = all."""
    best_lr_seeds: int = 1
    """Seeds run at the best learning rate of each `seed_optimizers` entry (1 = the grid's seed only)."""
    seed_optimizers: tuple[str, ...] = ("adamw", "muon")
    """Optimizers rerun with `best_lr_seeds` seeds at their best setting."""
    ns_precision: str = "fp32"
    """Muon's Newton-Schulz iterate dtype."""
    polar_method: str = "svd"
    """MOP's polar factor: exact SVD or Polar Express iterations."""
    precondition_frequency: int = 1
    """SOAP-REKLS: eigh refresh of the eigenbases every this many steps."""
    prewarm_steps: int = 0
    """Untimed steps of each optimizer on a throwaway model before its first trial in a process (kernel
    compilation, NS plan measurement, cuBLAS / cuSOLVER workspaces), then one evaluation; 0 = no prewarm. For an
    optimizer without a finished trial, at least 1 + its refresh period (1 + `precondition_frequency` for
    SOAP-REKLS, 2 for the others): the mean time of the steps after the first estimates its trials."""
    budget_s: float = 0.0
    """Start a trial only if its estimate says it ends within this many seconds of the process's start; 0 = no
    limit. Estimate (`bench.tools.quality.sweep.estimate_trial_s`): the mean duration of that optimizer's finished
    trials; with none, steps x its prewarm's seconds per step + the evaluations + the build; without a prewarm
    measurement, the other optimizers' mean. A rerun with the same `out` resumes. SIGTERM or SIGINT drops the
    trial in progress, records the piece and exits with 128 + the signal number."""
    cache: str = ""
    """Directory of the encoded corpus; empty = quality/ in muonbench's cache folder (optim/cache.py)."""
    lr_grids: dict[str, tuple[float, ...]] = field(default_factory=lambda: dict(LR_GRIDS))
    grids: dict[str, tuple[float, ...]] = field(default_factory=dict)
    """Grid of each tuned dimension but `lr` (the profile's)."""

    def __post_init__(self) -> None:
        checks = (
            ("profile", (self.profile,), tuple(sorted(PROFILES))),
            ("optimizers", self.optimizers, OPTIMIZERS),
            ("seed_optimizers", self.seed_optimizers, OPTIMIZERS),
            ("corpus", (self.corpus,), CORPORA),
            ("polar_method", (self.polar_method,), POLAR_METHODS),
            ("ns_precision", (self.ns_precision,), NS_PRECISIONS),
            ("tune", self.tune, DIMS),
        )
        for key, values, allowed in checks:
            for v in values:
                if v not in allowed:
                    raise ValueError(f"{key}={v!r} is not one of {sorted(allowed)}")
        if self.steps < 2 * self.eval_every:
            raise ValueError(f"steps={self.steps}: must be >= 2 x eval_every ({2 * self.eval_every})")
        if self.best_lr_seeds < 1:
            raise ValueError(f"best_lr_seeds={self.best_lr_seeds}: must be >= 1")
        if self.precondition_frequency < 1:
            raise ValueError(f"precondition_frequency={self.precondition_frequency}: must be >= 1")
        if self.tune[:1] != ("lr",):
            raise ValueError(f"tune={','.join(self.tune)!r}: must start with 'lr'")
        if not 0.0 < self.beta2 < 1.0:
            raise ValueError(f"beta2={self.beta2}: must be in (0, 1)")
        for dim in self.tune[1:]:
            start = getattr(self, dim)
            if float(f"{start:.6g}") not in self.grids.get(dim, ()):
                raise ValueError(f"{dim}={start:g}: must be one of its grid {list(self.grids.get(dim, ()))}")

    def as_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}

    def trial_dict(self) -> dict[str, Any]:
        """The keys that fix what one trial computes (all but RESUMABLE_KEYS and the grids)."""
        return {k: v for k, v in self.as_dict().items() if k not in (*RESUMABLE_KEYS, "lr_grids", "grids")}

    def trial_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.trial_dict(), sort_keys=True).encode()).hexdigest()[:12]


PROFILE_ONLY = ("lr_grids", "grids")
"""Keys a profile sets and the command line cannot (every optimizer keeps the same grid sizes)."""


def fresh_out(profile: str, root: str = "runs") -> str:
    """A folder under `root` that does not exist yet: `quality_<profile>_<yyyymmdd_hhmmss>` (`.2`, ... within one
    second)."""
    from datetime import datetime

    base = Path(root) / f"quality_{profile}_{datetime.now().strftime('%Y%m%d_%H%M%S')}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}.{n}")
    return str(path)


def parse_cli(argv: list[str]) -> QualityConfig:
    kv = dict(a.split("=", 1) for a in argv if "=" in a)
    bad = [a for a in argv if "=" not in a]
    if bad:
        raise ValueError(f"arguments must be key=value, got {bad}")
    profile = kv.pop("profile", "cpu")
    if profile not in PROFILES:
        raise ValueError(f"profile={profile!r}: must be one of {sorted(PROFILES)}")
    base: dict[str, Any] = dict(PROFILES[profile], profile=profile)
    base["lr_grids"] = dict(base.get("lr_grids", LR_GRIDS))
    base["grids"] = dict(base.get("grids", {}))
    if "out" not in kv:
        base["out"] = fresh_out(profile)
    fields = QualityConfig.__dataclass_fields__
    for key, raw in kv.items():
        if key not in fields or key in PROFILE_ONLY:
            raise ValueError(
                f"unknown key {key!r}; allowed: {sorted(k for k in fields if k not in PROFILE_ONLY)}"
            )
        kind = str(fields[key].type)  # the annotation (a string under postponed evaluation)
        if kind.startswith("tuple"):
            base[key] = tuple(x for x in raw.split(",") if x)
        elif kind == "bool":
            base[key] = raw.lower() in ("1", "true", "yes")
        elif kind in ("int", "float"):
            try:
                base[key] = int(raw) if kind == "int" else float(raw)
            except ValueError:
                raise ValueError(f"{key}={raw!r}: must be an {kind}") from None
        else:
            base[key] = raw
    return QualityConfig(**base)
