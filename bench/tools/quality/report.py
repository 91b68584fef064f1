"""Quality report from a sweep's output directory only (never from live processes).

`python -m bench.tools.quality.report src=<sweep out dir> [dest=<report dir>]` (dest defaults to src) writes README.md
(protocol, tuning, corpus manifest, tables, plots), summary.json (the result: horizon, each optimizer's grids, best
setting, seeds and tuning cost, time-to-target ratios with their 95% intervals, GPU-hours to AdamW's loss),
results.csv (one row per optimizer), trials.csv (one row per trial), run.json (configuration, provenance of every
piece, summary), reproduce.sh and three plots: validation loss against tokens and against wall seconds (best
setting per optimizer, band = min-max over seeds) and the learning-rate sweep.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

from bench.tools.quality import milestone, tuning
from bench.tools.quality import run as qrun
from bench.tools.quality.config import OPTIMIZER_OVERRIDES, QualityConfig, parse_cli
from bench.tools.quality.summary import BOOTSTRAP, best_runs, config_of, summarize

COLORS = {
    "adamw": "tab:blue",
    "muon": "tab:red",
    "muon_split_gate_up": "tab:orange",
    "mop": "tab:green",
    "soap_rekls": "tab:purple",
}
GPU_PEAK_KEYS = {"H200": "h200", "H100": "h100", "B200": "b200", "GB300": "gb300"}
TARGET_WALL_RATIO = 0.8
WEN_2025 = (
    "Wen et al. 2025 ([references](../../docs/references.md#fair-benchmarks)), every optimizer tuned, 1-8x "
    "Chinchilla horizons: matrix optimizers about 1.4x faster than AdamW at 0.1 B parameters (a token ratio of "
    "about 0.7) and about 1.1x at 1.2 B"
)


def _fmt(x: Any, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def _command(cfg: dict[str, Any]) -> str:
    """The CLI that reproduces `cfg`: its profile plus every key whose value differs from that profile's."""
    base = parse_cli([f"profile={cfg['profile']}"])
    args = [f"profile={cfg['profile']}"]
    for key, value in cfg.items():
        default = getattr(base, key, None)
        if (
            key not in QualityConfig.__dataclass_fields__
            or key in ("profile", "lr_grids", "grids", "budget_s", "cache", "out")
            or value == (list(default) if isinstance(default, tuple) else default)
        ):
            continue
        args.append(f"{key}={','.join(value) if isinstance(value, list) else value}")
    return "python -m bench.tools.quality " + " ".join(args)


def _overrides() -> str:
    """`OPTIMIZER_OVERRIDES` as the README lists them: `muon: extra_scale_factor=0.2; mop: ...`."""
    return "; ".join(
        f"{name}: " + ", ".join(o.removeprefix("optimizer.") for o in ovr)
        for name, ovr in OPTIMIZER_OVERRIDES.items()
    )


def _analysis(dest: Path) -> str:
    """The reading of the result by whoever ran the sweep (`analysis.md` beside the report), if there is one."""
    path = dest / "analysis.md"
    return f"\n## Reading the result\n{path.read_text().strip()}\n" if path.exists() else ""


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _plots(dest: Path, trials: list[dict[str, Any]], summary: dict[str, Any], cfg: QualityConfig) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for row in summary["rows"]:
        name = row["optimizer"]
        _, runs, _ = best_runs(trials, name, cfg)
        color = COLORS.get(name, "k")
        for ax, key, scale in ((axes[0], "tokens", 1e-6), (axes[1], "wall_s", 1.0)):
            n = min(len(t["curve"]) for t in runs)
            xs = np.array([[p[key] * scale for p in t["curve"][:n]] for t in runs])
            ys = np.array([[p["val_loss"] for p in t["curve"][:n]] for t in runs])
            label = f"{name} lr={row['best_lr']:g}" + (f" ({len(runs)} seeds)" if len(runs) > 1 else "")
            ax.plot(xs.mean(0), ys.mean(0), color=color, lw=2, label=label)
            if len(runs) > 1:
                ax.fill_between(xs.mean(0), ys.min(0), ys.max(0), color=color, alpha=0.2, lw=0)
    for ax, xl in zip(axes, ("tokens (M)", "wall-clock seconds (training, optimizer included)")):
        ax.axhline(summary["target"], color="gray", ls="--", lw=1, label="AdamW best final (target)")
        ax.set_xlabel(xl)
        ax.set_ylabel("validation loss")
        lo = min(r["final_val_loss_min"] for r in summary["rows"])
        ax.set_ylim(lo - 0.1, summary["target"] + 1.5)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    axes[0].set_title("best setting per optimizer (band: seed min-max)")
    axes[1].set_title("the same runs against wall-clock")
    fig.tight_layout()
    fig.savefig(dest / "loss_curves.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for name in dict.fromkeys(t["optimizer"] for t in trials):
        _, _, walk = best_runs(trials, name, cfg)
        lr_stage = next((st for st in walk.stages if st.dim == "lr"), None)
        pts = sorted(lr_stage.losses.items()) if lr_stage else []
        fin = [(lr, v) for lr, v in pts if v < float("inf")]
        ax.plot([p[0] for p in fin], [p[1] for p in fin], "o-", color=COLORS.get(name, "k"), label=name)
    ax.axhline(summary["target"], color="gray", ls="--", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel("final validation loss")
    ax.set_title("learning-rate stage (diverged runs omitted)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(dest / "lr_sweep.png", dpi=110)
    plt.close(fig)


def _peak_tflops(gpu: str | None) -> float | None:
    from muonbench import load

    for key, hw in GPU_PEAK_KEYS.items():
        if gpu and key in gpu:
            return load([f"hardware={hw}"]).hardware.peak_bf16_tflops
    return None


def _manifest_md(corpus: dict[str, Any], top: int = 25) -> str:
    pk = corpus.get("packages") or []
    lines = [
        "| package | distribution | version | train files | train MB | held-out files | encoded tokens |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in pk[:top]:
        lines.append(
            f"| {r['package']} | {r['distribution'] or '-'} | {r['version'] or '-'} | {r['train_files']} | "
            f"{r['train_bytes'] / 1e6:.1f} | {r['val_files']} | {r['encoded_tokens']:,} |"
        )
    if len(pk) > top:
        rest = pk[top:]
        lines.append(
            f"| {len(rest)} more packages | | | {sum(r['train_files'] for r in rest)} | "
            f"{sum(r['train_bytes'] for r in rest) / 1e6:.1f} | {sum(r['val_files'] for r in rest)} | "
            f"{sum(r['encoded_tokens'] for r in rest):,} |"
        )
    return "\n".join(lines) if pk else "(stdlib corpus: one package)"


def _ci(ci: tuple[float, float] | list[float] | None) -> str:
    if ci is None:
        return "n/a"
    lo, hi = ci
    return f"{lo:.2f}-{'never' if hi == float('inf') else format(hi, '.2f')}"


def _verdict(summary: dict[str, Any], complete: bool) -> str:
    rows = {r["optimizer"]: r for r in summary["rows"]}
    muon = rows.get("muon")
    head = "" if complete else "**Incomplete sweep** (the trials so far; rerun the sweep to finish it). "
    if muon is None:
        return head + "No Muon trial yet."
    ratio = muon["wall_ratio_vs_adamw"]
    if ratio is None:
        return head + (
            f"Muon (best LR {muon['best_lr']:g}) does not reach AdamW's best final validation loss "
            f"{summary['target']:.4f} in every seed ({muon['reached']}/{muon['seeds']}) within the budget."
        )
    met = "met" if ratio <= TARGET_WALL_RATIO else f"not met (by {ratio - TARGET_WALL_RATIO:+.2f})"
    return head + (
        f"Muon reaches AdamW's best final validation loss ({summary['target']:.4f}) in "
        f"{muon['wall_s_to_target']:.1f} s = **{ratio:.2f}x** AdamW's {summary['adamw_wall_s']:.1f} s (95% "
        f"{_ci(muon['wall_ratio_ci95'])}; {muon['tokens_ratio_vs_adamw']:.2f}x its tokens, 95% "
        f"{_ci(muon['tokens_ratio_ci95'])}; step time {muon['step_time_vs_adamw']:.2f}x). Target <= "
        f"{TARGET_WALL_RATIO}x: {met}."
    )


def _none_if_inf(x: Any) -> Any:
    if isinstance(x, float) and x == float("inf"):
        return None
    if isinstance(x, dict):
        return {k: _none_if_inf(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_none_if_inf(v) for v in x]
    return x


def summary_json(summary: dict[str, Any], cfg: QualityConfig, model: dict[str, Any], gpu: str | None) -> dict:
    """`summary.json`: the sweep's result for readers and for `recommend quality=` (no infinities: an interval
    end that is never reached is null)."""
    rows = {r["optimizer"]: r for r in summary["rows"]}
    tokens = cfg.steps * cfg.batch_size * cfg.seq_len
    non_emb = model["total_params_no_embedding"]
    out = {
        "profile": cfg.profile,
        "gpu": gpu,
        "model": cfg.model,
        "non_embedding_params": non_emb,
        "tokens_per_trial": tokens,
        "tokens_per_param": tokens / non_emb,
        "target_val_loss": summary["target"],
        "target": "AdamW's final validation loss, mean of its seeds at its best setting",
        "arms": summary["arms"],
        "time_to_target_ratio": {
            name: {
                "ratio": r["wall_ratio_vs_adamw"],
                "ci95": list(r["wall_ratio_ci95"]),
                "tokens_ratio": r["tokens_ratio_vs_adamw"],
                "tokens_ci95": list(r["tokens_ratio_ci95"]),
                "seeds": r["seeds"],
                "reached": r["reached"],
            }
            for name, r in rows.items()
            if name != "adamw"
        },
        "interval": f"95% percentile bootstrap over the seeds of the optimizer and of AdamW, {BOOTSTRAP} replicates",
    }
    adam = rows["adamw"]
    out["gpu_hours_to_target"] = {
        name: milestone.gpu_hours(
            out,
            optimizer=name,
            step_s=r["step_ms"] / 1e3,
            adamw_step_s=adam["step_ms"] / 1e3,
            tokens_per_step=cfg.batch_size * cfg.seq_len,
            num_gpus=1,
            horizon_tokens=tokens,
            source="this sweep",
        )
        for name, r in rows.items()
        if name != "adamw"
    }
    return _none_if_inf(out)


def _results_table(rows: list[dict[str, Any]], flops_tok: float, peak: float | None) -> str:
    lines = [
        (
            "| optimizer | best LR (grid) | runs | seeds | final val loss +- s.d. (min-max) | tokens to target "
            "(x AdamW, 95%) | steps | s to target (min-max) | x AdamW s (95%) | GPU-h | cost | step ms | "
            "opt-step ms | tokens/s | model TFLOP/s | MFU |"
        ),
        "|" + "---|" * 16,
    ]
    for r in rows:
        tflops = r["tokens_per_s"] * flops_tok / 1e12
        edge = " **edge**" if r["best_at_grid_edge"] else ""
        tok_ci = f", {_ci(r['tokens_ratio_ci95'])}" if r["tokens_ratio_ci95"] else ""
        wall_ci = f" ({_ci(r['wall_ratio_ci95'])})" if r["wall_ratio_ci95"] else ""
        lines.append(
            f"| {r['optimizer']} | {r['best_lr']:g}{edge} ({r['grid']}) | {r['runs']} | "
            f"{r['seeds']} ({r['reached']} reach) | {r['final_val_loss']:.4f} +- {r['final_val_loss_std']:.4f} "
            f"({r['final_val_loss_min']:.4f}-{r['final_val_loss_max']:.4f}) | "
            f"{_fmt(r['tokens_to_target'] and r['tokens_to_target'] / 1e6, '.2f')}"
            f"{' M' if r['tokens_to_target'] is not None else ''} "
            f"({_fmt(r['tokens_ratio_vs_adamw'], '.2f')}{tok_ci}) | {_fmt(r['steps_to_target'], '.0f')} | "
            f"{_fmt(r['wall_s_to_target'], '.1f')} ({_fmt(r['wall_s_to_target_min'], '.1f')}-"
            f"{_fmt(r['wall_s_to_target_max'], '.1f')}) | {_fmt(r['wall_ratio_vs_adamw'], '.2f')}{wall_ci} | "
            f"{_fmt(r['device_hours_to_target'], '.5f')} | {_fmt(r['cost_to_target'], '.4f')} | "
            f"{r['step_ms']:.1f} | {r['opt_step_ms']:.1f} | {r['tokens_per_s']:,.0f} | {tflops:.1f} | "
            f"{_fmt(peak and 100 * tflops / peak, '.1f')}{'%' if peak else ''} |"
        )
    return "\n".join(lines)


def _tuning_md(summary: dict[str, Any]) -> str:
    """Each optimizer's stages: grid (final losses), best value, edge, and what its tuning cost."""
    lines = [
        "| optimizer | dimension | grid: final val loss | best | edge | runs |",
        "|---|---|---|---|---|---|",
    ]
    for name, arm in summary["arms"].items():
        for dim, g in arm["grids"].items():
            pts = ", ".join(
                f"{v:g}: {'diverged' if f is None else format(f, '.4f')}"
                for v, f in zip(g["values"], g["final_val_loss"], strict=True)
            )
            ext = f" (+{g['extensions']} extended)" if g["extensions"] else ""
            edge = "**yes**" if g["at_edge"] else "no"
            lines.append(f"| {name} | {dim} | {pts}{ext} | {_fmt(g['best'], 'g')} | {edge} | |")
        r = arm["runs"]
        lines.append(
            f"| {name} | **total** | | | | {r['tuning']} tuning + {r['seeds']} seeds = {r['total']} |"
        )
    return "\n".join(lines)


def _wen_md(sj: dict[str, Any]) -> str:
    """This sweep's token ratios beside Wen et al.'s smallest-scale speedups."""
    ours = "; ".join(
        f"{name} {_fmt(r['tokens_ratio'], '.2f')} (95% {_ci([x if x is not None else float('inf') for x in r['tokens_ci95']])})"
        for name, r in sj["time_to_target_ratio"].items()
    )
    return (
        f"Token ratios to AdamW's loss here ({sj['non_embedding_params'] / 1e6:.1f} M non-embedding parameters, "
        f"{sj['tokens_per_param']:.1f} tokens per parameter): {ours or 'none yet'}. {WEN_2025}. A ratio far below "
        "theirs at a horizon this short (under 20 tokens per parameter) or with AdamW's best on a grid edge says "
        "the comparison favours the matrix optimizers; docs/quality.md lists what differs."
    )


def write_report(src: Path, dest: Path | None = None) -> str:
    """Write the report of the sweep in `src` into `dest` (default `src`); return the results table."""
    src = Path(src)
    dest = Path(dest or src)
    dest.mkdir(parents=True, exist_ok=True)
    meta = json.loads((src / "meta.json").read_text())
    corpus = json.loads((src / "corpus.json").read_text())
    pieces = [json.loads(x) for x in (src / "pieces.jsonl").read_text().splitlines() if x.strip()]
    progress = json.loads((src / "progress.json").read_text())
    trials = [json.loads(p.read_text()) for p in sorted((src / "trials").glob("*.json"))]
    cfg, model = meta["config"], meta["model"]
    qcfg = config_of(cfg)
    summary = summarize(trials, qcfg)
    rows = summary["rows"]
    _write_csv(dest / "results.csv", rows)
    trial_rows = [
        {k: t.get(k) for k in ("optimizer", "lr", "seed", "status", "final_val_loss", "wall_s", "opt_step_s")}
        | {"hparams": json.dumps(t.get("hparams"))}
        | {"evals": len(t["curve"]), "trial_s": t.get("trial_s"), "peak_mem_gib": t.get("peak_mem_gib")}
        for t in trials
    ]
    _write_csv(dest / "trials.csv", trial_rows)
    _plots(dest, trials, summary, qcfg)
    gpu = next((p["gpu"] for p in reversed(pieces) if p.get("gpu")), None)
    sj = summary_json(summary, qcfg, model, gpu)
    (dest / "summary.json").write_text(json.dumps(sj, indent=1) + "\n")
    command = _command(cfg)
    run_json = {
        "config": cfg,
        "trial_hash": meta["trial_hash"],
        "model": model,
        "corpus": {k: v for k, v in corpus.items() if k != "packages"},
        "progress": progress,
        "pieces": pieces,
        "summary": _none_if_inf(summary),
        "command": command,
    }
    (dest / "run.json").write_text(json.dumps(run_json, indent=1, default=str) + "\n")
    (dest / "reproduce.sh").write_text(
        "#!/usr/bin/env bash\n# Reruns the whole sweep (resumable: rerun it to go on, budget_s=S per piece), then "
        "writes this report from its state.\n"
        "set -euo pipefail\nOUT_DIR=${1:-runs/quality_" + cfg["profile"] + "}\n"
        f'{command} out="$OUT_DIR" "${{@:2}}"\n'
        f'python -m bench.tools.quality.report src="$OUT_DIR" dest={dest}\n'
    )
    (dest / "reproduce.sh").chmod(0o755)
    table = _results_table(rows, model["model_flops_per_token"], _peak_tflops(gpu))
    (dest / "README.md").write_text(
        _readme(dest, cfg, qcfg, model, corpus, pieces, progress, trials, summary, sj, table)
    )
    return table


def _readme(
    dest: Path,
    cfg: dict[str, Any],
    qcfg: QualityConfig,
    model: dict[str, Any],
    corpus: dict[str, Any],
    pieces: list[dict[str, Any]],
    progress: dict[str, Any],
    trials: list[dict[str, Any]],
    summary: dict[str, Any],
    sj: dict[str, Any],
    table: str,
) -> str:
    gpu, command = sj["gpu"], _command(cfg)
    flops_tok = model["model_flops_per_token"]
    peak = _peak_tflops(gpu)
    trial_lines = [
        "| trial | status | final val loss | wall s | opt-step s |",
        "|---|---|---|---|---|",
    ]
    trial_lines += [
        f"| {tuning.trial_id(t['optimizer'], tuning.hparams_of(t, qcfg), qcfg)} | {t['status']} | "
        f"{t['final_val_loss']:.4f} | {_fmt(t.get('wall_s'), '.1f')} | {_fmt(t.get('opt_step_s'), '.1f')} |"
        for t in trials
    ]
    edges = [
        f"{name} ({', '.join(a['best_at_grid_edge'])})"
        for name, a in summary["arms"].items()
        if a["best_at_grid_edge"]
    ]
    tied = [n for n in summary["arms"] if tuning.tied_adamw_lr(n, qcfg)]
    tok = corpus["tokenizer"]
    last = pieces[-1] if pieces else {}
    versions = last.get("versions", {})
    protocol = (
        qrun.__doc__.split("Protocol (written at the top of the report):")[1].split("Usage:")[0].strip()
    )
    hours = "\n".join(f"- {milestone.format_line(m)}" for m in sj["gpu_hours_to_target"].values())
    epochs = sj["tokens_per_trial"] / max(1, corpus["train_tokens"])
    return f"""# Quality bench: time to AdamW's best validation loss ({cfg["profile"]} profile{", " + gpu if gpu else ""})

Horizon: {sj["tokens_per_trial"] / 1e6:.1f} M tokens per trial for {sj["non_embedding_params"] / 1e6:.2f} M
non-embedding parameters = **{sj["tokens_per_param"]:.2f} tokens per parameter** ({epochs:.2f} epochs of the
encoded training split). Tuning: {", ".join(f"{n} {'+'.join(a['tuned'])} ({a['runs']['total']} runs)" for n, a in summary["arms"].items())}.

{_verdict(summary, progress["complete"])}
{"Best value on the edge of its grid (the optimum may lie outside it): " + "; ".join(edges) + "." if edges else "Every best value is inside its grid."}
{"Non-matrix parameters (embeddings, output layer, norms) of " + ", ".join(tied) + " ran at the matrices' LR (adamw_lr tied, untuned): their ratio is not a fair comparison." if tied else ""}

## Result (best setting per optimizer)
{table}

Target = AdamW's best final validation loss, {summary["target"]:.4f} (mean of its seeds at its best setting);
AdamW's reference time {summary["adamw_wall_s"]:.1f} s and {summary["adamw_tokens"] / 1e6:.2f} M tokens. "s to
target": training wall-clock (optimizer step included, evaluation excluded) until the validation loss first
reaches it; 95% intervals: percentile bootstrap over the seeds of the optimizer and of AdamW ({BOOTSTRAP}
replicates, the target recomputed in each; "never": some resamples do not reach it). GPU-hours and cost at
${cfg["price_per_hour"]}/GPU-hour. Model TFLOP/s = tokens/s x {flops_tok / 1e6:.1f} MFLOP/token (bench.flops, model
only: optimizer FLOPs are not counted){f"; MFU against the {peak:g} TFLOP/s dense bf16 peak" if peak else ""}.

GPU-hours to reach AdamW's loss (`bench.tools.quality.milestone`, this sweep's step times, one GPU):
{hours or "- none yet"}

![loss curves](loss_curves.png)

![learning-rate sweep](lr_sweep.png)

## Beside published fair comparisons
{_wen_md(sj)}
{_analysis(dest)}
## Tuning (each optimizer's stages, in order)
{_tuning_md(summary)}

## Protocol
{protocol}

- Model `{cfg["model"]}`: hidden {cfg["hidden_size"]}, {cfg["num_layers"]} layers;
  {model["total_params"] / 1e6:.2f} M total / {model["active_params"] / 1e6:.2f} M active parameters
  ({model["total_params_no_embedding"] / 1e6:.2f} M / {model["active_params_no_embedding"] / 1e6:.2f} M without
  embeddings); batch {cfg["batch_size"]} x seq {cfg["seq_len"]}, {cfg["steps"]} steps
  ({sj["tokens_per_trial"] / 1e6:.2f} M tokens per trial); evaluation every {cfg["eval_every"]} steps on
  {cfg["val_batches"]} fixed held-out batches; seed {cfg["seed"]} (+{cfg["best_lr_seeds"] - 1} at the best setting of
  {", ".join(cfg["seed_optimizers"])}).
- Optimizers: `conf/optimizer/<name>.yaml` (momentum, betas, NS coefficients and steps, routing) with the trial's
  hyperparameters and the bench's overrides ({_overrides()}); Muon's NS iterate {cfg["ns_precision"]}, MOP's polar
  factor by {cfg["polar_method"]}; SOAP-REKLS: eigh refresh every {cfg["precondition_frequency"]} step(s); gradient
  clip 1.0. Starting values: warm-up {qcfg.warmup_frac:g} of the steps, weight decay {qcfg.weight_decay:g}, AdamW
  beta2 {qcfg.beta2:g}, non-matrix LR {qcfg.adamw_lr:g} ({"tuned" if "adamw_lr" in qcfg.tune else "0 = the trial's LR" if not qcfg.adamw_lr else "fixed"}).
- Untimed warm-up: {cfg["prewarm_steps"]} step(s) of each optimizer on a throwaway model per process (at least 1 +
  the refresh period for an optimizer without a finished trial, whose later steps are timed for `budget_s`).
- Software: torch {versions.get("torch")}, transformers {versions.get("transformers")}, tokenizers
  {versions.get("tokenizers")}, Python {versions.get("python")}; git {commits_by_piece(pieces)};
  host {last.get("hardware", {}).get("hostname")}; {len(pieces)} piece(s), {progress["done"]}/{progress["planned"]} trials.

## Corpus
`{corpus["kind"]}`, digest `{corpus["digest"]}` (Python {corpus["python"]}): {corpus["train_files"]:,} training files
({corpus["train_bytes"] / 1e6:.1f} MB) and {corpus["val_files"]:,} held-out files ({corpus["val_bytes"] / 1e6:.1f} MB)
after removing {corpus["duplicates"]:,} duplicate and {corpus["skipped"]:,} empty or > 1 MB files; roots
{", ".join(f"`{r}`" for r in corpus["roots"])}. Encoded: {corpus["encoded_train_files"]:,} training files
({corpus["encoded_train_bytes"] / 1e6:.1f} MB, {corpus["train_tokens"]:,} tokens) and the held-out split
({corpus["val_tokens"]:,} tokens). Tokenizer: {tok["kind"]}, vocabulary {tok["vocab_size"]}, trained on
{tok["trained_on_files"]:,} files ({tok["trained_on_bytes"] / 1e6:.1f} MB).

{_manifest_md(corpus)}

## All trials
{chr(10).join(trial_lines)}

## Reproduce
`{command} out=<dir>` (one process; with `budget_s=S` it starts a trial only if its estimate ends inside S
seconds, from that optimizer's finished trials or else its prewarm's seconds per step, and a rerun with the same
`out` resumes; SIGTERM drops the trial in progress and records the piece), then
`python -m bench.tools.quality.report src=<out> dest=<report dir>`; `reproduce.sh OUT_DIR [budget_s=S]` does both.
"""


def commits_by_piece(pieces: list[dict[str, Any]]) -> str:
    """The commit of each piece, runs of equal commits merged: 'abc1234 (pieces 1-2), def5678 (piece 3)'."""
    runs: list[tuple[str, int, int]] = []
    for i, piece in enumerate(pieces, 1):
        sha = str((piece.get("git") or {}).get("sha") or "unknown")[:7]
        if runs and runs[-1][0] == sha:
            runs[-1] = (sha, runs[-1][1], i)
        else:
            runs.append((sha, i, i))
    if len(runs) == 1:
        return runs[0][0]
    return ", ".join(f"{sha} (piece {a})" if a == b else f"{sha} (pieces {a}-{b})" for sha, a, b in runs)


def main(argv: list[str] | None = None) -> int:
    from muonbench.cli_help import module_help

    args = list(sys.argv[1:] if argv is None else argv)
    if module_help(__doc__, args):
        return 0
    kv = dict(a.split("=", 1) for a in args if "=" in a)
    bad = sorted(set(kv) - {"src", "dest"}) + [a for a in args if "=" not in a]
    if "src" not in kv or bad:
        print(
            f"error: usage: python -m bench.tools.quality.report src=DIR [dest=DIR]; "
            f"{'not understood: ' + str(bad) if bad else 'src=DIR is required'}",
            file=sys.stderr,
        )
        return 2
    if not Path(kv["src"]).is_dir():
        print(
            f"error: src={kv['src']}: no such directory (a quality sweep's output directory)", file=sys.stderr
        )
        return 2
    print(write_report(Path(kv["src"]), Path(kv.get("dest", kv["src"]))))
    return 0


if __name__ == "__main__":
    from bench import entry

    raise SystemExit(entry.run(main))
