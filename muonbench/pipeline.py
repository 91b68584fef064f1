"""Megatron pipeline layouts: the layout string and the decoder layers each pipeline rank holds."""

from __future__ import annotations

import re

from muonbench.schema import ModelConfig, ParallelismConfig


def parse_pipeline_layout(layout: str) -> list[str]:
    """Megatron layout string -> one string per virtual stage, unrolled: "Et*2|(t|)*2L" -> ["Ett", "t", "t", "L"].

    E = embedding, t = decoder layer, m = MTP layer, L = loss; stage i runs on pipeline rank i % pp.
    """
    text = layout.replace(",", "")  # commas are cosmetic
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):  # unroll (..)*n, then x*n, as Megatron does
        text = re.sub(pattern, lambda mt: mt.group(1) * int(mt.group(2)), text)
    if set(text) - set("EtmL|"):
        raise ValueError(
            f"parallelism.pipeline_layout={layout!r}: only E, t, m, L, |, (...)*n and x*n are allowed"
        )
    return text.split("|")


def stage_layers(model: ModelConfig, par: ParallelismConfig) -> list[list[int]]:
    """Decoder layer indices per pipeline rank (Megatron layout string, or an even split into pp x vp chunks)."""
    pp, n = par.pp, model.num_layers
    if par.pipeline_layout:
        chunks = parse_pipeline_layout(par.pipeline_layout)
        if len(chunks) % pp:
            raise ValueError(
                f"parallelism.pipeline_layout={par.pipeline_layout!r}: {len(chunks)} stages, not a "
                f"multiple of pp={pp}"
            )
        sizes = [c.count("t") for c in chunks]
    else:
        sizes = [n // (pp * par.vp)] * (pp * par.vp)
    if sum(sizes) != n:
        raise ValueError(
            f"parallelism.pipeline_layout={par.pipeline_layout!r}: holds {sum(sizes)} decoder layers, "
            f"model.num_layers={n}"
        )
    out: list[list[int]] = [[] for _ in range(pp)]
    start = 0
    for i, size in enumerate(sizes):  # chunk i runs on pipeline rank i % pp (virtual stage i // pp)
        out[i % pp].extend(range(start, start + size))
        start += size
    return out
