"""Project step time and TFLOP/s per GPU of a configuration at any scale: `python -m bench.tools.project`.

    python -m bench.tools.project model=kimi_k2 parallelism=pp4_dp64_ep64 hardware=gb300 precision=fp8_mx \
        optimizer=muon [profile=published|ours] [format=json]
    python -m bench.tools.project experiment=gb300/qwen3_30b_a3b_muon profile=ours parallelism.tp=2 parallelism.distribution.tp_mode=auto
    python -m bench.tools.project report=reports/perfmodel_gb300_202611      # calibration + sweeps, README, CSV and PNGs

Everything except the CLI-only keys `profile`, `format` and `report` is a Hydra override composed by
`config.load`. With TP > 1 the text output lists, per TP-sharded matrix, the predicted milliseconds of
duplicated and distributed Newton-Schulz and the `tp_mode=auto` choice. Imports no torch.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from bench import entry

CLI_KEYS = ("profile", "format", "report")
DEFAULT_ENGINE = "megatron"
"""The engine `project` and `recommend` price unless the overrides choose one (an `engine=` or an `experiment=`,
which names its own): the one the performance model is calibrated on and that runs model parallelism."""


def with_default_engine(overrides: list[str]) -> list[str]:
    """`overrides`, led by `engine=DEFAULT_ENGINE` unless they choose an engine or an experiment."""
    chosen = {a.split("=", 1)[0].lstrip("+~") for a in overrides} & {"engine", "experiment"}
    return overrides if chosen else [f"engine={DEFAULT_ENGINE}", *overrides]


def split_args(argv: list[str], keys: tuple[str, ...] = CLI_KEYS) -> tuple[dict[str, str], list[str]]:
    """CLI-only `keys` (default: profile, format, report) and the remaining Hydra overrides; `format` is text or
    json."""
    cli: dict[str, str] = {}
    overrides: list[str] = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and key in keys:
            cli[key] = value
        else:
            overrides.append(arg)
    fmt = cli.get("format", "text")
    if fmt not in ("text", "json"):
        raise ValueError(f"format={fmt!r}: must be one of ['text', 'json']")
    return cli, overrides


def project(overrides: list[str], profile: str = "published") -> dict[str, Any]:
    """Prediction of one composed configuration as a plain dict (the json output)."""
    from bench.tools.perfmodel.constants import engine_calibration
    from bench.tools.perfmodel.intervals import interval
    from bench.tools.perfmodel.model import predict, tp_mode_table
    from muonbench import load
    from muonbench.engines import check_features

    cfg = load(with_default_engine(overrides))
    check_features(cfg)  # a model the engine cannot build is not projected for it
    pred = predict(cfg, profile)
    out = pred.as_dict()
    out["config"] = {
        "model": cfg.model.name,
        "parallelism": cfg.parallelism.name,
        "hardware": cfg.hardware.name,
        "precision": cfg.precision.name,
        "optimizer": cfg.optimizer.name,
        "world_size": cfg.parallelism.world_size,
        "engine": cfg.engine.name,
    }
    out["engine_calibration"] = engine_calibration(cfg.engine.name, cfg.hardware.name)
    out["hardware_profile"] = pred.info["hardware_profile"]
    out.update(interval(cfg, profile, pred.step_time_s))
    out.update(memory_prediction(cfg))
    out["tp_modes"] = tp_mode_table(cfg) if cfg.optimizer.name == "muon" else []
    return out


def prediction_of(cfg: Any) -> dict[str, Any]:
    """What the model predicts for one composed run config, as `muonbench compare` records it beside the measured
    steps: step time, its interval and basis, the hardware profile and engine calibration it rests on (algorithm
    profile `ours` for our implementation, else `published`, as the intervals' runs are priced)."""
    from dataclasses import asdict

    from bench.tools.perfmodel.constants import engine_calibration
    from bench.tools.perfmodel.intervals import _profile, interval
    from bench.tools.perfmodel.model import predict

    profile = _profile({"optimizer": asdict(cfg.optimizer)})
    pred = predict(cfg, profile)
    return {
        "step_time_s": pred.step_time_s,
        **interval(cfg, profile, pred.step_time_s),
        "profile": profile,
        "hardware_profile": pred.info["hardware_profile"],
        "engine_calibration": engine_calibration(cfg.engine.name, cfg.hardware.name),
    }


def memory_prediction(cfg: Any) -> dict[str, Any]:
    """`peak_memory_gb` (one rank's predicted peak in GB, or its lower bound where the engine has no fit),
    `peak_memory_basis` and `fits` (against the hardware row's memory; None where it has none)."""
    from bench import memory

    need, what = memory.peak(cfg)
    pred = memory.predict(cfg)
    basis = pred["basis"] if pred is not None else "lower bound: the engine's peak is not predicted"
    return {"peak_memory_gb": need / 1e9, "peak_memory_basis": f"{what}, {basis}", "fits": memory.fits(cfg)}


def format_text(res: dict[str, Any]) -> str:
    c = res["config"]
    lo, hi = res["step_time_s_interval"]
    lines = [
        (
            f"{c['model']} on {c['world_size']} x {c['hardware']} ({c['parallelism']}, {c['precision']}), "
            f"{c['optimizer']}, profile={res['profile']}"
        ),
        (
            f"  step time          {res['step_time_s']:.3f} s, interval {lo:.3f} - {hi:.3f} s "
            f"({res['step_time_s_interval_basis']})"
        ),
        f"  engine             {c['engine']} ({res['engine_calibration']})",
        f"  hardware           {c['hardware']} ({res['hardware_profile']})",
        f"  model TF/GPU       {res['tflops_per_gpu_model']:.1f}",
        f"  NS TF/GPU          {res['tflops_per_gpu_ns']:.1f}  (plain count, reported beside model TF)",
        f"  peak memory / GPU  {res['peak_memory_gb']:.1f} GB of {res['info']['memory_gib'] * 2**30 / 1e9:.1f}"
        + {True: "", False: "  ** does not fit **", None: ""}[res["fits"]]
        + f" ({res['peak_memory_basis']})",
        "  breakdown (s):",
    ]
    lines += [f"    {k:<32} {v:.4f}" for k, v in res["breakdown"].items() if v]
    if res["tp_modes"]:
        lines.append(
            "  tp_mode=auto per TP-sharded matrix (predicted ms: duplicated / distributed -> choice):"
        )
        lines += [
            f"    {r['kind']:<16} {r['rows']}x{r['cols']} tp={r['tp']}: {r['duplicated_ms']:.3f} / "
            f"{r['distributed_ms']:.3f} -> {r['choice']}"
            for r in res["tp_modes"]
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    from muonbench.cli_help import usage_help

    if usage_help(
        args,
        "bench.tools.project",
        "Projected step time and TFLOP/s per GPU of a configuration at any scale (performance model).",
        tool_options={
            "profile=published|ours": "which implementation the projection models (default published)",
            "format=text|json": "output format (default text)",
            "report=DIR": "write the calibration and sweep report into DIR instead",
        },
        examples=(
            "model=kimi_k2 parallelism=pp4_dp64_ep64 hardware=gb300 precision=fp8_mx profile=ours",
        ),
    ):
        return 0
    return entry.run(lambda: _main(args))  # one line and exit 2 on a user or config error


def _main(argv: list[str]) -> int:
    cli, overrides = split_args(argv)
    if "report" in cli:
        from bench.tools.perfmodel.report import write_report

        print(write_report(cli["report"]))
        return 0
    res = project(overrides, cli.get("profile", "published"))
    if cli.get("format") == "json":
        print(json.dumps(res, indent=1, sort_keys=True))
    else:
        print(format_text(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(entry.run(main))
