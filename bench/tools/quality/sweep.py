"""The resumable quality sweep: one output directory holds its state, a rerun picks up where the last one stopped.

Output directory (`out=`), all small (< 1 MB plus the tokenizer):
- `meta.json`: the configuration, the hash of the keys that fix a trial's computation (a rerun with other values
  of them is refused: a sweep never mixes setups), model size and FLOPs per token.
- `corpus.json`: corpus digest, roots, split and dedup counts, tokenizer sample, manifest per package (checked on
  resume: a different corpus is refused). `tokenizer.json`: the BPE, reused by every later piece.
- `trials/<trial id>.json` (`tuning.trial_id`: optimizer, the tuned values, seed): one finished trial each (its
  hyperparameters, curve and timings), written atomically when the trial ends; an existing file is never rerun (delete it to rerun that trial). A failed trial is
  recorded with its error, so the sweep never silently shrinks.
- `pieces.jsonl`: one line per process (start, end, host, GPU, versions, git SHA, trials run, prewarm seconds,
  seconds per step and per evaluation, why it stopped); `progress.json`: trials done / planned.
- The report of the trials so far (`bench.tools.quality.report`): README.md, results.csv, trials.csv, run.json, plots.

Order: optimizer by optimizer as listed, each through its tuning stages and then its extra seeds at the best
setting (`bench.tools.quality.tuning`). Before an optimizer's first trial in a process its prewarm runs (`prewarm_steps`; for an optimizer with
no finished trial at least 1 + its refresh period, so the steps after the first, which are timed, cover its
periodic work: 1 + `precondition_frequency` for SOAP-REKLS). With `budget_s`, a trial starts only if its
estimate (`estimate_trial_s`) says it ends inside the limit: the mean duration of that optimizer's finished
trials; with none, steps x the prewarm's seconds per step + the evaluations + the build; with no prewarm
measurement, the mean of the other optimizers' trials. A piece stopped so ends between trials, and its line in
`pieces.jsonl` names the optimizer and the estimate.

SIGTERM or SIGINT during a piece: the trial in progress is dropped (no trial file), the piece's line (`stopped`
and `interrupted`: signal, trial, step reached) and progress.json are written, the report is not (the next piece
writes it), and the process exits with 128 + the signal number.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.results import record
from bench.results.record import write_json_atomic
from bench.tools.quality import corpus as pc
from bench.tools.quality import data, report, run, tuning
from bench.tools.quality.config import QualityConfig, parse_cli
from bench.tools.quality.run import model_config


def load_trials(out: Path) -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((out / "trials").glob("*.json"))}


def check_resume(cfg: QualityConfig, out: Path) -> None:
    """Refuse an output directory whose trials were computed with other trial-defining keys, or a file."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"out={str(out)!r}: is a file; give a directory")
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
    if stored_path.exists():
        stored = json.loads(stored_path.read_text())
        here = {"train_tokens": info["train_tokens"], "val_tokens": info["val_tokens"]}
        if any(stored.get(k) != v for k, v in here.items()):
            raise ValueError(
                f"the tokenizer here encodes the corpus to {here}, the sweep in {stored_path} to "
                f"{ {k: stored.get(k) for k in here} }: another tokenizer (tokenizers version, or "
                f"{out / 'tokenizer.json'} lost and retrained differently); the sweep cannot resume (use a new out directory)"
            )
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
    """Parameters of the built model (counted on the meta device: nothing allocated), with and without the
    embedding and output layer, active (per token) and total, and Megatron FLOPs per token. Non-embedding
    parameters are the horizon's unit: tokens per parameter = tokens per trial / `total_params_no_embedding`."""
    import torch

    from bench import flops
    from bench.models.hf_build import build_model as build_hf_model

    m = model_config(cfg, vocab)
    with torch.device("meta"):
        net = build_hf_model(m, seed=cfg.seed)
    total = sum(p.numel() for p in net.parameters())
    emb = net.get_input_embeddings().weight.numel()
    if not m.tie_embeddings:
        emb += net.get_output_embeddings().weight.numel()
    num_moe = m.num_layers - m.num_dense_layers if m.num_experts else 0
    idle = num_moe * (m.num_experts - m.moe_router_topk) * 3 * m.hidden_size * m.moe_ffn_hidden_size
    tokens = cfg.steps * cfg.batch_size * cfg.seq_len
    return {
        "total_params": total,
        "active_params": total - idle,
        "total_params_no_embedding": total - emb,
        "active_params_no_embedding": total - emb - idle,
        "tokens_per_trial": tokens,
        "tokens_per_param": tokens / (total - emb),
        "model_flops_per_token": flops.model_flops_per_token(m),
    }


@dataclass(kw_only=True, slots=True)
class Piece:
    """What this process has done so far (its line in pieces.jsonl)."""

    t0: float
    warm: dict[str, run.Prewarm | None] = field(default_factory=dict)
    """Prewarm measurement per optimizer (None: `prewarm_steps=0`)."""
    ran: list[str] = field(default_factory=list)
    where: str = "while preparing the corpus"
    """What it is doing now, as the stop reason says it."""
    trial: str | None = None
    """The trial in progress, if any."""
    prepare_s: float | None = None


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """SIGTERM and SIGINT raise `run.Interrupted` in the main thread inside the block; the previous handlers
    are restored when it ends."""

    def handler(signum: int, frame: Any) -> None:
        raise run.Interrupted(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.tools.quality`: the protocol and keys are `bench.tools.quality.run`'s docstring."""
    from muonbench.cli_help import module_help

    args = list(sys.argv[1:] if argv is None else argv)
    if module_help(run.__doc__, args):
        return 0
    import torch

    started, t0 = record.now_iso(), time.perf_counter()
    try:
        cfg = configure(args)
    except ValueError as exc:  # a user or config error: one line, nothing written
        print(f"error: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    out = Path(cfg.out)
    gpu = torch.cuda.get_device_name() if cfg.device == "cuda" else None
    piece = Piece(t0=t0)
    stop, interrupted, signum = "", None, 0
    with signals_raise():
        try:
            stop = _sweep(cfg, out, piece, started)
        except run.Interrupted as exc:
            signum = exc.signum
            interrupted = {"signal": str(exc), "where": piece.where, "trial": piece.trial, "step": exc.step}
            stop = f"{exc} {piece.where}" + (f" at step {exc.step}/{cfg.steps}" if exc.step else "")
    state = progress(cfg, load_trials(out))  # from disk: a trial written just before a signal counts
    record.write_json_atomic(out / "progress.json", state)
    warm = {k: w for k, w in piece.warm.items() if w is not None}
    with open(out / "pieces.jsonl", "a") as fh:
        line = {
            "started": started,
            "ended": record.now_iso(),
            "seconds": round(time.perf_counter() - t0, 1),
            "prepare_s": None if piece.prepare_s is None else round(piece.prepare_s, 1),
            "prewarm_s": {k: round(w.seconds, 2) for k, w in warm.items()},
            "prewarm_step_s": {k: None if w.step_s is None else round(w.step_s, 4) for k, w in warm.items()},
            "prewarm_eval_s": {k: round(w.eval_s, 4) for k, w in warm.items()},
            "trials_run": piece.ran,
            "stopped": stop or None,
            "interrupted": interrupted,
            "gpu": gpu,
            "hardware": record.hardware_info(),
            "versions": record.package_versions() | _more_versions(),
            "git": record.git_info(),
            "argv": sys.argv[1:] if argv is None else argv,
        }
        fh.write(json.dumps(line) + "\n")
    print(
        f"quality sweep: {state['done']}/{state['planned']} trials in {out}"
        + (f"; stopped: {stop}; rerun the same command to resume" if stop else "")
    )
    if signum:
        return 128 + signum
    if state["done"]:
        print(report.write_report(out, out))
    return 0


def configure(args: list[str]) -> QualityConfig:
    """The sweep's configuration, checked before anything is written (ValueError names the field)."""
    import torch

    cfg = parse_cli(args)
    # Checked before training, not after it: the summary needs AdamW's final validation loss as the target.
    if "adamw" not in cfg.optimizers:
        names = ",".join(cfg.optimizers)
        raise ValueError(f"optimizers={names!r} must include 'adamw' (the target optimizer)")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"profile={cfg.profile} needs a CUDA GPU; none is visible (use profile=compute_optimal_tiny, cpu or tiny)"
        )
    check_resume(cfg, Path(cfg.out))
    return cfg


def _sweep(cfg: QualityConfig, out: Path, piece: Piece, started: str) -> str:
    """Prepare the data, then run the missing trials; returns why it stopped early ('' when it did not)."""
    from tqdm import tqdm

    prep = prepare(cfg, out)
    piece.prepare_s = prep.corpus["prepare_s"]
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
    bar = tqdm(
        total=tuning.num_planned(cfg, done),
        initial=len(done),
        desc="quality trials",
        unit="trial",
        file=sys.stderr,
    )
    try:
        for name in cfg.optimizers:
            stop = _run_optimizer(name, cfg, prep, out, done, piece, bar)
            if stop:
                return stop
    finally:
        bar.close()
    return ""


def _more_versions() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {}
    for name in ("tokenizers", "triton"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def num_evals(cfg: QualityConfig) -> int:
    """Evaluations in a trial: every `eval_every` steps and at the last step."""
    return cfg.steps // cfg.eval_every + (cfg.steps % cfg.eval_every != 0)


def estimate_trial_s(
    name: str, cfg: QualityConfig, done: dict[str, dict[str, Any]], warm: run.Prewarm | None
) -> tuple[float, str]:
    """Seconds the next trial of `name` should take, and what the number rests on.

    In order of preference: the mean `trial_s` of `name`'s finished trials (status ok); steps x the prewarm's
    seconds per step + the evaluations (mean `eval_s` of the finished trials of any optimizer, else evaluations x
    the prewarm's one) + the prewarm's build time; the mean `trial_s` of the other optimizers' trials; 0 when
    nothing was measured yet.
    """
    ok = [t for t in done.values() if t["status"] == "ok" and "trial_s" in t]
    mine = [t["trial_s"] for t in ok if t["optimizer"] == name]
    if mine:
        return statistics.fmean(mine), f"mean of {len(mine)} finished {name} trial(s)"
    if warm is not None and warm.step_s is not None:
        evals = [t["eval_s"] for t in ok if "eval_s" in t]
        eval_s = statistics.fmean(evals) if evals else num_evals(cfg) * warm.eval_s
        return cfg.steps * warm.step_s + eval_s + warm.build_s, f"prewarm: {warm.step_s:.2f} s/step"
    if ok:
        return statistics.fmean(t["trial_s"] for t in ok), f"mean of {len(ok)} other optimizers' trial(s)"
    return 0.0, "nothing measured yet"


def _prewarm(
    name: str, cfg: QualityConfig, prep: Prepared, done: dict[str, dict[str, Any]]
) -> run.Prewarm | None:
    """`name`'s prewarm (None with `prewarm_steps=0`); without a finished trial of `name`, at least 1 + its
    refresh period steps, so that its per-step time covers the periodic work."""
    if cfg.prewarm_steps <= 0:
        return None
    num_steps = cfg.prewarm_steps
    if not any(t["optimizer"] == name and t["status"] == "ok" for t in done.values()):
        num_steps = max(num_steps, 1 + run.refresh_period(name, cfg))
    return run.prewarm(name, cfg, prep.train_tokens, prep.val, prep.vocab, num_steps=num_steps)


def _ensure_prewarm(
    name: str, cfg: QualityConfig, prep: Prepared, done: dict[str, dict[str, Any]], piece: Piece
) -> None:
    """`name`'s prewarm, once per process."""
    if name not in piece.warm:
        piece.where = f"in the prewarm of {name}"
        piece.warm[name] = _prewarm(name, cfg, prep, done)
        piece.where = "between trials"


def _run_optimizer(
    name: str,
    cfg: QualityConfig,
    prep: Prepared,
    out: Path,
    done: dict[str, dict[str, Any]],
    piece: Piece,
    bar: Any,
) -> str:
    """Run `name`'s missing trials, stage by stage, then its seeds; returns why it stopped early ('' when it
    did not)."""
    while todo := tuning.walk(name, cfg, done).todo:
        for hp in todo:
            tid = tuning.trial_id(name, hp, cfg)
            own = any(t["optimizer"] == name and t["status"] == "ok" for t in done.values())
            if not own:  # the prewarm runs before the trial anyway; its measurement is the estimate
                _ensure_prewarm(name, cfg, prep, done, piece)
            need, basis = estimate_trial_s(name, cfg, done, piece.warm.get(name))
            elapsed = time.perf_counter() - piece.t0
            if cfg.budget_s and elapsed + need > cfg.budget_s:
                return f"budget_s={cfg.budget_s:g}: {elapsed:.0f} s used, next trial {name} ~{need:.0f} s ({basis})"
            # with finished trials the estimate needs no prewarm: it runs only once the trial will
            _ensure_prewarm(name, cfg, prep, done, piece)
            bar.total = max(bar.total, tuning.num_planned(cfg, done))
            bar.set_postfix_str(tid)
            piece.where, piece.trial = f"in trial {tid}", tid
            try:
                trial = run.train_one(name, hp, cfg, prep.train_tokens, prep.val, prep.vocab, bar.write)
            except Exception as exc:  # noqa: BLE001 - a failed trial is recorded, the sweep goes on
                trial = {
                    "optimizer": name,
                    "lr": hp.lr,
                    "seed": hp.seed,
                    "hparams": tuning.as_dict(hp),
                    "status": f"error: {type(exc).__name__}: {exc}",
                    "final_val_loss": float("inf"),
                    "curve": [],
                    "steps": cfg.steps,
                    "trial_s": 0.0,
                }
                bar.write(f"  {tid} failed: {exc}")
            trial["finished"] = record.now_iso()
            record.write_json_atomic(out / "trials" / f"{tid}.json", trial)
            piece.where, piece.trial = "between trials", None
            done[tid] = trial
            piece.ran.append(tid)
            bar.update(1)
    return ""


def progress(cfg: QualityConfig, done: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Trials done and planned so far; complete when every optimizer has its best setting and all its seeds (or
    a stage where every point diverged, which ends its tuning)."""
    walks = [tuning.walk(name, cfg, done) for name in cfg.optimizers]
    complete = all(w.failed_stage or (w.best is not None and not w.todo) for w in walks)
    return {"done": len(done), "planned": tuning.num_planned(cfg, done), "complete": complete}
