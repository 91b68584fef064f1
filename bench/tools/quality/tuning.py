"""The tuning protocol of the quality sweep: which trials each optimizer gets, in which order, and its best setting.

A trial is one optimizer at one `Hparams` point. Each optimizer's hyperparameters are tuned one at a time
(coordinate search) in the order of `tune`: a stage runs the dimension's grid with every other value at the best
setting so far (the profile's default before the stage), keeps the point with the lowest finite final validation
loss, and hands it to the next stage. The best setting so far is a point of every later grid, so a stage costs
its grid size minus one run. Dimensions per optimizer (`tuned_dims`), the same count for each:

- AdamW: `lr` (every parameter), `warmup_frac`, `weight_decay`, `beta2`.
- Muon, MOP, SOAP-REKLS: `lr` (the matrices), `adamw_lr` (the AdamW-stepped rest: embeddings, output layer,
  norms; its own value, never the matrices'), `warmup_frac`, `weight_decay`.

A learning-rate stage whose best point is the smallest or largest of its grid extends the grid by one more step of
the grid's ratio in that direction (at most `max_lr_extensions` times), so the best learning rate ends strictly
inside its grid or is reported at the edge. Other dimensions are reported at an edge, not extended (a weight decay
of 0 or a beta2 near 1 is a bound, not a grid choice). After the last stage the best setting is rerun with
`best_lr_seeds - 1` further seeds. Every count (`Walk.num_runs`) comes from the trial files, so what the tuning of
each optimizer cost is read, never assumed. Pure Python: the planner runs where the report is written.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from bench.tools.quality.config import DIMS, QualityConfig, base_optimizer
from optim import registry

LR_DIMS = ("lr", "adamw_lr")
"""Dimensions extended past a grid edge (log-spaced learning rates)."""
ADAMW_DIMS = ("lr", "warmup_frac", "weight_decay", "beta2")
MATRIX_DIMS = ("lr", "adamw_lr", "warmup_frac", "weight_decay")
SHORT = {"lr": "lr", "adamw_lr": "alr", "warmup_frac": "wu", "weight_decay": "wd", "beta2": "b2"}
"""Trial-id prefix of each dimension."""
INF = float("inf")


@dataclass(frozen=True, kw_only=True, slots=True)
class Hparams:
    """One trial's hyperparameters."""

    lr: float
    """Peak LR of the matrices (AdamW: of every parameter)."""
    adamw_lr: float | None
    """Peak LR of the AdamW-stepped non-matrix parameters of a matrix optimizer; None for AdamW itself."""
    warmup_frac: float
    weight_decay: float
    beta2: float
    """AdamW's second-moment decay (the AdamW baseline only; the matrix optimizers keep their YAML's)."""
    seed: int


def _round(x: float) -> float:
    """Six significant digits, as trial ids print them, so a grid point reached two ways is one trial."""
    return float(f"{x:.6g}")


def is_adamw(name: str) -> bool:
    """`name` is the AdamW baseline (no matrix optimizer), tuned on the AdamW dimensions."""
    return not registry.spec(base_optimizer(name)).matrix


def tuned_dims(name: str, cfg: QualityConfig) -> tuple[str, ...]:
    applies = ADAMW_DIMS if is_adamw(name) else MATRIX_DIMS
    return tuple(d for d in cfg.tune if d in applies)


def grid(name: str, dim: str, cfg: QualityConfig) -> tuple[float, ...]:
    return tuple(sorted(cfg.lr_grids[name] if dim == "lr" else cfg.grids[dim]))


def defaults(name: str, cfg: QualityConfig) -> Hparams:
    """The setting before any stage: the LR grid's first point (the lr stage sets it) and the profile's values.
    A matrix optimizer's non-matrix LR is `adamw_lr`, or, only where `adamw_lr` = 0 and untuned, its own LR
    (`tied_adamw_lr`)."""
    lr = grid(name, "lr", cfg)[0]
    adamw_lr = None if is_adamw(name) else (cfg.adamw_lr or lr)
    return Hparams(
        lr=lr,
        adamw_lr=adamw_lr,
        warmup_frac=cfg.warmup_frac,
        weight_decay=cfg.weight_decay,
        beta2=cfg.beta2,
        seed=cfg.seed,
    )


def tied_adamw_lr(name: str, cfg: QualityConfig) -> bool:
    """The non-matrix parameters of `name` follow its matrix LR (the lr-only profiles with `adamw_lr=0`)."""
    return not is_adamw(name) and not cfg.adamw_lr and "adamw_lr" not in tuned_dims(name, cfg)


def _with(hp: Hparams, dim: str, value: float, name: str, cfg: QualityConfig) -> Hparams:
    out = replace(hp, **{dim: value})
    if dim == "lr" and tied_adamw_lr(name, cfg):
        out = replace(out, adamw_lr=value)
    return out


def point(name: str, cfg: QualityConfig, **values: float) -> Hparams:
    """`defaults` with `values` set (a tied non-matrix LR follows `lr`), at the grid's seed."""
    hp = defaults(name, cfg)
    for dim, value in values.items():
        hp = _with(hp, dim, value, name, cfg)
    return hp


def trial_id(name: str, hp: Hparams, cfg: QualityConfig) -> str:
    """`<name>__lr<lr>[__<dim><value> for the other tuned dims]__seed<seed>` (an lr-only profile: the ids the
    sweep always had)."""
    dims = tuned_dims(name, cfg)
    parts = [f"{SHORT[d]}{getattr(hp, d):g}" for d in DIMS if d == "lr" or d in dims]
    return "__".join([name, *parts, f"seed{hp.seed}"])


def hparams_of(trial: dict[str, Any], cfg: QualityConfig) -> Hparams:
    """A trial file's hyperparameters (files written before `hparams` was recorded: lr and seed, the rest the
    profile's)."""
    if "hparams" in trial:
        return Hparams(**trial["hparams"])
    base = defaults(trial["optimizer"], cfg)
    return replace(_with(base, "lr", trial["lr"], trial["optimizer"], cfg), seed=trial["seed"])


def as_dict(hp: Hparams) -> dict[str, Any]:
    return asdict(hp)


@dataclass(kw_only=True, slots=True)
class Stage:
    """One dimension's sweep."""

    dim: str
    values: list[float]
    """The grid, extensions included, ascending."""
    losses: dict[float, float] = field(default_factory=dict)
    """Final validation loss per finished point (inf: diverged or failed)."""
    best: float | None = None
    extensions: int = 0
    at_edge: bool = False
    """The best point is the smallest or largest of `values` (for an LR dimension: after every extension)."""

    @property
    def complete(self) -> bool:
        return self.best is not None


@dataclass(kw_only=True, slots=True)
class Walk:
    """Where `name`'s tuning stands, read from the finished trials."""

    name: str
    stages: list[Stage] = field(default_factory=list)
    todo: list[Hparams] = field(default_factory=list)
    """The trials that can run now (all of one stage, or the seeds)."""
    best: Hparams | None = None
    """The best setting once every stage is complete; None before, or when a whole stage diverged."""
    seeds: list[dict[str, Any]] = field(default_factory=list)
    """Finished trials at `best` (grid seed first)."""
    tuning_ids: list[str] = field(default_factory=list)
    """Every finished or planned trial id at the grid seed."""
    num_remaining: int = 0
    """Trials not yet known to be planned: the later stages' grid sizes minus one, and the missing seeds."""
    failed_stage: str | None = None
    """The dimension whose every point diverged or failed (tuning stops there)."""

    @property
    def num_tuning_runs(self) -> int:
        return len(self.tuning_ids)

    @property
    def num_runs(self) -> int:
        """Trials this optimizer costs so far: its tuning runs and its extra seeds."""
        return self.num_tuning_runs + max(0, len(self.seeds) - 1)


def num_seeds(name: str, cfg: QualityConfig) -> int:
    """Seeds at `name`'s best setting, the grid's included."""
    return cfg.best_lr_seeds if name in cfg.seed_optimizers else 1


def _extend(values: list[float], stage: Stage) -> float:
    ratio = values[1] / values[0]
    return _round(values[0] / ratio) if stage.best == values[0] else _round(values[-1] * ratio)


def walk(name: str, cfg: QualityConfig, done: dict[str, dict[str, Any]]) -> Walk:
    """Replay `name`'s protocol over the finished trials `done` (id -> trial): the stages so far, and what runs
    next."""
    w = Walk(name=name)
    dims = tuned_dims(name, cfg)
    inc = defaults(name, cfg)

    def final(hp: Hparams) -> float | None:
        t = done.get(trial_id(name, hp, cfg))
        return None if t is None else t["final_val_loss"]

    for i, dim in enumerate(dims):
        stage = Stage(dim=dim, values=list(grid(name, dim, cfg)))
        w.stages.append(stage)
        while True:
            points = [_with(inc, dim, v, name, cfg) for v in stage.values]
            for p in points:
                tid = trial_id(name, p, cfg)
                if tid not in w.tuning_ids:
                    w.tuning_ids.append(tid)
            stage.losses = {v: f for v, p in zip(stage.values, points) if (f := final(p)) is not None}
            w.todo = [p for v, p in zip(stage.values, points) if v not in stage.losses]
            if w.todo:
                later = sum(len(grid(name, d, cfg)) - 1 for d in dims[i + 1 :])
                w.num_remaining = later + num_seeds(name, cfg) - 1
                return w
            finite = {v: f for v, f in stage.losses.items() if f < INF}
            if not finite:
                w.failed_stage = dim
                return w
            stage.best = min(finite, key=lambda v: (finite[v], v))
            stage.at_edge = len(stage.values) > 1 and stage.best in (stage.values[0], stage.values[-1])
            if stage.at_edge and dim in LR_DIMS and stage.extensions < cfg.max_lr_extensions:
                stage.values = sorted([*stage.values, _extend(stage.values, stage)])
                stage.extensions += 1
                stage.best, stage.at_edge = None, False
                continue
            break
        inc = _with(inc, dim, stage.best, name, cfg)
    w.best = inc
    at_best = [replace(inc, seed=cfg.seed + k) for k in range(num_seeds(name, cfg))]
    w.seeds = [t for p in at_best if (t := done.get(trial_id(name, p, cfg))) is not None]
    w.todo = [p for p in at_best if trial_id(name, p, cfg) not in done]
    return w


def num_planned(cfg: QualityConfig, done: dict[str, dict[str, Any]]) -> int:
    """Trials of the whole sweep as far as they are known now (a learning-rate extension adds to it later)."""
    total = 0
    for name in cfg.optimizers:
        w = walk(name, cfg, done)
        if w.best is None:
            total += w.num_tuning_runs + w.num_remaining
        else:
            total += w.num_tuning_runs + num_seeds(name, cfg) - 1
    return total
