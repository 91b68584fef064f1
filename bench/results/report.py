"""Markdown report and PNG plots from the collected CSVs (never from live processes).

    python -m bench.results.report                 # the most recently collected reports/<name>/results.csv
    python -m bench.results.report --name cpu_qwen3_moe_tiny_dp2

Reads `reports/<name>/results.csv` and `steps.csv` (written by `bench.results.collect`) and writes `report.md`,
`tflops.png` (model and NS TFLOP/s per GPU side by side, `bench.results.plots`), `step_breakdown.png`, `step_time.png` and
`loss.png` (a diverged run marked where it diverged) next to them. The Table-1 style table shows the published "total = model + NS" form AND the model-only figures, and the
model-only ratio of each optimizer against the AdamW run of the same setup (from the same commit, i.e. the same
measurement batch, when there is one; of those the one started nearest in time). The tables are printed too.
No torch import; matplotlib runs with the Agg backend.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import metrics
from bench.results import markdown, plots, record
from bench.results.collect import GROUP_COLUMNS, default_report_dir
from muonbench.cli_help import command

PLOTS = ("tflops.png", "step_breakdown.png", "step_time.png", "loss.png")
BASELINE = "adamw"


def _num(v: Any) -> float | None:
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _pos(v: Any) -> float | None:
    """A measured time or rate that can be divided by: finite and > 0 (else None, never a -inf or 0 ratio)."""
    f = _num(v)
    return f if f is not None and math.isfinite(f) and f > 0 else None


CHECKED: tuple[str, ...] = (
    "step_s_median",  # the run summary's own quartiles of the step (record.summarize)
    *(f"{name}_median" for name in metrics.medians() if name.endswith("_s")),
    "model_tflops_per_gpu",
    "ns_tflops_per_gpu",
)
"""Summary columns of an ok run that must be finite and >= 0."""


def suspect_records(rows: list[dict[str, Any]], steps: Any) -> list[str]:
    """Ok runs whose numbers cannot be measurements: a negative or infinite time or rate, an optimizer step shorter
    than its parts (a negative "other"), or a steps.csv whose step count is not the run's bench.steps."""
    counts = steps.groupby("run_id").size().to_dict() if len(steps) else {}
    out = []
    for r in rows:
        if r["status"] != "ok":
            continue
        why = [
            f"{k}={r[k]}"
            for k in CHECKED
            if _num(r.get(k)) is not None and (not math.isfinite(_num(r[k]) or 0.0) or (_num(r[k]) or 0.0) < 0)
        ]
        opt = _num(r.get("optim_s_median"))
        parts = [_num(r.get(k)) or 0.0 for k in ("ns_s_median", "adamw_s_median", "clip_s_median")]
        if opt is not None and opt - sum(parts) < 0:
            why.append("optimizer step shorter than its parts (negative other)")
        num, want = counts.get(r.get("run_id"), 0), _num(r.get("steps"))
        if want is not None and num != want:
            why.append(f"{num} step records for bench.steps={want:.0f}")
        if why:
            out.append(f"{r.get('run_id')}: {'; '.join(why)}")
    return out


def fmt(v: Any, spec: str = ".4g", scale: float = 1.0) -> str:
    f = _num(v)
    return "n/a" if f is None else format(f * scale, spec)


def _label(r: dict[str, Any]) -> str:
    if r.get("label"):
        return str(r["label"])
    return f"{r['optimizer']}" if r.get("num_same_optimizer", 1) == 1 else f"{r['optimizer']} ({r['run_id']})"


def _overrides(r: dict[str, Any]) -> dict[str, str]:
    text = r.get("overrides")
    if not isinstance(text, str):
        return {}
    pairs = (o.lstrip("+~").split("=", 1) for o in text.split() if "=" in o)
    return {k: v for k, v in pairs if not k.startswith(("hydra.", "bench.resume"))}  # how it ran, not what


def run_labels(rows: list[dict[str, Any]]) -> list[str]:
    """A label per run: its optimizer config name (`optimizer_config`, e.g. `muon_split_gate_up`, else the
    optimizer) plus the overrides whose values differ between the runs (e.g. `num_ns_steps=3`); the run id is added
    only where that still leaves two runs alike."""
    ovs = [_overrides(r) for r in rows]
    keys = sorted({k for o in ovs for k in o})
    swept = [k for k in keys if len({o.get(k) for o in ovs}) > 1 and k not in ("optimizer", "bench.out_dir")]
    labels = []
    for r, o in zip(rows, ovs):
        name = r.get("optimizer_config") if isinstance(r.get("optimizer_config"), str) else None
        parts = [name or str(r["optimizer"])]
        parts += [f"{k.removeprefix('optimizer.')}={o[k]}" for k in swept if k in o]
        labels.append(" ".join(parts))
    return [f"{lab} ({r['run_id']})" if labels.count(lab) > 1 else lab for lab, r in zip(labels, rows)]


NONE_OK = "No run ended ok: nothing to tabulate here (see Runs that did not end ok)."
NOT_RUN_HERE = {
    "written": "script written, not submitted (launcher.dry_run)",
    "submitted": "submitted; the cluster job closes its record",
}


def _error_text(r: dict[str, Any]) -> str:
    """The error cell of a run that did not end ok: its recorded error, or what its status means."""
    kind, message = (r.get(k) for k in ("error_type", "error_message"))
    if isinstance(kind, str) or isinstance(message, str):
        return f"{kind if isinstance(kind, str) else 'error'}: {str(message)[:200]}"
    return NOT_RUN_HERE.get(str(r.get("status")), "no error recorded")


def _status_text(r: dict[str, Any]) -> str:
    """The status cell; a diverged run says at which step."""
    at = _num(r.get("diverged_at_step"))
    return f"{r['status']} at step {int(at)}" if at is not None else str(r["status"])


def _nearest_baseline(r: dict[str, Any], base: list[dict[str, Any]]) -> dict[str, Any]:
    """The AdamW run to compare `r` with: same git SHA if any (runs of one measurement batch share a machine and its
    thermal / host state, runs of different calls do not), then nearest start time; else the last one."""
    from datetime import datetime

    sha = r.get("git_sha")
    pool = [b for b in base if sha and b.get("git_sha") == sha] or base

    def start(x: dict[str, Any]) -> float | None:
        try:
            return datetime.fromisoformat(str(x.get("start_time"))).timestamp()
        except ValueError:
            return None

    t = start(r)
    timed = [(abs(tb - t), i) for i, b in enumerate(pool) if t is not None and (tb := start(b)) is not None]
    return pool[min(timed)[1]] if timed else pool[-1]


def model_only_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each ok non-AdamW run: model-only and total TFLOP/s ratios against the ok AdamW run of the same setup."""
    out = []
    for r in rows:
        if r["status"] != "ok" or r["optimizer"] == BASELINE:
            continue
        key = tuple(r.get(c) for c in GROUP_COLUMNS)
        base = [
            b
            for b in rows
            if b["optimizer"] == BASELINE
            and b["status"] == "ok"
            and tuple(b.get(c) for c in GROUP_COLUMNS) == key
        ]
        if not base:
            continue
        b = _nearest_baseline(r, base)
        m, mb = _pos(r.get("model_tflops_per_gpu")), _pos(b.get("model_tflops_per_gpu"))
        t = _pos(r.get("total_tflops_per_gpu"))
        out.append(
            {
                "optimizer": _label(r),
                "baseline": _label(b),
                "model_only_ratio": m / mb if m and mb else None,
                "total_ratio": t / mb if t and mb else None,
                "step_time_ratio": (_pos(r["step_s_median"]) or 0) / (_pos(b["step_s_median"]) or 1),
                "extra_step_ms": ((_num(r["step_s_median"]) or 0) - (_num(b["step_s_median"]) or 0)) * 1e3,
                "resolved": abs((_num(r["step_s_median"]) or 0) - (_num(b["step_s_median"]) or 0))
                > max(_num(r.get("step_s_iqr")) or 0, _num(b.get("step_s_iqr")) or 0),
                "same_call": bool(r.get("git_sha")) and r.get("git_sha") == b.get("git_sha"),
            }
        )
    return out


def _num_key(text: str) -> tuple[float, str]:
    """Sort key of formatted numbers (non-numbers last), so that generated text does not depend on set order."""
    value = _num(text)
    return (value if value is not None else math.inf, text)


def _clean_calls(rows: list[dict[str, Any]]) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    """Ok runs with a model TFLOP/s, grouped by (setup columns..., commit): one measurement batch each. Runs recorded from
    a dirty tree are left out: their commit does not pin the code, so it cannot stand for one measurement batch."""
    calls: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        dirty = str(r.get("git_dirty") or "").lower() in ("true", "1")
        if r["status"] == "ok" and r.get("git_sha") and not dirty and _num(r.get("model_tflops_per_gpu")):
            calls.setdefault((*(r.get(c) for c in GROUP_COLUMNS), r["git_sha"]), []).append(r)
    return calls


def pooled_call_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per measurement batch (same setup and commit) with more than one run of a side: the mean model TFLOP/s of the runs
    of one configuration (config hash) over the mean of that call's AdamW runs. Repeated runs in one call (A B A, B A B
    A) then give one number instead of several nearest-in-time pairs that drift apart. Runs recorded from a dirty
    tree are left out: their commit does not pin the code, so it cannot stand for one measurement batch."""
    out = []
    for key, runs in _clean_calls(rows).items():
        base = [r for r in runs if r["optimizer"] == BASELINE]
        variants: dict[Any, list[dict[str, Any]]] = {}
        for r in runs:
            if r["optimizer"] != BASELINE:
                variants.setdefault(r.get("config_hash") or r["run_id"], []).append(r)
        for vr in variants.values():
            if not base or len(vr) + len(base) < 3:
                continue
            mean_b = statistics.fmean(_num(b["model_tflops_per_gpu"]) or 0.0 for b in base)
            mean_v = statistics.fmean(_num(v["model_tflops_per_gpu"]) or 0.0 for v in vr)
            out.append(
                {
                    "git_sha": key[-1],
                    "optimizer": f"{vr[0]['optimizer']} ({', '.join(v['run_id'] for v in vr)})",
                    "baseline": ", ".join(b["run_id"] for b in base),
                    "runs": len(vr),
                    "baseline_runs": len(base),
                    "model_only_ratio": mean_v / mean_b if mean_b else None,
                }
            )
    return out


def _visible_gpus(row: dict[str, Any]) -> str | None:
    """The run's CUDA_VISIBLE_DEVICES as text ("0" read back from a CSV as the number 0 included), or None."""
    value = row.get("visible_gpus")
    if value is None or value == "" or (isinstance(value, float) and math.isnan(value)):
        return None
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def pooled_across_calls(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per configuration (config hash) run in two or more measurement batches (clean commits): every run's model-only
    ratio against the mean of its own call's AdamW runs, then their mean, standard deviation and standard error.
    One call's ratio carries that call's drift and its GPU; this is the number to quote, with its uncertainty.
    Configurations whose hash changed (a schema field added) pool apart. Where calls ran AdamW on several GPUs
    (`visible_gpus`, a crossover), also the same statistics over the runs that have AdamW runs on their own GPU in
    their call, against those (`same_gpu_*`)."""
    per_cfg: dict[tuple[Any, ...], list[tuple[str, str, float, float | None]]] = {}
    for key, runs in _clean_calls(rows).items():
        base = [b for b in runs if b["optimizer"] == BASELINE]
        if not base:
            continue
        mean_b = statistics.fmean(_num(b["model_tflops_per_gpu"]) or 0.0 for b in base)
        by_gpu: dict[str, list[float]] = {}
        for b in base:
            if (gpu := _visible_gpus(b)) is not None:
                by_gpu.setdefault(gpu, []).append(_num(b["model_tflops_per_gpu"]) or 0.0)
        for r in runs:
            if r["optimizer"] != BASELINE and r.get("config_hash"):
                tf = _num(r["model_tflops_per_gpu"]) or 0.0
                gpu = _visible_gpus(r)
                same = by_gpu.get(gpu) if gpu is not None and len(by_gpu) > 1 else None
                per_cfg.setdefault((*key[:-1], r["optimizer"], r["config_hash"]), []).append(
                    (key[-1], r["run_id"], tf / mean_b, tf / statistics.fmean(same) if same else None)
                )
    out = []
    for (*_, opt, cfg), items in per_cfg.items():
        shas = sorted({sha for sha, _, _, _ in items})
        if len(shas) < 2:
            continue
        ratios = [x for _, _, x, _ in items]
        sd = statistics.stdev(ratios) if len(ratios) > 1 else 0.0
        entry = {
            "optimizer": opt,
            "config_hash": cfg,
            "runs": [run_id for _, run_id, _, _ in items],
            "calls": shas,
            "mean": statistics.fmean(ratios),
            "sd": sd,
            "se": sd / len(ratios) ** 0.5,
        }
        matched = [m for _, _, _, m in items if m is not None]
        if len(matched) > 1:
            # runs with AdamW runs of their own call on their own GPU (multi-GPU crossovers): the GPU-to-GPU
            # difference (~1% between the two H200s of one host) is then out of the ratio
            msd = statistics.stdev(matched)
            entry |= {
                "same_gpu_runs": len(matched),
                "same_gpu_mean": statistics.fmean(matched),
                "same_gpu_sd": msd,
                "same_gpu_se": msd / len(matched) ** 0.5,
            }
        out.append(entry)
    return out


def table1(rows: list[dict[str, Any]]) -> str:
    header = [
        "optimizer",
        "status",
        "step time, ms: median (IQR)",
        "first step, s (its optimizer step)",
        "tokens/s per GPU",
        "model TFLOP/s per GPU",
        "NS TFLOP/s per GPU",
        "published form: total = model + NS",
        "MFU (model)",
    ]
    body = []
    for r in rows:
        ok = r["status"] == "ok"
        mfu = _num(r.get("mfu"))
        body.append(
            [
                _label(r),
                _status_text(r) if ok else f"**{_status_text(r)}**",
                f"{fmt(r.get('step_s_median'), '.1f', 1e3)} ({fmt(r.get('step_s_iqr'), '.1f', 1e3)})"
                if ok
                else "-",
                f"{fmt(r.get('first_step_s'), '.3g')} ({fmt(r.get('first_optim_s'), '.3g')})" if ok else "-",
                fmt(r.get("tokens_per_s_per_gpu"), ".0f") if ok else "-",
                fmt(r.get("model_tflops_per_gpu")) if ok else "-",
                fmt(r.get("ns_tflops_per_gpu")) if ok else "-",
                (
                    f"{fmt(r.get('total_tflops_per_gpu'))} = {fmt(r.get('model_tflops_per_gpu'))} + "
                    f"{fmt(r.get('ns_tflops_per_gpu'))}"
                )
                if ok
                else "-",
                (f"{mfu:.1%}" if mfu is not None else "N/A (no peak for this hardware)") if ok else "-",
            ]
        )
    return markdown.table(header, body)


REMAINDERS = {
    "other_optim_s_median": ("optim_s", ("ns_s", "adamw_s", "clip_s")),
    "rest_s_median": ("step_s", ("fwd_bwd_s", "comm_s", "optim_s")),
}
"""What a step's timed parts leave of their whole: name -> (whole, parts), read from steps.csv."""


def add_remainders(rows: list[dict[str, Any]], steps: Any) -> None:
    """Each row gets, per `REMAINDERS`, the median over its steady steps of the whole less its parts, step by step:
    the difference of medians taken apart is not a median of anything and went negative (-4.11 ms)."""
    for r in rows:
        s = steps[(steps["run_id"] == r["run_id"]) & ~steps["warmup"].astype(bool)] if len(steps) else steps
        for name, (whole, parts) in REMAINDERS.items():
            if not len(s) or s[whole].isna().all():
                r[name] = None
                continue
            rest = s[whole] - s[list(parts)].fillna(0.0).sum(axis=1)
            r[name] = float(rest.median())


def breakdown(rows: list[dict[str, Any]]) -> str:
    header = [
        "optimizer",
        "step",
        "forward+backward",
        "communication",
        "optimizer step",
        "of which orthogonalize (NS; SVD for MOP)",
        "of which AdamW part",
        "of which grad clipping (incl. its norm all-reduce)",
        "of which other (momentum, update, LR)",
        "NS FLOPs per GPU per step (counted)",
        "NS FLOPs per step (bench.flops, each matrix once)",
    ]
    body = []
    for r in rows:
        if r["status"] != "ok":
            continue
        ns, adam, clip, other = (
            _num(r.get(k)) for k in ("ns_s_median", "adamw_s_median", "clip_s_median", "other_optim_s_median")
        )
        body.append(
            [
                _label(r),
                *(
                    fmt(r.get(k), ".2f", 1e3)
                    for k in ("step_s_median", "fwd_bwd_s_median", "comm_s_median", "optim_s_median")
                ),
                fmt(ns, ".2f", 1e3),
                fmt(adam, ".2f", 1e3),
                fmt(clip, ".2f", 1e3),
                fmt(other, ".2f", 1e3),
                fmt(r.get("ns_flops_per_gpu_per_step"), ".4g"),
                fmt(r.get("ns_flops_enumerated_per_step"), ".4g"),
            ]
        )
    if not body:  # a header alone says nothing
        return NONE_OK
    return markdown.table(header, body) + (
        "\n\nTimes in ms, medians over the steady window (each phase's own median, so the parts need not add up "
        "exactly; \"other\" is the median of what each step's optimizer step leaves after its NS, AdamW part and "
        "clipping). Communication = gradient sync and, for the layer-wise optimizer, the parameter all-gather; "
        "forward+backward and optimizer step exclude the communication inside them. NS FLOPs per GPU are those of "
        "the busiest rank (the layer-wise optimizer splits the matrices over the ranks; a replicated one runs all "
        "of them on every rank)."
    )


def _loss_note(ok: list[dict[str, Any]]) -> str:
    notes = []
    if any(r.get("data") == "mock" for r in ok):
        notes.append(
            "With `data=mock` the tokens are uniform random, so no model can go below ln(vocab) nats: the "
            "loss curve checks that training runs (finite, no divergence); it does not compare optimizer "
            "quality (bench/tools/quality does)."
        )
    warm = {int(w) for w in (_num(r.get("optimizer.lr_warmup_steps")) for r in ok) if w is not None}
    steps = {int(s) for s in (_num(r.get("steps")) for r in ok) if s is not None}
    if warm and steps and min(warm) > max(steps):
        notes.append(
            f"The LR schedule is the published one (linear warm-up over {min(warm)} steps), so in "
            f"{max(steps)} steps the LR stays below {max(steps) / min(warm):.1%} of its peak: the runs "
            "measure throughput, not learning."
        )
    return " ".join(notes)


def _txt(v: Any) -> str:
    """A CSV cell as text: '-' for empty (None or NaN)."""
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def _setup_text(rows: list[dict[str, Any]]) -> str:
    r = {k: _txt(v) for k, v in rows[0].items()}
    lines = [
        (
            f"- experiment `{r['experiment']}`: model `{r['model']}` ({r['model_family']}), parallelism "
            f"`{r['parallelism']}` (world size {r['world_size']}, DP {r['dp']}, TP {r['tp']}, PP {r['pp']}, EP {r['ep']}; "
            f"GBS {r['gbs']}, MBS {r['mbs']}, seq {r['seq_length']}), engine `{r['engine']}` on `{r['device']}`, "
            f"precision `{r['precision']}` (math: {r.get('math_dtype', '-')}), data `{r['data']}`"
        ),
        f"- hardware `{r['hardware_name']}`: CPU {r['cpu_model']}, GPU {r['gpu_name']} x {r['gpu_count']} "
        f"(driver {r['gpu_driver']}); 1-min load average at the start of each run: "
        + ", ".join(fmt(x.get("load_avg_1m"), ".1f") for x in rows),
        (
            f"- provenance: git `{r['git_sha'][:12]}`{' (dirty tree)' if r['git_dirty'] == 'True' else ''}, "
            f"torch {r['torch']}, transformers {r['transformers']}, megatron-core {r['megatron_core']}; "
            f"timer `{r['timer']}`; model FLOPs per step (bench.flops, Megatron formula) "
            f"{fmt(rows[0].get('model_flops_per_step'), '.4g')}"
        ),
    ]
    for x in rows:
        lines.append(f"- {_label(x)}: optimizer distribution: {_txt(x.get('optimizer_distribution'))}")
    for cmd in dict.fromkeys(str(x.get("command")) for x in rows):
        lines.append(f"- command: `{cmd}`")
    return "\n".join(lines)


def _left_out(dest: Path) -> list[str]:
    """The records the collector dropped or cut, with why (`skipped_records` of the report's run.json)."""
    try:
        prov = record.read_json(dest / "run.json")
    except (OSError, ValueError):
        return []
    return [str(m) for m in (prov.get("skipped_records") or [])] if isinstance(prov, dict) else []


def _pooled_parts(rows: list[dict[str, Any]]) -> list[str]:
    """The report's pooled ratios: per measurement batch, and across batches of one configuration."""
    parts: list[str] = []
    pooled = pooled_call_ratios(rows)
    if pooled:
        parts += [
            (
                "Pooled per measurement batch (same clean commit; mean model TFLOP/s of a configuration's runs over the "
                "mean of the call's AdamW runs):"
            ),
            "\n".join(
                f"- {x['git_sha']}: **{x['optimizer']}: {fmt(x['model_only_ratio'], '.3f')}** x AdamW "
                f"({x['runs']} run(s) vs {x['baseline_runs']} AdamW: {x['baseline']})"
                for x in pooled
            ),
        ]
    across = pooled_across_calls(rows)
    if across:
        parts += [
            (
                "Pooled across measurement batches (one configuration hash, clean commits; each run's model-only ratio "
                "against the mean of its own call's AdamW runs; mean, standard deviation, standard error):"
            ),
            "\n".join(
                f"- {x['optimizer']} (config {x['config_hash']}): **{fmt(x['mean'], '.4f')}** x AdamW, sd "
                f"{fmt(x['sd'], '.4f')}, s.e. {fmt(x['se'], '.4f')} ({record.count(len(x['runs']), 'run')} in {len(x['calls'])} "
                f"calls {', '.join(x['calls'])}: {', '.join(x['runs'])})"
                + (
                    f"; against the AdamW runs of the same call on the same GPU ({x['same_gpu_runs']} of the runs "
                    f"have some): **{fmt(x['same_gpu_mean'], '.4f')}**, sd {fmt(x['same_gpu_sd'], '.4f')}, s.e. "
                    f"{fmt(x['same_gpu_se'], '.4f')}"
                    if "same_gpu_mean" in x
                    else ""
                )
                for x in across
            ),
        ]
    return parts


def render(results: Any, steps: Any, dest: Path, name: str) -> str:
    """Write report.md and the plots into `dest`; returns the markdown."""
    import matplotlib

    matplotlib.use("Agg")
    rows = results.to_dict("records")
    add_remainders(rows, steps)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["optimizer"]] = counts.get(r["optimizer"], 0) + 1
    for r in rows:
        r["num_same_optimizer"] = counts[r["optimizer"]]
    for r, lab in zip(rows, run_labels(rows)):
        r["label"] = lab
    ratios = model_only_ratios(rows)
    ok = [r for r in rows if r["status"] == "ok"]
    failed = [r for r in rows if r["status"] != "ok"]
    steps_n = {fmt(r.get("steps"), ".0f") for r in rows}
    warm_n = {fmt(r.get("warmup_steps"), ".0f") for r in rows}
    parts = [
        f"# {name}",
        (
            f"Generated by `python -m bench.results.report` from `results.csv` and `steps.csv` ({record.count(len(rows), 'run')}, "
            f"{len(ok)} ok). Plots are drawn from these files only."
        ),
        "## Setup",
        _setup_text(rows),
        "## Protocol",
        (
            f"{' / '.join(sorted(steps_n, key=_num_key))} steps per run, the first "
            f"{' / '.join(sorted(warm_n, key=_num_key))} are warm-up. {record.PROTOCOL_TEXT}."
        ),
        "## Throughput (Table 1 form)",
        table1(rows),
    ]
    suspect = suspect_records(rows, steps)
    if suspect:
        parts += [
            "## Suspect records",
            "These ok runs hold numbers no measurement gives; their ratios are n/a, check the records:\n\n"
            + "\n".join(f"- {x}" for x in suspect),
        ]
    if ratios:
        lines = [
            f"- **{x['optimizer']} / {x['baseline']}: model-only ratio {fmt(x['model_only_ratio'], '.3f')}** "
            f"(model TFLOP/s per GPU; = step-time ratio {fmt(1 / x['step_time_ratio'] if x['step_time_ratio'] else None, '.3f')}"
            f", {fmt(x['extra_step_ms'], '+.1f')} ms per step); with NS FLOPs counted (published form) "
            f"{fmt(x['total_ratio'], '.3f')}"
            + (
                ""
                if x["resolved"]
                else "; the step-time difference is within the IQR of the runs, so this "
                "machine does not resolve it"
            )
            + (
                ""
                if x["same_call"]
                else " (no AdamW run of the same commit / measurement batch: compared with one of another batch, "
                "which may have run on another machine)"
            )
            for x in ratios
        ]
        parts += [
            (
                "Model-only ratio against AdamW (the honest comparison; the published form adds NS FLOPs to the "
                "Muon side only):"
            ),
            "\n".join(lines),
        ]
    parts += _pooled_parts(rows)
    parts += [
        "## Optimizer step breakdown",
        breakdown(rows),
        "## Loss",
        markdown.table(
            ["optimizer", "first step", "last step", "skipped updates"],
            [
                [
                    _label(r),
                    fmt(r.get("loss_first"), ".4f"),
                    fmt(r.get("loss_last"), ".4f"),
                    fmt(r.get("skipped_updates"), ".0f"),
                ]
                for r in ok
            ],
        )
        if ok
        else NONE_OK,
        _loss_note(ok),
    ]
    left_out = _left_out(dest)
    if left_out:
        parts += [
            "## Records left out",
            (
                "What `bench.results.collect` could not read whole (its `run.json`: `skipped_records`); the "
                "tables above do not include it:"
            ),
            "\n".join(f"- {m}" for m in left_out),
        ]
    if failed:
        parts += [
            "## Runs that did not end ok",
            markdown.table(
                ["run", "optimizer", "status", "error"],
                [
                    [
                        str(r["run_id"]),
                        _label(r),
                        _status_text(r),
                        (
                            f"loss {str(r.get('diverged_loss')).lower()} at step {fmt(r.get('diverged_at_step'), '.0f')}"
                            + (f": {r['diverged_reason']}" if r.get("diverged_reason") else "")
                            if _num(r.get("diverged_at_step")) is not None
                            else _error_text(r)
                        )
                        .replace("|", "/")
                        .replace("\n", " "),
                    ]
                    for r in failed
                ],
            ),
            "No ratio is computed against a run that did not end ok (docs/run_status.md: the status values).",
        ]
    peak = [r for r in ok if _num(r.get("peak_mem_bytes"))]
    if peak:
        parts += [
            "## Memory",
            markdown.table(
                ["optimizer", "peak memory per rank, MiB"],
                [[_label(r), fmt(r["peak_mem_bytes"], ".0f", 2**-20)] for r in peak],
            ),
            "GPU: torch.cuda.max_memory_allocated; CPU: peak resident set size of the rank process.",
        ]
    dest.mkdir(parents=True, exist_ok=True)
    curves = [r for r in rows if r["status"] == "ok" or _num(r.get("diverged_at_step")) is not None]
    figures = {}
    if ok:
        figures["tflops.png"] = plots.tflops_figure(ok, _label)
        figures["step_breakdown.png"] = plots.breakdown_figure(ok, _label)
    if curves:
        figures["step_time.png"] = plots.curves_figure(
            steps, curves, "step_s", "step time, ms", _label, scale=1e3
        )
        figures["loss.png"] = plots.curves_figure(steps, curves, "loss", "training loss", _label)
    drawn = [p for p in PLOTS if p in figures]
    if drawn:
        parts += ["## Plots", *(f"![{p[:-4]}]({p})" for p in drawn)]
    text = "\n\n".join(p for p in parts if p) + "\n"
    # Drawn into a temporary folder and moved in whole: an interrupt or a failed write leaves the old report as it was
    tmp = Path(tempfile.mkdtemp(dir=dest, prefix=".report."))
    try:
        for file, fig in figures.items():
            plots.save(fig, tmp / file)
        (tmp / "report.md").write_text(text)
        for file in set(PLOTS) - set(figures):  # an earlier report's plot would show runs this one does not have
            (dest / file).unlink(missing_ok=True)
        for file in [*figures, "report.md"]:
            os.replace(tmp / file, dest / file)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return text


def main(argv: list[str] | None = None) -> int:
    import pandas as pd

    ap = argparse.ArgumentParser(prog=command("bench.results.report"), description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--dir",
        type=Path,
        help="the folder holding results.csv and steps.csv (bench.results.collect's output)",
    )
    ap.add_argument(
        "--name", help="report folder under --reports (with --reports alone: the newest one there)"
    )
    ap.add_argument("--reports", type=Path, help="root of named report folders (default: reports)")
    ap.add_argument("--out-dir", type=Path, default=Path("runs"), help="bench.out_dir holding LATEST.json")
    args = ap.parse_args(argv)
    try:
        if args.dir:
            dest = args.dir
        elif args.name:
            dest = (args.reports or Path("reports")) / args.name
        elif args.reports:
            collected = sorted(args.reports.glob("*/results.csv"), key=lambda p: p.stat().st_mtime)
            if not collected:
                raise ValueError(
                    f"no --name and no {args.reports}/*/results.csv; run `{command('bench.results.collect')}` first"
                )
            dest = collected[-1].parent
        else:
            manifest = args.out_dir / "LATEST.json"
            if not manifest.exists():
                raise ValueError(
                    f"{manifest} does not exist: run `{command('bench.run')}` first, or pass --dir/--name"
                )
            dest = default_report_dir(record.read_json(manifest))
        if not (dest / "results.csv").exists():
            raise ValueError(
                f"{dest / 'results.csv'} does not exist; run `{command('bench.results.collect')}` first"
            )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    results = pd.read_csv(dest / "results.csv")
    steps = pd.read_csv(dest / "steps.csv")
    name = args.name or (dest.name if dest.name != "report" else dest.parent.name)
    text = render(results, steps, dest, str(name))
    start = text.index("## Throughput")
    end = text.index("## Loss")
    print(text[start:end].rstrip())
    if "## Runs that did not end ok" in text:  # on the terminal too: an all-failed sweep says why
        section = text[text.index("## Runs that did not end ok") :]
        nxt = section.find("\n## ")
        print("\n" + (section if nxt < 0 else section[:nxt]).rstrip())
    print(f"\n== report: {dest / 'report.md'} (+ {', '.join(p for p in PLOTS if (dest / p).exists())})")
    return 0


if __name__ == "__main__":
    from bench import entry

    raise SystemExit(entry.run(main))
