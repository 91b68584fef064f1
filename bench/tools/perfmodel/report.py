"""The committed performance-model report: calibration against Table 1, `ours` predictions and sweeps.

`python -m bench.tools.project report=reports/perfmodel_gb300_202611` writes README.md, results.csv (one row per predicted
configuration, `study` column), one PNG per sweep (drawn from the rows, never from live state) and run.json (what
generated the report: command, commit, date, versions, the measured inputs it reads).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.results import record
from bench.tools.perfmodel import calibrate, nscost
from bench.tools.perfmodel import constants as C
from bench.tools.perfmodel.calibration import FLOPS_RUNS, GPU_RUNS, MEGATRON_RUNS
from bench.tools.perfmodel.model import predict, tp_mode_table
from muonbench import validate
from muonbench.schema import RootConfig
from optim import registry

COMMAND = "python -m bench.tools.project report=reports/perfmodel_gb300_202611"


def _variant(
    cfg: RootConfig,
    *,
    par: dict[str, Any] | None = None,
    opt: dict[str, Any] | None = None,
    dist: dict[str, Any] | None = None,
) -> RootConfig:
    p = replace(cfg.parallelism, **(par or {}))
    p = replace(p, distribution=replace(p.distribution, **(dist or {})))
    if "world_size" in (par or {}):
        nodes = max(1, p.world_size // 4)
        p = replace(p, nodes=nodes, gpus_per_node=p.world_size // nodes, name=f"{p.name}_w{p.world_size}")
    out = replace(cfg, parallelism=p, optimizer=replace(cfg.optimizer, **(opt or {})))
    validate(out)
    return out


def _row(study: str, x: Any, cfg: RootConfig, profile: str, **extra: Any) -> dict[str, Any]:
    pred = predict(cfg, profile)
    p = cfg.parallelism
    row = {
        "study": study,
        "x": x,
        "model": cfg.model.name,
        "hardware": cfg.hardware.name,
        "optimizer": cfg.optimizer.name,
        "profile": profile,
        "world_size": p.world_size,
        "tp": p.tp,
        "pp": p.pp,
        "dp": p.dp,
        "ep": p.ep,
        "expert_dp": p.expert_dp,
        "gbs": p.gbs,
        "num_ns_steps": getattr(cfg.optimizer, "num_ns_steps", ""),
        "tp_mode": p.distribution.tp_mode if registry.spec(cfg.optimizer.name).matrix else "",
        "assignment": pred.info["assignment"],
        "step_time_s": pred.step_time_s,
        "tflops_per_gpu_model": pred.tflops_per_gpu_model,
        "tflops_per_gpu_ns": pred.tflops_per_gpu_ns,
        "optimizer_step_s": pred.breakdown["optimizer_step"],
        "exposed_dp_comm_s": pred.breakdown["grad_sync_exposed"] + pred.breakdown["param_gather_exposed"],
        "state_memory_gib": pred.info["state_memory_gib"],
    }
    row.update(extra)
    return row


def sweeps(base: dict[str, RootConfig]) -> list[dict[str, Any]]:
    """DP, EP, TP (duplicated / distributed / auto), NS steps and assignment sweeps on GB300."""
    return [*_layout_sweeps(base), *_optimizer_sweeps(base)]


def _layout_sweeps(base: dict[str, RootConfig]) -> list[dict[str, Any]]:
    """The DP, EP and TP sweeps."""
    rows: list[dict[str, Any]] = []
    qa, qm = base["gb300/qwen3_30b_a3b_adamw"], base["gb300/qwen3_30b_a3b_muon"]
    ka, km = base["gb300/kimi_k2_adamw"], base["gb300/kimi_k2_muon"]
    for dp in (8, 16, 32, 64, 128, 256, 512, 1024):  # 64 sequences per DP rank; Qwen3 EP8, Kimi K2 PP4 EP64
        for name, a_cfg, m_cfg, pp in (("qwen3_30b_a3b", qa, qm, 1), ("kimi_k2", ka, km, 4)):
            if dp < a_cfg.parallelism.ep:
                continue
            par = {"world_size": dp * pp, "gbs": 64 * dp}
            rows.append(_row("dp", dp, _variant(a_cfg, par=par), "published", setup=name))
            for prof in ("published", "ours"):
                rows.append(_row("dp", dp, _variant(m_cfg, par=par), prof, setup=name))
    for ep in (1, 2, 4, 8, 16, 32, 64):  # Qwen3 on 64 GPUs
        par = {"world_size": 64, "gbs": 4096, "ep": ep}
        rows.append(_row("ep", ep, _variant(qa, par=par), "published"))
        for prof in ("published", "ours"):
            rows.append(_row("ep", ep, _variant(qm, par=par), prof))
    for tp in (1, 2, 4, 8):  # TP with sequence parallel: Qwen3 on 64 GPUs (EP8), Kimi K2 on 256 (EP64)
        for name, a_cfg, m_cfg, world, gbs in (
            ("qwen3_30b_a3b", qa, qm, 64, 4096),
            ("kimi_k2", ka, km, 256, 4096),
        ):
            par = {"world_size": world, "gbs": gbs // tp, "tp": tp, "sequence_parallel": tp > 1}
            rows.append(_row("tp", tp, _variant(a_cfg, par=par), "published", setup=name))
            for mode in ("duplicated", "distributed", "auto"):
                rows.append(
                    _row("tp", tp, _variant(m_cfg, par=par, dist={"tp_mode": mode}), "ours", setup=name)
                )
    return rows


def _optimizer_sweeps(base: dict[str, RootConfig]) -> list[dict[str, Any]]:
    """The NS-steps and assignment sweeps, with their AdamW references."""
    rows: list[dict[str, Any]] = []
    qa, qm = base["gb300/qwen3_30b_a3b_adamw"], base["gb300/qwen3_30b_a3b_muon"]
    ka, km = base["gb300/kimi_k2_adamw"], base["gb300/kimi_k2_muon"]
    for k in (3, 4, 5, 6, 8, 10):
        for name, cfg in (("qwen3_30b_a3b", qm), ("kimi_k2", km)):
            for prof in ("published", "ours"):
                rows.append(_row("ns_steps", k, _variant(cfg, opt={"num_ns_steps": k}), prof, setup=name))
    for strat in ("round_robin", "ping_pong_numel", "lpt_cost"):
        for name, cfg, par in (
            ("qwen3_30b_a3b_dp64", qm, {"world_size": 64, "gbs": 4096}),
            ("kimi_k2", km, None),
        ):
            dist = {"assignment": strat, "grad_sync": "reduce_scatter", "overlap_param_gather": True}
            variant = _variant(cfg, par=par, opt={"implementation": "ours"}, dist=dist)
            rows.append(_row("assignment", strat, variant, "ours", setup=name))
    for name, cfg in (("qwen3_30b_a3b", qa), ("kimi_k2", ka)):  # AdamW references for the NS-steps sweep
        rows.append(_row("adamw_ref", 0, cfg, "published", setup=name))
    return rows


def _plot(rows: list[dict[str, Any]], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files: list[str] = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        files.append(name)

    def series(study: str, **match: Any) -> tuple[list[Any], list[dict[str, Any]]]:
        sel = [r for r in rows if r["study"] == study and all(r.get(k) == v for k, v in match.items())]
        return [r["x"] for r in sel], sel

    cal = [r for r in rows if r["study"] == "calibration"]
    terms = [
        k[len("published_") : -2]
        for k in cal[0]
        if k.startswith("published_") and k.endswith("_s") and k != "published_tflops"
    ]
    bars = [
        (f"{r['experiment'].split('/')[1]}\n{prof}", r, prof)
        for r in cal
        for prof in ("published", "ours")
        if not (prof == "ours" and "adamw" in str(r["experiment"]))
    ]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    bottom = [0.0] * len(bars)
    for term in terms:
        vals = [float(r[f"{prof}_{term}_s"]) for _, r, prof in bars]
        if max(vals) <= 0:
            continue
        ax.bar(range(len(bars)), vals, bottom=bottom, label=term)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=7)
    ax.set_ylabel("predicted step time (s), GB300 MXFP8")
    ax.legend(fontsize=7, loc="upper right")
    save(fig, "calibration_breakdown.png")
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, setup, xlabel in zip(
        axes,
        ("qwen3_30b_a3b", "kimi_k2"),
        ("DP size (Qwen3-30B-A3B, EP8, GB300)", "DP size (Kimi K2, PP4 EP64, GB300)"),
        strict=True,
    ):
        for label, match in (
            ("AdamW", {"optimizer": "adamw"}),
            ("Muon published", {"optimizer": "muon", "profile": "published"}),
            ("Muon ours", {"optimizer": "muon", "profile": "ours"}),
        ):
            xs, sel = series("dp", setup=setup, **match)
            ax.plot(xs, [r["tflops_per_gpu_model"] for r in sel], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("predicted model TF/GPU")
        ax.legend()
    save(fig, "sweep_dp.png")
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, match in (
        ("AdamW", {"optimizer": "adamw"}),
        ("Muon published", {"optimizer": "muon", "profile": "published"}),
        ("Muon ours", {"optimizer": "muon", "profile": "ours"}),
    ):
        xs, sel = series("ep", **match)
        ax.plot(xs, [r["step_time_s"] for r in sel], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("EP size (Qwen3-30B-A3B, 64 GB300)")
    ax.set_ylabel("predicted step time (s)")
    ax.legend()
    save(fig, "sweep_ep.png")
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, setup in zip(axes, ("qwen3_30b_a3b", "kimi_k2"), strict=True):
        for mode in ("duplicated", "distributed", "auto"):
            xs, sel = series("tp", optimizer="muon", tp_mode=mode, setup=setup)
            ax.plot(xs, [1e3 * r["optimizer_step_s"] for r in sel], marker="o", label=f"tp_mode={mode}")
        ax.set_xlabel(f"TP size ({setup}, Muon ours, GB300)")
        ax.set_ylabel("predicted optimizer step (ms)")
        ax.legend()
    save(fig, "sweep_tp.png")
    fig, ax = plt.subplots(figsize=(6, 4))
    for setup in ("qwen3_30b_a3b", "kimi_k2"):
        ref = next(r for r in rows if r["study"] == "adamw_ref" and r["setup"] == setup)[
            "tflops_per_gpu_model"
        ]
        for prof in ("published", "ours"):
            xs, sel = series("ns_steps", setup=setup, profile=prof)
            ax.plot(xs, [r["tflops_per_gpu_model"] / ref for r in sel], marker="o", label=f"{setup} {prof}")
    ax.set_xlabel("NS steps")
    ax.set_ylabel("Muon / AdamW model TF (predicted)")
    ax.legend()
    save(fig, "sweep_ns_steps.png")
    fig, ax = plt.subplots(figsize=(6, 4))
    strategies = ["round_robin", "ping_pong_numel", "lpt_cost"]
    for i, setup in enumerate(("qwen3_30b_a3b_dp64", "kimi_k2")):
        vals = [
            1e3
            * next(
                r["optimizer_step_s"]
                for r in rows
                if r["study"] == "assignment" and r["setup"] == setup and r["x"] == s
            )
            for s in strategies
        ]
        ax.bar([j + 0.4 * i for j in range(3)], vals, width=0.4, label=setup)
    ax.set_xticks([j + 0.2 for j in range(3)], strategies)
    ax.set_ylabel("predicted optimizer step (ms), Muon ours")
    ax.legend()
    save(fig, "sweep_assignment.png")
    return files


def _what_if() -> dict[str, list[dict[str, Any]]]:
    """Published Muon rows under other measured per-matrix host costs of the NS loop."""
    out = {}
    singles = nscost.ns_data("published").single_call_ms
    if singles:
        out[f"{singles[0]:.3f} ms (kernel run's fastest EO call)"] = calibrate.what_if_ns_host(singles[0])
    out[f"{C.EO_MUON_PARAM_HOST_MS.value} ms (EO's whole per-parameter step)"] = calibrate.what_if_ns_host(
        C.EO_MUON_PARAM_HOST_MS.value
    )
    return out


def h200_check() -> str:
    """Prediction of the single-H200 Megatron measurements: `calibration.MEGATRON_RUNS` (the fit run and its
    siblings), then the FLOP-matched slice of `calibration.FLOPS_RUNS` (out of sample) when present."""
    from bench.tools.perfmodel.h200 import compare

    text = compare()
    if FLOPS_RUNS.exists():
        source = json.loads(FLOPS_RUNS.read_text())["provenance"]["source"]
        text += (
            f"\n\n#### Out of sample: the FLOP-matched Qwen3-30B-A3B slice ({source})\n\n"
            "328 x 4096 tokens per step, measured later; no constant was refitted on these runs "
            "(`engine.manual_gc` and `empty_unused_memory_level` have no model term).\n\n"
            + compare(FLOPS_RUNS)
        )
    return text


def table1_sensitivity(base: dict[str, RootConfig]) -> list[dict[str, Any]]:
    """Table 1 rows predicted under each GB300 assumption set (`intervals.assumption_sets`, each with its memory-bound
    fraction refitted on Table 1): the spread the in-sample fit cannot show."""
    from bench.tools.perfmodel import intervals

    out = []
    for values in intervals.shipped()["assumption_sets"]["gb300"]:
        with intervals.assumed("gb300", {k: values[k] for k in ("gemm", "hbm", "eo_loop_ms")}):
            for row in calibrate.TABLE1:
                pred = predict(base[row.experiment], "published")
                out.append({**values, "row": row.label, "predicted_tflops": pred.tflops_per_gpu_model,
                            "published_tflops": row.model_tflops, "predicted_step_s": pred.step_time_s})  # fmt: skip
    return out


def write_report(out_dir: str) -> str:
    """Compute everything, write the report folder, return the README path."""
    git = record.git_info()  # before this report's own files change the tree
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    base = {row.experiment: calibrate.load_row(row) for row in calibrate.TABLE1}
    cal = calibrate.calibration(base)
    fit, worst = calibrate.fit_gb300_hbm()
    from bench.tools.perfmodel.validate import layer_step_comparison

    layer_steps = layer_step_comparison()
    rows = (
        [{"study": "calibration", **r} for r in cal]
        + sweeps(base)
        + [{"study": "h200_layer_step", **r} for r in layer_steps]
    )
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with (out / "results.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    files = _plot(rows, out)
    tp_cfg = _variant(
        base["gb300/qwen3_30b_a3b_muon"],
        par={"world_size": 64, "gbs": 1024, "tp": 4, "sequence_parallel": True},
    )
    from bench.tools.perfmodel import intervals
    from bench.tools.perfmodel.readme import render, summary

    sensitivity = table1_sensitivity(base)
    text = render(
        cal=cal,
        fit=fit,
        worst=worst,
        rows=rows,
        files=files,
        tp_table=tp_mode_table(tp_cfg),
        command=COMMAND,
        constants=C,
        what_if=_what_if(),
        h200=h200_check(),
        layer_steps=layer_steps,
        ns_sources={p: nscost.ns_data(p).source for p in ("published", "ours")},
        ns_hosts={p: nscost.ns_data(p).host_ms for p in ("published", "ours")},
        errors=intervals.shipped(),
        sensitivity=sensitivity,
    )
    (out / "README.md").write_text(text)
    record.write_json_atomic(
        out / "summary.json", summary(cal=cal, fit=fit, worst=worst, sensitivity=sensitivity, command=COMMAND)
    )
    _write_run_json(
        out_dir, files, git=git, ns_sources={p: nscost.ns_data(p).source for p in ("published", "ours")}
    )
    assert not any(isinstance(v, float) and math.isnan(v) for r in rows for v in r.values())
    return str(out / "README.md")


def _write_run_json(
    out_dir: str, files: list[str], *, git: dict[str, Any], ns_sources: dict[str, str]
) -> None:
    """The report's provenance. A model, not a measurement: no hardware is read; the measured inputs are named."""
    from bench.tools.perfmodel import intervals

    record.write_json_atomic(
        Path(out_dir) / "run.json",
        {
            "schema": "muonbench.report/perfmodel",
            "generated": record.now_iso(),
            "command": f"python -m bench.tools.project report={out_dir}",
            "git": git,
            "versions": record.package_versions(),
            "measured_inputs": {
                "ns_cost": ns_sources,
                "h200_check": {
                    p.name: json.loads(p.read_text())["provenance"] for p in (MEGATRON_RUNS, FLOPS_RUNS)
                },
                "prediction_errors": {
                    p.name: json.loads(p.read_text())["provenance"] for p in (GPU_RUNS, intervals.ERRORS)
                },
            },
            "files": ["README.md", "summary.json", "results.csv", *files],
        },
    )
