"""The engine registry: each engine owns its config (the `engine` group's schema) and its rules.

`RootConfig.engine` is the selected engine's own config dataclass (a tagged union on `engine.name`), so a field of
one engine cannot be set on another: `engine=hf engine.manual_gc=true` is refused at compose time. An entry holds
the config class, the `Engine` class that runs it (`module:Class`, imported by the worker only), the rules of its own
group (`validate`, at compose time) and what it cannot run (`check`, before launch: `muonbench.check_runnable`).

Adding an engine: its `Engine` subclass (`bench/engines/<name>.py`), its config and rules with one entry here, and
its YAML under `conf/engine/`. No torch here: a login node composes and checks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING

from muonbench.errors import fail
from optim import registry


# --------------------------------------------------------------------------------------------------------------
# configs
# --------------------------------------------------------------------------------------------------------------
@dataclass
class EngineConfig:
    """What every engine has: where its ranks run."""

    name: str = MISSING
    """A registered engine (`ENGINES`): hf | megatron | bridge."""
    device: str = "cpu"
    """cpu | cuda."""
    backend: str = "gloo"
    """torch.distributed backend: gloo | nccl."""
    requires_gpu: bool = False


@dataclass
class HFEngineConfig(EngineConfig):
    """transformers' models built from the model config; CPU (gloo) or one GPU, data parallel only."""

    name: str = "hf"


@dataclass
class MegatronEngineConfig(EngineConfig):
    """Megatron-Core's training loop (`bench/engines/megatron.py`)."""

    name: str = "megatron"
    empty_unused_memory_level: int = 0
    """As Megatron-LM's `--empty-unused-memory-level`: 1 = `torch.cuda.empty_cache()` after the optimizer step,
    2 = also after forward-backward (both inside the timed step)."""
    manual_gc: bool = False
    """Python's threshold GC off during steps, a young-generation collection at the start of each step (inside the
    timed step) and `gc.freeze()` after setup, as Megatron-LM's `--manual-gc`: a full collection over a model's
    millions of objects in the middle of a host-synchronising MoE forward stalls the GPU."""
    layers: str = "auto"
    """Layer implementation: auto (Transformer Engine's layer specs where TE imports, else local) | te | local
    (Megatron-Core's local layers with SDPA attention and grouped-GEMM experts)."""
    moe_permute_fusion: bool = False
    """Transformer Engine's fused MoE token permute / unpermute (Megatron-Core `moe_permute_fusion`, on in
    Megatron-Bridge's Qwen3 recipe); needs Transformer Engine to import, with TE or local layers."""
    apply_rope_fusion: bool = False
    """Transformer Engine's fused rotary embedding (Megatron-Core `apply_rope_fusion`, on in Megatron-Bridge's
    benchmark settings); needs Transformer Engine to import, with TE or local layers."""
    moe_router_fusion: bool = False
    """Transformer Engine's fused router top-k with its score function and aux-loss scores (Megatron-Core
    `moe_router_fusion`, on in Megatron-Bridge's benchmark settings); needs Transformer Engine to import, with TE
    or local layers."""
    moe_router_dtype: str = "fp32"
    """Precision of the router's logits, scores and aux loss (Megatron-Core `moe_router_dtype`): fp32 | fp64 |
    none (the activations' dtype, bf16 here; Megatron-Core's None, as Megatron-Bridge's Qwen3 recipe)."""
    grad_reduce_in_fp32: bool = True
    """fp32 main-grad buffer, into which every micro-batch's weight gradients are added and which DDP reduces
    (Megatron-Core DDP `grad_reduce_in_fp32`); false keeps it in the parameters' bf16, as Megatron-Bridge's bf16
    preset does."""


@dataclass
class BridgeEngineConfig(EngineConfig):
    """A Megatron-Bridge recipe (`recipes/`, NeMo container) run by Bridge's pretrain loop."""

    name: str = "bridge"
    ab_mode: str = "published"
    """`published` (MB's A/B: AdamW with distributed optimizer, param-gather overlap and MXFP8 gather; Muon without)
    or `fair` (the same param-gather and FP8 settings for every optimizer)."""
    recipe: str = ""
    """A Megatron-Bridge recipe function by dotted path (`megatron.bridge.recipes.llama.llama3_8b_pretrain_config`)
    used instead of the model family's recipe; `model` still sets the shapes and the run's layout, precision,
    optimizer and benchmark settings are applied on top (docs/bridge_recipes.md)."""


# --------------------------------------------------------------------------------------------------------------
# rules
# --------------------------------------------------------------------------------------------------------------
def _choices(engine: Any, allowed: dict[str, tuple[Any, ...]]) -> None:
    for name, values in allowed.items():
        if getattr(engine, name) not in values:
            fail(f"engine.{name}", getattr(engine, name), f"must be one of {list(values)}")


def _validate_megatron(engine: Any) -> None:
    _choices(
        engine,
        {
            "layers": ("auto", "te", "local"),
            "empty_unused_memory_level": (0, 1, 2),
            "moe_router_dtype": ("fp32", "fp64", "none"),
        },
    )


def _validate_bridge(engine: Any) -> None:
    _choices(engine, {"ab_mode": ("published", "fair")})


def _check_hf(root: Any) -> None:
    par, opt = root.parallelism, root.optimizer
    check_family_read(root)
    check_family_bias(root)
    check_features(root)
    for knob in ("tp", "pp", "cp", "ep", "etp"):
        if getattr(par, knob) != 1:
            fail(
                f"parallelism.{knob}",
                getattr(par, knob),
                "the hf engine is data parallel only (allowed: 1); use engine=megatron for model parallelism",
            )
    if root.precision.name != "bf16":
        fail("precision.name", root.precision.name, "the hf engine has no FP8 path; allowed: ['bf16']")
    allowed = ("ours",) if registry.spec(opt.name).matrix else ("torch",)
    if opt.implementation not in allowed:
        fail(
            "optimizer.implementation",
            opt.implementation,
            f"the hf engine runs {opt.name} as {list(allowed)} "
            "(Megatron's built-in Muon, optimizer=muon_megatron, runs under engine=megatron)",
        )
    if getattr(opt, "ns_overlap", False):
        fail("optimizer.ns_overlap", True, "engine=megatron only (its hooks live in Megatron's backward)")


def _check_megatron(root: Any) -> None:
    opt, par, impl = root.optimizer, root.parallelism, root.optimizer.implementation
    check_family_read(root)
    check_features(root)
    m = root.model
    if "llama3 RoPE scaling" in features(m) and m.rope_original_max_position_embeddings != LLAMA3_CONTEXT:
        fail(
            "model.rope_original_max_position_embeddings",
            m.rope_original_max_position_embeddings,
            f"Megatron-Core's llama3 RoPE scaling stretches a {LLAMA3_CONTEXT}-token context; allowed: "
            f"[{LLAMA3_CONTEXT}] (engine=hf builds any)",
        )
    if not registry.spec(opt.name).matrix:
        return
    if impl not in ("ours", "megatron"):
        fail("optimizer.implementation", impl, "the megatron engine runs ['ours', 'megatron']")
    if impl == "megatron" and opt.name != "muon":
        fail(
            "optimizer.implementation",
            impl,
            f"only muon is built into Megatron (optimizer.name={opt.name!r})",
        )
    if impl != "ours":
        return
    check_layerwise_ours(root)
    if getattr(opt, "ns_overlap", False):
        if par.pp != 1:
            fail("optimizer.ns_overlap", True, f"needs PP = 1 (parallelism.pp={par.pp})")
        if par.dp * par.cp != 1:
            fail(
                "optimizer.ns_overlap",
                True,
                f"needs DP x CP = 1 (DP x CP = {par.dp * par.cp}): at DP > 1 the gradients are reduced after "
                "the backward, so they are not final at its hooks",
            )
    check_adapter_overlap(root)


def _check_bridge(root: Any) -> None:
    check_family_bias(root)
    check_features(root)
    if registry.spec(root.optimizer.name).matrix and root.optimizer.implementation == "ours":
        check_layerwise_ours(root)
        check_adapter_overlap(root)


LLAMA3_CONTEXT = 8192
"""The original context Megatron-Core's llama3 RoPE scaling assumes (`RotaryEmbedding._apply_scaling`)."""


def features(model: Any) -> dict[str, tuple[str, Any]]:
    from muonbench.families import features as of

    return of(model)


def check_family_read(root: Any) -> None:
    """A family outside the table (read through Megatron-Bridge's AutoBridge) has no builder here but Bridge's."""
    from muonbench.families import FAMILIES

    if root.model.family not in FAMILIES:
        fail(
            "model.family",
            root.model.family,
            f"read through Megatron-Bridge's AutoBridge (muonbench.families has no reader of its own), so only "
            f"engine=bridge builds it (engine={root.engine.name}); the families read here: {list(FAMILIES)}",
        )


def check_features(root: Any) -> None:
    """Refuse, naming the setting, an architecture feature of the model (`muonbench.families.features`) that the
    engine does not build, so it is never dropped; the message names the engines that build it."""
    builds = spec(root.engine.name).features
    for name, (field, value) in features(root.model).items():
        if builds is not None and name not in builds:
            others = [n for n, e in ENGINES.items() if e.features is None or name in e.features]
            fail(field, value, f"{name} is not built by engine={root.engine.name} (engines that build it: {others})")
        if spec(root.engine.name).features_from_source and not root.model.source:
            fail(field, value, f"engine={root.engine.name} builds {name} only as AutoBridge reads it (model=hf:<spec>)")


def check_family_bias(root: Any) -> None:
    """`model.qkv_bias` on an engine that builds the family's attention (hf: transformers' class; bridge: the
    family's recipe or AutoBridge): the value must be the family's, or it would be dropped."""
    from muonbench.families import FAMILIES

    m = root.model
    if m.family not in FAMILIES:  # AutoBridge's provider: its own biases
        return
    built = FAMILIES[m.family].qkv_bias
    if m.qkv_bias != built:
        fail(
            "model.qkv_bias",
            m.qkv_bias,
            f"the {root.engine.name} engine builds {m.family}'s attention, which has "
            f"{'' if built else 'no '}q/k/v biases; allowed: [{built}] (engine=megatron builds either)",
        )


def check_layerwise_ours(root: Any) -> None:
    """What `optim.megatron.build_ours` refuses inside a rank, checked before launch (megatron and bridge)."""
    par, dist = root.parallelism, root.parallelism.distribution
    sharded = par.tp > 1 or (root.model.num_experts > 0 and par.etp > 1)
    if sharded and dist.tp_mode != "blockwise" and dist.distributed == "layerwise" and par.dp * par.cp > 1:
        fail(
            "parallelism.distribution.tp_mode",
            dist.tp_mode,
            f"the layer-wise optimizer at DP x CP = {par.dp * par.cp} > 1 with TP = {par.tp}, expert TP = "
            f"{par.etp} orthogonalizes each TP shard alone; allowed: ['blockwise'] "
            "(or parallelism.distribution.distributed=none)",
        )


def check_adapter_overlap(root: Any) -> None:
    """The overlap switches the Megatron adapter's layer-wise optimizer cannot follow (`MegatronLayerWise`)."""
    par, dist = root.parallelism, root.parallelism.distribution
    if dist.distributed != "layerwise" or par.dp * par.cp == 1:
        return
    for name in ("overlap_param_gather", "overlap_grad_reduce"):
        if getattr(dist, name):
            fail(
                f"parallelism.distribution.{name}",
                True,
                f"the {root.engine.name} engine's layer-wise optimizer (optimizer.implementation=ours) steps fp32 "
                "master copies after the backward and gathers them at the step; allowed: [False] "
                "(engine=hf overlaps both)",
            )


def _nothing(arg: Any) -> None:
    return None


# --------------------------------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class EngineSpec:
    """One engine: its config and its rules."""

    config: type
    """Its config dataclass (a subclass of `EngineConfig`): the schema of `engine=<name>`."""
    engine: str
    """`module:Class` of its `bench.engines.base.Engine` subclass (imported by the worker only)."""
    validate: Callable[[Any], None] = _nothing
    """Rules of its own group, on its config (allowed sets), at compose time."""
    check: Callable[[Any], None] = _nothing
    """What it cannot run, on the whole `RootConfig`, before launch (`muonbench.check_runnable`)."""
    preflight: str = ""
    """`module:function` of further checks on the whole `RootConfig` that need its own packages as plain data (no
    GPU), run by `bench.run`'s preflight; '' for none."""
    data: tuple[str, ...] = ("mock",)
    """The `bench.data` kinds it reads (`mock`, `text:<file>`, `indexed:<path prefix>`)."""
    probes: bool = False
    """It runs `bench.probes` in its step."""
    prewarm: bool = False
    """`bench.prewarm` applies to it (one untimed step before the timed run, our kernels compiled on disk)."""
    param_bytes: int = 2
    """Bytes of one weight (and one gradient) element it keeps (the memory lower bound, `bench.memory`)."""
    grad_bytes: int = 4
    """Bytes of one gradient element in the buffer it reduces (Megatron-Core's fp32 `main_grad`; Bridge's bf16
    buffers), for the predicted peak (`bench.memory.features`)."""
    megatron_core: bool = False
    """Its step is Megatron-Core's (its DDP, optimizer and layers): the performance model describes it
    (`bench.tools.perfmodel.constants.engine_calibration`)."""
    features_from_source: bool = False
    """It builds the architecture features only as AutoBridge reads them from a checkpoint (`model.source`,
    `model=hf:<spec>`): a conf/model model with one is refused (Bridge's recipes have none)."""
    plans_bridge: bool = False
    """It runs a Megatron-Bridge recipe: a Slurm launch builds and keeps the recipe plan before the job queues
    (`bench.slurm.check_bridge_plan`)."""
    ns_overlap: bool = False
    """Its backward runs the Newton-Schulz overlap hooks (`optimizer.ns_overlap`), a setting `recommend` searches."""
    features: frozenset[str] | None = None
    """The architecture features (`muonbench.families.features`) it builds; None = every one (it builds each
    family's own layers: transformers' classes, Bridge's AutoBridge providers). The others are refused."""


ENGINES: dict[str, EngineSpec] = {
    "hf": EngineSpec(
        config=HFEngineConfig,
        engine="bench.engines.hf:HFEngine",
        check=_check_hf,
        data=("mock", "text"),
        param_bytes=4,
    ),
    "megatron": EngineSpec(
        config=MegatronEngineConfig,
        engine="bench.engines.megatron:MegatronEngine",
        validate=_validate_megatron,
        check=_check_megatron,
        data=("mock", "indexed"),
        probes=True,
        prewarm=True,
        megatron_core=True,
        ns_overlap=True,
        features=frozenset({"llama3 RoPE scaling", "shared-expert gate"}),
    ),
    "bridge": EngineSpec(
        config=BridgeEngineConfig,
        engine="bench.engines.bridge:BridgeEngine",
        validate=_validate_bridge,
        check=_check_bridge,
        data=("mock", "indexed"),
        preflight="recipes.overrides:preflight",
        grad_bytes=2,
        megatron_core=True,
        features_from_source=True,
        plans_bridge=True,
    ),
}
"""`engine.name` -> its entry."""


def spec(name: str) -> EngineSpec:
    """The entry of `engine.name`; ConfigError naming the value and the registered engines."""
    if name not in ENGINES:
        fail("engine.name", name, f"must be one of {list(ENGINES)}")
    return ENGINES[name]


def validate(engine: Any) -> None:
    """The rules of the engine group: the device every engine shares, then the engine's own."""
    entry = spec(engine.name)
    _choices(engine, {"device": ("cpu", "cuda"), "backend": ("gloo", "nccl")})
    if engine.requires_gpu and engine.device != "cuda":
        fail("engine.device", engine.device, f"engine {engine.name!r} runs on GPUs only (device=cuda)")
    if engine.device == "cuda" and engine.backend != "nccl":
        fail("engine.backend", engine.backend, "device=cuda uses the nccl backend")
    entry.validate(engine)


def preflight(root: Any) -> None:
    """The selected engine's `preflight` on `root` (nothing for an engine without one)."""
    entry = spec(root.engine.name)
    if entry.preflight:
        registry.load(entry.preflight)(root)


def owner_of(field: str) -> list[str]:
    """The engines whose config has `field` (the refusal of a field set on another engine names them)."""
    from dataclasses import fields

    return [name for name, e in ENGINES.items() if field in {f.name for f in fields(e.config)}]
