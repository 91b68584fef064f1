"""Offline corpus, tokenizer and batches for the quality bench.

Corpus: the top-level `*.py` modules of the running interpreter's standard library (`sysconfig` "stdlib" path, no
sub-packages), sorted by file name. Split: every 10th file in that order (index % 10 == 9) is held out for
validation; the rest is training text. The split is a pure function of the file names, so it is fixed and disjoint.
Files are read as UTF-8 (undecodable bytes replaced). The corpus digest (SHA-256 over names and bytes) is recorded
with every result, because stdlib sources differ slightly between Python patch releases.

Tokenizer: a byte-level BPE (`tokenizers`) trained on the training split only, cached on disk under the digest.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

VAL_EVERY = 10


@dataclass(frozen=True, kw_only=True, slots=True)
class Corpus:
    train_files: tuple[Path, ...]
    val_files: tuple[Path, ...]
    digest: str

    def text(self, split: str) -> str:
        files = {"train": self.train_files, "val": self.val_files}[split]
        return "\n".join(f.read_bytes().decode("utf-8", errors="replace") for f in files)


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


def cache_dir() -> Path:
    d = Path(os.environ.get("MUONBENCH_CACHE", Path.home() / ".cache" / "muonbench")) / "quality"
    d.mkdir(parents=True, exist_ok=True)
    return d


def train_tokenizer(corpus: Corpus, vocab_size: int):  # -> tokenizers.Tokenizer
    """Byte-level BPE trained on the training split; cached as JSON keyed by corpus digest and vocab size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    path = cache_dir() / f"bpe-{corpus.digest}-{vocab_size}.json"
    if path.exists():
        return Tokenizer.from_file(str(path))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    texts = [f.read_bytes().decode("utf-8", errors="replace") for f in corpus.train_files]
    tok.train_from_iterator(texts, trainer=trainer)
    tmp = path.with_suffix(".tmp")
    tok.save(str(tmp))
    os.replace(tmp, path)
    return tok


def encode_split(corpus: Corpus, tokenizer, split: str):  # -> torch.Tensor (int64, 1-D)
    """Token ids of one split (files joined by the end-of-text token), cached as a .pt file."""
    import torch

    vocab = tokenizer.get_vocab_size()
    path = cache_dir() / f"tokens-{corpus.digest}-{vocab}-{split}.pt"
    if path.exists():
        return torch.load(path)
    eot = tokenizer.token_to_id("<|endoftext|>")
    files = {"train": corpus.train_files, "val": corpus.val_files}[split]
    ids: list[int] = []
    for enc in tokenizer.encode_batch([f.read_bytes().decode("utf-8", errors="replace") for f in files]):
        ids.extend(enc.ids)
        ids.append(eot)
    out = torch.tensor(ids, dtype=torch.int64)
    tmp = path.with_suffix(".tmp")
    torch.save(out, tmp)
    os.replace(tmp, path)
    return out


class Batches:
    """Deterministic random windows of `seq_len + 1` tokens from a token stream."""

    def __init__(self, tokens, *, batch_size: int, seq_len: int, seed: int) -> None:
        import torch

        if tokens.numel() <= seq_len + 1:
            raise ValueError(f"token stream of {tokens.numel()} is shorter than seq_len + 1 = {seq_len + 1}")
        self.tokens, self.batch_size, self.seq_len = tokens, batch_size, seq_len
        self.gen = torch.Generator().manual_seed(seed)

    def next(self):  # -> (inputs, labels), each (batch, seq_len)
        import torch

        starts = torch.randint(
            0, self.tokens.numel() - self.seq_len - 1, (self.batch_size,), generator=self.gen
        )
        win = torch.stack([self.tokens[s : s + self.seq_len + 1] for s in starts.tolist()])
        return win[:, :-1], win[:, 1:]


def fixed_val_batches(tokens, *, batch_size: int, seq_len: int, num_batches: int):
    """Non-overlapping validation windows from the start of the held-out stream (same for every run)."""
    need = batch_size * num_batches * (seq_len + 1)
    if tokens.numel() < need:
        num_batches = max(1, tokens.numel() // (batch_size * (seq_len + 1)))
        need = batch_size * num_batches * (seq_len + 1)
    win = tokens[:need].view(num_batches, batch_size, seq_len + 1)
    return [(w[:, :-1], w[:, 1:]) for w in win]
