"""`python -m bench.tools.model hf:<spec> [model.<field>=...]`: the model group YAML of a Hugging Face config.

Prints what `model=hf:<spec>` composes (muonbench/hf_model.py), with the overrides given, as a `conf/model/` file:
commit it as `conf/model/<name>.yaml` and select it with `model=<name>`. Only the fields that differ from the
schema's defaults are written, after `defaults: [base_model]`.
"""

from __future__ import annotations

import sys
from dataclasses import fields
from typing import Any

from muonbench.schema import ModelConfig

_RECORD_ONLY = ("source", "trust_remote_code")
"""Fields of a read config a committed YAML leaves out: it stands alone (no config to re-read, no remote code)."""


def model_yaml(model: ModelConfig) -> str:
    """`conf/model/<name>.yaml` text of `model`: its schema, then every field that differs from the default."""
    from omegaconf import MISSING

    lines = [
        f"# {model.name}: read from {model.source or 'conf/model'} (python -m bench.tools.model).",
        "defaults:",
        "  - base_model",
    ]
    for f in fields(ModelConfig):
        value = getattr(model, f.name)
        if f.name in _RECORD_ONLY or (f.default is not MISSING and value == f.default):
            continue
        lines.append(f"{f.name}: {_scalar(value)}")
    return "\n".join(lines) + "\n"


def _scalar(value: Any) -> str:
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.tools.model hf:<spec> [model.<field>=...]`; exit 2 naming the field on bad input."""
    from muonbench import load

    args = list(sys.argv[1:] if argv is None else argv)
    from muonbench.cli_help import usage_help

    if usage_help(
        args or ["--help"],
        "bench.tools.model",
        "The conf/model YAML of a Hugging Face config.json (a path, a folder holding one, or a Hub id in\n"
        "the local cache), with model.<field>= overrides applied; commit it under conf/model/.",
        examples=(
            "hf:path/to/config.json",
            "hf:Qwen/Qwen3-8B model.num_layers=4",
        ),
        synopsis="hf:<config.json, folder or Hub id> [model.<field>=value ...]",
    ):
        return 0 if args else 2
    spec, rest = args[0], args[1:]
    extra = [a for a in rest if a.startswith("hf:")]
    if extra:
        print(f"error: {extra[0]!r}: give one hf:<spec> first, then model.<field>= overrides", file=sys.stderr)
        return 2
    if not spec.startswith("hf:"):
        print(f"error: {spec!r}: the first argument is hf:<config.json, folder or Hub id>", file=sys.stderr)
        return 2
    try:
        root = load([f"model={spec}", *rest])
    except ValueError as exc:  # config and user errors: one line naming the field, the value and the rule
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(model_yaml(root.model))
    return 0


if __name__ == "__main__":
    from bench import entry

    raise SystemExit(entry.run(main))
