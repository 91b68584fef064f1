"""SOAP-REKLS's eigenbasis refresh on the quality model's factors: how the eigh of every Kronecker factor can run.

    python -m experiments.soap_eigh.soap_eigh [profile=gpu] [device=cuda] [streams=2,4,8] [repeats=1] [out=FILE]

The census comes from the real optimizer: `bench.tools.quality`'s model of the profile and its SOAP-REKLS
(`optim.optimizers.soap.SOAP`) give the side lengths of every preconditioned factor, counted per expert (gpu profile:
824 of 512 and 256 of 256; SOAP-REKLS steps took about 1.6 s on one H200 with the single batched eigh per factor).
For each side length, on random symmetric positive semi-definite factors of that count, one refresh is timed as

- `batched`: one `torch.linalg.eigh` over the stack (what `optim.functional.soap_math.eigh_descending` did per
  parameter before it used streams);
- `streams=S`: the stack split in S chunks, each eigh on its own CUDA stream from its own host thread (cuSOLVER's
  per-matrix calls are latency-bound at these sizes; the GIL is released inside them);
- `host`: copied to the host, eigh there with torch's threads, copied back; `host_threads=T`: chunks from T threads;
- `magma`: the batched call with MAGMA as the backend (CUDA only);
- `product`: `optim.functional.soap_math.eigh_descending` itself (on CUDA: 8 streams), compared through
  diag(Q^T F Q) of its eigenvectors.

Each variant runs once untimed, then `repeats` timed calls (median). Prints each table row as soon as it is measured
(ms per refresh, speedup over `batched`, the largest eigenvalue difference against `batched`) and writes the table as
JSON to `out` when given. One eigh runs on the calling thread before any threaded variant: torch's lazy load of its
CUDA linear-algebra library is not thread-safe.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from bench.tools.quality import run
from bench.tools.quality.config import parse_cli
from bench.tools.quality.tuning import point

ALLOWED = ("profile", "device", "streams", "repeats", "out")


def parse_args(argv: list[str]) -> dict[str, str]:
    """key=value arguments; an unknown key raises ValueError naming the allowed set."""
    args = {"profile": "gpu", "device": "cuda" if torch.cuda.is_available() else "cpu", "streams": "2,4,8"}
    args["repeats"] = "1"
    for a in argv:
        k, sep, v = a.partition("=")
        if not sep or k not in ALLOWED:
            raise ValueError(f"argument {a!r}: expected key=value with key in {list(ALLOWED)}")
        args[k] = v
    return args


def factor_census(profile: str) -> Counter[int]:
    """Side length -> number of preconditioned factors of SOAP-REKLS on the quality model of `profile`."""
    from optim.optimizers.soap import SOAP

    cfg = parse_cli([f"profile={profile}", "device=cpu"])
    with torch.device("meta"):
        model = run.build_model(cfg, cfg.vocab_size)
    opt = run.build_opt("soap_rekls", model, point("soap_rekls", cfg, lr=1e-3), cfg)
    inner = opt.optimizers.values() if isinstance(opt.optimizers, dict) else opt.optimizers
    sizes: Counter[int] = Counter()
    for o in inner:
        if not isinstance(o, SOAP):
            continue
        for group in o.param_groups:
            for p in group["params"]:
                lead = p.numel() // (p.shape[-1] * p.shape[-2])
                for k in p.shape[-2:]:
                    if k <= o.config.max_precond_dim:
                        sizes[int(k)] += lead
    return sizes


def random_factors(count: int, k: int, device: str, seed: int = 0) -> torch.Tensor:
    """(count, k, k) fp32 G G^T / k factors of random (k, k) G: symmetric PSD, like Shampoo statistics."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    g = torch.randn(count, k, k, generator=gen)
    return (g @ g.mT / k).to(device)


def eigh_batched(f: torch.Tensor) -> torch.Tensor:
    return torch.linalg.eigh(f).eigenvalues


def eigh_streams(f: torch.Tensor, streams: int) -> torch.Tensor:
    """Chunks of the stack on `streams` CUDA streams from as many threads (plain threads on a CPU tensor)."""
    chunks = list(f.chunk(streams))
    out: list[torch.Tensor | None] = [None] * len(chunks)
    main = torch.cuda.current_stream() if f.is_cuda else None

    def work(i: int) -> None:
        if f.is_cuda:
            s = torch.cuda.Stream(device=f.device)
            s.wait_stream(main)
            with torch.cuda.stream(s):
                out[i] = torch.linalg.eigh(chunks[i]).eigenvalues
            main.wait_stream(s)
        else:
            out[i] = torch.linalg.eigh(chunks[i]).eigenvalues

    with ThreadPoolExecutor(len(chunks)) as pool:
        list(pool.map(work, range(len(chunks))))
    return torch.cat([o for o in out if o is not None])


def eigh_host(f: torch.Tensor) -> torch.Tensor:
    return torch.linalg.eigh(f.cpu()).eigenvalues.to(f.device)


def eigh_host_threads(f: torch.Tensor, threads: int) -> torch.Tensor:
    """The host stack in `threads` chunks, one eigh per chunk from its own thread (torch releases the GIL)."""
    chunks = list(f.cpu().chunk(threads))
    with ThreadPoolExecutor(len(chunks)) as pool:
        vals = list(pool.map(lambda c: torch.linalg.eigh(c).eigenvalues, chunks))
    return torch.cat(vals).to(f.device)


def eigh_magma(f: torch.Tensor) -> torch.Tensor:
    """The batched call with MAGMA as torch's CUDA linear-algebra backend (cuSOLVER is the default)."""
    previous = torch.backends.cuda.preferred_linalg_library()
    torch.backends.cuda.preferred_linalg_library("magma")
    try:
        return torch.linalg.eigh(f).eigenvalues
    finally:
        torch.backends.cuda.preferred_linalg_library(previous)


def eigh_product(f: torch.Tensor) -> torch.Tensor:
    """The optimizer's refresh (`eigh_descending`), as ascending diag(Q^T F Q) to compare with the eigenvalues."""
    from optim.functional.soap_math import approx_eigvals, eigh_descending

    return approx_eigvals(f, eigh_descending(f)).flip(-1)


def timed(fn: Any, f: torch.Tensor, repeats: int) -> tuple[float, torch.Tensor]:
    """Median seconds of `repeats` calls after one untimed call; the last result."""
    res = fn(f)
    times = []
    for _ in range(repeats):
        if f.is_cuda:
            torch.cuda.synchronize(f.device)
        t0 = time.perf_counter()
        res = fn(f)
        if f.is_cuda:
            torch.cuda.synchronize(f.device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), res


def measure(
    census: Counter[int], device: str, streams: list[int], repeats: int, *, show: bool = False
) -> list[dict[str, Any]]:
    """One row per (side length, variant): seconds per refresh, speedup over batched, eigenvalue difference.
    `show` prints the table header, then each row as soon as it is measured."""
    # torch's lazy linalg load on this thread, before any threaded variant (it races between threads)
    torch.linalg.eigh(torch.eye(2, device=device))
    if show:
        print(HEADER, flush=True)
    rows: list[dict[str, Any]] = []
    for k, count in sorted(census.items()):
        f = random_factors(count, k, device)
        variants: list[tuple[str, Any]] = [("batched", eigh_batched)]
        variants += [(f"streams={s}", lambda x, s=s: eigh_streams(x, s)) for s in streams if s > 1]
        variants.append(("host", eigh_host))
        threads = max(2, torch.get_num_threads())
        variants.append((f"host_threads={threads}", lambda x, t=threads: eigh_host_threads(x, t)))
        if f.is_cuda:
            variants.append(("magma", eigh_magma))
        variants.append(("product", eigh_product))
        base_s, base = timed(eigh_batched, f, repeats)
        for name, fn in variants:
            sec, vals = (base_s, base) if name == "batched" else timed(fn, f, repeats)
            err = float((vals - base).abs().max() / base.abs().max().clamp_min(1e-30))
            row = {"k": k, "count": count, "variant": name, "s": sec, "speedup": base_s / sec, "rel_err": err}
            rows.append(row)
            if show:
                print(table_row(row), flush=True)
    return rows


HEADER = (
    "| side | factors | variant | ms per refresh | x batched | max eigenvalue diff (rel) |\n"
    "|---|---|---|---|---|---|"
)


def table_row(r: dict[str, Any]) -> str:
    ms, x, err = f"{r['s'] * 1e3:.1f}", f"{r['speedup']:.2f}", f"{r['rel_err']:.1e}"
    return f"| {r['k']} | {r['count']} | {r['variant']} | {ms} | {x} | {err} |"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    census = factor_census(args["profile"])
    env = {
        "device": torch.cuda.get_device_name() if args["device"].startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "host_threads": torch.get_num_threads(),
        "census": dict(sorted(census.items())),
    }
    print(env, flush=True)
    streams = [int(s) for s in args["streams"].split(",") if s]
    rows = measure(census, args["device"], streams, int(args["repeats"]), show=True)
    if "out" in args:
        Path(args["out"]).write_text(json.dumps({"env": env, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
