"""`python -m recipes [--ab-mode fair] <hydra overrides>`: print the Megatron-Bridge plan of a config, offline.

Shows the base recipe, the A/B mode and every override (section -> field -> value) that `recipes.bridge` would set
inside the NeMo container, and checks the fields against the installed Megatron-Bridge source when it is there.
    python -m recipes experiment=gb300/kimi_k2_muon --ab-mode fair
"""

from __future__ import annotations

import json
import sys

from muonbench import load
from recipes.fields import bridge_version
from recipes.overrides import AB_MODES, build_plan, unknown_fields


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    from muonbench.cli_help import usage_help

    if usage_help(
        args,
        "recipes",
        "Print the Megatron-Bridge plan of a config (base recipe, A/B mode, every override), offline.",
        tool_options={"--ab-mode published|fair": "A/B mode (default: engine.ab_mode)"},
        examples=("experiment=gb300/kimi_k2_muon --ab-mode fair",),
    ):
        return 0
    ab_mode = None
    if "--ab-mode" in args:
        i = args.index("--ab-mode")
        if i + 1 >= len(args) or args[i + 1] not in AB_MODES:
            print(f"error: --ab-mode takes one of {list(AB_MODES)}", file=sys.stderr)
            return 2
        ab_mode = args[i + 1]
        del args[i : i + 2]
    try:
        plan = build_plan(load(args), ab_mode=ab_mode)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    doc = {
        "base_recipe": plan.base_recipe,
        "precision_preset": plan.precision_preset,
        "metadata": plan.metadata,
        "overrides": plan.overrides,
    }
    print(json.dumps(doc, indent=1, default=str))
    if bridge_version() is not None:
        bad = unknown_fields(plan)
        print(
            f"# megatron-bridge {bridge_version()}: "
            + (f"UNKNOWN fields {bad}" if bad else "every override is a known field"),
            file=sys.stderr,
        )
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
