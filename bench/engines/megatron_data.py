"""Micro-batches for the megatron engine: mock tokens or a Megatron indexed dataset.

Both yield Megatron's GPT batch dict {tokens, labels, loss_mask, position_ids} of shape [mbs, seq] on the device.

- `mock`: uniform random token ids from a seeded generator (the published perf runs use mock data too). Forced-balanced
  routing keeps the expert load independent of the token values.
- `indexed:<prefix>`: `<prefix>.bin/.idx` written by Megatron's preprocess_data.py; documents are concatenated (EOD
  separated as stored) and cut into seq + 1 windows, read sequentially, rank r of the data-parallel group taking
  every dp-th window. No blending, no shuffling: a throughput benchmark, not a training pipeline.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def parse_data_spec(spec: str) -> tuple[str, str]:
    """`mock` -> ("mock", ""); `indexed:<prefix>` -> ("indexed", prefix); ValueError otherwise."""
    if spec == "mock":
        return "mock", ""
    kind, _, arg = spec.partition(":")
    if kind == "indexed" and arg:
        return "indexed", arg
    raise ValueError(f"bench.data={spec!r}: the megatron engine reads 'mock' or 'indexed:<path prefix>'")


def _batch(tokens_plus_one: Any) -> dict[str, Any]:
    import torch

    tokens = tokens_plus_one[:, :-1].contiguous()
    labels = tokens_plus_one[:, 1:].contiguous()
    mbs, seq = tokens.shape
    position_ids = torch.arange(seq, device=tokens.device).unsqueeze(0).expand(mbs, seq)
    loss_mask = torch.ones(mbs, seq, dtype=torch.float32, device=tokens.device)
    return {"tokens": tokens, "labels": labels, "loss_mask": loss_mask, "position_ids": position_ids}


def mock_batches(
    *, vocab_size: int, seq_length: int, mbs: int, seed: int, device: Any
) -> Iterator[dict[str, Any]]:
    """Endless random micro-batches (ids in [0, vocab_size)); the same seed gives the same stream."""
    import torch

    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    while True:
        ids = torch.randint(0, vocab_size, (mbs, seq_length + 1), generator=gen, device=device)
        yield _batch(ids)


def indexed_batches(
    prefix: str, *, seq_length: int, mbs: int, dp_rank: int, dp_size: int, device: Any
) -> Iterator[dict[str, Any]]:
    """Sequential seq + 1 windows over the concatenated documents of a Megatron indexed dataset, cycling."""
    import numpy as np
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    ds = IndexedDataset(prefix)
    if len(ds) == 0:
        raise ValueError(f"bench.data=indexed:{prefix}: the dataset holds no documents")
    window = seq_length + 1
    buf: list[np.ndarray] = []
    held = 0
    doc = 0
    index = 0
    while True:
        rows = []
        while len(rows) < mbs:
            while held < window:
                arr = np.asarray(ds[doc % len(ds)], dtype=np.int64)
                doc += 1
                buf.append(arr)
                held += arr.size
            flat = np.concatenate(buf)
            row, rest = flat[:window], flat[window:]
            buf, held = [rest], rest.size
            if index % dp_size == dp_rank:
                rows.append(row)
            index += 1
        ids = torch.from_numpy(np.stack(rows)).to(device, non_blocking=True)
        yield _batch(ids)
