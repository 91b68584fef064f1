"""Measured per-shape plan: time each candidate NS method once, keep the fastest, cache the choice on disk.

A plan key is (batch, m, n, input dtype, coefficients, use_gram, restarts) on one GPU with one torch and Triton
version (and QuACK version, where installed and usable); the cache file (json) lives in $MUONBENCH_CACHE or
~/.cache/muonbench and records the times of every candidate, each candidate's first call (`first_call_s`: JIT
compilation, graph capture) and the whole warm-up cost (`plan_s`), so a report can show why a method was chosen
and what compiling it cost. An entry that lacks a candidate the current code offers (written before that kernel
existed) is measured again. Nothing is guessed: a candidate is
only chosen after it ran, matched the cuBLAS reference within bf16 tolerance, and was the fastest by median.

Candidates (all bf16 operands, fp32 accumulation):
- `plain_torch`: plain iteration on torch.bmm / baddbmm (cuBLAS), alpha/beta fused in the GEMM epilogue.
- `plain_sym_<tile>` (t128, t128s4, t128w4, t64; tma128, tma128s5, tma256, tma128w4, tma128k128, tma128o,
  tma128w4o, tma128wso through tensor descriptors; tma128g8, tma256g4 in grouped launch order; ptma128, ptma256,
  ptma128o persistent): X X^T and b A + c A^2 by the Triton symmetric kernel (one triangle); with the
  fp16 iterate a I is added in that kernel's epilogue too.
- `plain_quack_sym`, `plain_quack_all` (only with quack-kernels installed, on SM90+, both dimensions a multiple of
  8): X X^T and b A + c A^2 by QuACK's symmetric GEMM; `_all` also X <- a X + P X by its gemm_add, `_sym` leaves
  that to cuBLAS (`optim.kernels.sym_quack`).
- `gram_torch`, `gram_sym_<tile>`, `gram_quack_sym`, `gram_quack_all`: Gram-NS with restarts (only when
  use_gram=True).
- `+graph`: the same body captured once in a CUDA graph and replayed (only for small problems, where launch
  gaps dominate).
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from optim import cost
from optim.kernels.ns_batched import Coeff, MatOps, TorchOps, orthogonalize_with

# Problems with fewer plain FLOPs than this are also tried under CUDA graph replay (~0.3 ms at 700 TF/s).
GRAPH_MAX_FLOPS = 2.0e11
# Names of the Triton tile configs (optim.kernels.sym_triton.TILE_CONFIGS; kept here so no Triton import is needed).
TILE_NAMES = (
    "t128", "t128s4", "t128w4", "t64", "tma128", "tma128s5", "tma256", "tma128w4", "tma128k128",
    "tma128o", "tma128w4o", "tma128wso", "tma128g8", "tma256g4", "ptma128", "ptma256", "ptma128o",
)  # fmt: skip
# Product backends of QuACK (`optim.kernels.sym_quack.QuackOps`): symmetric products only, or every product.
QUACK_BACKENDS = ("quack_sym", "quack_all")
# A candidate must agree with the cuBLAS path to this relative Frobenius distance (bf16 rounding differences).
AGREE_RTOL = 5e-2


def cache_path() -> Path:
    """$MUONBENCH_CACHE/ns_plan.json, else ~/.cache/muonbench/ns_plan.json."""
    root = os.environ.get("MUONBENCH_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "muonbench")
    return Path(root) / "ns_plan.json"


def env_key(device: torch.device) -> str:
    """GPU name and software versions (QuACK's only where the plan offers it, so the keys of an install without it
    stay as they were); a change of any of them invalidates the cached choices."""
    import triton

    from optim.kernels import sym_quack

    key = f"{torch.cuda.get_device_name(device)}|torch {torch.__version__}|triton {triton.__version__}"
    return f"{key}|quack {sym_quack.quack_version()}" if sym_quack.usable(device) else key


def plan_key(
    env: str,
    x: torch.Tensor,
    coeffs: Sequence[Coeff],
    eps: float,
    use_gram: bool,
    restarts: frozenset[int],
    dtype: torch.dtype = torch.bfloat16,
) -> str:
    """The cache key of one NS problem: environment, (B, r, c), input dtype, coefficients, Gram-NS and restarts,
    eps, and the iterate's dtype when it is not bf16 (so the bf16 keys of earlier caches stay valid)."""
    nb, r, c = x.shape
    ckey = ",".join(f"{a:.6g}/{b:.6g}/{cc:.6g}" for a, b, cc in coeffs)
    rkey = ",".join(str(i) for i in sorted(restarts)) if use_gram else "-"
    key = f"{env}|{nb}x{r}x{c}|{x.dtype}|{ckey}|gram={use_gram}|restarts={rkey}|eps={eps:g}"
    return key if dtype == torch.bfloat16 else f"{key}|iterate={dtype}"


def plain_flops(batch: int, m: int, n: int, num_steps: int) -> float:
    """Plain-count NS FLOPs, short side m: k (4 m^2 n + 2 m^3) per matrix."""
    return batch * cost.ns_flops(m, n, num_steps)


def _ops(name: str) -> MatOps:
    """The product backend of a candidate name `<body>_<backend>` (graph suffix removed)."""
    backend = name.split("_", 1)[1]
    if backend == "torch":
        return TorchOps()
    if backend in QUACK_BACKENDS:
        from optim.kernels.sym_quack import QuackOps

        return QuackOps(general=backend == "quack_all")
    from optim.kernels.sym_triton import TILE_CONFIGS, TritonOps

    return TritonOps(TILE_CONFIGS[backend.removeprefix("sym_")])


def skipped_tiles() -> frozenset[str]:
    """Tile configs named in $MUONBENCH_NS_SKIP (comma-separated) are never tried: the way out when a compiler
    cannot build one on some machine without raising (a crash cannot be caught by the plan's measurement).
    Unknown names raise, naming the known ones."""
    names = frozenset(t.strip() for t in os.environ.get("MUONBENCH_NS_SKIP", "").split(",") if t.strip())
    unknown = names - set(TILE_NAMES)
    if unknown:
        raise ValueError(f"MUONBENCH_NS_SKIP={sorted(unknown)}: not tile configs; known: {list(TILE_NAMES)}")
    return names


def candidate_names(
    batch: int, m: int, n: int, num_steps: int, use_gram: bool, triton_ok: bool, quack_ok: bool = False
) -> list[str]:
    """Methods worth timing for this problem (graph variants only for small ones; none of $MUONBENCH_NS_SKIP;
    QuACK's with `quack_ok` and 16-byte operand rows)."""
    from optim.kernels.sym_quack import aligned

    skip = skipped_tiles()
    backends = [f"sym_{t}" for t in TILE_NAMES if t not in skip] if triton_ok else []
    if quack_ok and aligned(m, n):
        backends += QUACK_BACKENDS
    bodies = [f"plain_{b}" for b in ("torch", *backends)]
    if use_gram:
        bodies += [f"gram_{b}" for b in ("torch", *backends)]
    if plain_flops(batch, m, n, num_steps) <= GRAPH_MAX_FLOPS:
        bodies += [b + "+graph" for b in list(bodies)]
    return bodies


class GraphRunner:
    """One CUDA graph of a whole orthogonalize body for one static input shape; replay copies in and out."""

    def __init__(self, body: Callable[[torch.Tensor], torch.Tensor], example: torch.Tensor) -> None:
        self.static_in = example.clone()
        stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # compile Triton kernels, create cuBLAS handles and workspaces
                body(self.static_in)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.static_out = body(self.static_in)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.static_in.copy_(x)
        self.graph.replay()
        return self.static_out.clone()


@dataclass(kw_only=True, slots=True)
class Planner:
    """Owns the in-memory plan, the on-disk cache and the captured graphs."""

    path: Path = field(default_factory=cache_path)
    choices: dict[str, dict[str, object]] = field(default_factory=dict)
    graphs: dict[str, GraphRunner] = field(default_factory=dict)
    loaded: bool = False
    complete: set[str] = field(default_factory=set)
    """Keys whose cached entry was found to cover every current candidate (checked once per process, not per call)."""

    def _load(self) -> None:
        self.loaded = True
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return
        if isinstance(data, dict):
            self.choices.update(data)

    def _save(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".tmp{os.getpid()}")
            # entries another process saved since this one loaded are kept (two processes planning at once,
            # e.g. one per GPU, would otherwise drop each other's new shapes); this process's entries win
            try:
                on_disk = json.loads(self.path.read_text())
            except (OSError, ValueError):
                on_disk = {}
            kept = on_disk if isinstance(on_disk, dict) else {}
            kept.update(
                {k: v for k, v in self.choices.items() if not v.get("fallback")}
            )  # fallbacks: this process only
            tmp.write_text(json.dumps(kept, indent=1, sort_keys=True))
            os.replace(tmp, self.path)
        except OSError:  # a read-only home must not break the optimizer step
            pass

    def body(
        self,
        name: str,
        coeffs: Sequence[Coeff],
        eps: float,
        restarts: frozenset[int],
        dtype: torch.dtype = torch.bfloat16,
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        base = name.removesuffix("+graph")
        ops, gram = _ops(base), base.startswith("gram")

        def run(x: torch.Tensor) -> torch.Tensor:
            return orthogonalize_with(x, coeffs, eps=eps, gram=gram, restarts=restarts, ops=ops, dtype=dtype)

        return run

    def run(
        self,
        name: str,
        key: str,
        x: torch.Tensor,
        coeffs: Sequence[Coeff],
        eps: float,
        restarts: frozenset[int],
        dtype: torch.dtype = torch.bfloat16,
    ) -> torch.Tensor:
        body = self.body(name, coeffs, eps, restarts, dtype)
        if not name.endswith("+graph") or torch.cuda.is_current_stream_capturing():
            return body(x)
        gkey = f"{key}|{name}"
        runner = self.graphs.get(gkey)
        if runner is None:
            runner = self.graphs[gkey] = GraphRunner(body, x)
        return runner(x)

    def choose(
        self,
        x: torch.Tensor,
        coeffs: Sequence[Coeff],
        eps: float,
        use_gram: bool,
        restarts: frozenset[int],
        dtype: torch.dtype = torch.bfloat16,
    ) -> tuple[str, str]:
        """Returns (method, plan key) for a (B, r, c) CUDA tensor iterated in `dtype`, measuring the candidates on
        a cache miss."""
        if not self.loaded:
            self._load()
        key = plan_key(env_key(x.device), x, coeffs, eps, use_gram, restarts, dtype)
        hit = self.choices.get(key)
        if hit is not None and (key in self.complete or not self.untried(hit, x, len(coeffs), use_gram)):
            self.complete.add(key)
            return str(hit["method"]), key
        if torch.cuda.is_current_stream_capturing():
            return "plain_torch", key  # cannot time inside a capture; the cuBLAS body is always valid
        entry = self.measure(x, coeffs, eps, use_gram, restarts, key, dtype)
        self.choices[key] = entry  # a fallback is kept in memory (no re-measuring every step), never on disk
        self._save()
        # Timing every candidate on a batched expert stack leaves GBs of temporaries (and the losers' graph pools)
        # cached in the allocator: hand them back. (Measured on the H200: a Megatron process that planned
        # and compiled our Triton kernels in its first step ran its later forward-backwards ~0.5% slower than one
        # that found both caches warm; this release alone did not remove that. Cause open; the remedy used is a
        # warm-up process, `bench.prewarm` of bench.run. reports/megatron_h200_flops_202611/README.md.)
        torch.cuda.empty_cache()
        return str(entry["method"]), key

    @staticmethod
    def untried(entry: dict[str, object], x: torch.Tensor, num_steps: int, use_gram: bool) -> list[str]:
        """Candidates this code offers for x's problem that a cached entry neither timed nor rejected (a cache
        written before a kernel was added): such an entry is measured again, so a new kernel is never ignored.
        A fallback entry (nothing could be measured) is kept for the process as it is."""
        from optim.kernels import sym_quack, triton_importable

        if entry.get("fallback"):
            return []
        seen = set(entry.get("times_ms") or {}) | set(entry.get("rejected") or {})  # type: ignore[call-overload]
        nb, r, c = x.shape
        names = candidate_names(
            nb, r, c, num_steps, use_gram, triton_importable(), sym_quack.usable(x.device)
        )
        return [n for n in names if n not in seen]

    def measure(
        self,
        x: torch.Tensor,
        coeffs: Sequence[Coeff],
        eps: float,
        use_gram: bool,
        restarts: frozenset[int],
        key: str,
        dtype: torch.dtype = torch.bfloat16,
    ) -> dict[str, object]:
        """Times every candidate on x (median of a few runs, CUDA events) after one warm-up call (timed apart:
        `first_call_s`); drops failing or disagreeing ones."""
        from optim.kernels import sym_quack, triton_importable

        t_start = time.perf_counter()
        nb, r, c = x.shape
        names = candidate_names(
            nb, r, c, len(coeffs), use_gram, triton_importable(), sym_quack.usable(x.device)
        )
        ref = self.run("plain_torch", key, x, coeffs, eps, restarts, dtype).float()
        times: dict[str, float] = {}
        first: dict[str, float] = {}
        rejected: dict[str, str] = {}
        for name in names:
            try:
                t_first = time.perf_counter()
                out = self.run(name, key, x, coeffs, eps, restarts, dtype)  # warm-up: compile, capture
                if x.is_cuda:
                    torch.cuda.synchronize(x.device)
                first[name] = time.perf_counter() - t_first
                err = float((out.float() - ref).norm() / ref.norm().clamp_min(1e-30))
                if not err < AGREE_RTOL:
                    rejected[name] = f"disagrees with plain_torch: rel err {err:.3g}"
                    continue
                times[name] = _median_ms(
                    functools.partial(self.run, name, key, x, coeffs, eps, restarts, dtype)
                )
            except Exception as e:  # noqa: BLE001 - a candidate that cannot run is simply not chosen
                rejected[name] = f"{type(e).__name__}: {str(e)[:160]}"
        if not times:
            # Nothing could be timed (e.g. out of memory while measuring next to a full model): use the cuBLAS body,
            # which is always valid, and say why once; the choice is not written to the on-disk cache.
            warnings.warn(
                f"NS plan for {nb}x{r}x{c}: no candidate could be measured ({rejected}); using plain_torch",
                RuntimeWarning,
                stacklevel=3,
            )
            return {
                "method": "plain_torch",
                "times_ms": {},
                "rejected": rejected,
                "first_call_s": first,
                "fallback": True,
                "plan_s": time.perf_counter() - t_start,
            }
        best = min(times, key=times.__getitem__)
        for name in list(self.graphs):  # keep only the chosen graph alive (memory)
            if name.startswith(key + "|") and not name.endswith("|" + best):
                del self.graphs[name]
        return {
            "method": best,
            "times_ms": times,
            "rejected": rejected,
            "first_call_s": first,
            "plan_s": time.perf_counter() - t_start,
        }


def _median_ms(fn: Callable[[], object], budget_ms: float = 60.0) -> float:
    """Median of CUDA-event timings; as many repeats (3..25) as fit in about budget_ms."""
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]

    def once() -> float:
        start.record()
        fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))

    first = once()
    reps = max(3, min(25, int(budget_ms / max(first, 1e-3))))
    return statistics.median([once() for _ in range(reps)])
