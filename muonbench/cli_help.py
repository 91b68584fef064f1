"""`--help` of the Hydra-style entry points (`bench.run`, `bench.flops`, `bench.tools.balance`, `bench.tools.project`): usage,
the config groups with their options (read from `conf/`), the main fields with their defaults, and the tool's own
options. No torch import.
"""

from __future__ import annotations

from dataclasses import MISSING, fields

import muonbench
from muonbench import schema

MAIN_FIELDS: dict[str, tuple[type, tuple[str, ...]]] = {
    "bench": (
        schema.BenchConfig,
        ("steps", "warmup_steps", "seed", "out_dir", "report_name", "timeout_s", "budget_s", "data"),
    ),
    "optimizer": (schema.MuonSchema, ("lr", "weight_decay", "momentum", "num_ns_steps", "coefficient_type")),
    "parallelism": (schema.ParallelismConfig, ("world_size", "tp", "pp", "ep", "mbs", "gbs")),
}
"""Fields shown under "main fields" (group -> schema, field names); `--cfg job` prints every field."""


COMMANDS: dict[str, str] = {}
"""Entry-point module -> the command that runs it, while the `muonbench` command runs one (bench/cli.py fills it:
`bench.run` -> `muonbench run`); empty under `python -m`, where help and hints name `python -m <module>`."""


def command(module: str) -> str:
    """How the user names the entry point `module` in this process: `muonbench run` or `python -m bench.run`."""
    return COMMANDS.get(module, f"python -m {module}")


def _defaults(cls: type, names: tuple[str, ...]) -> list[str]:
    out = []
    for f in fields(cls):
        if f.name in names:
            default = f.default if f.default is not MISSING else "(required)"
            out.append(f"{f.name}={default}")
    return out


def groups_text() -> str:
    """One line per config group: `group: option, option, ...`."""
    groups = sorted(
        p.name for p in muonbench.CONF_DIR.iterdir() if p.is_dir() and p.name not in ("hydra", "local")
    )
    return "\n".join(f"  {g:<12} {', '.join(muonbench.available_options(g))}" for g in groups)


SYNOPSIS = "[group=option ...] [group.field=value ...]"


def usage(
    prog: str,
    summary: str,
    *,
    tool_options: dict[str, str] | None = None,
    examples: tuple[str, ...] = (),
    synopsis: str = SYNOPSIS,
) -> str:
    """The help text of a Hydra-style entry point (`synopsis`: its arguments, required ones first)."""
    lines = [f"usage: {command(prog)} {synopsis}", "", summary, ""]
    if tool_options:
        lines += ["options of this tool:"]
        lines += [f"  {k:<24} {v}" for k, v in tool_options.items()]
        lines += [""]
    lines += ["config groups (group=option; conf/<group>/<option>.yaml):", groups_text(), ""]
    lines += ["main fields (defaults; the group's YAML or an experiment may set others):"]
    for group, (cls, names) in MAIN_FIELDS.items():
        lines += [f"  {group}.{{{', '.join(_defaults(cls, names))}}}"]
    lines += [
        "",
        f"Every field is typed (muonbench/schema.py); print a composed config with: {command('bench.run')} ... --cfg job",
    ]
    if examples:
        lines += ["", "examples:", *(f"  {command(prog)} {e}" for e in examples)]
    return "\n".join(lines)


def run_usage() -> str:
    return usage(
        "bench.run",
        "Run a benchmark (one run, or a sweep with -m and comma-separated values): records under bench.out_dir,\n"
        "one directory per run with run.json (status: docs/run_status.md) and steps.jsonl.",
        tool_options={
            "-m, --multirun": "sweep over comma-separated values (optimizer=adamw,muon)",
            "bench.resume=PATH": "rerun the jobs of a sweep (dir or runs/LATEST.json) that did not end ok",
            "--cfg job": "print the composed config and exit (Hydra)",
            "--hydra-help": "Hydra's own options",
        },
        examples=(
            "-m optimizer=adamw,muon experiment=cpu/qwen3_moe_tiny_dp2",
            "experiment=gb300/kimi_k2_muon launcher.dry_run=true",
            "bench.resume=runs/LATEST.json",
        ),
    )


def asks_for_help(argv: list[str]) -> bool:
    return any(a in ("-h", "--help") for a in argv)


def usage_help(
    argv: list[str],
    prog: str,
    summary: str,
    *,
    tool_options: dict[str, str] | None = None,
    examples: tuple[str, ...] = (),
    synopsis: str = SYNOPSIS,
) -> bool:
    """Print `usage(...)` of a Hydra-style tool when `argv` asks for help; True when it did (the caller exits)."""
    if not asks_for_help(argv):
        return False
    print(usage(prog, summary, tool_options=tool_options, examples=examples, synopsis=synopsis))
    return True


def module_help(doc: str | None, argv: list[str]) -> bool:
    """For the key=value tools whose module docstring is their usage: print it when `argv` asks for help."""
    if not asks_for_help(argv):
        return False
    print((doc or "").strip())
    return True
