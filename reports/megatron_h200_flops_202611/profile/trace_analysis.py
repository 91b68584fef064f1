"""Session-3 analysis of the chrome traces written by `megatron_bench --profile` with MUONBENCH_PROFILE_TRACE=1
(device calls E and F; the traces, 12-19 MB gzipped each, are not committed: re-run
reports/device_calls/next_h200_profile.sh or h200_s3_call2.sh to regenerate them).

    python reports/megatron_h200_flops_202611/profile/trace_analysis.py trace_prof_adamw.json.gz trace_prof_muon_ours.json.gz

Prints, per trace and phase window (the GPU-side `muonbench/<phase>` annotation): GPU idle gaps > 20 us grouped by
the host op that launched the kernel ending the gap, and host-side durations (p50, mean) of common ops.
"""

from __future__ import annotations

import bisect
import collections
import gzip
import json
import sys


def load(path: str) -> list[dict]:
    with gzip.open(path) if path.endswith(".gz") else open(path) as f:
        return json.load(f)["traceEvents"]


def window(ev: list[dict], phase: str, cat: str) -> tuple[float, float]:
    spans = [e for e in ev if e.get("cat") == cat and e.get("name") == f"muonbench/{phase}"]
    return min(e["ts"] for e in spans), max(e["ts"] + e["dur"] for e in spans)


def gaps_by_launcher(ev: list[dict], phase: str) -> tuple[float, list[tuple[str, int, float]]]:
    w0, w1 = window(ev, phase, "gpu_user_annotation")
    ks = sorted(
        (e for e in ev if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy") and w0 <= e["ts"] < w1),
        key=lambda e: e["ts"],
    )
    runtime = {e["args"].get("correlation"): e for e in ev if e.get("cat") == "cuda_runtime"}
    ops = collections.defaultdict(list)
    for e in ev:
        if e.get("cat") == "cpu_op":
            ops[e["tid"]].append(e)
    for lst in ops.values():
        lst.sort(key=lambda e: e["ts"])
    starts = {t: [e["ts"] for e in lst] for t, lst in ops.items()}
    agg: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    end = ks[0]["ts"] + ks[0]["dur"]
    for k in ks[1:]:
        gap = k["ts"] - end
        if gap > 20:
            r = runtime.get(k["args"].get("correlation"))
            name = "?"
            if r is not None and r["tid"] in ops:
                i = bisect.bisect_right(starts[r["tid"]], r["ts"]) - 1
                if i >= 0 and ops[r["tid"]][i]["ts"] + ops[r["tid"]][i]["dur"] >= r["ts"]:
                    name = ops[r["tid"]][i]["name"]
            agg[name][0] += 1
            agg[name][1] += gap
        end = max(end, k["ts"] + k["dur"])
    total = sum(v[1] for v in agg.values())
    return total, sorted(((n, int(c), g) for n, (c, g) in agg.items()), key=lambda x: -x[2])


def host_ops(ev: list[dict], phase: str, names: tuple[str, ...]) -> dict[str, tuple[float, float, int]]:
    w0, w1 = window(ev, phase, "user_annotation")
    d = collections.defaultdict(list)
    for e in ev:
        if e.get("cat") in ("cpu_op", "cuda_runtime") and w0 <= e["ts"] < w1 and e["name"] in names:
            d[e["name"]].append(e["dur"])
    return {n: (sorted(v)[len(v) // 2], sum(v) / len(v), len(v)) for n, v in d.items()}


def main() -> None:
    names = (
        "cudaLaunchKernel",
        "aten::view",
        "aten::t",
        "aten::empty",
        "aten::cat",
        "aten::mm",
        "aten::_grouped_mm",
    )
    for path in sys.argv[1:]:
        ev = load(path)
        for phase in ("fwd_bwd", "optim"):
            total, rows = gaps_by_launcher(ev, phase)
            print(f"{path} {phase}: GPU idle in gaps > 20 us: {total / 1e3:.1f} ms")
            for n, c, g in rows[:8]:
                print(f"    {g / 1e3:8.2f} ms  {c:5d} gaps  before a kernel launched by {n}")
        print("  host op durations in fwd_bwd (p50 us, mean us, count):")
        for n, (p50, mean, cnt) in host_ops(ev, "fwd_bwd", names).items():
            print(f"    {n:22s} {p50:7.1f} {mean:7.1f} {cnt:7d}")


if __name__ == "__main__":
    main()
