"""The resumable quality sweep: one output directory holds its state, a rerun picks up where the last one stopped.

Output directory (`out=`), all small (< 1 MB plus the tokenizer):
- `meta.json`: the configuration, the hash of the keys that fix a trial's computation (a rerun with other values
  of them is refused: a sweep never mixes setups), model size and FLOPs per token.
- `corpus.json`: corpus digest, roots, split and dedup counts, tokenizer sample, manifest per package (checked on
  resume: a different corpus is refused). `tokenizer.json`: the BPE, reused by every later piece.
- `trials/<optimizer>__lr<lr>__seed<seed>.json`: one finished trial each (curve and timings), written atomically
  when the trial ends; an existing file is never rerun (delete it to rerun that trial). A failed trial is
  recorded with its error, so the sweep never silently shrinks.
- `pieces.jsonl`: one line per process (start, end, host, GPU, versions, git SHA, warm-up times, trials run);
  `progress.json`: trials done / planned.
- The report of the trials so far (`tools.quality.report`): README.md, results.csv, trials.csv, run.json, plots.

Order: each optimizer's grid, then its extra seeds at the grid's best learning rate, optimizer by optimizer as
listed. With `time_limit_s`, a trial starts only if the mean duration of the trials done so far (of that
optimizer, else of all) says it ends inside the limit, so a piece stops cleanly between trials.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.quality.config import QualityConfig, parse_cli


def trial_id(name: str, lr: float, seed: int) -> str:
    return f"{name}__lr{lr:g}__seed{seed}"


def load_trials(out: Path) -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((out / "trials").glob("*.json"))}


def best_grid_trial(name: str, cfg: QualityConfig, done: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """Lowest finite final loss among `name`'s grid trials at the grid seed; None until the grid is complete."""
    grid = [done.get(trial_id(name, lr, cfg.seed)) for lr in cfg.lr_grids[name]]
    if any(t is None for t in grid):
        return None
    ok = [t for t in grid if t is not None and t["final_val_loss"] < float("inf")]
    return min(ok, key=lambda t: t["final_val_loss"]) if ok else None


def planned(name: str, cfg: QualityConfig, done: dict[str, dict[str, Any]]) -> list[tuple[float, int]]:
    """(lr, seed) of `name`'s trials: the grid, then the extra seeds once the grid has a best point."""
    todo = [(lr, cfg.seed) for lr in cfg.lr_grids[name]]
    if name in cfg.seed_optimizers and cfg.best_lr_seeds > 1:
        best = best_grid_trial(name, cfg, done)
        if best is not None:
            todo += [(best["lr"], cfg.seed + k) for k in range(1, cfg.best_lr_seeds)]
    return todo


def num_planned(cfg: QualityConfig) -> int:
    extra = cfg.best_lr_seeds - 1
    return sum(len(cfg.lr_grids[n]) + (extra if n in cfg.seed_optimizers else 0) for n in cfg.optimizers)


def check_resume(cfg: QualityConfig, out: Path) -> None:
    """Refuse an output directory whose trials were computed with other trial-defining keys."""
    path = out / "meta.json"
    if not path.exists():
        return
    stored = json.loads(path.read_text())["trial_config"]
    now = cfg.trial_dict()
    diff = {
        k: (stored.get(k), now.get(k)) for k in sorted(set(stored) | set(now)) if stored.get(k) != now.get(k)
    }
    if diff:
        raise ValueError(
            f"out={str(out)!r} holds a sweep with other settings: {diff} (stored, given); "
            "rerun with the stored values or use a new out directory"
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Prepared:
    vocab: int
    train_tokens: Any
    val: list[Any]
    corpus: dict[str, Any]


def prepare(cfg: QualityConfig, out: Path) -> Prepared:
    """Corpus, tokenizer (out/tokenizer.json), token streams (cache) and corpus.json (written once)."""
    from bench.record import write_json_atomic
    from tools.quality import corpus as pc
    from tools.quality import data

    t0 = time.perf_counter()
    if cfg.corpus == "stdlib":
        sc = data.stdlib_corpus()
        as_file = lambda f: pc.SourceFile(
            name=f.name, path=f, package="stdlib", size=f.stat().st_size, sha=""
        )
        train, val = [as_file(f) for f in sc.train_files], [as_file(f) for f in sc.val_files]
        digest, extra = sc.digest, {"roots": [str(sc.train_files[0].parent)], "duplicates": 0, "skipped": 0}
        scan = pc.PackageCorpus(
            train=tuple(train), val=tuple(val), digest=digest, num_duplicates=0, num_skipped=0, roots=()
        )
        encoded = train
    else:
        scan = pc.scan([("", Path(r)) for r in cfg.corpus_roots] or None)
        train, val, digest = list(scan.train), list(scan.val), scan.digest
        extra = {"roots": list(scan.roots), "duplicates": scan.num_duplicates, "skipped": scan.num_skipped}
        encoded = pc.take_bytes(train, cfg.corpus_max_mb)
    tok_sample = pc.take_bytes(train, cfg.tokenizer_train_mb)
    stored_path = out / "corpus.json"
    if stored_path.exists() and json.loads(stored_path.read_text())["digest"] != digest:
        raise ValueError(
            f"the corpus here (digest {digest}) differs from the one in {stored_path}; the sweep cannot resume "
            "on another machine image (use a new out directory)"
        )
    tok = data.load_or_train_tokenizer(out / "tokenizer.json", [f.path for f in tok_sample], cfg.vocab_size)
    key = f"{digest}-{data.tokenizer_hash(tok)}"
    cache = data.cache_dir(cfg.cache)
    train_tokens, train_counts = data.encode_files(
        tok, [f.path for f in encoded], cache / f"tokens-{key}-train-{len(encoded)}.npy"
    )
    val_tokens, val_counts = data.encode_files(tok, [f.path for f in val], cache / f"tokens-{key}-val.npy")
    info = {
        "kind": cfg.corpus,
        "digest": digest,
        "python": platform.python_version(),
        **extra,
        "train_files": len(train),
        "train_bytes": sum(f.size for f in train),
        "val_files": len(val),
        "val_bytes": sum(f.size for f in val),
        "encoded_train_files": len(encoded),
        "encoded_train_bytes": sum(f.size for f in encoded),
        "train_tokens": int(train_tokens.numel()),
        "val_tokens": int(val_tokens.numel()),
        "tokenizer": {
            "kind": "byte-level BPE (tokenizers), trained on the training split only",
            "vocab_size": tok.get_vocab_size(),
            "trained_on_files": len(tok_sample),
            "trained_on_bytes": sum(f.size for f in tok_sample),
        },
    }
    counts = dict(zip([f.name for f in encoded], train_counts, strict=True))
    counts |= dict(zip([f.name for f in val], val_counts, strict=True))
    info["packages"] = pc.manifest(scan, counts)
    if not stored_path.exists():
        write_json_atomic(stored_path, info)
    info["prepare_s"] = time.perf_counter() - t0
    val_batches = data.fixed_val_batches(
        val_tokens, batch_size=cfg.batch_size, seq_len=cfg.seq_len, num_batches=cfg.val_batches
    )
    return Prepared(
        vocab=tok.get_vocab_size(),
        train_tokens=train_tokens.to(cfg.device),
        val=val_batches,
        corpus=info,
    )


def model_size(cfg: QualityConfig, vocab: int) -> dict[str, Any]:
    """Total and active parameters (with and without embeddings) and Megatron FLOPs per token."""
    from bench import flops
    from tools.quality.run import model_config

    m = model_config(cfg, vocab)
    h, v = m.hidden_size, flops.padded_vocab_size(m.vocab_size, m.make_vocab_size_divisible_by)
    q, kv = m.num_attention_heads * m.kv_channels, m.num_query_groups * m.kv_channels
    attn = h * (q + 2 * kv) + q * h + 2 * m.kv_channels + 2 * h  # projections, qk-norm, two layer norms
    expert = 3 * h * m.moe_ffn_hidden_size
    router = m.num_experts * h
    emb = v * h * (1 if m.tie_embeddings else 2)
    total = m.num_layers * (attn + router + m.num_experts * expert) + emb + h
    active = m.num_layers * (attn + router + m.moe_router_topk * expert) + emb + h
    return {
        "total_params": total,
        "active_params": active,
        "total_params_no_embedding": total - emb,
        "active_params_no_embedding": active - emb,
        "model_flops_per_token": flops.model_flops_per_token(m),
    }


def main(argv: list[str] | None = None) -> int:
    import torch
    from tqdm import tqdm

    from bench import record
    from tools.quality import report

    started, t0 = record.now_iso(), time.perf_counter()
    cfg = parse_cli(sys.argv[1:] if argv is None else argv)
    # Checked before training, not after it: the summary needs AdamW's final validation loss as the target.
    if "adamw" not in cfg.optimizers:
        names = ",".join(cfg.optimizers)
        raise ValueError(f"optimizers={names!r} must include 'adamw' (the target optimizer)")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"profile={cfg.profile} needs a CUDA GPU; none is visible (use profile=cpu or tiny)")
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    out = Path(cfg.out)
    check_resume(cfg, out)
    prep = prepare(cfg, out)
    gpu = torch.cuda.get_device_name() if cfg.device == "cuda" else None
    if not (out / "meta.json").exists():
        record.write_json_atomic(
            out / "meta.json",
            {
                "created": started,
                "config": cfg.as_dict(),
                "trial_config": cfg.trial_dict(),
                "trial_hash": cfg.trial_hash(),
                "model": model_size(cfg, prep.vocab),
            },
        )
    done = load_trials(out)
    prewarm_s: dict[str, float] = {}
    ran: list[str] = []
    stop = ""
    bar = tqdm(
        total=num_planned(cfg), initial=len(done), desc="quality trials", unit="trial", file=sys.stderr
    )
    for name in cfg.optimizers:
        stop = _run_optimizer(name, cfg, prep, out, done, prewarm_s, ran, bar, t0)
        if stop:
            break
    bar.close()
    total = num_planned(cfg)
    progress = {"done": len(done), "planned": total, "complete": not stop and len(done) >= total}
    record.write_json_atomic(out / "progress.json", progress)
    with open(out / "pieces.jsonl", "a") as fh:
        piece = {
            "started": started,
            "ended": record.now_iso(),
            "seconds": round(time.perf_counter() - t0, 1),
            "prepare_s": round(prep.corpus["prepare_s"], 1),
            "prewarm_s": prewarm_s,
            "trials_run": ran,
            "stopped": stop or None,
            "gpu": gpu,
            "hardware": record.hardware_info(),
            "versions": record.package_versions() | _more_versions(),
            "git": record.git_info(),
            "argv": sys.argv[1:] if argv is None else argv,
        }
        fh.write(json.dumps(piece) + "\n")
    print(
        f"quality sweep: {progress['done']}/{total} trials in {out}"
        + (f"; stopped: {stop}; rerun the same command to resume" if stop else "")
    )
    if done:
        print(report.write_report(out, out))
    return 0


def _more_versions() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {}
    for name in ("tokenizers", "triton"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _estimate(name: str, done: dict[str, dict[str, Any]]) -> float:
    mine = [t["trial_s"] for t in done.values() if t["optimizer"] == name and "trial_s" in t]
    every = [t["trial_s"] for t in done.values() if "trial_s" in t]
    pool = mine or every
    return sum(pool) / len(pool) if pool else 0.0


def _run_optimizer(
    name: str,
    cfg: QualityConfig,
    prep: Prepared,
    out: Path,
    done: dict[str, dict[str, Any]],
    prewarm_s: dict[str, float],
    ran: list[str],
    bar: Any,
    t0: float,
) -> str:
    """Run `name`'s missing trials (grid, then seeds); returns why it stopped early ('' when it did not)."""
    from bench import record
    from tools.quality import run

    for phase in ("grid", "seeds"):
        todo = planned(name, cfg, done)
        todo = todo[: len(cfg.lr_grids[name])] if phase == "grid" else todo[len(cfg.lr_grids[name]) :]
        for lr, seed in todo:
            tid = trial_id(name, lr, seed)
            if tid in done:
                continue
            need = _estimate(name, done)
            elapsed = time.perf_counter() - t0
            if cfg.time_limit_s and elapsed + need > cfg.time_limit_s:
                return f"time_limit_s={cfg.time_limit_s:g}: {elapsed:.0f} s used, next trial ~{need:.0f} s"
            if name not in prewarm_s:
                prewarm_s[name] = round(run.prewarm(name, cfg, prep.train_tokens, prep.vocab), 2)
            bar.set_postfix_str(f"{name} lr={lr:g} seed={seed}")
            try:
                trial = run.train_one(
                    name, lr, cfg, prep.train_tokens, prep.val, prep.vocab, bar.write, seed=seed
                )
            except Exception as exc:  # noqa: BLE001 - a failed trial is recorded, the sweep goes on
                trial = {
                    "optimizer": name,
                    "lr": lr,
                    "seed": seed,
                    "status": f"error: {type(exc).__name__}: {exc}",
                    "final_val_loss": float("inf"),
                    "curve": [],
                    "steps": cfg.steps,
                    "trial_s": 0.0,
                }
                bar.write(f"  {tid} failed: {exc}")
            trial["finished"] = record.now_iso()
            record.write_json_atomic(out / "trials" / f"{tid}.json", trial)
            done[tid] = trial
            ran.append(tid)
            bar.update(1)
    return ""
