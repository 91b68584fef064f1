"""Megatron-Bridge's run vs the megatron engine's on the same experiment: every setting that differs, as a table.

    python -m bench.tools.bridge_diff experiment=h200/qwen3_30b_a3b_slice_flops_bridge_1gpu [OVERRIDE ...]

Overrides apply to both sides, except `engine.*`, which apply to the megatron engine only (for example
`engine.moe_permute_fusion=true` shows the table after that flip). Both sides are configs only: no model, no CUDA.

- Bridge: the ConfigContainer `pretrain` receives (`recipes.bridge.build_config_container`: Bridge's recipe, our
  overrides, the node adjustments), with the mixed-precision preset applied to its model, optimizer and DDP
  configs, the first step of Bridge's `runtime_config_update`.
- megatron engine: the same config with `engine=megatron engine.layers=te` (then the `engine.*` overrides): the
  TransformerConfig arguments (`megatron_model.transformer_config_kwargs`), the GPTModel arguments, the DDP config
  (`megatron.ddp_config`) and, for AdamW and Megatron's Muon, the OptimizerConfig that `optim.megatron`'s builders
  hand Megatron.

Model configs are compared as declared, before Megatron-Core's `__post_init__` derives fields from them (Bridge
defers it to `finalize()`, which needs Transformer Engine for its fusion checks); derived fields agree when the
declared ones do. Rows: `shape` (every shape field, the batch and the FLOPs per step, equal or not), `perf` (differs
and can change the step time on this layout), `inert` (differs; the note says why it cannot here), `unclassified`
(differs and no rule in `bench/tools/bridge_diff_rules.py` knows it: reported with the `perf` rows), `same` (a setting
that can change the step time, equal on both sides).

Bridge imports Transformer Engine: the tool runs where TE is installed (the NeMo container) and says so elsewhere.
"""

from __future__ import annotations

import dataclasses
import enum
import sys
from dataclasses import dataclass
from typing import Any

from bench.flops import padded_vocab_size
from bench.tools.bridge_diff_rules import SHAPE_FIELDS, WATCHED, classify
from muonbench.schema import RootConfig

ENGINE_SIDE = ("engine=megatron", "engine.layers=te")
"""Overrides that turn the Bridge experiment into the megatron engine's run of it (TE layers, as Bridge runs)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Row:
    """One compared setting."""

    field: str
    """`section.name`: model, gpt_model, layers, train, ddp, optimizer, data, env, flops."""
    bridge: Any
    """Bridge's value (dtypes and enums by name, functions by qualified name)."""
    engine: Any
    """The megatron engine's value, in the same form."""
    bridge_origin: str = ""
    """Who set Bridge's value: `recipes/` (our overrides) or `Bridge` (its recipe, preset or default); model only."""
    engine_origin: str = ""
    """Who set the engine's value: `megatron_model` or `Megatron-Core default`; model only."""
    kind: str
    """shape | perf | inert | unclassified | same (a `WATCHED` setting both sides agree on)."""
    note: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class Diff:
    """The comparison of one experiment."""

    experiment: str
    bridge_overrides: list[str]
    engine_overrides: list[str]
    rows: list[Row]

    def of_kind(self, *kinds: str) -> list[Row]:
        return [r for r in self.rows if r.kind in kinds]

    def row(self, field: str) -> Row:
        """The row of `field`; KeyError when it is not reported."""
        for r in self.rows:
            if r.field == field:
                return r
        raise KeyError(field)


def split_args(args: list[str]) -> tuple[list[str], list[str]]:
    """(overrides for both sides, `engine.*` overrides for the megatron engine only).

    Raises:
        ValueError: an `engine=` group override (each side's engine is fixed).
    """
    shared, engine = [], []
    for arg in args:
        key = arg.split("=", 1)[0].lstrip("+~")
        if key == "engine":
            raise ValueError(
                f"{arg!r}: the engines are fixed (bridge vs {' '.join(ENGINE_SIDE)}); use engine.<field>=..."
            )
        (engine if key.startswith("engine.") else shared).append(arg)
    return shared, engine


def _plain(value: Any) -> Any:
    """A comparable, printable form: dtypes and enums by name, functions by qualified name."""
    if isinstance(value, enum.Enum):
        return value.name
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '')}.{value.__qualname__}"
    if type(value).__module__ == "torch" and type(value).__name__ == "dtype":
        return str(value).removeprefix("torch.")
    if isinstance(value, tuple):
        return list(value)
    return value


def _layer_freq(value: Any, num_layers: int) -> Any:
    """Megatron's `moe_layer_freq` as its per-layer list (an int k means every k-th layer is MoE)."""
    if isinstance(value, int):
        return [1 if i % value == 0 else 0 for i in range(num_layers)]
    return list(value)


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise AssertionError(f"{f.name} has no default")  # every TransformerConfig field has one


def _row(
    field: str, bridge: Any, engine: Any, root: RootConfig, *, origin: tuple[str, str] = ("", "")
) -> Row | None:
    """The row of one setting: always for shape fields, else only when the values differ."""
    b, e = _plain(bridge), _plain(engine)
    values = {
        "field": field,
        "bridge": b,
        "engine": e,
        "bridge_origin": origin[0],
        "engine_origin": origin[1],
    }
    if field in SHAPE_FIELDS:
        return Row(**values, kind="shape", note="equal" if b == e else "DIFFERS")
    if b == e:
        return Row(**values, kind="same") if field in WATCHED else None
    kind, note = classify(field, root)
    return Row(**values, kind=kind, note=note)


def _model_rows(container: Any, plan: Any, root: RootConfig, cls: type, kw: dict[str, Any]) -> list[Row]:
    provider, ours = container.model, plan.overrides.get("model", {})
    rows = []
    for f in dataclasses.fields(cls):
        if not f.init or not hasattr(provider, f.name):
            continue
        bridge, engine = getattr(provider, f.name), kw[f.name] if f.name in kw else _default(f)
        if f.name == "moe_layer_freq":
            bridge, engine = _layer_freq(bridge, provider.num_layers), _layer_freq(engine, kw["num_layers"])
        origin = (
            "recipes/" if f.name in ours else "Bridge",
            "megatron_model" if f.name in kw else "Megatron-Core default",
        )
        row = _row(f"model.{f.name}", bridge, engine, root, origin=origin)
        if row is not None:
            rows.append(row)
    return rows


def _gpt_model_rows(container: Any, root: RootConfig, engine_gpt: dict[str, Any]) -> list[Row]:
    m = container.model
    vocab = m.vocab_size
    if m.should_pad_vocab:
        vocab = padded_vocab_size(vocab, m.make_vocab_size_divisible_by, m.tensor_model_parallel_size)
    bridge = {
        "vocab_size": vocab,
        "max_sequence_length": m.seq_length,
        "share_embeddings_and_output_weights": m.share_embeddings_and_output_weights,
        "position_embedding_type": m.position_embedding_type,
        "rotary_base": m.rotary_base,
    }
    return [r for k, v in bridge.items() if (r := _row(f"gpt_model.{k}", v, engine_gpt[k], root))]


def _layers_row(container: Any, root: RootConfig, use_te: bool) -> Row:
    """Which layer modules each side builds (Bridge: `transformer_layer_spec` of its GPT provider)."""
    from megatron.bridge.models import gpt_provider

    m = container.model
    spec = getattr(m.transformer_layer_spec, "__name__", type(m.transformer_layer_spec).__name__)
    te_specs = (gpt_provider.default_layer_spec.__name__, gpt_provider.transformer_engine_layer_spec.__name__)
    bridge = "te_full" if m.use_transformer_engine_full_layer_spec else "te" if spec in te_specs else spec
    row = _row("layers.implementation", bridge, "te" if use_te else "local", root)
    assert row is not None  # a shape row
    return row


def _section_rows(section: str, bridge_cfg: Any, engine_cfg: Any, root: RootConfig) -> list[Row]:
    """Rows of the fields of `engine_cfg`'s dataclass (Megatron-Core's) whose values differ on the two sides."""
    rows = []
    for f in dataclasses.fields(engine_cfg):
        if hasattr(bridge_cfg, f.name):
            row = _row(f"{section}.{f.name}", getattr(bridge_cfg, f.name), getattr(engine_cfg, f.name), root)
            if row is not None:
                rows.append(row)
    return rows


def _train_rows(container: Any, root: RootConfig) -> list[Row]:
    t, e, par = container.train, root.engine, root.parallelism
    bridge_gc = (
        f"full collection every {t.manual_gc_interval} steps" if t.manual_gc else "Python's automatic GC"
    )
    engine_gc = "young generations at each step start" if e.manual_gc else "Python's automatic GC"
    pairs = {
        "micro_batch_size": (t.micro_batch_size, par.mbs),
        "global_batch_size": (t.global_batch_size, par.gbs),
        "manual_gc": (bridge_gc, engine_gc),
        "empty_unused_memory_level": (t.empty_unused_memory_level, e.empty_unused_memory_level),
    }
    return [r for k, (b, v) in pairs.items() if (r := _row(f"train.{k}", b, v, root))]


def _data_rows(container: Any, root: RootConfig) -> list[Row]:
    from bench.engines.megatron_data import parse_data_spec

    ds, kind = container.dataset, parse_data_spec(root.bench.data)[0]
    bridge_loader = (
        f"{'MockGPTDataset' if ds.blend is None else 'GPTDataset'} in a DataLoader "
        f"(num_workers={ds.num_workers}, pin_memory={ds.pin_memory})"
    )
    engine_loader = (
        "megatron_data.mock_batches (made on the GPU)" if kind == "mock" else "megatron_data.indexed_batches"
    )
    to_gpu = not getattr(ds, "skip_getting_attention_mask_from_dataset", True)  # Bridge's gpt_step.get_batch
    pairs = {
        "loader": (bridge_loader, engine_loader),
        "create_attention_mask": (ds.create_attention_mask, False),
        "attention_mask_to_gpu": (to_gpu, False),
    }
    return [r for k, (b, v) in pairs.items() if (r := _row(f"data.{k}", b, v, root))]


def _env_rows(container: Any, root: RootConfig) -> list[Row]:
    """Process environment: Bridge's recipe variables (set at `pretrain` start) vs the launcher's (both sides)."""
    launcher = {str(k): str(v) for k, v in root.launcher.env.items()}
    bridge = {str(k): str(v) for k, v in container.env_vars.items()}
    rows = []
    for name in sorted(bridge.keys() | launcher.keys()):
        row = _row(f"env.{name}", bridge.get(name, "unset"), launcher.get(name, "unset"), root)
        if row is not None:
            rows.append(row)
    return rows


def _engine_optimizer_config(root: RootConfig) -> Any | None:
    """The Megatron OptimizerConfig the engine's AdamW / Megatron Muon builder passes Megatron (None for ours)."""
    from bench.engines import megatron_optim

    return megatron_optim.megatron_config(root)


def compare(args: list[str], *, hf_dir: Any = None) -> Diff:
    """Build both sides' configs of the experiment `args` select and compare them (see the module docstring).

    Bridge must be importable here (`recipes.bridge.require_bridge`; the tests import it without TE).
    """
    import copy

    import muonbench
    from bench.engines import megatron_model as mm
    from bench.engines.bridge import bridge_step_flops
    from bench.engines.megatron import ddp_config
    from bench.flops import model_flops_per_step
    from recipes.bridge import make_config_container

    shared, engine_only = split_args(args)
    bridge_root = muonbench.load(shared)
    engine_root = muonbench.load([*shared, *ENGINE_SIDE, *engine_only])
    built, plan = make_config_container(bridge_root, hf_dir=hf_dir)
    container = copy.deepcopy(built)
    container.mixed_precision.setup(container.model, container.optimizer, container.ddp)

    layers = engine_root.engine.layers
    use_te = mm.te_available() if layers == "auto" else layers == "te"
    opts = mm.build_options(engine_root, use_te=use_te)
    cls, kw = mm.transformer_config_kwargs(engine_root.model, engine_root.parallelism, opts)
    par = engine_root.parallelism
    rows = [
        _layers_row(container, engine_root, use_te),
        *_model_rows(container, plan, engine_root, cls, kw),
        *_gpt_model_rows(container, engine_root, mm.gpt_model_kwargs(engine_root.model, tp=par.tp)),
        *_train_rows(container, engine_root),
        *_section_rows("ddp", container.ddp, ddp_config(engine_root), engine_root),
        *_data_rows(container, engine_root),
        *_env_rows(container, engine_root),
    ]
    flops = _row(
        "flops.model_flops_per_step",
        bridge_step_flops(container, bridge_root.parallelism.gbs),
        model_flops_per_step(engine_root.model, par),
        engine_root,
    )
    assert flops is not None  # a shape row
    rows.append(flops)
    opt = _engine_optimizer_config(engine_root)
    if opt is not None:
        rows += _section_rows("optimizer", container.optimizer, opt, engine_root)
    return Diff(
        experiment=bridge_root.experiment_name,
        bridge_overrides=shared,
        engine_overrides=[*shared, *ENGINE_SIDE, *engine_only],
        rows=rows,
    )


def render(diff: Diff) -> str:
    """The comparison as markdown: shapes, then the settings that can change the step time, then the inert ones."""

    def cell(value: Any, origin: str) -> str:
        return repr(value) + (f" ({origin})" if origin else "")

    def table(rows: list[Row], last: str) -> list[str]:
        out = [f"| field | Megatron-Bridge | megatron engine | {last} |", "|---|---|---|---|"]
        return out + [
            f"| `{r.field}` | {cell(r.bridge, r.bridge_origin)} | {cell(r.engine, r.engine_origin)} | {r.note} |"
            for r in rows
        ]

    lines = [
        f"# Megatron-Bridge vs the megatron engine: {diff.experiment}",
        "",
        f"Bridge: `{' '.join(diff.bridge_overrides)}`; engine: `{' '.join(diff.engine_overrides)}`.",
        "",
        "## Shapes, batch and FLOPs",
        "",
        *table(diff.of_kind("shape"), "equal"),
        "",
        "## Settings that differ and can change the step time",
        "",
        *table(diff.of_kind("perf", "unclassified"), "what it does here"),
        "",
        "## Settings that differ without effect on this layout",
        "",
        *table(diff.of_kind("inert"), "why"),
        "",
        "## Settings that can change the step time and agree",
        "",
        *table(diff.of_kind("same"), ""),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    from muonbench.cli_help import module_help
    from recipes.bridge import require_bridge

    if module_help(__doc__, list(args)):
        return 0
    try:
        split_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        require_bridge()
    except ValueError as exc:
        raise SystemExit(f"bench.tools.bridge_diff: {exc}") from None
    print(render(compare(args)), end="")
    return 0


if __name__ == "__main__":
    from bench import entry

    raise SystemExit(entry.run(main))
