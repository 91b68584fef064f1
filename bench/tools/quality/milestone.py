"""Cost per quality milestone: GPU-hours to reach AdamW's loss, from a measured token efficiency and a step time.

A quality sweep measures, at one horizon, how many of AdamW's tokens an optimizer needs to reach AdamW's final
validation loss (`time_to_target_ratio.<optimizer>.tokens_ratio` of its `summary.json`, with a 95% interval). For a
training run of D tokens with AdamW, at `tokens_per_step` tokens per step on `num_gpus` GPUs:

    AdamW GPU-hours     = D / tokens_per_step x adamw_step_s x num_gpus / 3600
    optimizer GPU-hours = tokens_ratio x D / tokens_per_step x step_s x num_gpus / 3600

D defaults to the measurement's own horizon in tokens per non-embedding parameter times the model's non-embedding
parameters. The answer rests on carrying the measured token ratio over to another model and horizon; every result
says which measurement and which horizon, so the assumption is never hidden. `bench.tools.recommend` (`quality=`)
and the quality report call `gpu_hours`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import flops
from muonbench.schema import ModelConfig

INF = float("inf")


def load(path: str | Path) -> dict[str, Any]:
    """A quality sweep's `summary.json` (a file, or the report folder holding it)."""
    p = Path(path)
    p = p / "summary.json" if p.is_dir() else p
    if not p.exists():
        raise ValueError(
            f"quality={path}: no summary.json there (a quality report folder, e.g. reports/quality_*)"
        )
    return json.loads(p.read_text())


def non_embedding_params(model: ModelConfig) -> int:
    """Decoder matrices of `model` (attention, MLP or experts, router): the parameters a horizon in tokens per
    parameter counts (norms, a few thousand, left out)."""
    mats = flops.enumerate_ns_matrices(model, split_qkv=False, router_to_matrix=True)
    return sum(m.rows * m.cols * m.count for m in mats)


def gpu_hours(
    quality: dict[str, Any],
    *,
    optimizer: str,
    step_s: float,
    adamw_step_s: float,
    tokens_per_step: float,
    num_gpus: int,
    horizon_tokens: float | None = None,
    non_embedding: int | None = None,
    source: str = "summary.json",
) -> dict[str, Any]:
    """GPU-hours for AdamW to train `horizon_tokens` and for `optimizer` to reach AdamW's loss at that horizon.

    Args:
        quality: a quality `summary.json`.
        optimizer: an arm of it other than adamw.
        step_s, adamw_step_s: seconds per step of the optimizer and of AdamW on the user's setup.
        tokens_per_step: global batch x sequence length.
        num_gpus: GPUs the step time is for.
        horizon_tokens: AdamW's training tokens; None = the measurement's tokens per parameter x `non_embedding`.
        non_embedding: the user's model's non-embedding parameters (needed without `horizon_tokens`).
        source: where `quality` was read from (named in `rests_on`).
    """
    ratios = quality.get("time_to_target_ratio", {})
    if optimizer not in ratios:
        raise ValueError(f"optimizer={optimizer!r}: {source} measures {sorted(ratios) or 'no optimizer'}")
    r = ratios[optimizer]
    tpp = quality["tokens_per_param"]
    if horizon_tokens is None:
        if non_embedding is None:
            raise ValueError("gpu_hours needs horizon_tokens or non_embedding")
        horizon_tokens = tpp * non_embedding
        horizon = (
            f"{tpp:.1f} tokens per non-embedding parameter (the measurement's) x {non_embedding / 1e6:,.1f} M"
        )
    else:
        horizon = f"{horizon_tokens:.3g} tokens (given)"

    def hours(tokens: float, seconds: float) -> float:
        return tokens / tokens_per_step * seconds * num_gpus / 3600

    lo, hi = (
        INF if x is None else x for x in r["tokens_ci95"]
    )  # summary.json writes a never-reached end as null
    adamw_h = hours(horizon_tokens, adamw_step_s)
    return {
        "optimizer": optimizer,
        "horizon_tokens": horizon_tokens,
        "horizon": horizon,
        "adamw_gpu_hours": adamw_h,
        "gpu_hours": None if r["tokens_ratio"] is None else hours(r["tokens_ratio"] * horizon_tokens, step_s),
        "gpu_hours_ci95": [hours(lo * horizon_tokens, step_s), hours(hi * horizon_tokens, step_s)],
        "tokens_ratio": r["tokens_ratio"],
        "tokens_ci95": [lo, hi],
        "step_time_ratio": step_s / adamw_step_s,
        "no_interval": {"step_time_ratio": "the step times given, a scale factor, not a measured comparison"},
        "rests_on": (
            f"{source}: {optimizer} reached AdamW's final validation loss in {_x(r['tokens_ratio'])} of AdamW's "
            f"tokens (95% {_x(lo)}-{_x(hi)}, {r['seeds']} seeds) on a {quality['non_embedding_params'] / 1e6:.1f} M "
            f"non-embedding-parameter model at {tpp:.1f} tokens per parameter ({quality.get('gpu') or 'CPU'}); "
            f"assumed to hold at this model and horizon"
        ),
    }


def _x(v: float | None) -> str:
    return "n/a" if v is None else ("never" if v == INF else f"{v:.2f}x")


def _h(v: float | None) -> str:
    return "never" if v is None or v == INF else f"{v:,.4g}"


def format_line(m: dict[str, Any]) -> str:
    """One line of what `gpu_hours` found, and one of what it rests on."""
    got = "does not reach it" if m["gpu_hours"] is None else f"{m['gpu_hours']:,.4g} GPU-h"
    lo, hi = m["gpu_hours_ci95"]
    return (
        f"GPU-hours to reach AdamW's loss ({m['horizon']}): AdamW {m['adamw_gpu_hours']:,.4g}, {m['optimizer']} "
        f"{got} (95% {_h(lo)}-{_h(hi)})\n    rests on {m['rests_on']}"
    )
