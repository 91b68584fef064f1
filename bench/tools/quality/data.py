"""Offline corpus, tokenizer and batches for the quality bench.

Corpora (`corpus=`):
- `stdlib`: the top-level `*.py` modules of the running interpreter's standard library (`sysconfig` "stdlib" path,
  no sub-packages), sorted by file name; every 10th file in that order (index % 10 == 9) is held out.
- `python_packages`: the source of every installed package and the stdlib, deduplicated, held out by path hash
  (`bench.tools.quality.corpus`).
Files are read as UTF-8 (undecodable bytes replaced). The corpus digest is recorded with every result and checked
when a sweep resumes, because installed sources differ between machines and Python patch releases.

Tokenizer: a byte-level BPE (`tokenizers`) trained on (a byte-capped prefix of) the training split only, saved as
`tokenizer.json` in the sweep's output directory and reused from there. Token streams: files joined by the
end-of-text token, cached as `.npy` under the corpus digest and the tokenizer's hash.
"""

from __future__ import annotations

import hashlib
import json
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VAL_EVERY = 10
EOT = "<|endoftext|>"


@dataclass(frozen=True, kw_only=True, slots=True)
class Corpus:
    train_files: tuple[Path, ...]
    val_files: tuple[Path, ...]
    digest: str

    def text(self, split: str) -> str:
        files = {"train": self.train_files, "val": self.val_files}[split]
        return "\n".join(read_text(f) for f in files)


def read_text(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")


def stdlib_corpus(root: Path | None = None) -> Corpus:
    """The fixed stdlib corpus and its train/validation split."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = sorted(root.glob("*.py"), key=lambda p: p.name)
    if len(files) < VAL_EVERY:
        raise ValueError(f"stdlib root {root} has {len(files)} top-level .py files; need >= {VAL_EVERY}")
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    val = tuple(f for i, f in enumerate(files) if i % VAL_EVERY == VAL_EVERY - 1)
    train = tuple(f for i, f in enumerate(files) if i % VAL_EVERY != VAL_EVERY - 1)
    return Corpus(train_files=train, val_files=val, digest=h.hexdigest()[:16])


def cache_dir(override: str = "") -> Path:
    """`override`, else `quality/` in muonbench's cache folder (`optim.cache.cache_root`); created."""
    from optim.cache import cache_root

    d = Path(override) if override else cache_root() / "quality"
    d.mkdir(parents=True, exist_ok=True)
    return d


def load_or_train_tokenizer(path: Path, files: list[Path], vocab_size: int):  # -> tokenizers.Tokenizer
    """The byte-level BPE at `path`, or one trained on `files` and saved there. A stored tokenizer of another
    vocabulary size is an error (the output directory belongs to another sweep)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if path.exists():
        tok = Tokenizer.from_file(str(path))
        if tok.get_vocab_size() != vocab_size:
            raise ValueError(
                f"vocab_size={vocab_size} but {path} holds a tokenizer of {tok.get_vocab_size()}; "
                "use a new out directory or the stored vocab_size"
            )
        return tok
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[EOT],
        show_progress=False,
    )
    tok.train_from_iterator((read_text(f) for f in files), trainer=trainer, length=len(files))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tok.save(str(tmp))
    os.replace(tmp, path)
    return tok


def tokenizer_hash(tokenizer) -> str:
    return hashlib.sha256(tokenizer.to_str().encode()).hexdigest()[:12]


def encode_files(
    tokenizer, files: list[Path], cache: Path, *, chunk: int = 512
):  # -> (torch int32 1-D, counts)
    """Token ids of `files` joined by the end-of-text token, and the token count of each file (end-of-text
    included). Cached at `cache` (.npy) with the counts beside it (.json)."""
    import numpy as np
    import torch

    counts_path = cache.with_suffix(".json")
    if cache.exists() and counts_path.exists():
        arr = np.load(cache)
        return torch.from_numpy(arr.astype(np.int32)), json.loads(counts_path.read_text())
    eot = tokenizer.token_to_id(EOT)
    dtype = np.uint16 if tokenizer.get_vocab_size() <= 1 << 16 else np.int32
    parts: list[Any] = []
    counts: list[int] = []
    for i in range(0, len(files), chunk):
        for enc in tokenizer.encode_batch([read_text(f) for f in files[i : i + chunk]]):
            ids = np.asarray(enc.ids + [eot], dtype=dtype)
            parts.append(ids)
            counts.append(int(ids.size))
    arr = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(cache.name + ".tmp.npy")
    np.save(tmp, arr)
    os.replace(tmp, cache)
    counts_path.write_text(json.dumps(counts))
    return torch.from_numpy(arr.astype(np.int32)), counts


class Batches:
    """Deterministic random windows of `seq_len + 1` tokens from a token stream (on the stream's device).

    Window starts come from a CPU generator, drawn `CHUNK` batches at a time and copied to the device once per
    chunk (a host-to-device copy from pageable memory waits for the device, so one per step would serialise
    the host and the GPU); the draws equal one call per batch.
    """

    CHUNK = 64

    def __init__(self, tokens, *, batch_size: int, seq_len: int, seed: int) -> None:
        import torch

        if tokens.numel() <= seq_len + 1:
            raise ValueError(f"token stream of {tokens.numel()} is shorter than seq_len + 1 = {seq_len + 1}")
        self.tokens, self.batch_size, self.seq_len = tokens, batch_size, seq_len
        self.gen = torch.Generator().manual_seed(seed)
        self.offsets = torch.arange(seq_len + 1, device=tokens.device)
        self._starts = self.offsets[:0]
        self._next = 0

    def next(self):  # -> (inputs, labels), each (batch, seq_len) int64
        import torch

        if self._next == self._starts.size(0):
            high = self.tokens.numel() - self.seq_len - 1
            starts = torch.randint(0, high, (self.CHUNK, self.batch_size), generator=self.gen)
            self._starts, self._next = starts.to(self.tokens.device), 0
        starts = self._starts[self._next]
        self._next += 1
        win = self.tokens[starts[:, None] + self.offsets].long()
        return win[:, :-1], win[:, 1:]


def fixed_val_batches(tokens, *, batch_size: int, seq_len: int, num_batches: int):
    """Non-overlapping validation windows from the start of the held-out stream (same for every run)."""
    need = batch_size * num_batches * (seq_len + 1)
    if tokens.numel() < need:
        num_batches = max(1, tokens.numel() // (batch_size * (seq_len + 1)))
        need = batch_size * num_batches * (seq_len + 1)
    win = tokens[:need].long().view(num_batches, batch_size, seq_len + 1)
    return [(w[:, :-1], w[:, 1:]) for w in win]
