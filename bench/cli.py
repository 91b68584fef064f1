"""The `muonbench` command: one subcommand per entry point, each the same as its `python -m` module.

    muonbench run -m optimizer=adamw,muon experiment=cpu/qwen3_moe_tiny_dp2
    muonbench run --config-dir ~/my_conf experiment=my_setup      # a user's own config files, shadowing ours
    muonbench collect && muonbench report
    muonbench flops model=kimi_k2 parallelism=pp4_dp64_ep64
    muonbench model hf:path/to/config.json model.num_layers=4 > conf/model/mine.yaml

`muonbench <subcommand> --help` prints that entry point's own help. The modules are imported only when their
subcommand runs (a login node lists and launches without torch; the tools load nothing until asked).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from bench import entry as entry_point
from muonbench import cli_help


@dataclass(frozen=True, kw_only=True, slots=True)
class Subcommand:
    module: str
    """The module whose `function` runs (`main`: also runnable as `python -m <module>`)."""
    summary: str
    function: str = "main"


SUBCOMMANDS: dict[str, Subcommand] = {
    "run": Subcommand(module="bench.run", summary="run one benchmark job or a sweep (-m) of the Hydra config"),
    "collect": Subcommand(
        module="bench.results.collect", summary="gather the latest sweep's run records into results.csv"
    ),
    "report": Subcommand(module="bench.results.report", summary="markdown report and plots from the collected CSVs"),
    "regress": Subcommand(module="bench.results.regress", summary="compare a report with golden rows (+-5%)"),
    "cluster": Subcommand(
        module="bench.cli",
        function="cluster",
        summary="a run as a NeMo-Run Slurm job (DRY_RUN=1 prints it); status, logs, cancel",
    ),
    "flops": Subcommand(module="bench.tools.flops", summary="model and Newton-Schulz FLOPs of a configuration"),
    "balance": Subcommand(module="bench.tools.balance", summary="layer-wise optimizer load balance"),
    "project": Subcommand(module="bench.tools.project", summary="performance-model projection at any scale"),
    "recommend": Subcommand(
        module="bench.tools.recommend", summary="recommended Muon settings with their predicted cost"
    ),
    "quality": Subcommand(
        module="bench.tools.quality.sweep", summary="time to AdamW's loss for AdamW, Muon, MOP, SOAP-REKLS"
    ),
    "model": Subcommand(
        module="bench.tools.model", summary="conf/model YAML of a Hugging Face config (model=hf:<spec>)"
    ),
    "compare": Subcommand(
        module="bench.tools.compare", summary="a variant optimizer's cost against a baseline, to a stated precision"
    ),
    "crossover": Subcommand(
        module="bench.tools.crossover", summary="runs of two optimizers in crossover order: model-only ratio"
    ),
    "calibrate": Subcommand(module="bench.tools.calibrate", summary="this GPU's hardware profile at a model's shapes (needs a GPU)"),
    "ns-kernels": Subcommand(
        module="bench.tools.ns_kernels", summary="Newton-Schulz kernels against their peers (needs a GPU)"
    ),
}
"""Subcommand -> entry point; `make help` lists the same entry points as make targets."""


def parser() -> argparse.ArgumentParser:
    """`muonbench <subcommand>`: argparse lists, checks and helps the subcommand; its arguments go to the entry
    point unparsed (each has its own parser, Hydra's included)."""
    ap = argparse.ArgumentParser(
        prog="muonbench",
        description="Muon, MOP and SOAP-REKLS against AdamW: runs, reports and tools.",
        epilog="muonbench <subcommand> --help prints that entry point's own options.",
    )
    subs = ap.add_subparsers(dest="subcommand", metavar="<subcommand>", title="subcommands", required=True)
    for name, sub in SUBCOMMANDS.items():
        subs.add_parser(name, help=sub.summary.replace("%", "%%"), add_help=False)
    return ap


def entry(name: str) -> Callable[[], int | None]:
    """The function a subcommand runs (imported now: a login node imports only what it runs)."""
    sub = SUBCOMMANDS[name]
    return getattr(importlib.import_module(sub.module), sub.function)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    ap = parser()
    if args[:1] in (["-h"], ["--help"], ["help"]):
        ap.print_help()
        return 0
    try:
        name = ap.parse_args(args[:1]).subcommand
    except SystemExit as exc:  # no or an unknown subcommand: argparse's usage line, exit 2
        return exc.code if isinstance(exc.code, int) else 2
    run = entry(name)
    sys.argv = [f"muonbench {name}", *args[1:]]  # every entry point reads its arguments from sys.argv (Hydra's too)
    cli_help.COMMANDS.update({sub.module: f"muonbench {n}" for n, sub in SUBCOMMANDS.items() if sub.function == "main"})
    try:
        return entry_point.run(run)  # the one-line errors of `python -m <module>`
    finally:
        cli_help.COMMANDS.clear()


CLUSTER_USAGE = """\
usage: muonbench cluster [bench.run overrides ...]       (make bench-cluster; docs/cluster.md)
       muonbench cluster status|logs|cancel <run dir>

    muonbench cluster experiment=gb300/kimi_k2_muon launcher.account=A launcher.partition=P   # submit
    DRY_RUN=1 muonbench cluster experiment=gb300/kimi_k2_muon        # print the sbatch script, submit nothing
    muonbench cluster launcher=local experiment=cpu/qwen3_moe_tiny_dp2  # the same experiment here, through NeMo-Run

A run with launcher.via=nemo_run (bench.cluster): NeMo-Run's SlurmExecutor (LocalExecutor for launcher=local) and
one Experiment per run; any bench.run override applies (launcher.qos=Q launcher.segment=16 ...)."""


DRY_RUN_VALUES = {"1": True, "true": True, "yes": True, "on": True, "": False, "0": False, "false": False,
                  "no": False, "off": False}  # fmt: skip
"""`DRY_RUN=` of `muonbench cluster` (and `make bench-cluster`), case-insensitive: print the job or submit it."""


def dry_run_env() -> bool:
    """Whether `DRY_RUN` asks for a dry run; ValueError naming it for a value that is neither."""
    value = os.environ.get("DRY_RUN", "")
    if value.strip().lower() not in DRY_RUN_VALUES:
        raise ValueError(f"DRY_RUN={value!r}: allowed {sorted(k for k in DRY_RUN_VALUES if k)} (or unset)")
    return DRY_RUN_VALUES[value.strip().lower()]


def cluster() -> int:
    """`muonbench cluster`: `bench.run` with launcher.via=nemo_run (DRY_RUN=1: launcher.dry_run=true), or the status,
    logs or cancel of a submitted run by its run directory (`bench.cluster.manage`)."""
    args = sys.argv[1:]
    if any(a in ("-h", "--help") for a in args):
        print(CLUSTER_USAGE)
        return 0
    cluster_mod = importlib.import_module("bench.cluster")
    if args and args[0] in cluster_mod.MANAGE:
        if len(args) != 2:
            print(f"usage: muonbench cluster {args[0]} <run dir>", file=sys.stderr)
            return 2
        try:
            return int(cluster_mod.manage(args[0], args[1]))
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    given = {a.split("=", 1)[0] for a in args}
    via = [] if "launcher.via" in given else ["launcher.via=nemo_run"]
    try:
        dry = dry_run_env() and "launcher.dry_run" not in given
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sweep = [a for a in args if a in ("-m", "--multirun")]  # Hydra takes its flags before the overrides only
    rest = [a for a in args if a not in sweep]
    sys.argv = [sys.argv[0], *sweep, *via, *(["launcher.dry_run=true"] if dry else []), *rest]
    try:
        importlib.import_module("bench.run").main()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
