"""The `muonbench` command: one subcommand per entry point, each the same as its `python -m` module.

    muonbench run -m optimizer=adamw,muon experiment=cpu/qwen3_moe_tiny_dp2
    muonbench run --config-dir ~/my_conf experiment=my_setup      # a user's own experiment files (Hydra searchpath)
    muonbench collect && muonbench report
    muonbench flops model=kimi_k2 parallelism=pp4_dp64_ep64

`muonbench <subcommand> --help` prints that entry point's own help. The modules are imported only when their
subcommand runs (a login node lists and launches without torch; the tools load nothing until asked).
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class Subcommand:
    module: str
    """The module whose `main` runs (also runnable as `python -m <module>`)."""
    summary: str


SUBCOMMANDS: dict[str, Subcommand] = {
    "run": Subcommand(module="bench.run", summary="run one benchmark job or a sweep (-m) of the Hydra config"),
    "collect": Subcommand(
        module="bench.results.collect", summary="gather the latest sweep's run records into results.csv"
    ),
    "report": Subcommand(module="bench.results.report", summary="markdown report and plots from the collected CSVs"),
    "regress": Subcommand(module="bench.results.regress", summary="compare a report with golden rows (+-5%)"),
    "cluster": Subcommand(
        module="bench.cluster", summary="a run as a NeMo-Run Slurm job (DRY_RUN=1 prints it); status, logs, cancel"
    ),
    "flops": Subcommand(module="bench.tools.flops", summary="model and Newton-Schulz FLOPs of a configuration"),
    "balance": Subcommand(module="bench.tools.balance", summary="layer-wise optimizer load balance"),
    "project": Subcommand(module="bench.tools.project", summary="performance-model projection at any scale"),
    "recommend": Subcommand(
        module="bench.tools.recommend", summary="recommended Muon settings with their predicted cost"
    ),
    "quality": Subcommand(
        module="bench.tools.quality.run", summary="time to AdamW's loss for AdamW, Muon, MOP, SOAP-REKLS"
    ),
    "ns-kernels": Subcommand(
        module="bench.tools.ns_kernels", summary="Newton-Schulz kernels against their peers (needs a GPU)"
    ),
}
"""Subcommand -> entry point; `make help` lists the same entry points as make targets."""


def usage() -> str:
    lines = ["usage: muonbench <subcommand> [args ...]   (muonbench <subcommand> --help for its options)", ""]
    lines += ["subcommands:", *(f"  {name:<12} {sub.summary}" for name, sub in SUBCOMMANDS.items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    sub = SUBCOMMANDS.get(name)
    if sub is None:
        print(
            f"error: muonbench {name!r}: no such subcommand; available: {', '.join(SUBCOMMANDS)}", file=sys.stderr
        )
        return 2
    entry = importlib.import_module(sub.module).main
    sys.argv = [f"muonbench {name}", *rest]  # every entry point reads its arguments from sys.argv (Hydra's too)
    return int(entry() or 0)


if __name__ == "__main__":
    raise SystemExit(main())
