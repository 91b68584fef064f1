"""Quality bench: train the tiny Qwen3-MoE proxy on stdlib text with each optimizer and a fair LR sweep.

Protocol (written at the top of the report):
- Data: `tools.quality.data` (stdlib corpus, fixed held-out split, byte-level BPE trained on the training split).
- Model: `model=<name>` from conf/model (default qwen3_moe_tiny), vocab = the tokenizer's, seq = profile seq_len.
- Every optimizer gets the same number of learning-rate trials (a x3-spaced grid around its usual setting), the same
  token budget, the same warm-up + cosine schedule to 10% of the peak, completed at the last step, and the same
  seed. Validation loss on fixed held-out windows every `eval_every` steps and at the end.
- Each optimizer's best trial = lowest final validation loss. Target = AdamW's best final validation loss.
  Steps-to-target = first evaluation at which a run's validation loss <= target (linear interpolation between the
  two evaluations around the crossing). Wall time and cost the same way.

Usage: `python -m tools.quality [profile=cpu|gpu] [optimizers=adamw,muon,mop,soap_rekls] [steps=N] [out=DIR]`.
Routing variants (VARIANTS, e.g. `muon_split_gate_up`) are further optimizer names; `adamw` must be among them.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

PROFILES: dict[str, dict[str, Any]] = {
    # 2 cores, under 30 minutes for 4 optimizers x 4 learning rates.
    "cpu": {
        "device": "cpu",
        "model": "qwen3_moe_tiny",
        "vocab_size": 2048,
        "seq_len": 128,
        "batch_size": 16,
        "steps": 400,
        "eval_every": 25,
        "val_batches": 8,
        "hidden_size": 128,
        "num_layers": 2,
        "price_per_hour": 0.0,
    },
    # One GPU: a wider proxy and a longer budget.
    "gpu": {
        "device": "cuda",
        "model": "qwen3_moe_tiny",
        "vocab_size": 4096,
        "seq_len": 256,
        "batch_size": 64,
        "steps": 2000,
        "eval_every": 100,
        "val_batches": 16,
        "hidden_size": 256,
        "num_layers": 4,
        "price_per_hour": 3.5,
    },
}

# Peak learning rates per optimizer; each grid has the same number of points (fair sweep).
LR_GRIDS: dict[str, tuple[float, ...]] = {
    "adamw": (1e-3, 3e-3, 1e-2, 3e-2),
    "muon": (
        1e-3,
        3e-3,
        1e-2,
        3e-2,
    ),  # spectral scale x 0.2 = AdamW-matched update RMS, so the same grid applies
    "mop": (
        1e-3,
        3e-3,
        1e-2,
        3e-2,
    ),  # spectral scale x 0.2 here too (nuclear-norm scale needs per-layer LR retuning)
    "soap_rekls": (1e-3, 3e-3, 1e-2, 3e-2),
}
# Named routing variants: entry -> (optimizer it configures, RoutingConfig fields that differ). Same LR grid as
# the base optimizer, so the sweep stays fair.
VARIANTS: dict[str, tuple[str, dict[str, bool]]] = {
    # fused [gate; up] fc1 (HF experts.gate_up_proj) orthogonalized as two halves (Moonlight / HF layout);
    # plain "muon" keeps the joint matrix (Megatron-core's default).
    "muon_split_gate_up": ("muon", {"split_gate_up": True}),
}
LR_GRIDS |= {name: LR_GRIDS[base] for name, (base, _) in VARIANTS.items()}


@dataclass(kw_only=True)
class QualityConfig:
    profile: str = "cpu"
    device: str = "cpu"
    model: str = "qwen3_moe_tiny"
    vocab_size: int = 2048
    seq_len: int = 128
    batch_size: int = 16
    steps: int = 400
    warmup_frac: float = 0.05
    min_lr_frac: float = 0.1
    eval_every: int = 25
    val_batches: int = 8
    hidden_size: int = 128
    num_layers: int = 2
    seed: int = 1234
    weight_decay: float = 0.01
    price_per_hour: float = 0.0
    optimizers: tuple[str, ...] = ("adamw", "muon", "mop", "soap_rekls")
    out: str = "reports/quality_cpu_202611"
    lr_grids: dict[str, tuple[float, ...]] = field(default_factory=lambda: dict(LR_GRIDS))

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ValueError(f"profile={self.profile!r}: must be one of {sorted(PROFILES)}")
        for name in self.optimizers:
            if name not in LR_GRIDS:
                raise ValueError(f"optimizers={name!r} is not one of {sorted(LR_GRIDS)}")
        if self.steps < 2 * self.eval_every:
            raise ValueError(f"steps={self.steps}: must be >= 2 x eval_every ({2 * self.eval_every})")


def parse_cli(argv: list[str]) -> QualityConfig:
    kv = dict(a.split("=", 1) for a in argv if "=" in a)
    bad = [a for a in argv if "=" not in a]
    if bad:
        raise ValueError(f"arguments must be key=value, got {bad}")
    profile = kv.pop("profile", "cpu")
    if profile not in PROFILES:
        raise ValueError(f"profile={profile!r}: must be one of {sorted(PROFILES)}")
    base: dict[str, Any] = dict(PROFILES[profile], profile=profile, out=f"reports/quality_{profile}_202611")
    fields = QualityConfig.__dataclass_fields__
    for key, raw in kv.items():
        if key not in fields or key == "lr_grids":
            raise ValueError(f"unknown key {key!r}; allowed: {sorted(k for k in fields if k != 'lr_grids')}")
        cur = base.get(key, fields[key].default)
        if key == "optimizers":
            base[key] = tuple(x for x in raw.split(",") if x)
        elif isinstance(cur, bool):
            base[key] = raw.lower() in ("1", "true", "yes")
        elif isinstance(cur, int):
            base[key] = int(raw)
        elif isinstance(cur, float):
            base[key] = float(raw)
        else:
            base[key] = raw
    return QualityConfig(**base)


def lr_at(step: int, cfg: QualityConfig, peak: float) -> float:
    """Linear warm-up, then cosine to min_lr_frac x peak, reached exactly at the last step."""
    warm = max(1, int(cfg.warmup_frac * cfg.steps))
    if step < warm:
        return peak * (step + 1) / warm
    t = (step - warm) / max(1, cfg.steps - 1 - warm)
    return peak * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def build_model(cfg: QualityConfig, vocab_size: int):
    """The proxy from conf/model/<cfg.model>, widened/deepened per profile, as a transformers model."""
    from bench.models.hf_build import build_model as build_hf_model
    from config import load

    model_cfg = load([f"model={cfg.model}"]).model
    model_cfg = replace(
        model_cfg,
        vocab_size=vocab_size,
        seq_length=cfg.seq_len,
        hidden_size=cfg.hidden_size,
        num_layers=cfg.num_layers,
    )
    return build_hf_model(model_cfg, seed=cfg.seed)


def build_opt(name: str, model, lr: float, cfg: QualityConfig):
    """The optimizer under test through the suite's own factory (matrices to `name`, the rest to AdamW).

    A VARIANTS entry builds its base optimizer with the entry's RoutingConfig fields.
    """
    import optim
    from optim import configs

    named = list(model.named_parameters())
    base, routing = VARIANTS.get(name, (name, {}))
    common = {"lr": lr, "weight_decay": cfg.weight_decay}
    if base == "adamw":
        conf = configs.AdamWConfig(**common, betas=(0.9, 0.95), eps=1e-8)
    elif base == "muon":
        conf = configs.MuonConfig(
            **common, nesterov=True, scale_mode="spectral", extra_scale_factor=0.2, ns_precision="fp32"
        )
    elif base == "mop":
        conf = configs.MOPConfig(**common, nesterov=True, scale_mode="spectral", extra_scale_factor=0.2)
    else:
        conf = configs.SOAPConfig(**common, betas=(0.9, 0.95))
    return optim.build_optimizer(named, conf, naming="hf", routing=configs.RoutingConfig(**routing))


def set_lr(opt, lr: float) -> None:
    groups = opt.param_groups if hasattr(opt, "param_groups") else []
    for g in groups:
        g["lr"] = lr


def evaluate(model, val) -> float:
    import torch
    import torch.nn.functional as F

    model.eval()
    with torch.no_grad():
        losses = [
            F.cross_entropy(model(input_ids=x).logits.float().flatten(0, 1), y.reshape(-1)) for x, y in val
        ]
    model.train()
    return float(torch.stack(losses).mean())


def train_one(name: str, lr: float, cfg: QualityConfig, train_tokens, val, vocab: int, log) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from tools.quality.data import Batches

    torch.manual_seed(cfg.seed)
    model = build_model(cfg, vocab).to(cfg.device)
    opt = build_opt(name, model, lr, cfg)
    batches = Batches(train_tokens, batch_size=cfg.batch_size, seq_len=cfg.seq_len, seed=cfg.seed)
    val = [(x.to(cfg.device), y.to(cfg.device)) for x, y in val]
    curve: list[dict[str, float]] = []
    wall = 0.0
    opt_time = 0.0
    status = "ok"
    for step in range(cfg.steps):
        x, y = (t.to(cfg.device) for t in batches.next())
        t0 = time.perf_counter()
        set_lr(opt, lr_at(step, cfg, lr))
        out = model(input_ids=x)
        loss = F.cross_entropy(out.logits.float().flatten(0, 1), y.reshape(-1))
        aux = getattr(out, "aux_loss", None)  # MoE load-balancing loss, as in training (not in val loss)
        total = loss + model.config.router_aux_loss_coef * aux if aux is not None else loss
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        t1 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cfg.device == "cuda":
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        wall += t2 - t0
        opt_time += t2 - t1
        if not math.isfinite(loss.item()):
            status = "diverged"
            break
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            v = evaluate(model, val)
            curve.append({"step": step + 1, "train_loss": loss.item(), "val_loss": v, "wall_s": wall})
            log(
                f"  {name:<10} lr={lr:.0e} step {step + 1:>5}/{cfg.steps} train {loss.item():.3f} val {v:.3f}"
            )
    final = curve[-1]["val_loss"] if curve and status == "ok" else float("inf")
    return {
        "optimizer": name,
        "lr": lr,
        "status": status,
        "final_val_loss": final,
        "curve": curve,
        "wall_s": wall,
        "opt_step_s": opt_time,
        "steps": cfg.steps,
    }


def crossing(curve: list[dict[str, float]], target: float, key: str) -> float | None:
    """First point (interpolated) where val_loss <= target, in units of `key` (step or wall_s)."""
    prev = None
    for pt in curve:
        if pt["val_loss"] <= target:
            if prev is None:
                return pt[key]
            f = (prev["val_loss"] - target) / (prev["val_loss"] - pt["val_loss"])
            return prev[key] + f * (pt[key] - prev[key])
        prev = pt
    return None


def summarize(trials: list[dict[str, Any]], cfg: QualityConfig) -> dict[str, Any]:
    best: dict[str, dict[str, Any]] = {}
    for t in trials:
        if t["optimizer"] not in best or t["final_val_loss"] < best[t["optimizer"]]["final_val_loss"]:
            best[t["optimizer"]] = t
    if "adamw" not in best:
        raise ValueError(
            "the quality summary needs AdamW trials (the target is AdamW's final validation loss)"
        )
    target = best["adamw"]["final_val_loss"]
    adam_step_s = best["adamw"]["wall_s"] / best["adamw"]["steps"]
    rows = []
    for name, t in best.items():
        steps_to = crossing(t["curve"], target, "step")
        wall_to = crossing(t["curve"], target, "wall_s")
        hours = wall_to / 3600 if wall_to is not None else None
        rows.append(
            {
                "optimizer": name,
                "best_lr": t["lr"],
                "final_val_loss": t["final_val_loss"],
                "target": target,
                "steps_to_target": steps_to,
                "steps_ratio_vs_adamw": (steps_to / best["adamw"]["steps"]) if steps_to is not None else None,
                "wall_s_to_target": wall_to,
                "device_hours_to_target": hours,
                "cost_to_target": (hours * cfg.price_per_hour) if hours is not None else None,
                "step_ms": 1e3 * t["wall_s"] / t["steps"],
                "opt_step_ms": 1e3 * t["opt_step_s"] / t["steps"],
                "step_overhead_vs_adamw": (t["wall_s"] / t["steps"]) / adam_step_s,
            }
        )
    return {"target": target, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    from bench.cli_help import module_help

    if module_help(__doc__, list(sys.argv[1:] if argv is None else argv)):
        return 0
    import torch
    from tqdm import tqdm

    from tools.quality import data
    from tools.quality.report import write_report

    cfg = parse_cli(sys.argv[1:] if argv is None else argv)
    # Checked before training, not after it: summarize() needs AdamW's final validation loss as the target.
    if "adamw" not in cfg.optimizers:
        names = ",".join(cfg.optimizers)
        raise ValueError(f"optimizers={names!r} must include 'adamw' (the target optimizer)")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("profile=gpu needs a CUDA GPU; none is visible (use profile=cpu)")
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    corpus = data.stdlib_corpus()
    tok = data.train_tokenizer(corpus, cfg.vocab_size)
    train_tokens = data.encode_split(corpus, tok, "train")
    val_tokens = data.encode_split(corpus, tok, "val")
    val = data.fixed_val_batches(
        val_tokens, batch_size=cfg.batch_size, seq_len=cfg.seq_len, num_batches=cfg.val_batches
    )
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(n, lr) for n in cfg.optimizers for lr in cfg.lr_grids[n]]
    trials: list[dict[str, Any]] = []
    bar = tqdm(jobs, desc="quality trials", unit="trial", file=sys.stderr)
    for name, lr in bar:
        bar.set_postfix_str(f"{name} lr={lr:.0e}")
        try:
            trials.append(train_one(name, lr, cfg, train_tokens, val, tok.get_vocab_size(), bar.write))
        except Exception as exc:  # noqa: BLE001 - a failed trial is recorded, the sweep goes on
            trials.append(
                {
                    "optimizer": name,
                    "lr": lr,
                    "status": f"error: {type(exc).__name__}: {exc}",
                    "final_val_loss": float("inf"),
                    "curve": [],
                    "wall_s": 0.0,
                    "opt_step_s": 0.0,
                    "steps": cfg.steps,
                }
            )
            bar.write(f"  {name} lr={lr:.0e} failed: {exc}")
    summary = summarize(trials, cfg)
    meta = {
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()},
        "corpus_digest": corpus.digest,
        "train_files": len(corpus.train_files),
        "val_files": len(corpus.val_files),
        "train_tokens": int(train_tokens.numel()),
        "val_tokens": int(val_tokens.numel()),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
    }
    tmp = out / "trials.json.tmp"
    tmp.write_text(json.dumps({"meta": meta, "trials": trials, "summary": summary}, indent=1))
    os.replace(tmp, out / "trials.json")
    print(write_report(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
