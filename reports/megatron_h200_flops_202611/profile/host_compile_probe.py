"""CPU-only probe: does compiling Triton kernels in-process slow the host side of later torch ops?

    TRITON_CACHE_DIR=$(mktemp -d) PYTHONPATH=. python reports/megatron_h200_flops_202611/profile/host_compile_probe.py compile
    TRITON_CACHE_DIR=$(mktemp -d) PYTHONPATH=. python reports/megatron_h200_flops_202611/profile/host_compile_probe.py none

Times a loop of small CPU torch ops (view, empty, cat, index_select, t: host dispatch and allocation, like the MoE
token dispatch's host work) before and after compiling our symmetric NS kernel for sm_90 in 24 variants (Triton's
LLVM and ptxas run on the CPU; no GPU needed), then after glibc malloc_trim(0). `none` skips the compile (control).
Prints after/before and trimmed/before ratios of the median loop time. Results of 15 + 14 runs on the 2-core
development machine: host_compile_probe.txt.
"""

import ctypes, gc, os, statistics, sys, time
import torch

torch.set_num_threads(1)


def host_ops(n=20000):
    x = torch.randn(64, 32)
    idx = torch.arange(16)
    t0 = time.perf_counter()
    for _ in range(n):
        y = x.view(32, 64)
        z = torch.empty(128)
        w = torch.cat([x[:4], x[4:8]])
        v = x.index_select(0, idx)
        u = y.t()
    return (time.perf_counter() - t0) / n * 1e6


def measure(tag):
    xs = [host_ops() for _ in range(7)]
    print(f"{tag:28s} us/iter median {statistics.median(xs):.2f} min {min(xs):.2f}", flush=True)
    return statistics.median(xs)


base = measure("baseline")
mode = sys.argv[1]
if mode == "compile":
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from optim.kernels.sym_triton import _sym_mm_kernel

    sig = {
        n: t
        for n, t in zip(
            [
                "a_ptr",
                "b_ptr",
                "d_ptr",
                "c_ptr",
                "M",
                "K",
                "s_ab",
                "s_am",
                "s_ak",
                "s_bb",
                "s_bm",
                "s_bk",
                "s_db",
                "s_dm",
                "s_dn",
                "s_cb",
                "s_cm",
                "s_cn",
                "alpha",
                "beta",
            ],
            ["*bf16"] * 4 + ["i32"] * 2 + ["i64"] * 12 + ["fp32"] * 2,
        )
    }
    t = time.perf_counter()
    k = 0
    for block, bk in ((128, 64), (128, 32), (64, 64), (64, 32), (128, 128), (32, 64)):
        for has_d in (True, False):
            for even in (True, False):
                src = ASTSource(
                    fn=_sym_mm_kernel,
                    signature={
                        **sig,
                        "HAS_D": "constexpr",
                        "EVEN_K": "constexpr",
                        "BLOCK": "constexpr",
                        "BLOCK_K": "constexpr",
                    },
                    constexprs={"HAS_D": has_d, "EVEN_K": even, "BLOCK": block, "BLOCK_K": bk},
                )
                triton.compile(
                    src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_stages": 3}
                )
                k += 1
    print(f"compiled {k} kernels in {time.perf_counter() - t:.1f} s", flush=True)
after = measure("after " + mode)
gc.collect()
r = ctypes.CDLL("libc.so.6").malloc_trim(0)
trimmed = measure(f"after malloc_trim ({r})")
print(f"ratio after/base {after / base:.3f}  trimmed/base {trimmed / base:.3f}")
