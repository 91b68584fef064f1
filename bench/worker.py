"""One rank of a benchmark run: `torchrun --nproc_per_node=N -m bench.worker <run_dir>`.

Reads the resolved config from `<run_dir>/run.json`, builds the engine, runs `bench.steps` steps and has rank 0 write
`steps.jsonl` (per-step numbers reduced over ranks: times and memory as the max over ranks, loss as the mean) and
close the record. A failing rank writes `worker_error.rank<r>.json` (exception type, message, traceback) before it
exits, so the launcher can tell an out-of-memory from another error without parsing prose.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from bench import flops, metrics, probes, sinks, telemetry
from bench.engines import RankInfo, StepMetrics, engine_class
from bench.entry import quiet_dependencies
from bench.results import record
from muonbench.compose import config_from_dict


def rank_info() -> RankInfo:
    """This process's place, from torchrun's environment (a plain `python -m bench.worker` is rank 0 of 1)."""
    env = os.environ
    return RankInfo(
        rank=int(env.get("RANK", 0)),
        world_size=int(env.get("WORLD_SIZE", 1)),
        local_rank=int(env.get("LOCAL_RANK", 0)),
    )


def reduce_metrics(
    m: StepMetrics, rank: RankInfo, device: Any, optional: tuple[str, ...] | None = None
) -> dict[str, Any]:
    """Times, memory, NS FLOPs, grad norm: max over ranks; loss: mean over the ranks that report one (with pipeline
    parallelism only the last stage has one), NaN when any rank's loss is NaN or Inf. Unmeasured (None) values stay
    None."""
    import math

    import torch
    import torch.distributed as dist

    optional = metrics.optional_keys() if optional is None else optional
    extra = [k for k in metrics.step_keys() if metrics.METRICS[k].origin == "extra"]
    values = {k: getattr(m, k) for k in metrics.of("field")} | {k: m.extra.get(k) for k in extra}
    values |= {k: m.extra[k] for k in optional if k in m.extra}  # same keys on every rank (same config)
    has_loss = m.loss is not None and math.isfinite(m.loss)
    bad_loss = m.loss is not None and not has_loss
    if rank.world_size > 1:
        maxes = torch.tensor(
            [float("nan") if v is None else float(v) for v in values.values()],
            dtype=torch.float64,
            device=device,
        )
        dist.all_reduce(maxes, op=dist.ReduceOp.MAX)
        loss = torch.tensor(
            [m.loss if has_loss else 0.0, float(has_loss), float(bad_loss)],
            dtype=torch.float64,
            device=device,
        )
        dist.all_reduce(loss, op=dist.ReduceOp.SUM)
        values = {k: None if v is None else float(x) for (k, v), x in zip(values.items(), maxes.tolist())}
        total, count, bad = loss.tolist()
        loss_value = total / count if count and not bad else float("nan")
    else:
        loss_value = float(m.loss) if has_loss else float("nan")
    if values["peak_mem_bytes"] is not None:
        values["peak_mem_bytes"] = int(values["peak_mem_bytes"])
    return {**values, "tokens": m.tokens, "loss": loss_value}


def _torch_facts() -> dict[str, Any]:
    import torch

    facts: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "num_threads": torch.get_num_threads(),
        "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        facts.update(
            gpu_name=torch.cuda.get_device_name(0),
            gpu_count=torch.cuda.device_count(),
            compute_capability="{}.{}".format(*torch.cuda.get_device_capability(0)),
            nccl=".".join(map(str, torch.cuda.nccl.version())),
        )
    return facts


def error_of(exc: BaseException, rank: int) -> dict[str, Any]:
    """A worker's structured error: rank, exception type, message, traceback tail, and for an OSError the errno's
    name (`ENOSPC`: the disk is full)."""
    err = {
        "rank": rank,
        "type": type(exc).__name__,
        "message": str(exc)[:2000],
        "traceback": record.tail("".join(traceback.format_exception(exc))),
    }
    if record.errno_name(exc):
        err["errno"] = record.errno_name(exc)
    return err


def _close_failed(run_dir: Path, rank: RankInfo, exc: BaseException, log: record.StepLog | None) -> None:
    """Record a failed run: `worker_error.rank<r>.json`, and on rank 0 the closed run.json. A write that fails too
    (the disk is full: each is retried once after freeing the run's reserve, `record.closing_write`) is reported on
    stderr, where bench.run finds it with the exit code; it never hides `exc`."""
    err = error_of(exc, rank.rank)
    if log is not None:
        with contextlib.suppress(OSError):
            log.close()
    try:
        path = run_dir / f"worker_error.rank{rank.rank}.json"
        record.closing_write(run_dir, lambda: record.write_json_atomic(path, err))
        if log is not None:
            status = record.classify_failure(returncode=None, timed_out=False, worker_error=err)
            keep = ("type", "message", "traceback", "errno")
            record.finalize(run_dir, status=status, error={k: err[k] for k in keep if k in err})
    except OSError as write_exc:
        print(
            f"bench.worker rank {rank.rank}: could not record {err['type']}: {err['message']} in {run_dir}: "
            f"{write_exc}",
            file=sys.stderr,
            flush=True,
        )


def _record_ns_plan(run_dir: Path) -> None:
    """The NS plan entries this process ran (`optim.kernels.plans_in_use`) as run.json's `ns_plan`, if any."""
    kernels = sys.modules.get("optim.kernels")  # imported by the optimizer when it orthogonalized anything
    plans = kernels.plans_in_use() if kernels is not None else {}
    if plans:
        record.update_run_json(run_dir, ns_plan=plans)


def _progress_bar(cfg: Any) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=cfg.bench.steps,
        desc=f"{cfg.optimizer.name}",
        unit="step",
        file=sys.stderr,
        dynamic_ncols=True,
        ascii=True,
        mininterval=0.5,
    )


def _steps(
    cfg: Any,
    engine: Any,
    rank: RankInfo,
    optional: tuple[str, ...],
    *,
    model_flops: float | None,
    sampler: Any,
    log: Any,
    sink: Any,
    bar: Any,
) -> dict[str, Any] | None:
    """The timed steps: each measured, reduced over ranks, logged (rank 0) and shown; the divergence record of a
    non-finite loss (all ranks stop there), else None."""
    skipped_before = engine.skipped_updates()
    for i in range(cfg.bench.steps):
        measured = engine.step()
        if sampler is not None:
            measured.extra.update(sampler.step())
        if skipped_before is not None:  # this step's skipped updates (the optimizers count cumulatively)
            skipped_now = engine.skipped_updates() or 0
            measured.extra["skipped_updates"] = skipped_now - skipped_before
            skipped_before = skipped_now
        row = reduce_metrics(measured, rank, engine.device, optional)
        if log is not None:
            log.write({"step": i, "warmup": i < cfg.bench.warmup_steps, **row})
        if rank.rank == 0 and (sink is not None or bar is not None):
            scalars = sinks.scalars(
                {**row, "warmup": i < cfg.bench.warmup_steps},
                model_flops_per_step=model_flops,
                world_size=rank.world_size,
                peak_tflops=cfg.hardware.peak_bf16_tflops,
            )
            if sink is not None:
                sink.log(scalars, i)
            if bar is not None:
                tf = scalars.get(metrics.METRICS["model_tflops_per_gpu"].sink)
                bar.set_postfix(
                    loss=f"{row['loss']:.3f}",
                    step_ms=f"{row['step_s'] * 1e3:.0f}",
                    tflops=f"{tf:.3g}" if tf is not None else "n/a",
                    refresh=False,
                )
                bar.update(1)
        if not math.isfinite(row["loss"]):  # the same reduced loss on every rank: all stop here
            return {"step": i, "loss": str(row["loss"]), "reason": "non-finite loss"}
    return None


def run(run_dir: Path) -> None:
    """Run the benchmark of `run_dir` on this rank."""
    import torch.distributed as dist

    rec = record.read_json(run_dir / "run.json")
    cfg = config_from_dict(rec["config"])
    rank = rank_info()
    if cfg.engine.device == "cuda":
        import torch

        torch.cuda.set_device(rank.local_rank)  # before NCCL starts, so every collective uses this rank's GPU
    if rank.world_size > 1:
        dist.init_process_group(backend=cfg.engine.backend)
    sinks.prepare(cfg.bench.logger)
    engine = engine_class(cfg.engine.name)()
    engine.run_dir = str(run_dir)
    optional = (*metrics.optional_keys(), *probes.keys(cfg.bench.probes))
    log = record.StepLog(run_dir, extra_keys=optional) if rank.rank == 0 else None
    sink = None
    sampler = None
    model_flops = record.model_flops_per_step(rec["config"])
    try:
        engine.setup(cfg, rank)
        if cfg.engine.device == "cuda":
            sampler = telemetry.open_for(rank.local_rank)
        if rank.rank == 0:
            sink = sinks.open_sink(
                cfg.bench.logger,
                run_dir,
                run_id=str(rec.get("run_id", run_dir.name)),
                project=cfg.bench.logger_project,
                config=rec["config"],
            )
            record.update_run_json(
                run_dir, worker={**_torch_facts(), "timer": engine.timer, "engine": engine.describe()}
            )
        bar = _progress_bar(cfg) if rank.rank == 0 and cfg.bench.progress else None
        divergence = _steps(
            cfg, engine, rank, optional, model_flops=model_flops, sampler=sampler, log=log, sink=sink, bar=bar
        )
        if bar is not None:
            bar.close()
        if log is not None:
            log.close()
            _record_ns_plan(run_dir)
            if divergence is None:
                m, tp = cfg.model, cfg.parallelism.tp
                vocab = (m.vocab_size, flops.padded_vocab_size(m.vocab_size, m.make_vocab_size_divisible_by, tp))
                divergence = record.judge_training(record.read_steps(run_dir), vocab_sizes=vocab)
            if divergence is None:
                final = record.finalize(run_dir, status=record.Status.OK)
            else:
                final = record.finalize(run_dir, status=record.Status.DIVERGED, divergence=divergence)
            if sink is not None:
                sink.summary(sinks.summary_scalars(final.get("summary")))
        if rank.world_size > 1:
            dist.barrier()  # leave together: a rank tearing down gloo while rank 0 still writes can abort
    except BaseException as exc:
        _close_failed(run_dir, rank, exc, log)
        raise
    finally:
        if sampler is not None:
            sampler.close()
        if sink is not None:
            sink.close()
        engine.teardown()
        if rank.world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args in (["-h"], ["--help"]):
        print(
            "usage: torchrun --nproc_per_node=N -m bench.worker <run_dir>  (started by bench.run's launcher)"
        )
        return
    if len(args) != 1:
        raise SystemExit("usage: torchrun --nproc_per_node=N -m bench.worker <run_dir>")
    quiet_dependencies()
    t0 = time.perf_counter()
    run(Path(args[0]))
    if rank_info().rank == 0:
        print(f"worker done in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    # Records are written and fsynced and the process group is destroyed. Skip interpreter teardown: with gloo a
    # rank occasionally aborts there ("terminate called without an active exception", SIGABRT) after a clean run,
    # which would turn a finished run into a failed one.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
