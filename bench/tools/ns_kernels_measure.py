"""Measurements behind `bench.tools.ns_kernels` (imports torch; emerging-optimizers and quack-kernels optional, as peers
only)."""

from __future__ import annotations

import functools
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from optim import cost
from optim.functional.newton_schulz import ns_coefficients
from optim.kernels import orthogonalize, plan_for, sym_quack, timing
from optim.kernels.fused_step import apply_update, momentum_pack
from optim.kernels.ns_batched import MatOps, TorchOps, orthogonalize_with

QUINTIC = ns_coefficients("quintic", 5)
TORCH_MUON_COEFFS = (3.4445, -4.7750, 2.0315)
# Layer parameter shapes (rows, cols, count); experts as separate parameters, like the H200 baseline json.
LAYERS: dict[str, list[tuple[int, int, int]]] = {
    "qwen3_30b_a3b_layer": [
        (4096, 2048, 1),
        (512, 2048, 2),
        (2048, 4096, 1),
        (1536, 2048, 128),
        (2048, 768, 128),
    ],
    # 6 local routed experts at EP64 plus the shared expert, MLA projections, attention out, router.
    "kimi_k2_moe_layer_ep64": [
        (4096, 7168, 7),
        (7168, 2048, 7),
        (1536, 7168, 1),
        (12288, 1536, 1),
        (576, 7168, 1),
        (16384, 512, 1),
        (7168, 8192, 1),
        (384, 7168, 1),
    ],
}
OURS_STEPS = ("ours", "ours_gram", "ours_quack", "optim_muon", "optim_muon_gram")
CPU_LAYERS = {"tiny_layer": [(32, 48, 3), (40, 24, 2)]}
# The fused [gate; up] expert fc1 of each layer (rows, cols): `optim_muon_split` orthogonalizes its halves apart.
FC1: dict[str, tuple[int, int]] = {
    "qwen3_30b_a3b_layer": (1536, 2048),
    "kimi_k2_moe_layer_ep64": (4096, 7168),
    "tiny_layer": (32, 48),
}
# Product micro-benchmark shapes (B, m, K): Qwen3 fc1 / fc1 halves / fc2 / q, K2 expert half and dense fc2, square.
PRODUCT_SHAPES = (
    (128, 1536, 2048),
    (256, 768, 2048),
    (128, 768, 2048),
    (1, 2048, 4096),
    (8, 2048, 7168),
    (1, 7168, 18432),
    (1, 8192, 8192),
)


def median_ms(fn: Callable[[], object], dev: str, budget_ms: float = 400.0, warmup: int = 2) -> float:
    """Median ms of fn alone after `warmup` calls: per-call latency on an idle GPU (`optim.kernels.timing`, the
    timer of the plan and of `measure_shape`), as many repeats (5-40) as fit in about budget_ms. On CPU one
    timed call (no timing claims)."""
    for _ in range(warmup if dev == "cuda" else 1):
        fn()
    timer = timing.timer_for(dev)
    first = timer(fn)
    if dev != "cuda":
        return first
    reps = max(5, min(40, int(budget_ms / max(first, 1e-3))))
    return statistics.median([timer(fn) for _ in range(reps)])


def polar64(x: torch.Tensor) -> torch.Tensor:
    """fp64 polar factor of one (r, c) matrix via eigh of the short-side Gram matrix (U S^-1 U^T X)."""
    tall = x.shape[0] > x.shape[1]
    xx = (x.mT if tall else x).double()
    evals, u = torch.linalg.eigh(xx @ xx.mT)
    inv = evals.clamp_min(evals.max() * 1e-30).rsqrt()
    p = (u * inv) @ (u.mT @ xx)
    return p.mT if tall else p


def ortho_err(out: torch.Tensor, refs: list[torch.Tensor]) -> float:
    errs = [float((out[i].double() - p).norm() / p.norm()) for i, p in enumerate(refs)]
    return sum(errs) / len(errs)


def family(method: str) -> str:
    """Plan candidate name -> family: `cublas` (plain_torch, gram_torch), `quack`, or `triton` (symmetric tiles)."""
    backend = method.removesuffix("+graph").split("_", 1)[1]
    return "cublas" if backend == "torch" else "quack" if backend.startswith("quack") else "triton"


def family_best(times_ms: dict[str, float]) -> dict[str, Any]:
    """Fastest plan candidate of each family, {family: (method, ms)} for the families that were timed; also
    `triton_rowmajor`: the Triton configs without grouped order or persistence."""
    from optim.kernels.sym_triton import TILE_CONFIGS

    best: dict[str, Any] = {}
    for name, ms in times_ms.items():
        keys = [family(name)]
        if keys[0] == "triton":
            cfg = TILE_CONFIGS[name.removesuffix("+graph").split("_", 2)[2]]
            if not (cfg.group or cfg.persistent):
                keys.append("triton_rowmajor")
        for f in keys:
            if f not in best or ms < best[f][1]:
                best[f] = (name, ms)
    return best


def fixed_ns(ops: MatOps) -> Callable[[torch.Tensor], torch.Tensor]:
    """Plain quintic NS, bf16 iterate, on one product backend (no plan)."""

    def run(x: torch.Tensor) -> torch.Tensor:
        return orthogonalize_with(x, QUINTIC, eps=1e-7, gram=False, restarts=frozenset(), ops=ops)

    return run


def ns_impls(dev: str) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    impls: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "ours": lambda x: orthogonalize(x, coeffs=QUINTIC),
        "ours_gram": lambda x: orthogonalize(x, coeffs=QUINTIC, use_gram=True),
        "cublas": fixed_ns(TorchOps()),
    }
    if dev == "cuda" and sym_quack.usable(torch.device(dev)):
        impls["quack"] = fixed_ns(sym_quack.QuackOps(general=True))
    try:
        from emerging_optimizers.orthogonalized_optimizers import muon_utils

        def eo(x: torch.Tensor) -> torch.Tensor:
            y = x[0] if x.shape[0] == 1 else x
            out = muon_utils.newton_schulz(y, steps=5, coefficient_type="quintic")
            return out.unsqueeze(0) if x.shape[0] == 1 else out

        impls["eo_plain"] = eo
    except ImportError:
        pass
    from torch.optim._muon import _zeropower_via_newtonschulz as tz

    impls["torch_muon"] = lambda x: torch.stack([tz(m, TORCH_MUON_COEFFS, 5, 1e-7) for m in x.unbind(0)])
    return impls


# Interleaved timing of the implementations of one shape: about this many ms per implementation, 5-40 rounds.
SHAPE_BUDGET_MS = 400.0


def measure_shape(
    shape: tuple[str, int, int, int, str, str], dev: str, with_error: bool, log: Callable
) -> dict:
    """Every NS implementation on one shape: first call apart (compilation, the plan's warm-up) with its error
    against the fp64 polar factor, then all timed together in interleaved rounds (`optim.kernels.timing`: per-call
    latency on an idle GPU, median per implementation), the protocol the plan times its candidates with."""
    name, rows, cols, batch, model, role = shape
    gen = torch.Generator(device=dev).manual_seed(1234)
    x = torch.randn(batch, rows, cols, device=dev, generator=gen)
    refs = [polar64(x[i]) for i in range(min(batch, 2))] if with_error else []
    row: dict[str, Any] = {
        "name": name,
        "rows": rows,
        "cols": cols,
        "batch": batch,
        "model": model,
        "role": role,
    }
    row["impls"] = {}
    timed: dict[str, Callable[[], object]] = {}
    for impl, fn in ns_impls(dev).items():
        r: dict[str, Any] = {}
        try:
            t = time.perf_counter()
            out = fn(x)
            if dev == "cuda":
                torch.cuda.synchronize()
            first_s = time.perf_counter() - t
            if impl.startswith("ours") and dev == "cuda":
                entry = plan_for(x, coeffs=QUINTIC, use_gram=impl == "ours_gram")
                r.update(
                    method=entry["method"],
                    warmup_s=first_s,
                    plan_times_ms=entry["times_ms"],
                    plan_first_call_s=entry.get("first_call_s", {}),
                    family_best=family_best(entry["times_ms"]),  # type: ignore[arg-type]
                )
                if entry.get("rejected"):
                    r["rejected"] = entry["rejected"]
            elif impl == "quack":
                r["warmup_s"] = first_s  # QuACK's JIT compilation of each kernel variant (first shape only)
            if refs:
                r["ortho_err"] = ortho_err(out, refs)
            del out
            timed[impl] = functools.partial(fn, x)
        except Exception as e:  # noqa: BLE001 - one failing baseline must not lose the others
            r["note"] = f"error: {type(e).__name__}: {str(e)[:200]}"
        row["impls"][impl] = r
    rounds = (5, 40) if dev == "cuda" else (1, 1)  # CPU: a smoke of the code path, no timing claims
    medians, errors = timing.interleaved_medians(
        timed,
        timer=timing.timer_for(dev),
        budget_ms=SHAPE_BUDGET_MS * len(timed),
        min_rounds=rounds[0],
        max_rounds=rounds[1],
    )
    for impl, r in row["impls"].items():
        if impl in medians:
            r["ms"] = medians[impl]
        if impl in errors:
            r["note"] = f"error while timed: {errors[impl]}"
        ms, err = r.get("ms", float("nan")), r.get("ortho_err", float("nan"))
        log(f"  {name} {impl}: {ms:.3f} ms err {err:.4f} {r.get('method', '')} {r.get('note', '')}")
    if dev == "cuda":
        torch.cuda.empty_cache()
    return row


_SYRK_CODE = r"""
import json, sys, time, torch
from triton.testing import do_bench
torch.set_float32_matmul_precision("medium")
from emerging_optimizers.orthogonalized_optimizers import muon_utils
def polar64(x):
    tall = x.shape[0] > x.shape[1]; xx = (x.mT if tall else x).double()
    ev, u = torch.linalg.eigh(xx @ xx.mT); p = (u * ev.clamp_min(ev.max() * 1e-30).rsqrt()) @ (u.mT @ xx)
    return p.mT if tall else p
for name, r, c in json.loads(sys.argv[1]):
    x = torch.randn(r, c, device="cuda")
    f = lambda: muon_utils.newton_schulz(x, steps=5, coefficient_type="quintic", use_syrk=True)
    t0 = time.time(); y = f(); torch.cuda.synchronize(); tune = time.time() - t0
    p = polar64(x); err = float((y.double() - p).norm() / p.norm())
    ms = do_bench(f, warmup=25, rep=200, return_mode="median")
    print(json.dumps({"name": name, "ms": ms, "autotune_s": tune, "ortho_err": err}), flush=True)
"""


def run_eo_syrk(
    shapes: list[tuple[str, int, int]], timeout: float, log: Callable
) -> dict[str, dict[str, Any]]:
    """EO use_syrk=True in a subprocess with a wall-clock limit: a shape still autotuning reports a timeout."""
    if not shapes:
        return {}
    t = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", _SYRK_CODE, json.dumps(shapes)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        timed_out = True
    res: dict[str, dict[str, Any]] = {}
    for line in out.splitlines():
        if line.startswith("{"):
            d = json.loads(line)
            res[d.pop("name")] = d
    for name, _, _ in shapes:
        if name not in res:
            why = f"autotune timeout (> {timeout:.0f} s for the SYRK shapes)" if timed_out else err[-200:]
            res[name] = {"note": why}
    log(f"  eo_syrk subprocess {time.perf_counter() - t:.1f} s: {res}")
    return res


class BenchMuon:
    """Bench-local batched Muon step (optim.Muon had not landed): same-shape parameters are one NS batch.

    Same math as EO Muon v0.3.0 defaults: buf <- lerp(buf, g, 1 - beta); update = NS(buf or Nesterov input),
    quintic, 5 steps; scale sqrt(max(out, in)) ("spectral"); decoupled weight decay p <- p (1 - lr wd).
    With `ops`, NS runs on that product backend (plain, bf16 iterate) instead of the plan.
    """

    def __init__(
        self, params: list[torch.Tensor], *, lr: float, use_gram: bool = False, ops: MatOps | None = None
    ) -> None:
        self.lr, self.beta, self.wd, self.nesterov, self.use_gram = lr, 0.95, 0.01, False, use_gram
        self.ns = fixed_ns(ops) if ops is not None else self.planned
        self.groups: dict[tuple[int, int], list[torch.Tensor]] = {}
        for p in params:
            self.groups.setdefault(tuple(p.shape), []).append(p)
        self.bufs = {k: [torch.zeros_like(p) for p in ps] for k, ps in self.groups.items()}

    def planned(self, x: torch.Tensor) -> torch.Tensor:
        return orthogonalize(x, coeffs=QUINTIC, use_gram=self.use_gram)

    def pack(self, key: tuple[int, int]) -> torch.Tensor:
        """Momentum update and the bf16 NS input of one shape group, a tall shape's stored transposed (wide: the NS
        needs no transposing copy), as optim.Muon's fused step does."""
        r, c = key
        grads = [p.grad for p in self.groups[key]]
        return momentum_pack(grads, self.bufs[key], beta=self.beta, nesterov=self.nesterov, transpose=r > c)

    def update(self, key: tuple[int, int], o: torch.Tensor) -> None:
        """p <- p (1 - lr wd) - lr scale O for one shape group (O as `pack` laid it out)."""
        r, c = key
        apply_update(
            self.groups[key], o, lr=self.lr, weight_decay=self.wd, scale=max(r, c) ** 0.5, transposed=r > c
        )

    @torch.no_grad()
    def step(self) -> None:
        for key in self.groups:
            self.update(key, self.ns(self.pack(key)))

    @torch.no_grad()
    def phase_ms(self, dev: str) -> dict[str, float]:
        """Median ms of each phase over all groups: momentum pack, orthogonalize, update."""
        keys = list(self.groups)

        def pack() -> list[torch.Tensor]:
            return [self.pack(k) for k in keys]

        xs = pack()
        os_ = [self.ns(x) for x in xs]

        def upd() -> None:
            for k, o in zip(keys, os_, strict=True):
                self.update(k, o)

        return {
            "pack_ms": median_ms(pack, dev),
            "orthogonalize_ms": median_ms(lambda: [self.ns(x) for x in xs], dev),
            "update_ms": median_ms(upd, dev),
        }


def make_params(spec: list[tuple[int, int, int]], dev: str) -> list[torch.nn.Parameter]:
    gen = torch.Generator(device=dev).manual_seed(7)
    ps = []
    for r, c, n in spec:
        for _ in range(n):
            p = torch.nn.Parameter(torch.randn(r, c, device=dev, generator=gen) * 0.02)
            p.grad = torch.randn(r, c, device=dev, generator=gen) * 1e-3
            ps.append(p)
    return ps


def optimizers(dev: str, fc1: tuple[int, int] | None = None) -> dict[str, Callable[[list], Any]]:
    """Step implementations; `fc1` (the fused [gate; up] shape) adds `optim_muon_split` (halves apart)."""
    opts: dict[str, Callable[[list], Any]] = {
        "adamw_fused": lambda ps: torch.optim.AdamW(ps, lr=1e-4, fused=dev == "cuda", foreach=dev != "cuda"),
        "ours": lambda ps: BenchMuon(ps, lr=1e-4),
        "ours_gram": lambda ps: BenchMuon(ps, lr=1e-4, use_gram=True),
        "torch_muon": lambda ps: torch.optim.Muon(ps, lr=1e-4),
    }
    if dev == "cuda" and sym_quack.usable(torch.device(dev)):
        opts["ours_quack"] = lambda ps: BenchMuon(ps, lr=1e-4, ops=sym_quack.QuackOps(general=True))
    from optim import Muon, MuonConfig
    from optim.functional.split import RowSplit

    # the project's optimizer: same defaults as EO Muon v0.3.0 except lr
    opts["optim_muon"] = lambda ps: Muon(ps, MuonConfig(lr=1e-4))
    opts["optim_muon_gram"] = lambda ps: Muon(ps, MuonConfig(lr=1e-4, use_gram_ns=True))
    if fc1 is not None:
        halves = RowSplit(num_groups=1, sizes=(fc1[0] // 2, fc1[0] // 2), labels=("gate", "up"))
        opts["optim_muon_split"] = lambda ps: Muon(
            ps, MuonConfig(lr=1e-4), splits={p: halves for p in ps if tuple(p.shape) == fc1}
        )
    try:
        from emerging_optimizers.orthogonalized_optimizers import Muon as EOMuon

        opts["eo_muon"] = lambda ps: EOMuon(ps, lr=1e-4)
    except ImportError:
        pass
    return opts


def measure_layer(name: str, spec: list[tuple[int, int, int]], dev: str, log: Callable) -> dict[str, Any]:
    flops = sum(n * cost.ns_flops(r, c, 5) for r, c, n in spec)
    d: dict[str, Any] = {"ns_plain_flops": flops, "params": sum(r * c * n for r, c, n in spec), "impls": {}}
    deltas: dict[str, list[torch.Tensor]] = {}
    for impl, mk in optimizers(dev, FC1.get(name)).items():
        r: dict[str, Any] = {}
        try:
            ps = make_params(spec, dev)
            before = [p.detach().clone() for p in ps] if impl in ("eo_muon", *OURS_STEPS) else None
            opt = mk(ps)
            t = time.perf_counter()
            opt.step()
            if dev == "cuda":
                torch.cuda.synchronize()
            r["first_step_ms"] = (time.perf_counter() - t) * 1e3
            if before is not None:
                deltas[impl] = [(p.detach() - b).flatten() for p, b in zip(ps, before, strict=True)]
                del before
            r["ms"] = median_ms(opt.step, dev, budget_ms=1500.0, warmup=2)
            if isinstance(opt, BenchMuon):
                r.update(opt.phase_ms(dev))
            del opt, ps
        except Exception as e:  # noqa: BLE001
            r["note"] = f"error: {type(e).__name__}: {str(e)[:200]}"
        if impl.startswith("ours"):
            r["note"] = (r.get("note", "") + " bench-local batched step").strip()
        d["impls"][impl] = r
        log(
            f"  step {name} {impl}: {r.get('ms', float('nan')):.2f} ms (first {r.get('first_step_ms', 0):.0f} ms)"
        )
        if dev == "cuda":
            torch.cuda.empty_cache()
    if "eo_muon" in deltas:
        ref = torch.cat(deltas["eo_muon"])
        for impl in OURS_STEPS:
            if impl in deltas:
                err = float((torch.cat(deltas[impl]) - ref).norm() / ref.norm())
                d["impls"][impl]["update_rel_err_vs_eo"] = err
    return d


def product_micro(log: Callable[[str], None]) -> list[dict[str, Any]]:
    """The two symmetric products of a plain NS step alone, per backend: X X^T (K = n) and b A + c A^2 (K = m, the
    epilogue reading A), by cuBLAS (the full product), each Triton tile config and QuACK's gemm_symmetric (its fixed
    tiles, `quack`, and on SM90 each SYMMETRIC_CONFIGS config, `quack_<config>`); median ms (first call apart:
    compilation) and the largest error relative to the fp32 product's largest entry."""
    from optim.kernels.sym_triton import TILE_CONFIGS, TritonOps

    _, b, c = QUINTIC[0]
    backends: dict[str, MatOps] = {
        "cublas": TorchOps(),
        **{t: TritonOps(cfg) for t, cfg in TILE_CONFIGS.items()},
    }
    if sym_quack.usable(torch.device("cuda")):
        backends["quack"] = sym_quack.QuackOps(general=False)
    if sym_quack.configs_usable(torch.device("cuda")):
        from optim.kernels.plan import skipped_tiles

        skip = skipped_tiles()
        for name in sym_quack.SYMMETRIC_CONFIGS:
            if name not in skip:
                backends[f"quack_{name}"] = sym_quack.QuackOps(general=True, config=name)
    rows = []
    for nb, m, k in PRODUCT_SHAPES:
        # rows of unit norm: A = X X^T is O(1)
        x = (torch.randn(nb, m, k, device="cuda") * k**-0.5).bfloat16()
        a = torch.bmm(x, x.mT)
        for product in ("gram", "poly"):
            prec = torch.get_float32_matmul_precision()
            # the run's "medium" would round the fp32 reference's operands to bf16
            torch.set_float32_matmul_precision("highest")
            if product == "gram":
                ref = torch.bmm(x.float(), x.float().mT)
            else:
                ref = torch.baddbmm(a.float(), a.float(), a.float(), beta=b, alpha=c)
            torch.set_float32_matmul_precision(prec)
            scale = float(ref.abs().max())
            r: dict[str, Any] = {"product": product, "batch": nb, "m": m, "k": k if product == "gram" else m}
            for name, ops in backends.items():

                def fn(
                    o: MatOps = ops, p: str = product, xx: torch.Tensor = x, aa: torch.Tensor = a
                ) -> torch.Tensor:
                    return o.gram(xx) if p == "gram" else o.sym(aa, aa, c, aa, b)

                _time_product(r, name, fn, ref, scale)
            tri = {t: r[f"{t}_ms"] for t in TILE_CONFIGS if r.get(f"{t}_ms")}
            if tri:
                r["best_triton"] = min(tri, key=tri.__getitem__)
                r["best_triton_ms"] = tri[r["best_triton"]]
            rows.append(r)
            log(
                f"  {product} {nb}x{m}x{r['k']}: cublas {r['cublas_ms']} best triton {r.get('best_triton')} "
                f"{r.get('best_triton_ms')} quack {r.get('quack_ms')}"
            )
            del ref
        torch.cuda.empty_cache()
    return rows


def _time_product(
    r: dict[str, Any], name: str, fn: Callable[[], torch.Tensor], ref: torch.Tensor, scale: float
) -> bool:
    """One backend of a product row: first call apart (compilation), largest error against the fp32 `ref` over
    `scale`, median ms. A backend that cannot run is reported in `errors`, not fatal. True when it was timed."""
    try:
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        r[f"{name}_first_s"] = time.perf_counter() - t0
        r[f"{name}_err"] = float((out.float() - ref).abs().max()) / scale
        del out
        r[f"{name}_ms"] = median_ms(fn, "cuda", budget_ms=60.0)
        return True
    except Exception as e:  # noqa: BLE001 - a config that cannot run is reported, not fatal
        r[f"{name}_ms"] = None
        r.setdefault("errors", {})[name] = f"{type(e).__name__}: {str(e)[:160]}"
        return False


def general_backends() -> dict[str, MatOps]:
    """Backends of the general product X <- a X + P X in `general_micro`: cuBLAS (baddbmm), and on SM90 QuACK's
    gemm_add in its default config (`quack`) and in each explicit config (`quack_<config>`) that
    $MUONBENCH_NS_SKIP does not name (a config that crashes its compiler would end the run)."""
    from optim.kernels.plan import skipped_tiles

    backends: dict[str, MatOps] = {"cublas": TorchOps()}
    if sym_quack.usable(torch.device("cuda")):
        backends["quack"] = sym_quack.QuackOps(general=True)
    if sym_quack.configs_usable(torch.device("cuda")):
        skip = skipped_tiles()
        for name in sym_quack.GENERAL_CONFIGS:
            if name not in skip:
                backends[f"quack_{name}"] = sym_quack.QuackOps(general=True, config=name)
    return backends


def general_micro(log: Callable[[str], None]) -> list[dict[str, Any]]:
    """The general product of a plain NS step alone, X <- a X + P X (P = b A + c A^2 of m x m, X of m x n, so
    K = m), per backend of `general_backends`, on PRODUCT_SHAPES read as (B, m, n): median ms (first call apart:
    compilation), TFLOP/s on 2 B m^2 n, and the largest error relative to the fp32 product's largest entry."""
    a_coef, b, c = QUINTIC[0]
    backends = general_backends()
    rows = []
    for nb, m, n in PRODUCT_SHAPES:
        x = (torch.randn(nb, m, n, device="cuda") * n**-0.5).bfloat16()
        g = torch.bmm(x, x.mT)
        p = torch.baddbmm(g, g, g, beta=b, alpha=c)
        prec = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("highest")
        ref = torch.baddbmm(x.float(), p.float(), x.float(), beta=a_coef)
        torch.set_float32_matmul_precision(prec)
        scale = float(ref.abs().max())
        del g
        r: dict[str, Any] = {"product": "apply", "batch": nb, "m": m, "n": n, "k": m}
        for name, ops in backends.items():

            def fn(o: MatOps = ops, pp: torch.Tensor = p, xx: torch.Tensor = x) -> torch.Tensor:
                return o.apply(pp, xx, a_coef)

            if _time_product(r, name, fn, ref, scale):
                r[f"{name}_tflops"] = 2 * nb * m * m * n / r[f"{name}_ms"] / 1e9
        timed = {k: r[f"{k}_ms"] for k in backends if r.get(f"{k}_ms")}
        if timed:
            r["best"] = min(timed, key=timed.__getitem__)
        rows.append(r)
        log(f"  apply {nb}x{m}x{n}: " + " ".join(f"{k} {v:.3g}" for k, v in timed.items()))
        del x, p, ref
        torch.cuda.empty_cache()
    return rows


def run_all(
    shapes: list[tuple[str, int, int, int, str, str]],
    *,
    device: str,
    eo_syrk: tuple[str, ...],
    syrk_timeout: float,
    with_error: bool,
    log: Callable[[str], None],
    checkpoint: Callable[[dict[str, Any]], None] = lambda res: None,
) -> dict[str, Any]:
    """All measurements; returns the results dict that `bench.tools.ns_kernels` renders."""
    import triton

    res: dict[str, Any] = {"torch": torch.__version__, "triton": triton.__version__, "started": time.time()}
    try:
        from importlib.metadata import version

        res["emerging_optimizers"] = version("emerging-optimizers")
    except Exception:  # noqa: BLE001
        res["emerging_optimizers"] = None
    from optim.kernels.plan import PLAN_VERSION

    res["plan_version"] = PLAN_VERSION  # what the plan times and offers (optim.kernels.plan)
    res["quack_kernels"] = sym_quack.quack_version()
    res["quack_usable"] = device == "cuda" and sym_quack.usable(torch.device("cuda"))
    if device == "cuda":
        torch.set_float32_matmul_precision("medium")  # EO's bf16 path ("medium" is MCore's default)
        res["device_name"] = torch.cuda.get_device_name()
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn_like(a)
        res["ceiling_tflops"] = 2 * 8192**3 / median_ms(lambda: a @ b, "cuda", budget_ms=500) / 1e9
        del a, b
        log(f"bf16 matmul ceiling {res['ceiling_tflops']:.0f} TFLOP/s")
    else:
        res["device_name"] = "cpu"
    if device == "cuda":
        res["product_micro"] = product_micro(log)
        res["general_micro"] = general_micro(log)
    res["shapes"] = []
    for s in shapes:
        log(f"shape {s[0]} {s[3]}x{s[1]}x{s[2]}")
        res["shapes"].append(measure_shape(s, device, with_error, log))
        checkpoint(res)
    syrk = run_eo_syrk([(s[0], s[1], s[2]) for s in shapes if s[0] in eo_syrk], syrk_timeout, log)
    for row in res["shapes"]:
        if device == "cuda" and "eo_plain" in row["impls"]:
            row["impls"]["eo_syrk"] = syrk.get(row["name"]) or {
                "note": "skipped: EO SYRK autotunes minutes per new shape (docs/references.md#h200-baseline); run with eo_syrk=NAME"
            }
    layers = CPU_LAYERS if device == "cpu" else LAYERS
    res["steps"] = {}
    for name, spec in layers.items():
        log(f"layer step {name}")
        res["steps"][name] = measure_layer(name, spec, device, log)
        checkpoint(res)
    from optim.kernels.fused_step import TRITON_FAILURE

    res["fused_step_triton_failure"] = list(TRITON_FAILURE)
    res["finished"] = time.time()
    return res
