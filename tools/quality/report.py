"""Quality report from `trials.json` only (never from live processes): table, loss curves, protocol."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from tools.quality import run as qrun


def _fmt(x, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def _command(cfg: dict) -> str:
    """The CLI that reproduces `cfg`: its profile plus every key whose value differs from that profile's."""
    base = qrun.parse_cli([f"profile={cfg['profile']}"])
    args = [f"profile={cfg['profile']}"]
    for key, value in cfg.items():
        default = getattr(base, key)
        if key in ("profile", "lr_grids") or value == (
            list(default) if isinstance(default, tuple) else default
        ):
            continue
        args.append(f"{key}={','.join(value) if isinstance(value, list) else value}")
    return "python -m tools.quality " + " ".join(args)


def write_report(out: Path) -> str:
    """Write README.md, results.csv and loss_curves.png into `out`; return the markdown table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    blob = json.loads((out / "trials.json").read_text())
    meta, trials, summary = blob["meta"], blob["trials"], blob["summary"]
    cfg = meta["config"]
    rows = summary["rows"]
    with open(out / "results.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = {
        "adamw": "tab:blue",
        "muon": "tab:red",
        "muon_split_gate_up": "tab:orange",
        "mop": "tab:green",
        "soap_rekls": "tab:purple",
    }
    best = {r["optimizer"]: r["best_lr"] for r in rows}
    for t in trials:
        if not t["curve"]:
            continue
        is_best = best.get(t["optimizer"]) == t["lr"]
        steps = [p["step"] for p in t["curve"]]
        axes[0].plot(
            steps,
            [p["val_loss"] for p in t["curve"]],
            color=colors.get(t["optimizer"], "k"),
            alpha=1.0 if is_best else 0.25,
            lw=2 if is_best else 1,
            label=f"{t['optimizer']} lr={t['lr']:.0e}" if is_best else None,
        )
        if is_best:
            axes[1].plot(
                [p["wall_s"] for p in t["curve"]],
                [p["val_loss"] for p in t["curve"]],
                color=colors.get(t["optimizer"], "k"),
                lw=2,
                label=t["optimizer"],
            )
    for ax, xl in zip(axes, ("step", "wall time (s)")):
        ax.axhline(summary["target"], color="gray", ls="--", lw=1, label="AdamW final (target)")
        ax.set_xlabel(xl)
        ax.set_ylabel("validation loss")
        ax.set_ylim(top=min(ax.get_ylim()[1], summary["target"] + 2.5))
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    axes[0].set_title("validation loss (best LR bold, other trials faint)")
    axes[1].set_title("best trial per optimizer vs wall time")
    fig.tight_layout()
    fig.savefig(out / "loss_curves.png", dpi=110)
    plt.close(fig)

    head = (
        "| optimizer | best LR | final val loss | steps to AdamW final | x AdamW steps | wall s to target | "
        "device-h to target | cost | step ms | opt-step ms | step time x AdamW |"
    )
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        lines.append(
            f"| {r['optimizer']} | {r['best_lr']:.0e} | {r['final_val_loss']:.4f} | {_fmt(r['steps_to_target'], '.0f')} | "
            f"{_fmt(r['steps_ratio_vs_adamw'], '.2f')} | {_fmt(r['wall_s_to_target'], '.1f')} | "
            f"{_fmt(r['device_hours_to_target'], '.4f')} | {_fmt(r['cost_to_target'], '.4f')} | {r['step_ms']:.1f} | "
            f"{r['opt_step_ms']:.1f} | {r['step_overhead_vs_adamw']:.2f} |"
        )
    table = "\n".join(lines)
    trial_lines = ["| optimizer | LR | status | final val loss |", "|---|---|---|---|"]
    trial_lines += [
        f"| {t['optimizer']} | {t['lr']:.0e} | {t['status']} | {t['final_val_loss']:.4f} |" for t in trials
    ]
    doc = f"""# Quality bench: time to AdamW's final validation loss ({cfg["profile"]} profile)

## Protocol
{qrun.__doc__.split("Protocol (written at the top of the report):")[1].split("Usage:")[0].strip()}

- Corpus digest `{meta["corpus_digest"]}` (Python {meta["python"]} stdlib: {meta["train_files"]} training files,
  {meta["val_files"]} held-out files; {meta["train_tokens"]:,} / {meta["val_tokens"]:,} tokens), BPE vocab {cfg["vocab_size"]}.
- Model `{cfg["model"]}` widened to hidden {cfg["hidden_size"]}, {cfg["num_layers"]} layers; batch {cfg["batch_size"]} x
  seq {cfg["seq_len"]}; {cfg["steps"]} steps; eval every {cfg["eval_every"]} steps on {cfg["val_batches"]} fixed batches;
  device {cfg["device"]}; torch {meta["torch"]}; price {cfg["price_per_hour"]}/device-hour.
- Muon and MOP use the spectral scale x 0.2 (AdamW-matched update RMS), fp32 NS on CPU, quintic NS5 for Muon;
  SOAP-REKLS uses eigh every step with KL-Shampoo factors; non-matrix parameters use AdamW in every run.
- Command: `{_command(cfg)}` (`make quality` runs the cpu profile's defaults).

## Result (best learning rate per optimizer)
{table}

Target (AdamW final validation loss): {summary["target"]:.4f}. "x AdamW steps" = steps to reach it / AdamW's steps.

![loss curves](loss_curves.png)

## All trials
{chr(10).join(trial_lines)}
"""
    (out / "README.md").write_text(doc)
    return table
