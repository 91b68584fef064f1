"""Recommended Muon settings for a model, layout and hardware, priced by the performance model:
`python -m bench.tools.recommend` (`make recommend ARGS=...`).

    python -m bench.tools.recommend model=qwen3_30b_a3b parallelism=dp8_ep8 hardware=h200 [numerics=allow]
        [out=DIR] [format=json] [quality=reports/quality_<gpu>_<yyyymm> [horizon_tokens=N]]

With `quality=` (a quality report folder or its summary.json) it also prints the GPU-hours to reach AdamW's loss
(`bench.tools.quality.milestone`: the measured token ratio x the predicted step times, at `horizon_tokens` or the
measurement's tokens per parameter), naming the measurement and horizon it rests on.

Everything except the CLI-only keys `out`, `format`, `numerics`, `quality` and `horizon_tokens` is a Hydra override composed by `muonbench.load`
(the optimizer is Muon; the engine defaults as `project`'s, `project.DEFAULT_ENGINE`). The search prices
with `bench.tools.perfmodel` (profile `ours`, NS precision and Gram-NS as configured) every option the product has:
the TP Newton-Schulz mode (where TP or expert-TP > 1), the layer-wise assignment, split QKV and split gate / up
(jointly), then NS overlap, NS precision, Gram-NS and the coefficient set with its step count (one at a time from
the best layout, the layout searched again if one of them changed). Settings that change the update itself (split
QKV, NS precision, Gram-NS, coefficient set and steps) keep their configured values unless `numerics=allow`; with
it, a set and step count is a candidate only if its singular values end as close to 1 as the configured ones
(`recommend_checks.band_error`). Ties (within `TIE_REL`) go to the configured values. Every candidate is validated as `bench.run`
validates it and only runnable ones are priced; the winner is composed again from its overrides through
`muonbench.load`, checked by `muonbench.check_runnable` (and the Bridge plan for engine=bridge), and its optimizer is
built and stepped on a tiny CPU slice of the model (`recommend_checks.build_on_cpu`).

Prints the set with one reason per choice, the predicted step time and Muon/AdamW model-only ratio (AdamW step time
over Muon's: the ratio of model TFLOP/s per GPU), the optimizer step and Newton-Schulz seconds per GPU, the memory of
weights, gradients and optimizer state per GPU, and writes `scaling.csv` / `scaling.png` (the ratio over
data-parallel sizes 8 to 1024) and `recommendation.json` into `out` (default
runs/recommend/<model>_<parallelism>_<hardware>_<engine>).
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
import sys
from pathlib import Path
from typing import Any

from bench.tools import project
from bench.tools.quality import milestone
from muonbench import engines
from muonbench.schema import RootConfig
from optim.configs import NS_PRECISIONS, TP_MODE_CHOICES
from optim.distributed.assignment import Strategy

CLI_KEYS = ("out", "format", "numerics", "quality", "horizon_tokens")
NUMERICS = ("keep", "allow")
"""`numerics=`: keep the configured NS precision, Gram-NS, coefficient set and steps, or allow changing them."""
PROFILE = "ours"
DP_SIZES = tuple(2**k for k in range(3, 11))
"""Data-parallel sizes of the scaling curve: 8 to 1024."""
LAYOUT = ("tp_mode", "assignment", "split_qkv", "split_gate_up")
"""Searched jointly: they decide which matrices each GPU orthogonalizes, and how."""
STEP = ("ns_overlap", "ns_precision", "use_gram_ns", "coefficients")
"""Searched one at a time from the best layout; `coefficients` is the pair (coefficient_type, num_ns_steps)."""
NUMERICS_CHANGING = ("split_qkv", "ns_precision", "use_gram_ns", "coefficients")
"""Searched only with numerics=allow: they change the update, and no quality measurement says by how little (split
gate / up has one: reports/quality_cpu_split_gate_up_202612, the same loss; it is searched by default)."""
TIE_REL = 1e-4
"""Step times within this fraction of the fastest are ties (far below the model's resolution): the configured value
stays."""
DIST_FIELDS = ("tp_mode", "assignment")
SEARCHED = (*LAYOUT, "ns_overlap", "ns_precision", "use_gram_ns", "coefficient_type", "num_ns_steps")
"""Every setting a candidate row carries."""
PRECISION_ORDER = tuple(sorted(NS_PRECISIONS, key=("fp16", "bf16", "fp32").index))
"""NS precisions in the order equal-cost ones are preferred: fp16 and bf16 cost the same, fp16 is more accurate."""
GRAM_UNSAFE_SETS = ("cans",)
"""Gram-NS diverges with these sets below fp32 (optim/functional/newton_schulz.py): never offered there."""
MEASURED = {
    "split_gate_up": "the same loss split or joint (reports/quality_cpu_split_gate_up_202612)",
    "fp16": "fp16 iterates closer to fp32 NS than bf16 at the same GEMM rate (docs/ns_kernels_h200.md)",
    "ns_overlap": "the cost model charges overlapped NS in full: on one H200 it hid nothing, the backward already "
    "holds the GPU at its power cap (docs/megatron_h200.md), and its results wait in memory (2 B per element)",
}


def split_args(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """CLI-only keys (out, format, numerics) and the Hydra overrides; optimizer=muon unless given, the engine as
    `project.with_default_engine`."""
    cli, overrides = project.split_args(argv, CLI_KEYS)
    if cli.get("numerics", "keep") not in NUMERICS:
        raise ValueError(f"numerics={cli['numerics']!r}: allowed {list(NUMERICS)}")
    for arg in overrides:
        key, _, value = arg.partition("=")
        if key == "optimizer" and value != "muon":
            raise ValueError(f"optimizer={value!r}: the recommendation is for Muon; allowed ['muon']")
    if not any(a.startswith("optimizer=") for a in overrides):
        overrides.insert(0, "optimizer=muon")
    return cli, project.with_default_engine(overrides)


def settings_of(root: RootConfig) -> dict[str, Any]:
    """The searched settings of `root`, flat (a candidate row's keys)."""
    opt, dist = root.optimizer, root.parallelism.distribution
    return {
        "tp_mode": dist.tp_mode,
        "assignment": dist.assignment,
        **{k: getattr(opt, k) for k in SEARCHED if k not in DIST_FIELDS},
    }


def apply(root: RootConfig, settings: dict[str, Any]) -> RootConfig:
    """`root` with `settings` (flat, as `settings_of`) in its optimizer and distribution."""
    par = root.parallelism
    dist = {k: v for k, v in settings.items() if k in DIST_FIELDS}
    opt = {k: v for k, v in settings.items() if k not in DIST_FIELDS}
    par = dataclasses.replace(par, distribution=dataclasses.replace(par.distribution, **dist))
    return dataclasses.replace(root, parallelism=par, optimizer=dataclasses.replace(root.optimizer, **opt))


def runnable(root: RootConfig) -> str | None:
    """None when the product runs `root` (validated as bench.run does, optimizer configs built), else why not."""
    import muonbench
    from muonbench.schema import optim_configs

    try:
        muonbench.validate(root)
        muonbench.check_runnable(root)
        algo, routing, _ = optim_configs(root.optimizer)
        if root.optimizer.implementation == "megatron":  # what Megatron-core's Muon can follow
            from optim.megatron.config import megatron_muon_fields

            tp_mode = root.parallelism.distribution.tp_mode
            megatron_muon_fields(algo, routing, "blockwise" if tp_mode == "auto" else tp_mode)
        engines.preflight(root)  # as bench.run's preflight (bench.sweep.preflight)
    except ValueError as exc:
        return str(exc)
    return None


def options(root: RootConfig, *, allow_numerics: bool) -> dict[str, tuple[Any, ...]]:
    """The values searched per setting, the configured one first (ties keep it)."""
    from bench.tools.recommend_checks import band_error, keeps_quality
    from optim.functional.newton_schulz import COEFFICIENT_SETS

    par, model, opt = root.parallelism, root.model, root.optimizer
    conf = settings_of(root)

    def first(name: str, values: tuple[Any, ...]) -> tuple[Any, ...]:
        return (conf[name], *(v for v in values if v != conf[name]))

    sharded = par.tp > 1 or (model.num_experts > 0 and par.etp > 1)
    out = {
        "tp_mode": first("tp_mode", tuple(map(str, TP_MODE_CHOICES)) if sharded else ()),
        "assignment": first("assignment", tuple(s.value for s in Strategy)),
        "split_qkv": first("split_qkv", (True, False) if model.attention == "gqa" and allow_numerics else ()),
        "split_gate_up": first("split_gate_up", (False, True) if model.gated_linear_unit else ()),
        "ns_overlap": first("ns_overlap", (False, True) if engines.spec(root.engine.name).ns_overlap else ()),
    }
    base = (opt.coefficient_type, opt.num_ns_steps)
    coeffs: list[tuple[str, int]] = [base]
    if allow_numerics and opt.coefficient_type != "custom":
        for k in range(1, opt.num_ns_steps + 1):  # more steps never cost less; per step count the closest set
            fit = [n for n in COEFFICIENT_SETS if keeps_quality(n, k, baseline=base)]
            if fit:
                coeffs.append((min(fit, key=lambda n, k=k: band_error(n, k)), k))
    out["coefficients"] = tuple(dict.fromkeys(coeffs))
    out["ns_precision"] = first("ns_precision", PRECISION_ORDER if allow_numerics else ())
    out["use_gram_ns"] = first("use_gram_ns", (False, True) if allow_numerics else ())
    return out


def quality_refusal(cand: dict[str, Any]) -> str | None:
    """Why a runnable candidate is still never offered (its numerics are known bad), or None."""
    unsafe = cand["coefficient_type"] in GRAM_UNSAFE_SETS and cand["ns_precision"] != "fp32"
    if cand["use_gram_ns"] and unsafe:
        return (
            f"use_gram_ns=True with coefficient_type={cand['coefficient_type']!r} in {cand['ns_precision']} "
            "diverges (optim/functional/newton_schulz.py)"
        )
    return None


class Search:
    """Prices candidates (memoised by their settings) and picks the fastest runnable one."""

    def __init__(self, root: RootConfig, *, allow_numerics: bool) -> None:
        self.root, self.allow = root, allow_numerics
        self.conf = settings_of(root)
        self.opts = options(root, allow_numerics=allow_numerics)
        self.rows: dict[tuple[Any, ...], dict[str, Any]] = {}

    def price(self, cand: dict[str, Any]) -> dict[str, Any]:
        from bench.tools.perfmodel.model import predict

        key = tuple(cand[k] for k in SEARCHED)
        if key in self.rows:
            return self.rows[key]
        root = apply(self.root, cand)
        why_not = runnable(root) or quality_refusal(cand)
        row: dict[str, Any] = {**cand, "runnable": why_not is None, "why_not": why_not}
        if why_not is None:
            pred = predict(root, PROFILE, ns_as_configured=True)
            row |= {
                "step_time_s": pred.step_time_s,
                "optimizer_step_s": pred.breakdown["optimizer_step"],
                "ns_s": pred.info["ns_s"],
            }
        self.rows[key] = row
        return row

    def changes(self, row: dict[str, Any]) -> int:
        return sum(row[k] != self.conf[k] for k in SEARCHED)

    def best(self, cands: list[dict[str, Any]]) -> dict[str, Any]:
        """The fastest runnable candidate; within `TIE_REL` the fewest changes, then the first (configured
        first)."""
        ok = [r for r in (self.price(c) for c in cands) if r["runnable"]]
        if not ok:
            why = self.price(cands[0])["why_not"]
            raise ValueError(f"no runnable Muon setting for this config; first reason: {why}")
        fastest = min(r["step_time_s"] for r in ok)
        return min((r for r in ok if r["step_time_s"] <= fastest * (1 + TIE_REL)), key=self.changes)

    def layout(self, at: dict[str, Any]) -> dict[str, Any]:
        cands = [
            {**at, **dict(zip(LAYOUT, combo, strict=True))}
            for combo in itertools.product(*(self.opts[k] for k in LAYOUT))
        ]
        return self.best(cands)

    @staticmethod
    def with_(row: dict[str, Any], name: str, value: Any) -> dict[str, Any]:
        cand = {k: row[k] for k in SEARCHED}
        if name == "coefficients":
            cand["coefficient_type"], cand["num_ns_steps"] = value
        else:
            cand[name] = value
        return cand

    def run(self) -> dict[str, Any]:
        best = self.layout(dict(self.conf))
        for name in STEP:
            best = self.best([self.with_(best, name, v) for v in self.opts[name]])
        if any(best[k] != self.conf[k] for k in SEARCHED if k not in LAYOUT):
            best = self.layout({k: best[k] for k in SEARCHED})
        return best


def _fmt(row: dict[str, Any], best: dict[str, Any] | None = None) -> str:
    """A priced row: its step time and NS seconds, or against `best` the difference; or why it cannot run."""
    if not row["runnable"]:
        return f"not runnable ({row['why_not']})"
    if best is None:
        return f"step {row['step_time_s']:.4f} s, NS {row['ns_s']:.4f} s/GPU"
    return f"step {row['step_time_s'] - best['step_time_s']:+.4f} s, NS {row['ns_s'] - best['ns_s']:+.4f} s"


def reasons_for(search: Search, best: dict[str, Any]) -> dict[str, str]:
    """One line per setting: the pick and what each alternative would cost (or why it cannot run)."""
    from bench.tools.recommend_checks import band_error

    def vs(name: str, values: tuple[Any, ...]) -> str:
        picked = (best["coefficient_type"], best["num_ns_steps"]) if name == "coefficients" else best[name]
        alts = [v for v in values if v != picked]
        others = "; ".join(f"{v}: {_fmt(search.price(search.with_(best, name, v)), best)}" for v in alts)
        return _fmt(best) + (f" (vs {others})" if others else "")

    conf, opts, model = search.conf, search.opts, search.root.model
    kept = "" if search.allow else " [numerics=keep: changes the update; numerics=allow searches it]"
    kept_qkv = kept if model.attention == "gqa" else ""
    reasons = {
        "tp_mode": f"{best['tp_mode']}: "
        + (vs("tp_mode", opts["tp_mode"]) if len(opts["tp_mode"]) > 1 else "moot, TP = expert-TP = 1"),
        "assignment": f"{best['assignment']}: " + vs("assignment", opts["assignment"]),
        "split_qkv": f"{best['split_qkv']}{kept_qkv}: "
        + (vs("split_qkv", (True, False)) if model.attention == "gqa" else "moot, MLA has no fused QKV"),
        "split_gate_up": f"{best['split_gate_up']}: "
        + (
            vs("split_gate_up", opts["split_gate_up"]) + f"; {MEASURED['split_gate_up']}"
            if model.gated_linear_unit
            else "moot, no gated MLP"
        ),
    }
    overlap = search.price(search.with_(best, "ns_overlap", not best["ns_overlap"]))
    if not engines.spec(search.root.engine.name).ns_overlap:
        where = "|".join(name for name, e in engines.ENGINES.items() if e.ns_overlap)
        reasons["ns_overlap"] = f"{best['ns_overlap']}: runs on engine={where} only"
    elif not overlap["runnable"] and not best["ns_overlap"]:
        reasons["ns_overlap"] = f"False: True is {_fmt(overlap)}"
    else:
        reasons["ns_overlap"] = f"{best['ns_overlap']}: {MEASURED['ns_overlap']}; " + vs(
            "ns_overlap", opts["ns_overlap"]
        )
    prec_alts = opts["ns_precision"] if search.allow else PRECISION_ORDER
    reasons["ns_precision"] = (
        f"{best['ns_precision']}{kept}: " + vs("ns_precision", prec_alts) + f"; {MEASURED['fp16']}"
    )
    reasons["use_gram_ns"] = f"{best['use_gram_ns']}{kept}: " + vs(
        "use_gram_ns", opts["use_gram_ns"] if search.allow else (False, True)
    )
    err = band_error(best["coefficient_type"], best["num_ns_steps"])
    fewer = []
    if best["num_ns_steps"] > 1 and best["coefficient_type"] != "custom":
        k = best["num_ns_steps"] - 1
        row = search.price(search.with_(best, "coefficients", (best["coefficient_type"], k)))
        fewer = [f"{k} steps: {_fmt(row, best)}, max |s - 1| {band_error(best['coefficient_type'], k):.3f}"]
    band = f"singular values end within {err:.3f} of 1"
    changed = best["coefficient_type"] != conf["coefficient_type"]
    reasons["coefficient_type"] = (
        f"{best['coefficient_type']}{kept}: {band} after {best['num_ns_steps']} steps"
        + (f" (configured {conf['coefficient_type']})" if changed else "")
    )
    reasons["num_ns_steps"] = (
        f"{best['num_ns_steps']}{kept}: NS cost is linear in steps; fewer leave the update farther from "
        f"orthogonal: {_fmt(best)}" + (f" (vs {fewer[0]})" if fewer else "")
    )
    return reasons


def search(root: RootConfig, *, allow_numerics: bool = False) -> dict[str, Any]:
    """Price the runnable candidates: the fastest one, its reasons, and each candidate priced (or why it cannot
    run)."""
    s = Search(root, allow_numerics=allow_numerics)
    best = s.run()
    reasons = reasons_for(s, best)
    settings_opt = {k: best[k] for k in SEARCHED if k not in DIST_FIELDS}
    settings_dist = {k: best[k] for k in DIST_FIELDS}
    return {
        "optimizer": settings_opt,
        "distribution": settings_dist,
        "reasons": reasons,
        "candidates": list(s.rows.values()),
    }


def overrides_of(found: dict[str, Any]) -> list[str]:
    """The Hydra overrides that select the recommended settings."""
    out = [
        f"optimizer.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in found["optimizer"].items()
    ]
    return out + [f"parallelism.distribution.{k}={v}" for k, v in found["distribution"].items()]


def build_checked(overrides: list[str]) -> tuple[RootConfig, str]:
    """Compose the recommended config through `muonbench.load`, check the product runs it, and build and step its
    optimizer on a tiny CPU slice of the model; returns the config and what was built.

    Raises:
        ValueError: the composed config is not runnable or its optimizer does not build (a bug of the search: it
            only picks runnable settings).
    """
    import muonbench
    from bench.tools.recommend_checks import build_on_cpu

    root = muonbench.load(overrides)
    why_not = runnable(root)
    if why_not:
        raise ValueError(f"recommended settings do not build: {why_not}")
    return root, build_on_cpu(root)


def _scaled(root: RootConfig, dp: int) -> RootConfig | None:
    """`root` at data-parallel size `dp`: tokens per DP rank kept, EP halved until it fits; None if it cannot."""
    par, model = root.parallelism, root.model
    world = dp * par.tp * par.pp * par.cp
    ep = par.ep
    while ep > 1 and (ep * par.etp > dp * par.tp * par.cp or (model.num_experts and model.num_experts % ep)):
        ep //= 2
    gpn = par.gpus_per_node if world % par.gpus_per_node == 0 else world
    scaled = dataclasses.replace(
        par,
        world_size=world,
        ep=ep,
        gbs=max(par.gbs * dp // par.dp, dp * par.mbs),
        nodes=world // gpn,
        gpus_per_node=gpn,
        name=f"{par.name}@dp{dp}",
    )
    out = dataclasses.replace(root, parallelism=scaled)
    import muonbench

    try:
        muonbench.validate(out)
    except ValueError:
        return None
    return out


def scaling(muon: RootConfig, adamw: RootConfig) -> list[dict[str, Any]]:
    """Muon/AdamW model-only ratio over `DP_SIZES` (same layout otherwise)."""
    from bench.tools.perfmodel.model import predict

    rows = []
    for dp in DP_SIZES:
        m, a = _scaled(muon, dp), _scaled(adamw, dp)
        if m is None or a is None:
            continue
        pm, pa = predict(m, PROFILE, ns_as_configured=True), predict(a, PROFILE)
        rows.append(
            {
                "dp": dp,
                "world_size": m.parallelism.world_size,
                "ep": m.parallelism.ep,
                "gbs": m.parallelism.gbs,
                "muon_step_s": pm.step_time_s,
                "adamw_step_s": pa.step_time_s,
                "ratio": pa.step_time_s / pm.step_time_s,
                "muon_optimizer_step_s": pm.breakdown["optimizer_step"],
                "muon_ns_s": pm.info["ns_s"],
            }
        )
    return rows


def write_outputs(out: Path, result: dict[str, Any]) -> list[Path]:
    """scaling.csv, scaling.png and recommendation.json under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    rows = result["scaling"]
    csv_path, png_path, json_path = out / "scaling.csv", out / "scaling.png", out / "recommendation.json"
    with csv_path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([r["dp"] for r in rows], [r["ratio"] for r in rows], marker="o")
    ax.set_xscale("log", base=2)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("data-parallel size")
    ax.set_ylabel("Muon / AdamW (model TFLOP/s per GPU)")
    c = result["config"]
    ax.set_title(f"{c['model']}, {c['hardware']}, TP{c['tp']} PP{c['pp']} (predicted)", fontsize=9)
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    json_path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    return [csv_path, png_path, json_path]


def check_state_fits(root: RootConfig) -> None:
    """Refuse a layout whose weights, gradients and optimizer state alone exceed a GPU's memory (no setting the
    search can change makes it fit); a layout that only the predicted activations push over is flagged instead
    (`fits`), as the activation term knows neither recomputation nor offloading."""
    from bench import memory

    cap = memory.capacity(root)
    if cap is None or not memory.has_fit(root.engine.name):
        return
    exact, _ = memory.features(root)
    need = sum(exact.values())
    if need > cap[0]:
        par = root.parallelism
        raise ValueError(
            f"parallelism={par.name}: model={root.model.name} needs {need / 2**30:.1f} GiB per GPU for weights, "
            f"gradients and optimizer state alone (TP{par.tp} PP{par.pp} EP{par.ep} DP{par.dp}), more than "
            f"{cap[0] / 2**30:.1f} GiB ({cap[1]}); shard it over more GPUs (pp, ep, dp) or pick hardware with more "
            "memory"
        )


def recommend(overrides: list[str], *, allow_numerics: bool = False) -> dict[str, Any]:
    """The recommendation of one composed config as a plain dict (what `format=json` prints)."""
    import muonbench
    from bench.tools.perfmodel.constants import engine_calibration
    from bench.tools.perfmodel.intervals import interval
    from bench.tools.perfmodel.model import predict

    base = muonbench.load(overrides)
    check_state_fits(base)
    found = search(base, allow_numerics=allow_numerics)
    chosen = [*overrides, *overrides_of(found)]
    muon, built = build_checked(chosen)
    adamw = muonbench.load([o for o in overrides if not o.startswith("optimizer=")] + ["optimizer=adamw"])
    pm, pa = predict(muon, PROFILE, ns_as_configured=True), predict(adamw, PROFILE)
    par = muon.parallelism
    return {
        "config": {
            "model": muon.model.name,
            "parallelism": par.name,
            "hardware": muon.hardware.name,
            "precision": muon.precision.name,
            "engine": muon.engine.name,
            "world_size": par.world_size,
            "tp": par.tp,
            "pp": par.pp,
            "dp": par.dp,
            "ep": par.ep,
        },
        "numerics": "allow" if allow_numerics else "keep",
        "settings": {**found["distribution"], **found["optimizer"]},
        "reasons": found["reasons"],
        "overrides": overrides_of(found),
        "muon_step_s": pm.step_time_s,
        "muon_step_s_interval": interval(muon, PROFILE, pm.step_time_s, ns_as_configured=True)[
            "step_time_s_interval"
        ],
        "adamw_step_s": pa.step_time_s,
        "adamw_step_s_interval": interval(adamw, PROFILE, pa.step_time_s)["step_time_s_interval"],
        "step_time_s_interval_basis": interval(adamw, PROFILE, pa.step_time_s)["step_time_s_interval_basis"],
        "ratio": pa.step_time_s / pm.step_time_s,
        "optimizer_step_s_per_gpu": pm.breakdown["optimizer_step"],
        "adamw_optimizer_step_s_per_gpu": pa.breakdown["optimizer_step"],
        "ns_s_per_gpu": pm.info["ns_s"],
        "built": built,
        "state_memory_gib_per_gpu": pm.info["state_memory_gib"],
        **project.memory_prediction(muon),
        "engine_calibration": engine_calibration(muon.engine.name, muon.hardware.name),
        "hardware_profile": pm.info["hardware_profile"],
        "adamw_state_memory_gib_per_gpu": pa.info["state_memory_gib"],
        "memory_gib": muon.hardware.memory_gib,
        "candidates": found["candidates"],
        "scaling": scaling(muon, adamw),
    }


def quality_milestone(res: dict[str, Any], overrides: list[str], cli: dict[str, str]) -> dict[str, Any]:
    """GPU-hours to reach AdamW's loss for the recommended Muon settings (`bench.tools.quality.milestone`)."""
    import muonbench

    root = muonbench.load(overrides)
    horizon = cli.get("horizon_tokens")
    try:
        tokens = None if horizon is None else float(horizon)
    except ValueError:
        raise ValueError(f"horizon_tokens={horizon!r}: must be a number of tokens") from None
    return milestone.gpu_hours(
        milestone.load(cli["quality"]),
        optimizer="muon",
        step_s=res["muon_step_s"],
        adamw_step_s=res["adamw_step_s"],
        tokens_per_step=root.parallelism.gbs * root.model.seq_length,
        num_gpus=root.parallelism.world_size,
        horizon_tokens=tokens,
        non_embedding=milestone.non_embedding_params(root.model),
        source=cli["quality"],
    )


def default_out(config: dict[str, Any]) -> Path:
    """Where a recommendation is written without `out=`: one folder per model, layout, hardware and engine."""
    c = config
    return Path("runs", "recommend", f"{c['model']}_{c['parallelism']}_{c['hardware']}_{c['engine']}")


def format_text(res: dict[str, Any], written: list[Path]) -> str:
    c = res["config"]
    (mlo, mhi), (alo, ahi) = res["muon_step_s_interval"], res["adamw_step_s_interval"]
    lines = [
        (
            f"{c['model']} on {c['world_size']} x {c['hardware']} ({c['parallelism']}: TP{c['tp']} PP{c['pp']} "
            f"DP{c['dp']} EP{c['ep']}, {c['precision']}, engine={c['engine']}): recommended Muon settings"
        ),
    ]
    lines += [f"  {k:<16} {res['reasons'][k]}" for k in res["settings"]]
    lines += [
        f"  overrides: {' '.join(res['overrides'])}",
        (
            f"  predicted step time   Muon {res['muon_step_s']:.3f} s ({mlo:.3f} - {mhi:.3f}), AdamW "
            f"{res['adamw_step_s']:.3f} s ({alo:.3f} - {ahi:.3f}); Muon/AdamW model-only ratio {res['ratio']:.3f}"
        ),
        f"  intervals             {res['step_time_s_interval_basis']}",
        (
            f"  optimizer step / GPU  Muon {res['optimizer_step_s_per_gpu']:.4f} s (NS + update), "
            f"AdamW {res['adamw_optimizer_step_s_per_gpu']:.4f} s"
        ),
        f"  Newton-Schulz / GPU   {res['ns_s_per_gpu']:.4f} s (the GPU with the most; inside the optimizer step)",
        (
            f"  weights + grads + optimizer state / GPU  Muon {res['state_memory_gib_per_gpu']:.1f} GiB, "
            f"AdamW {res['adamw_state_memory_gib_per_gpu']:.1f} GiB (of {res['memory_gib']:.0f}; "
            "activations not counted)"
        ),
        (
            f"  peak memory / GPU     Muon {res['peak_memory_gb']:.1f} GB of {res['memory_gib'] * 2**30 / 1e9:.1f}"
            + {True: "", None: "", False: "  ** does not fit: fewer tokens per micro-batch or more GPUs **"}[
                res["fits"]
            ]
            + f" ({res['peak_memory_basis']})"
        ),
        f"  engine                {c['engine']} ({res['engine_calibration']})",
        f"  hardware              {c['hardware']} ({res['hardware_profile']})",
        "  ratio over data-parallel size: "
        + ", ".join(f"DP{r['dp']} {r['ratio']:.3f}" for r in res["scaling"]),
        *([f"  {milestone.format_line(res['milestone'])}"] if "milestone" in res else []),
        f"  checked: {res['built']}",
        "  written: " + ", ".join(str(p) for p in written),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    from muonbench.cli_help import usage_help

    if usage_help(
        args,
        "bench.tools.recommend",
        "Recommended Muon settings for a model, layout and hardware, with their predicted cost.",
        tool_options={
            "out=DIR": "where scaling.csv, scaling.png and recommendation.json go "
            "(default runs/recommend/<model>_<parallelism>_<hardware>_<engine>)",
            "format=text|json": "output format (default text)",
            "numerics=keep|allow": "keep the configured NS precision, Gram-NS, coefficient set and "
            "steps (default), or search them too (they change the update)",
            "quality=DIR": "a quality report (summary.json): also print GPU-hours to reach AdamW's loss",
            "horizon_tokens=N": "AdamW's training tokens for that (default: the measurement's tokens per parameter)",
        },
        examples=("model=qwen3_30b_a3b parallelism=dp8_ep8 hardware=h200",),
    ):
        return 0
    try:
        cli, overrides = split_args(args)
        res = recommend(overrides, allow_numerics=cli.get("numerics") == "allow")
        if "quality" in cli:
            res["milestone"] = quality_milestone(res, overrides, cli)
    except ValueError as exc:  # user and config errors: one line, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = Path(cli.get("out") or default_out(res["config"]))
    written = write_outputs(out, res)
    text = json.dumps(res, indent=1, default=str) if cli.get("format") == "json" else format_text(res, written)
    print(text)
    return 0


if __name__ == "__main__":
    from bench import entry

    raise SystemExit(entry.run(main))
