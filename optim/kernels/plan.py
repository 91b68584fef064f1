"""Measured per-shape plan: time each candidate NS method once, keep the fastest, cache the choice on disk.

A plan key is (batch, m, n, input dtype, coefficients, use_gram, restarts) on one GPU with one torch and Triton
version (and QuACK version, where installed and usable) and one plan version; the cache file (json) lives in $MUONBENCH_CACHE or
muonbench's cache folder (`optim.cache`) and records the times of every candidate, each candidate's first call (`first_call_s`: JIT
compilation, graph capture) and the whole warm-up cost (`plan_s`), so a report can show why a method was chosen
and what compiling it cost. An entry that lacks a candidate the current code offers (written before that kernel
existed) is measured again. Nothing is guessed: a candidate is
only chosen after it ran, matched the cuBLAS reference within bf16 tolerance, and was the fastest by median (or
the CUDA-graph twin of the fastest, within 5% of it: `pick`).

Candidates (all bf16 operands, fp32 accumulation):
- `plain_torch`: plain iteration on torch.bmm / baddbmm (cuBLAS), alpha/beta fused in the GEMM epilogue.
- `plain_sym_<tile>` (t128, t128s4, t128w4, t64; tma128, tma128s5, tma256, tma128w4, tma128k128, tma128o,
  tma128w4o, tma128wso through tensor descriptors; tma128g8, tma256g4 in grouped launch order; ptma128, ptma256,
  ptma128o persistent): X X^T and b A + c A^2 by the Triton symmetric kernel (one triangle); with the
  fp16 iterate a I is added in that kernel's epilogue too.
- `plain_quack_sym`, `plain_quack_all` (only with quack-kernels installed, on SM90+, both dimensions a multiple of
  8): X X^T and b A + c A^2 by QuACK's symmetric GEMM; `_all` also X <- a X + P X by its general GEMM in its
  default config, `_sym` leaves that to cuBLAS (`optim.kernels.sym_quack`).
- `plain_quack_all_<config>` (coop256x208_cl1x2, coop128x256_cl2x1, sym128pp, sym128paired; with the QuACK candidates, on SM90,
  where `quack_configs_offered`): `plain_quack_all` with the general product in one of QuACK's explicit SM90 tile
  configs (`sym_quack.GENERAL_CONFIGS`), or the symmetric products in another tile config than QuACK's fixed one
  (`sym_quack.SYMMETRIC_CONFIGS`), instead of its default; offered on the expert batches and large single matrices,
  where the general products take milliseconds, not on the launch-bound ones (one compilation per config and
  process, ~2-3 s; a few timed calls per problem).
- `gram_torch`, `gram_sym_<tile>`, `gram_quack_sym`, `gram_quack_all`: Gram-NS with restarts (only when
  use_gram=True).
- `+graph`: the same body captured once in a CUDA graph and replayed, for launch-sensitive problems
  (`launch_sensitive`: 1.48 plain TFLOP and less at 5 steps; of the Qwen3-30B-A3B and Kimi K2 Muon shapes: attention
  q and o, k / v, the MLA projections and the routers, not 7168 x 8192 and larger, not the expert batches), where
  the host cost of launching a call's ~3k + 4 kernels is a visible share of the call.

Timing (`optim.kernels.timing`, the same protocol as `bench.tools.ns_kernels`): each candidate is first run once (compiled,
captured, checked against cuBLAS), then all are timed in interleaved rounds, each call started on an idle GPU
(per-call latency: what a call costs at the start of an optimizer step, host launch gaps included); median per
candidate; after five rounds a candidate whose fastest call is more than 10% behind the best median is timed no
further (`timing.interleaved_samples`); the entry records every candidate's median and number of timed calls. The
fastest median wins,
except that a `+graph` variant within 5% of its plain twin is taken over it (`pick`): a replay does not depend on how
fast the host launches, a plain call of a launch-sensitive problem does; and QuACK's default general product within
3% of an explicit config of it is taken over that config: the plan times on an idle GPU, a large step runs at the
power cap, where the explicit configs did not beat the default (DEFAULT_PREFERENCE).

Cold start: a key with no cached entry adopts a shipped seed entry of the same key after one check against cuBLAS,
or else times only the seeds' prior for its problem class, ranked on seeds of the same GPU name or, where there are
none, of the same compute capability (`optim.kernels.plan_seed`; the entry lists it as `prior` and counts as
complete); `MUONBENCH_NS_PLAN=measure` times every candidate.

Cache versioning: PLAN_VERSION is part of every key; a change of what is timed or how (protocol, candidate
rules) bumps it, so entries measured under an older protocol are never reused (they stay in the file, unread).
Processes share the file: a save merges under a lock and replaces it in one rename, and a miss reads the file again
before measuring; a corrupt file or entry is measured again with a warning; a directory that cannot be written
keeps the plan in memory with a warning.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import torch

from optim import cost
from optim.kernels import timing
from optim.kernels.fused_step import scale_cast
from optim.kernels.ns_batched import (
    AccumulatingOps,
    Coeff,
    LastProduct,
    MatOps,
    TorchOps,
    orthogonalize_with,
    plain_iterations,
    plain_until_last,
)
from optim.kernels.tiles import TILE_NAMES

# Version of what the plan measures, offers and picks; part of every cache key. 5: five rounds before candidates
# are dropped, and a candidate is dropped on its fastest call, not its median. 4: `pick` prefers QuACK's default
# general product within DEFAULT_PREFERENCE of an explicit config of it. 3: `pick` prefers a graph variant
# within GRAPH_PREFERENCE of its plain twin (2: interleaved per-call-latency timing (optim.kernels.timing) and graph
# variants by `launch_sensitive`; 1: candidates timed one after another, graph variants up to 2e11 plain FLOPs).
PLAN_VERSION = 5
# `launch_sensitive`: a problem's GEMM time estimated at the bf16 ceiling against the host time of launching its
# 3k + 4 kernels at HOST_LAUNCH_S each (an upper estimate for a Python launch, Triton's launcher included). Graph
# variants are offered while the GEMM time is at most LAUNCH_RATIO times the launch time, where a slow host makes
# the call host-bound (for 5 steps: up to 1.48 TFLOP); above it the host runs ahead of the GPU and a graph only adds
# its input and output copies. Measurements: docs/ns_kernels_h200.md#plan-launch-bound.
CEILING_FLOPS = 780e12
HOST_LAUNCH_S = 40e-6
LAUNCH_RATIO = 2.5
# A plain call of a launch-sensitive problem costs what the host takes to launch its kernels, which varies within a
# process; a graph replay is one launch. `pick` takes the graph variant where it is within this fraction of the
# fastest plain candidate (docs/ns_kernels_h200.md#plan-graph-preference).
GRAPH_PREFERENCE = 0.05
# The plan times on an idle GPU, a large Muon step runs its NS at the GPU's power cap, and explicit QuACK configs that
# win on an idle GPU by a few percent do not win at the cap. `pick` takes `plain_quack_all` (QuACK's default general
# product) over a `plain_quack_all_<GENERAL_CONFIGS name>` unless that is faster by more than this fraction
# (docs/ns_kernels_h200.md#plan-quack-default).
DEFAULT_PREFERENCE = 0.03
# Timing budget of the plan: about this many ms of timed calls per candidate (interleaved rounds, MIN_ROUNDS to 25).
BUDGET_MS_PER_CANDIDATE = 60.0
# After MIN_ROUNDS rounds, a candidate whose fastest call is slower than the best median by more than this fraction
# is timed no further. Five rounds, not three: a median of three can land on calls slowed by a clock change
# (docs/ns_kernels_h200.md#plan-min-rounds).
MIN_ROUNDS = 5
KEEP_WITHIN = 0.10
# Product backends of QuACK (`optim.kernels.sym_quack.QuackOps`): symmetric products only, or every product.
QUACK_BACKENDS = ("quack_sym", "quack_all")
# A candidate must agree with the cuBLAS path to this relative Frobenius distance (bf16 rounding differences).
AGREE_RTOL = 5e-2


def cache_path() -> Path:
    """`ns_plan.json` in muonbench's cache folder (`optim.cache.cache_root`: $MUONBENCH_CACHE, else the user cache
    folder, honouring XDG_CACHE_HOME)."""
    from optim.cache import cache_root

    return cache_root() / "ns_plan.json"


def env_string(gpu: str, torch_version: str, triton_version: str, quack_version: str | None) -> str:
    """The environment part of a plan key: GPU name, software versions (QuACK's where the plan offers it) and
    PLAN_VERSION; a change of any of them invalidates the cached choices."""
    key = f"{gpu}|torch {torch_version}|triton {triton_version}"
    key = f"{key}|quack {quack_version}" if quack_version is not None else key
    return f"{key}|plan {PLAN_VERSION}"


@functools.cache
def env_key(device: torch.device) -> str:
    """`env_string` of this process on `device` (looked up once per device: it sits on every call's path)."""
    import triton

    from optim.kernels import sym_quack

    quack = sym_quack.quack_version() if sym_quack.usable(device) else None
    return env_string(torch.cuda.get_device_name(device), torch.__version__, triton.__version__, quack)


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


def plain_flops(batch: int, m: int, n: int, num_ns_steps: int) -> float:
    """Plain-count NS FLOPs, short side m: k (4 m^2 n + 2 m^3) per matrix."""
    return batch * cost.ns_flops(m, n, num_ns_steps)


def backend_of(method: str) -> str:
    """Which library runs a candidate's products: "cuBLAS" (`*_torch`), "Triton" (`*_sym_<tile>`), "QuACK"
    (`*_quack_all*`) or "QuACK+cuBLAS" (`*_quack_sym`: QuACK's symmetric products, cuBLAS's general one)."""
    backend = method.removesuffix("+graph").split("_", 1)[-1]
    if backend == "torch":
        return "cuBLAS"
    if backend == "quack_sym":
        return "QuACK+cuBLAS"
    if backend.startswith("quack_all"):
        return "QuACK"
    return "Triton"


def _ops(name: str) -> MatOps:
    """The product backend of a candidate name `<body>_<backend>` (graph suffix removed)."""
    backend = name.split("_", 1)[1]
    if backend == "torch":
        return TorchOps()
    if backend in QUACK_BACKENDS:
        from optim.kernels.sym_quack import QuackOps

        return QuackOps(general=backend == "quack_all")
    if backend.startswith("quack_all_"):
        from optim.kernels.sym_quack import QuackOps

        return QuackOps(general=True, config=backend.removeprefix("quack_all_"))
    from optim.kernels.sym_triton import TILE_CONFIGS, TritonOps

    return TritonOps(TILE_CONFIGS[backend.removeprefix("sym_")])


def deferrable(name: str) -> bool:
    """Whether candidate `name`'s last product can be left to `Planner.deferred`: a plain body whose general
    products run in QuACK's gemm_add (its gemm_add_inplace accumulates into fp32 at the same rate), not a graph."""
    return name == "plain_quack_all" or (name.startswith("plain_quack_all_") and not name.endswith("+graph"))


def prescalable(name: str, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether candidate `name` can normalize each matrix inside its first step (`FoldingOps.first_step`): a
    `deferrable` body, the bf16 iterate, and QuACK's per-matrix scaled symmetric kernel usable on `device`."""
    from optim.kernels.sym_quack import first_step_usable

    return deferrable(name) and dtype == torch.bfloat16 and first_step_usable(device)


def _prescaled_body(
    g: torch.Tensor, scale: torch.Tensor, *, coeffs: list[Coeff], ops: MatOps
) -> torch.Tensor:
    """The plain iteration from the unnormalized iterate g, normalized by `scale` in its first step."""
    return plain_iterations(g, coeffs, ops, scale=scale)


def skipped_tiles() -> frozenset[str]:
    """Triton tile configs and QuACK general- and symmetric-product configs named in $MUONBENCH_NS_SKIP
    (comma-separated) are never tried: the way out when a compiler cannot build one on some machine without raising
    (a crash cannot be caught by the plan's measurement). Unknown names raise, naming the known ones."""
    from optim.kernels.sym_quack import GENERAL_CONFIGS, SYMMETRIC_CONFIGS

    names = frozenset(t.strip() for t in os.environ.get("MUONBENCH_NS_SKIP", "").split(",") if t.strip())
    known = [*TILE_NAMES, *GENERAL_CONFIGS, *SYMMETRIC_CONFIGS]
    unknown = names - set(known)
    if unknown:
        raise ValueError(f"MUONBENCH_NS_SKIP={sorted(unknown)}: not tile or QuACK configs; known: {known}")
    return names


def pick(times_ms: dict[str, float]) -> str:
    """The chosen candidate of a timed plan: the fastest median, except that QuACK's default general product
    (`plain_quack_all`) within DEFAULT_PREFERENCE of an explicit general-product config takes that config's place,
    and a `+graph` variant within GRAPH_PREFERENCE of the choice takes its place (see both constants)."""
    from optim.kernels.sym_quack import GENERAL_CONFIGS

    if not times_ms:
        raise ValueError("times_ms is empty: no candidate was timed")
    best = min(times_ms, key=times_ms.__getitem__)
    default = "plain_quack_all"
    if (
        best.removeprefix(default + "_") in GENERAL_CONFIGS
        and default in times_ms
        and times_ms[default] <= times_ms[best] * (1.0 + DEFAULT_PREFERENCE)
    ):
        best = default
    graph = best + "+graph"
    if graph in times_ms and times_ms[graph] <= times_ms[best] * (1.0 + GRAPH_PREFERENCE):
        return graph
    return best


def launch_sensitive(batch: int, m: int, n: int, num_ns_steps: int) -> bool:
    """Whether CUDA-graph variants are offered: estimated GEMM time <= LAUNCH_RATIO x host launch time (see
    CEILING_FLOPS)."""
    gemm_s = plain_flops(batch, m, n, num_ns_steps) / CEILING_FLOPS
    return gemm_s <= LAUNCH_RATIO * (3 * num_ns_steps + 4) * HOST_LAUNCH_S


def quack_configs_offered(batch: int, m: int, n: int, num_ns_steps: int) -> bool:
    """Whether QuACK's explicit general-product configs are worth their compilation and timing here: the problems
    that are not `launch_sensitive` (expert batches, single matrices from 7168 x 8192 up), where the GPU time of
    the general products, not the host, decides the call."""
    return not launch_sensitive(batch, m, n, num_ns_steps)


def candidate_names(
    batch: int,
    m: int,
    n: int,
    num_ns_steps: int,
    use_gram: bool,
    triton_ok: bool,
    quack_ok: bool = False,
    quack_configs: bool = False,
) -> list[str]:
    """Methods worth timing for this problem (graph variants where `launch_sensitive`; none of
    $MUONBENCH_NS_SKIP; QuACK's with `quack_ok` and 16-byte operand rows; with `quack_configs` (an SM90 device)
    also `plain_quack_all_<config>`, general-product and symmetric-product configs, where `quack_configs_offered`)."""
    from optim.kernels.sym_quack import GENERAL_CONFIGS, SYMMETRIC_CONFIGS, aligned

    skip = skipped_tiles()
    backends = [f"sym_{t}" for t in TILE_NAMES if t not in skip] if triton_ok else []
    quack = quack_ok and aligned(m, n)
    if quack:
        backends += QUACK_BACKENDS
    bodies = [f"plain_{b}" for b in ("torch", *backends)]
    if quack and quack_configs and quack_configs_offered(batch, m, n, num_ns_steps):
        bodies += [f"plain_quack_all_{c}" for c in (*GENERAL_CONFIGS, *SYMMETRIC_CONFIGS) if c not in skip]
    if use_gram:
        bodies += [f"gram_{b}" for b in ("torch", *backends)]
    if launch_sensitive(batch, m, n, num_ns_steps):
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


_MISSING = object()


@dataclass(kw_only=True, slots=True)
class Planner:
    """Owns the in-memory plan, the on-disk cache and the captured graphs."""

    path: Path = field(default_factory=cache_path)
    choices: dict[str, dict[str, object]] = field(default_factory=dict)
    graphs: dict[str, GraphRunner] = field(default_factory=dict)
    loaded: bool = False
    complete: set[str] = field(default_factory=set)
    """Keys whose cached entry was found to cover every current candidate (checked once per process, not per call)."""
    bodies: dict[tuple[object, ...], Callable[[torch.Tensor], torch.Tensor]] = field(default_factory=dict)
    """(candidate, coefficients, eps, restarts, iterate dtype) -> its body, built once."""
    fast: dict[tuple[object, ...], Callable[..., object] | None] = field(default_factory=dict)
    """The memo of `dispatch`, `deferred` and `prescaled` (`_variant`): (kind, shape, dtype, device, coefficients,
    eps, use_gram, restarts, iterate dtype) -> the call built for the chosen candidate, so a planned call costs one
    dict lookup on the host, as little as the plan's timing saw."""
    memory_only: bool = False
    """The cache file could not be written: plans stay in this process's memory."""
    warned: set[str] = field(default_factory=set)

    def _load(self) -> None:
        self.loaded = True
        self.choices.update(self._read_disk())

    def _read_disk(self) -> dict[str, dict[str, object]]:
        """The entries of the cache file that are well formed. An unreadable file or a malformed entry (a write
        cut short by an older version, an edit by hand) is said once; its problems are measured again and the
        next save rewrites the file."""
        try:
            text = self.path.read_text()
        except (FileNotFoundError, NotADirectoryError):  # nothing cached yet
            return {}
        except OSError as e:
            self._warn_once(f"NS plan cache {self.path} cannot be read ({e}): plans are measured again")
            return {}
        try:
            data = json.loads(text)
        except ValueError as e:
            self._warn_once(f"NS plan cache {self.path} is corrupt ({e}): plans are measured again")
            return {}
        if not isinstance(data, dict):
            self._warn_once(f"NS plan cache {self.path} is not a JSON object: plans are measured again")
            return {}
        good = {k: v for k, v in data.items() if isinstance(v, dict) and isinstance(v.get("method"), str)}
        if len(good) < len(data):
            self._warn_once(
                f"NS plan cache {self.path}: {len(data) - len(good)} malformed entries ignored; "
                "their plans are measured again"
            )
        return good

    def _warn_once(self, message: str) -> None:
        if message not in self.warned:
            self.warned.add(message)
            warnings.warn(message, RuntimeWarning, stacklevel=4)

    def _save(self) -> None:
        """Merges this process's entries into the file under an exclusive lock (two processes planning at once,
        e.g. one per GPU, keep each other's new shapes; this process's entries win) and replaces the file in one
        rename, so a reader never sees half a file. A directory that cannot be written keeps the plan in memory
        for this process, said once: a read-only home must not break the optimizer step."""
        if self.memory_only:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                kept = self._read_disk()
                kept.update({k: v for k, v in self.choices.items() if not v.get("fallback")})  # fallbacks: here only
                tmp = self.path.with_name(f"{self.path.name}.tmp{os.getpid()}")
                with open(tmp, "w") as f:
                    f.write(json.dumps(kept, indent=1, sort_keys=True))
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
        except OSError as e:
            self.memory_only = True
            self._warn_once(f"NS plan cache {self.path} cannot be written ({e}): plans are kept in memory only")

    def body(
        self,
        name: str,
        coeffs: Sequence[Coeff],
        eps: float,
        restarts: frozenset[int],
        dtype: torch.dtype = torch.bfloat16,
        normalized: bool = False,
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """The orthogonalize body of candidate `name` (graph suffix ignored), built once per problem constants;
        `normalized`: the body of an input that is already the normalized iterate (`orthogonalize_with`)."""
        base = name.removesuffix("+graph")
        bkey = (base, tuple(coeffs), eps, restarts, dtype, normalized)
        cached = self.bodies.get(bkey)
        if cached is not None:
            return cached
        ops, gram = _ops(base), base.startswith("gram")

        def run(x: torch.Tensor) -> torch.Tensor:
            return orthogonalize_with(
                x, coeffs, eps=eps, gram=gram, restarts=restarts, ops=ops, dtype=dtype, normalized=normalized
            )

        self.bodies[bkey] = run
        return run

    def runner(
        self,
        name: str,
        key: str,
        coeffs: Sequence[Coeff],
        eps: float,
        restarts: frozenset[int],
        dtype: torch.dtype = torch.bfloat16,
        normalized: bool = False,
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """The call that runs candidate `name` on problem `key`: what the plan times and what `dispatch` returns.
        A `+graph` candidate captures its graph on the first call outside a capture and replays it after; inside
        another capture it runs the body (the caller's graph records it). `normalized`: see `body`."""
        body = self.body(name, coeffs, eps, restarts, dtype, normalized)
        if not name.endswith("+graph"):
            return body
        gkey = f"{key}|{name}|normalized" if normalized else f"{key}|{name}"

        def replay(x: torch.Tensor) -> torch.Tensor:
            if torch.cuda.is_current_stream_capturing():
                return body(x)
            graph = self.graphs.get(gkey)
            if graph is None:
                graph = self.graphs[gkey] = GraphRunner(body, x)
            return graph(x)

        return replay

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
        """Candidate `name` on x (problem `key`)."""
        return self.runner(name, key, coeffs, eps, restarts, dtype)(x)

    def dispatch(
        self,
        x: torch.Tensor,
        coeffs: Sequence[Coeff],
        eps: float,
        use_gram: bool,
        restarts: frozenset[int],
        dtype: torch.dtype = torch.bfloat16,
        normalized: bool = False,
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """The planned call for x's problem ((B, r, c) CUDA tensor): `choose` once, then a memo lookup.
        `normalized`: the returned call takes the normalized iterate of x instead of x (`body`); the method is the
        one planned for x."""

        def make(method: str, key: str) -> Callable[[torch.Tensor], torch.Tensor]:
            return self.runner(method, key, coeffs, eps, restarts, dtype, normalized)

        fn = self._variant(("dispatch", normalized), make, x, coeffs, eps, use_gram, restarts, dtype)
        return cast(Callable[[torch.Tensor], torch.Tensor], fn)

    def deferred(
        self,
        x: torch.Tensor,
        coeffs: Sequence[Coeff],
        eps: float,
        use_gram: bool,
        restarts: frozenset[int],
        dtype: torch.dtype = torch.bfloat16,
    ) -> Callable[[torch.Tensor, torch.Tensor], LastProduct] | None:
        """For x's planned problem ((B, m, n) CUDA, m <= n): the call (g, scale) -> `LastProduct` that runs the
        planned body on the unnormalized iterate g with each matrix's 1 / norm `scale` (B,) up to its last product
        (`plain_until_last`; the normalization inside the first step where `prescalable`, else a scale pass
        first), or None where the plan chose a method whose last product is not one GEMM that can accumulate into
        fp32 tensors (`deferrable`: QuACK's general product; not a graph replay, Gram-NS, or a cuBLAS product,
        whose fp32 accumulation would cost a pass of its own) or the iterate is not bf16."""

        def make(method: str, key: str) -> Callable[[torch.Tensor, torch.Tensor], LastProduct] | None:
            if (
                not deferrable(method) or dtype != torch.bfloat16
            ):  # measured and GPU-tested on the bf16 iterate
                return None
            ops = cast(AccumulatingOps, _ops(method))
            inside = prescalable(method, dtype, x.device)

            def fn(g: torch.Tensor, scale: torch.Tensor) -> LastProduct:
                if inside and g.dtype == dtype:
                    return plain_until_last(g, coeffs, ops, scale)
                return plain_until_last(scale_cast(g, scale, dtype), coeffs, ops)

            return fn

        fn = self._variant("deferred", make, x, coeffs, eps, use_gram, restarts, dtype)
        return cast(Callable[[torch.Tensor, torch.Tensor], LastProduct] | None, fn)

    def prescaled(
        self,
        x: torch.Tensor,
        coeffs: Sequence[Coeff],
        eps: float,
        use_gram: bool,
        restarts: frozenset[int],
        dtype: torch.dtype = torch.bfloat16,
    ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
        """For x's planned problem ((B, m, n) CUDA, m <= n): the call (g, scale) -> NS output that runs the planned
        body on the unnormalized iterate g, each matrix normalized by `scale` (B,) inside the first step, or None
        where the planned method cannot (`prescalable`)."""

        def make(method: str, key: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
            if not prescalable(method, dtype, x.device):
                return None
            return functools.partial(_prescaled_body, coeffs=list(coeffs), ops=_ops(method))

        fn = self._variant("prescaled", make, x, coeffs, eps, use_gram, restarts, dtype)
        return cast(Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None, fn)

    def _variant(
        self,
        kind: object,
        make: Callable[[str, str], Callable[..., object] | None],
        x: torch.Tensor,
        coeffs: Sequence[Coeff],
        eps: float,
        use_gram: bool,
        restarts: frozenset[int],
        dtype: torch.dtype,
    ) -> Callable[..., object] | None:
        """`make(planned method, plan key)` for x's problem, memoized in `fast` per (kind, problem) once its plan
        entry is complete (not the stand-in `choose` returns inside a capture before a full plan)."""
        fkey = (kind, x.shape, x.dtype, x.device, tuple(coeffs), eps, use_gram, restarts, dtype)
        fn = self.fast.get(fkey, _MISSING)
        if fn is not _MISSING:
            return fn  # type: ignore[return-value]
        method, key = self.choose(x, coeffs, eps, use_gram, restarts, dtype)
        made = make(method, key)
        if key in self.complete:
            self.fast[fkey] = made
        return made

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
        # a prior entry stays complete only as long as `untried` says so (not under MUONBENCH_NS_PLAN=measure)
        if hit is not None and (
            (key in self.complete and not hit.get("prior")) or not self.untried(hit, x, len(coeffs), use_gram)
        ):
            self.complete.add(key)
            return str(hit["method"]), key
        if torch.cuda.is_current_stream_capturing():
            return "plain_torch", key  # cannot time inside a capture; the cuBLAS body is always valid
        fresh = self._read_disk().get(key)  # another process may have measured it since this one loaded
        if fresh is not None and not fresh.get("fallback") and not self.untried(fresh, x, len(coeffs), use_gram):
            self.choices[key] = fresh
            self.complete.add(key)
            return str(fresh["method"]), key
        entry = self.adopt(x, coeffs, eps, restarts, key, dtype) if hit is None else None
        if entry is None:  # a cold key times the seeds' prior; a cached entry missing a new candidate, everything
            entry = self.measure(x, coeffs, eps, use_gram, restarts, key, dtype, narrow=hit is None)
        self.choices[key] = entry  # a fallback is kept in memory (no re-measuring every step), never on disk
        self.complete.add(key)
        self._save()
        # Timing every candidate on a batched expert stack leaves GBs of temporaries (and the losers' graph pools)
        # cached in the allocator: hand them back (a planning process still runs slower: docs/megatron_h200.md#findings).
        torch.cuda.empty_cache()
        return str(entry["method"]), key

    def adopt(
        self,
        x: torch.Tensor,
        coeffs: Sequence[Coeff],
        eps: float,
        restarts: frozenset[int],
        key: str,
        dtype: torch.dtype = torch.bfloat16,
        seed_dir: Path | None = None,
    ) -> dict[str, object] | None:
        """The shipped entry for `key` (`optim.kernels.plan_seed`) once its method ran on x and agreed with cuBLAS;
        None (measure instead) when there is none, or when it fails or disagrees here."""
        from optim.kernels import plan_seed

        seeded = plan_seed.lookup(key, seed_dir)
        if seeded is None:
            return None
        t_start = time.perf_counter()
        method = str(seeded["method"])
        try:
            ref = self.run("plain_torch", key, x, coeffs, eps, restarts, dtype).float()
            out = self.runner(method, key, coeffs, eps, restarts, dtype)(x).float()
            err = float((out - ref).norm() / ref.norm().clamp_min(1e-30))
        except Exception as e:  # noqa: BLE001 - a seed that cannot run here is measured instead
            warnings.warn(f"NS plan seed {method} failed here ({type(e).__name__}); measuring", RuntimeWarning,
                          stacklevel=3)
            return None
        if not err < AGREE_RTOL:
            return None
        return {**seeded, "plan_s": time.perf_counter() - t_start}

    @staticmethod
    def untried(entry: dict[str, object], x: torch.Tensor, num_ns_steps: int, use_gram: bool) -> list[str]:
        """Candidates this code offers for x's problem that a cached entry neither timed nor rejected (a cache
        written before a kernel was added): such an entry is measured again, so a new kernel is never ignored.
        A fallback entry (nothing could be measured) is kept for the process as it is."""
        from optim.kernels import plan_seed, sym_quack, triton_importable

        if entry.get("fallback") or (entry.get("prior") and plan_seed.mode() == "seed"):
            return []
        seen = set(entry.get("times_ms") or {}) | set(entry.get("rejected") or {})  # type: ignore[call-overload]
        nb, r, c = x.shape
        names = candidate_names(
            nb,
            r,
            c,
            num_ns_steps,
            use_gram,
            triton_importable(),
            sym_quack.usable(x.device),
            sym_quack.configs_usable(x.device),
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
        narrow: bool = False,
    ) -> dict[str, object]:
        """Runs every candidate once on x (compilation, graph capture: `first_call_s`) and drops failing or
        disagreeing ones, then times the rest in interleaved rounds (`optim.kernels.timing`, median per candidate).
        With `narrow`, only the shipped seeds' prior for this problem (`plan_seed.prior`), where there is one; the
        entry then lists them as `prior`."""
        from optim.kernels import plan_seed, sym_quack, triton_importable

        t_start = time.perf_counter()
        nb, r, c = x.shape
        offered = candidate_names(
            nb,
            r,
            c,
            len(coeffs),
            use_gram,
            triton_importable(),
            sym_quack.usable(x.device),
            sym_quack.configs_usable(x.device),
        )
        capability = "{}.{}".format(*torch.cuda.get_device_capability(x.device)) if x.is_cuda else None
        names = (plan_seed.prior(key, offered, capability=capability) if narrow else None) or offered
        narrowed = {"prior": names} if len(names) < len(offered) else {}
        ref = self.run("plain_torch", key, x, coeffs, eps, restarts, dtype).float()
        fns: dict[str, Callable[[], object]] = {}
        first: dict[str, float] = {}
        rejected: dict[str, str] = {}
        for name in names:
            try:
                call = self.runner(name, key, coeffs, eps, restarts, dtype)
                t_first = time.perf_counter()
                out = call(x)  # warm-up: compile, capture
                if x.is_cuda:
                    torch.cuda.synchronize(x.device)
                first[name] = time.perf_counter() - t_first
                err = float((out.float() - ref).norm() / ref.norm().clamp_min(1e-30))
                del out
                if not err < AGREE_RTOL:
                    rejected[name] = f"disagrees with plain_torch: rel err {err:.3g}"
                    continue
                fns[name] = functools.partial(call, x)
            except Exception as e:  # noqa: BLE001 - a candidate that cannot run is simply not chosen
                rejected[name] = f"{type(e).__name__}: {str(e)[:160]}"
        samples, failed = timing.interleaved_samples(
            fns,
            timer=timing.timer_for(x.device),
            budget_ms=BUDGET_MS_PER_CANDIDATE * len(fns),
            min_rounds=MIN_ROUNDS,
            max_rounds=25,
            keep_within=KEEP_WITHIN,
        )
        times = {n: statistics.median(s) for n, s in samples.items()}
        rounds = {n: len(s) for n, s in samples.items()}
        rejected.update(failed)
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
                "rounds": {},
                "rejected": rejected,
                "first_call_s": first,
                "fallback": True,
                "plan_s": time.perf_counter() - t_start,
                **narrowed,
            }
        best = pick(times)
        for name in list(self.graphs):  # keep only the chosen graph alive (memory)
            if name.startswith(key + "|") and not name.endswith("|" + best):
                del self.graphs[name]
        return {
            "method": best,
            "times_ms": times,
            "rounds": rounds,
            "rejected": rejected,
            "first_call_s": first,
            "plan_s": time.perf_counter() - t_start,
            **narrowed,
        }
