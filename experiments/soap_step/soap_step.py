"""Where a SOAP-REKLS optimizer step spends its time on the quality bench's model.

The quality report measures SOAP-REKLS's optimizer step (557 ms on one H200 for the 123 M-parameter `gpu`
profile, against Muon's 10 ms) but not its parts. This probe builds the same model and optimizer, computes one
set of gradients on random tokens, then times `opt.step()` on those gradients:

- per step with CUDA events (host clock on CPU), refresh steps (an eigh of every factor, every
  `precondition_frequency` steps) apart from the others;
- per part, with each of SOAP's pieces (`optim.functional.soap_math`: the KL factor statistics, the rotations
  into and out of the eigenbasis, the Adam direction, the refresh and its eigh, the finiteness screens)
  wrapped in a `torch.profiler.record_function` label for the profiled steps: host time and device time per
  label, the number of kernels launched per step, and the kernels that take the most device time.

    python -m experiments.soap_step.soap_step profile=gpu device=cuda steps=10 profile_steps=3 \\
        out=soap_step.json

Arguments are the quality bench's (`bench.tools.quality.config`) plus `steps` (timed steps after the warm-up, which
runs until the first refresh after step 1 is behind it), `profile_steps` (then profiled, 3 by default, refresh
steps skipped unless `profile_refresh=1`: a run that profiled 10 steps with a refresh in them did not finish
within 170 s on the H200), `out` (JSON file, written before profiling and again after; printed too) and
`tf32=1` (fp32 matmuls at TF32, to see what they weigh; the bench runs them at full fp32). Each step's time is
printed as it is measured.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from bench.tools.quality import run as qrun
from bench.tools.quality.config import parse_cli
from bench.tools.quality.tuning import point
from experiments.step_profile.step_profile import device_time_us, profile_step

PARTS = {
    "kl_factor_updates": "optim.functional.soap_math",
    "approx_eigvals": "optim.functional.soap_math",
    "rotate": "optim.functional.soap_math",
    "rotate_back": "optim.functional.soap_math",
    "adam_direction": "optim.functional.soap_math",
    "eigh_descending": "optim.functional.soap_math",
    "sort_basis": "optim.functional.soap_math",
    "finite_flags": "optim.optimizers.soap",
}
REFRESH = "SOAP._refresh"


@contextlib.contextmanager
def labelled_parts() -> Iterator[None]:
    """Wrap SOAP's pieces in profiler labels (module attributes patched for the duration, then restored)."""
    import importlib

    from optim.optimizers import soap

    saved: list[tuple[Any, str, Any]] = []

    def wrap(fn: Callable[..., Any], label: str) -> Callable[..., Any]:
        def inner(*args: Any, **kwargs: Any) -> Any:
            with torch.profiler.record_function(label):
                return fn(*args, **kwargs)

        return inner

    for name, module_name in PARTS.items():  # soap.py calls these through its module attributes
        mod = importlib.import_module(module_name)
        saved.append((mod, name, getattr(mod, name)))
        setattr(mod, name, wrap(getattr(mod, name), name))
    cls = soap.SOAP
    saved.append((cls, "_refresh", cls._refresh))
    cls._refresh = wrap(cls._refresh, REFRESH)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for obj, name, fn in reversed(saved):
            setattr(obj, name, fn)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed_step(opt: torch.optim.Optimizer, device: str) -> float:
    """One `opt.step()` in ms (CUDA events on CUDA, host clock elsewhere)."""
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        opt.step()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))
    t0 = time.perf_counter()
    opt.step()
    return (time.perf_counter() - t0) * 1e3


def summarize(prof: torch.profiler.profile, steps: int, top: int = 15) -> dict[str, Any]:
    """Per-label host and device ms per step, kernels per step, the top kernels by device time."""
    events = prof.key_averages()
    labels = set(PARTS) | {REFRESH}

    parts = {
        e.key: {
            "calls_per_step": e.count / steps,
            "host_ms_per_step": e.cpu_time_total / 1e3 / steps,
            "device_ms_per_step": device_time_us(e) / 1e3 / steps,
        }
        for e in events
        if e.key in labels
    }
    kernels = [e for e in events if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA]
    kernels.sort(key=lambda e: -getattr(e, "self_device_time_total", 0.0))
    top_kernels = [
        {
            "kernel": e.key[:120],
            "calls_per_step": e.count / steps,
            "ms_per_step": getattr(e, "self_device_time_total", 0.0) / 1e3 / steps,
        }
        for e in kernels[:top]
    ]
    host_ops = sorted(
        (e for e in events if e.key not in labels and not e.key.startswith("ProfilerStep")),
        key=lambda e: -e.self_cpu_time_total,
    )[:top]
    return {
        "parts": dict(sorted(parts.items(), key=lambda kv: -kv[1]["host_ms_per_step"])),
        "kernels_per_step": sum(e.count for e in kernels) / steps,
        "kernel_ms_per_step": sum(getattr(e, "self_device_time_total", 0.0) for e in kernels) / 1e3 / steps,
        "top_kernels": top_kernels,
        "top_host_ops": [
            {
                "op": e.key[:80],
                "calls_per_step": e.count / steps,
                "self_host_ms_per_step": e.self_cpu_time_total / 1e3 / steps,
            }
            for e in host_ops
        ],
    }


def _write(out: str, result: dict[str, Any]) -> None:
    if out:
        Path(out).write_text(json.dumps(result, indent=1) + "\n")


def run(argv: list[str]) -> dict[str, Any]:
    """Timed steps first (printed as measured; the JSON written before profiling starts), then the profile."""
    import torch.nn.functional as F

    kv = dict(a.split("=", 1) for a in argv if "=" in a)
    steps = int(kv.pop("steps", "10"))
    profile_steps = int(kv.pop("profile_steps", "3"))
    profile_refresh = kv.pop("profile_refresh", "0") in ("1", "true")
    out = kv.pop("out", "")
    if kv.pop("tf32", "0") in (
        "1",
        "true",
    ):  # what fp32 matmuls at TF32 would change (not the bench's setting)
        torch.set_float32_matmul_precision("high")
    cfg = parse_cli([f"{k}={v}" for k, v in kv.items()])
    device = cfg.device
    torch.manual_seed(cfg.seed)
    model = qrun.build_model(cfg, cfg.vocab_size)
    opt = qrun.build_opt("soap_rekls", model, point("soap_rekls", cfg, lr=1e-3), cfg)
    x = torch.randint(0, cfg.vocab_size, (cfg.batch_size, cfg.seq_len + 1), device=device)
    with qrun._autocast(cfg):
        logits = model(input_ids=x[:, :-1]).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].reshape(-1))
    loss.backward()
    _sync(device)
    period = cfg.precondition_frequency
    done = 0  # steps taken; step done+1 refreshes when done % period == 0

    def step(label: str) -> float:
        nonlocal done
        refresh = done % period == 0
        ms = timed_step(opt, device)
        done += 1
        print(f"{label} step {done:3d}{' (refresh)' if refresh else ''}: {ms:9.1f} ms", flush=True)
        return ms

    warm = period + 1  # step 1 (first eigh) and the first periodic refresh behind us
    t_warm = [step("warm-up") for _ in range(warm)]
    first = done
    t = [step("timed") for _ in range(steps)]
    refresh = [ms for i, ms in enumerate(t) if (first + i) % period == 0]
    plain = sorted(ms for i, ms in enumerate(t) if (first + i) % period != 0)
    soap_params = [p for p in opt.state if "Q_L" in opt.state[p] or "Q_R" in opt.state[p]]
    result: dict[str, Any] = {
        "config": {**cfg.as_dict(), "steps": steps, "profile_steps": profile_steps},
        "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "params": sum(p.numel() for p in model.parameters()),
        "soap_tensors": len(soap_params),
        "soap_shapes": sorted({tuple(p.shape) for p in soap_params}),
        "warmup_ms": t_warm,
        "step_ms": t,
        "refresh_step_ms": refresh,
        "plain_step_ms_median": plain[len(plain) // 2] if plain else None,
    }
    _write(out, result)
    if profile_steps <= 0:
        return result
    # refresh steps (one eigh per factor) are profiled only on request: see the module doc
    while not profile_refresh and any((done + i) % period == 0 for i in range(profile_steps)):
        step("skipped")
    print(f"profiling steps {done + 1}-{done + profile_steps}", flush=True)

    def profiled() -> None:
        for _ in range(profile_steps):
            opt.step()
        _sync(device)

    with labelled_parts():
        _, prof = profile_step(profiled, cuda=device == "cuda")
    result["profiled_steps"] = [done + 1, done + profile_steps]
    result["profile"] = summarize(prof, profile_steps)
    _write(out, result)
    return result


def main(argv: list[str] | None = None) -> int:
    res = run(sys.argv[1:] if argv is None else argv)
    print(json.dumps({k: v for k, v in res.items() if k != "config"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
