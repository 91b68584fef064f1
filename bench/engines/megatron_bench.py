"""Several megatron-engine runs in ONE process on one GPU, each a full run record (run.json + steps.jsonl).

    python -m bench.engines.megatron_bench --out runs/h200 --budget-s 420 \
        --case qwen_adamw experiment=h200/qwen3_30b_a3b_slice_adamw_1gpu \
        --case qwen_muon experiment=h200/qwen3_30b_a3b_slice_muon_1gpu

Each `--case NAME OVERRIDES...` is composed with `config.load`, run through `MegatronEngine` (setup, steps,
teardown), and recorded with `bench.record` exactly as `bench.worker` records a run (same schema, same summary).
With several cases each runs in its own child process (memory of one case cannot leak into the next: measured, an
in-process second case ran out of memory at 130 GiB); a failing case (OOM, error) gets its record with the status
and the next case runs. Cases that would start after `--budget-s` seconds
are recorded as skipped (status error, message "skipped: time budget").
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from bench import launch


def parse_cases(argv: list[str]) -> tuple[argparse.Namespace, list[tuple[str, list[str]]]]:
    """Split `--case NAME OVERRIDES...` groups; ValueError on a case without a name or a repeated name."""
    ap = argparse.ArgumentParser(prog="python -m bench.engines.megatron_bench")
    ap.add_argument("--out", required=True, help="root directory of the run directories")
    ap.add_argument(
        "--budget-s", type=float, default=float("inf"), help="start no case after this many seconds"
    )
    ap.add_argument(
        "--case-timeout-s",
        type=float,
        default=None,
        help="kill a case's child process after this many seconds",
    )
    ap.add_argument("--common", nargs="*", default=[], help="overrides appended to every case")
    ap.add_argument(
        "--in-process", action="store_true", help="run the cases in this process (default: one child each)"
    )
    ap.add_argument(
        "--prewarm",
        action="store_true",
        help="before the timed cases, run each distinct workload of our matrix optimizer once for one step in a "
        "throwaway child process, so Triton's kernel cache and the NS plan cache are on disk when the timed "
        "process starts (see prewarm_cases)",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="profile the last warm-up step under torch.profiler and write profile_step<k>.json (per-phase "
        "kernel time vs wall time, top kernels): the same as the override bench.probes=[step_profile]",
    )
    head, cases, cur = [], [], None
    for tok in argv:
        if tok == "--case":
            cur = []
            cases.append(cur)
        elif cur is None:
            head.append(tok)
        else:
            cur.append(tok)
    args = ap.parse_args(head)
    out = []
    for c in cases:
        if not c or "=" in c[0]:
            raise ValueError(f"--case {' '.join(c)}: give a name first, then Hydra overrides")
        opts = [t for t in c if t.startswith("--")]
        if opts:  # e.g. `--common ...` after a case would silently become that case's overrides
            raise ValueError(
                f"--case {c[0]}: {opts} after a case; put options before the first --case (cases take only "
                "Hydra overrides)"
            )
        profile = ["bench.probes=[step_profile]"] if args.profile else []
        out.append((c[0], c[1:] + list(args.common) + profile))
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise ValueError(f"case names must be unique, got {names}")
    return args, out


def _override(key: str, value: object) -> str:
    return f"bench.{key}={str(value).lower() if isinstance(value, bool) else value}"


PREWARM_OVERRIDES = tuple(_override(k, v) for k, v in launch.PREWARM_BENCH.items())


def prewarm_cases(cases: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    """One untimed one-step case per distinct workload (config hash) run with our matrix optimizer.

    Why: on the H200 (reports/megatron_h200_flops_202611) a process that compiled our Triton kernels (and
    measured the NS plan) in its own first step ran every later forward-backward ~0.5% slower (+0.10 to +0.20 s per
    20.5 s step, every call) than a process started after those caches were on disk (within +0.00 to +0.05 s of
    AdamW); one process that found the kernels compiled but re-measured the plan was not slower either. The first
    step is excluded from the timings either way; the after-effect was not. A prewarm child takes that first step
    for the timed one. AdamW and Megatron's built-in compile nothing of ours."""
    import config

    seen: set[str] = set()
    out = []
    for name, overrides in cases:
        cfg = config.load(overrides)
        if not launch.runs_our_kernels(cfg):
            continue
        key = config.config_hash(cfg)
        if key in seen:
            continue
        seen.add(key)
        out.append((f"prewarm_{name}", [*overrides, *PREWARM_OVERRIDES]))
    return out


def run_case(name: str, overrides: list[str], root: Path) -> dict[str, Any]:
    """One run: compose, record, setup, steps, finalize. Returns the final run.json."""
    import config
    from bench import probes, record
    from bench.engines.base import RankInfo
    from bench.engines.megatron import MegatronEngine
    from bench.worker import reduce_metrics  # the same steps.jsonl row as a bench.worker run

    cfg = config.load(overrides)
    run_dir = root / name
    rec = record.new_run_record(
        run_id=name,
        run_dir=run_dir,
        config=config.as_dict(cfg),
        config_hash=config.config_hash(cfg),
        overrides=overrides,
        command=[sys.executable, "-m", "bench.engines.megatron_bench", "--case", name, *overrides],
    )
    record.write_json_atomic(run_dir / "run.json", rec)
    log = record.StepLog(run_dir, extra_keys=(*record.OPTIONAL_KEYS, *probes.keys(cfg.bench.probes)))
    engine = MegatronEngine()
    engine.run_dir = str(run_dir)
    try:
        rank = RankInfo(rank=0, world_size=1, local_rank=0)
        engine.setup(cfg, rank)
        record.update_run_json(
            run_dir, worker={**_torch_facts(), "timer": engine.timer, "engine": engine.describe()}
        )
        for i in range(cfg.bench.steps):
            m = engine.step()
            optional = (*record.OPTIONAL_KEYS, *probes.keys(cfg.bench.probes))
            row = {"step": i, "warmup": i < cfg.bench.warmup_steps, **reduce_metrics(m, rank, None, optional)}
            log.write(row)
            print(
                f"[{name}] step {i} {m.step_s * 1e3:.0f} ms (fb {m.fwd_bwd_s * 1e3:.0f}, opt {m.optim_s * 1e3:.0f},"
                f" ns {(m.ns_s or 0) * 1e3:.0f}) loss {m.loss:.3f} mem {m.peak_mem_bytes / 2**30:.1f} GiB",
                flush=True,
            )
        log.close()
        record.update_run_json(
            run_dir, tp_modes=engine.describe().get("tp_modes", {})
        )  # auto resolved by now
        return record.finalize(run_dir, status="ok")
    except Exception as exc:  # noqa: BLE001 - every failure leaves a record; the next case still runs
        log.close()
        err = {
            "type": type(exc).__name__,
            "message": str(exc)[:2000],
            "traceback": record.tail("".join(traceback.format_exception(exc))),
        }
        print(f"[{name}] FAILED {err['type']}: {err['message'][:500]}\n{err['traceback']}", flush=True)
        status = record.classify_failure(returncode=None, timed_out=False, worker_error=err)
        return record.finalize(run_dir, status=status, error=err)
    finally:
        engine.teardown()


def _torch_facts() -> dict[str, Any]:
    import torch

    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu_name": torch.cuda.get_device_name(0),
        "gpu_count": torch.cuda.device_count(),
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
    }


def _start_process_group() -> None:
    """One NCCL group for all cases (the engine then leaves it alone), so no case re-binds the rendezvous port."""
    import torch

    from bench.engines.base import RankInfo
    from bench.engines.megatron import _init_distributed

    if not torch.cuda.is_available():
        raise SystemExit(
            "bench.engines.megatron_bench runs the megatron engine, on NVIDIA GPUs only (Megatron-core models need "
            "CUDA); this machine has none. Use engine=hf (python -m bench.run) for CPU runs."
        )
    torch.cuda.set_device(0)
    _init_distributed(RankInfo(rank=0, world_size=1, local_rank=0), "nccl")


def _prewarm(cases: list[tuple[str, list[str]]], timeout_s: float | None) -> None:
    """Run `prewarm_cases(cases)` in child processes; their records go to a temporary directory and are dropped."""
    import shutil
    import subprocess
    import tempfile

    scratch = Path(tempfile.mkdtemp(prefix="muonbench_prewarm_"))
    try:
        for name, overrides in prewarm_cases(cases):
            t = time.perf_counter()
            cmd = [
                sys.executable,
                "-m",
                "bench.engines.megatron_bench",
                "--out",
                str(scratch),
                "--case",
                name,
            ]
            try:
                rc = subprocess.run([*cmd, *overrides], check=False, timeout=timeout_s).returncode
            except subprocess.TimeoutExpired:
                rc = "killed"
            print(f"[{name}] prewarm done (rc {rc}) in {time.perf_counter() - t:.0f} s", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    from bench import record

    args, cases = parse_cases(sys.argv[1:] if argv is None else argv)
    root = Path(args.out)
    isolate = len(cases) > 1 and not args.in_process
    t0 = time.perf_counter()
    if args.prewarm:  # before this process touches the GPU
        _prewarm(cases, args.case_timeout_s)
    if not isolate:
        _start_process_group()
    for name, overrides in cases:
        if time.perf_counter() - t0 > args.budget_s:
            print(f"[{name}] skipped: time budget {args.budget_s:.0f} s spent", flush=True)
            run_dir = root / name
            record.write_json_atomic(
                run_dir / "run.json",
                {
                    "schema": record.RUN_SCHEMA,
                    "run_id": name,
                    "status": "error",
                    "overrides": overrides,
                    "error": {"type": "Skipped", "message": "skipped: time budget", "traceback": ""},
                },
            )
            continue
        if isolate:
            import subprocess

            cmd = [
                sys.executable,
                "-m",
                "bench.engines.megatron_bench",
                "--out",
                str(root),
                "--case",
                name,
                *overrides,
            ]
            left = args.case_timeout_s
            try:
                subprocess.run(cmd, check=False, timeout=left)
            except subprocess.TimeoutExpired:
                print(f"[{name}] killed after {left:.0f} s", flush=True)
                if (root / name / "run.json").exists():
                    err = {"type": "Timeout", "message": f"case killed after {left:.0f} s", "traceback": ""}
                    record.finalize(root / name, status="timeout", error=err)
            rec = (
                record.read_json(root / name / "run.json")
                if (root / name / "run.json").exists()
                else {"status": "error", "summary": None}
            )
        else:
            rec = run_case(name, overrides, root)
        s = rec.get("summary") or {}
        print(
            f"[{name}] {rec['status']}: step {s.get('step_s_median')} s, model TF/GPU {s.get('model_tflops_per_gpu')},"
            f" optim {s.get('optim_s_median')} s, ns {s.get('ns_s_median')} s",
            flush=True,
        )
    print(f"all cases done in {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
