"""Typed schemas of the Hydra config tree (`conf/`).

Each config group registers one dataclass schema in Hydra's ConfigStore (``base_<group>``); every YAML of the group
names it in its defaults list, so a typo or a wrong type fails at compose time. ``validate`` checks the rules that
span groups (world size, expert and pipeline divisibility, batch sizes) and names the field, the value and the rule.

This module imports no torch and no Megatron: a login node can compose, validate and launch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, make_dataclass
from types import UnionType
from typing import Any, ClassVar, Literal, Optional, Union, get_args, get_origin, get_type_hints

from omegaconf import MISSING

from optim import registry
from optim.configs import AdamWConfig, RoutingConfig

# The optimizer schemas are generated from `optim`'s config dataclasses, so their defaults are `optim`'s
# (emerging-optimizers 0.3.0); the YAML files of conf/optimizer/ state the recipe values that differ.
_ADAMW = AdamWConfig()


# --------------------------------------------------------------------------------------------------------------
# model
# --------------------------------------------------------------------------------------------------------------
@dataclass
class ModelConfig:
    """A decoder-only MoE transformer, described in Megatron's terms (weights out x in)."""

    name: str = MISSING
    """Config name, e.g. `qwen3_30b_a3b`."""
    family: str = MISSING
    """The transformers model_type: llama, mistral, qwen2, qwen3, gemma2, phi3 (dense GQA); qwen3_moe, qwen2_moe,
    mixtral, olmoe, gpt_oss (MoE GQA); deepseek_v2, deepseek_v3 (MLA; DeepSeek-V3 and Kimi K2 are deepseek_v3).
    `model=hf:<config.json>` reads it from a config (muonbench/hf_model.py); the table: muonbench/families.py."""
    num_layers: int = MISSING
    hidden_size: int = MISSING
    num_attention_heads: int = MISSING
    attention: str = "gqa"
    """`gqa` or `mla`."""
    num_query_groups: int = 0
    """GQA: number of KV groups (0 for MLA)."""
    kv_channels: int = 0
    """GQA: head dimension."""
    q_lora_rank: int = 0
    """MLA: query down-projection rank (0 = no query compression)."""
    kv_lora_rank: int = 0
    """MLA: KV latent rank."""
    qk_head_dim: int = 0
    """MLA: per-head q/k dim without the rope part."""
    qk_pos_emb_head_dim: int = 0
    """MLA: rope part of q/k per head."""
    v_head_dim: int = 0
    """MLA: value head dim."""
    ffn_hidden_size: int = 0
    """FFN size of the dense (non-MoE) layers."""
    num_dense_layers: int = 0
    """The first `num_dense_layers` layers are dense (Kimi K2: 1); the rest are MoE."""
    num_experts: int = 0
    moe_router_topk: int = 0
    moe_ffn_hidden_size: int = 0
    moe_shared_expert_intermediate_size: int = 0
    """0 = no shared expert."""
    vocab_size: int = MISSING
    make_vocab_size_divisible_by: int = 128
    seq_length: int = 4096
    gated_linear_unit: bool = True
    qk_layernorm: bool = True
    qkv_bias: bool = False
    """Biases on the query, key and value projections (Qwen2); every other linear layer has none."""
    norm_eps: float = 1e-6
    rotary_base: float = 10000.0
    tie_embeddings: bool = False
    moe_aux_loss_coeff: float = 1e-3
    # Router and rope details the HF / Megatron builders need.
    moe_router_score_function: str = "softmax"
    """`softmax` (Qwen3) or `sigmoid` (Kimi K2 / DeepSeek-V3)."""
    moe_router_topk_scaling_factor: float = 1.0
    """Scale of the routed-expert output (Kimi K2: 2.827)."""
    moe_router_enable_expert_bias: bool = False
    """Aux-loss-free load balancing bias (Kimi K2: True)."""
    moe_router_pre_softmax: bool = False
    """Softmax over all experts before top-k, weights not renormalised (OLMoE: norm_topk_prob false); False = softmax
    over the top-k scores (Qwen3-MoE, Mixtral)."""
    rope_scaling_factor: float = 1.0
    """RoPE scaling factor (Kimi K2 YaRN: 32; Llama 3.1/3.2: 8/32); 1.0 = no rope scaling."""
    rope_original_max_position_embeddings: int = 0
    """The context the scaling stretches (Kimi K2: 4096; Llama 3.1: 8192); 0 when rope_scaling_factor == 1."""
    rope_scaling_type: str = "yarn"
    """`yarn` or `llama3` (Llama 3.1 frequency scaling, low/high frequency factors 1 and 4); read only when
    rope_scaling_factor != 1."""
    sliding_window: int = 0
    """Sliding-window attention: the tokens a query of a sliding layer sees, itself included (the Hugging Face
    `sliding_window`; Mistral v0.1 4096, Gemma 2 4096, gpt-oss 128, Phi-3-mini 2047); 0 = full attention everywhere."""
    window_attn_skip_freq: int = 0
    """With a sliding window: every N-th layer (1-based) attends fully, the others slide (Megatron's
    `window_attn_skip_freq`; Gemma 2 and gpt-oss: 2); 0 = every layer slides."""
    activation: str = "silu"
    """The gated feed-forward's activation: `silu` (SwiGLU) or `gelu_tanh` (GeGLU, Gemma 2)."""
    mtp_num_layers: int = 0
    """Multi-token-prediction layers (both published models: 0)."""
    source: str = ""
    """`hf:<spec>` when the fields were read from a Hugging Face config (`model=hf:<spec>`); '' for conf/model."""
    trust_remote_code: bool = False
    """`model=hf:<spec>` only: let transformers run the config's own code (auto_map) to read it."""


# --------------------------------------------------------------------------------------------------------------
# parallelism
# --------------------------------------------------------------------------------------------------------------
DISTRIBUTED_CHOICES: tuple[str, ...] = ("none", "layerwise")
"""`parallelism.distribution.distributed`: every DP rank orthogonalizes every matrix, or whole matrices per rank."""


@dataclass
class DistributionConfig:
    """How a matrix optimizer (muon, mop, soap_rekls) spreads its work over the parallel layout: the TP mode of
    Newton-Schulz and the layer-wise distributed optimizer. AdamW reads none of it (Megatron's distributed optimizer).
    """

    tp_mode: str = "blockwise"
    """duplicated | distributed | distributed_gram | blockwise | auto (moot at TP=1)."""
    distributed: str = "layerwise"
    """none | layerwise (whole matrices per DP rank)."""
    assignment: str = "lpt_cost"
    """round_robin | ping_pong_numel | lpt_cost."""
    grad_sync: str = "reduce_scatter"
    """reduce_scatter (ours, owner-aligned buckets) | all_reduce (published path)."""
    overlap_param_gather: bool = False
    """Leave the parameter all-gather in flight after the step and complete it in forward pre-hooks (the hf
    engine; the Megatron adapter gathers its fp32 masters at the step and refuses True at DP x CP > 1)."""
    overlap_grad_reduce: bool = False
    """Start each bucket's gradient reduce-scatter during backward (the hf engine then cannot time it apart)."""
    bucket_numel: int = 40_000_000
    """Elements per gradient/parameter bucket of the layer-wise optimizer."""
    collective: str = "auto"
    """auto | padded (one all_gather_into_tensor) | per_owner (one broadcast per owner): how all_gatherv moves."""


LAYERWISE_FIELDS: dict[str, str] = {
    "assignment": "strategy",
    "grad_sync": "grad_sync",
    "collective": "collective",
    "overlap_param_gather": "overlap_param_gather",
    "overlap_grad_reduce": "overlap_grad_reduce",
    "bucket_numel": "bucket_numel",
}
"""`parallelism.distribution` field -> the `optim.distributed.layerwise.LayerWiseConfig` field it sets (the rest,
`tp_mode` and `distributed`, choose the optimizer, not its layer-wise config)."""


def layerwise_fields(dist: DistributionConfig) -> dict[str, Any]:
    """The `LayerWiseConfig` keywords of `dist`, the one mapping every engine that runs the layer-wise optimizer
    uses (each adds its `max_grad_norm`)."""
    return {ours: getattr(dist, name) for name, ours in LAYERWISE_FIELDS.items()}


@dataclass
class ParallelismConfig:
    """A parallel layout. Data parallel size is derived: dp = world_size / (tp * pp * cp)."""

    name: str = MISSING
    world_size: int = MISSING
    """Total number of processes (GPUs, or CPU gloo ranks)."""
    tp: int = 1
    pp: int = 1
    vp: int = 1
    """Virtual pipeline stages per pipeline rank (1 = none)."""
    cp: int = 1
    ep: int = 1
    etp: int = 1
    """Expert tensor parallel size."""
    mbs: int = 1
    """Micro-batch size (sequences)."""
    gbs: int = 1
    """Global batch size (sequences)."""
    pipeline_layout: str = ""
    """Explicit Megatron pipeline layout string; empty = even split (layers divisible by pp * vp)."""
    sequence_parallel: bool = False
    nodes: int = 1
    gpus_per_node: int = 1
    distribution: DistributionConfig = field(default_factory=DistributionConfig)
    """The matrix optimizer's distribution over this layout (`parallelism.distribution.tp_mode`, ...)."""

    @property
    def dp(self) -> int:
        return self.world_size // (self.tp * self.pp * self.cp)

    @property
    def expert_dp(self) -> int:
        """Expert data parallel size: ranks of one pipeline stage that hold the same experts."""
        return (self.dp * self.tp * self.cp) // (self.ep * self.etp)

    @property
    def grad_accum(self) -> int:
        return self.gbs // (self.mbs * self.dp)


# --------------------------------------------------------------------------------------------------------------
# optimizer: the algorithm fields are `optim`'s config dataclasses themselves (one name per setting, YAML to kernel)
# --------------------------------------------------------------------------------------------------------------
@dataclass
class OptimizerSchemaBase:
    """What every optimizer config carries beside its algorithm: the LR schedule, clipping, the AdamW that steps the
    non-matrix parameters (named as Megatron-core's OptimizerConfig names them) and who implements the step."""

    name: str = MISSING
    """A registered optimizer (`optim.registry.OPTIMIZERS`): adamw | muon | mop | soap_rekls."""
    lr: float = _ADAMW.lr
    weight_decay: float = _ADAMW.weight_decay
    min_lr: float = 3e-5
    lr_warmup_steps: int = 2000
    lr_decay: str = "cosine"
    clip_grad: float = 1.0
    adam_beta1: float = _ADAMW.betas[0]
    adam_beta2: float = _ADAMW.betas[1]
    adam_eps: float = _ADAMW.eps
    implementation: str = "ours"
    """ours | megatron (Megatron's built-in TensorParallelMuon + LayerWiseDistributedOptimizer) | eo | torch."""


@dataclass
class AdamWSchema(OptimizerSchemaBase):
    """The AdamW baseline: its AdamWConfig is the non-matrix side's (`adamw_config`)."""

    name: str = "adamw"
    implementation: str = "torch"


@dataclass
class MatrixOptimizerSchema(OptimizerSchemaBase):
    """Base of the matrix optimizers; `optim.configs.RoutingConfig`'s fields are added with the algorithm's."""

    ALGORITHM: ClassVar[type]
    """The `optim` config class whose fields the generated schema has (the registry entry's `config`)."""


@dataclass
class MuonRunSchema(MatrixOptimizerSchema):
    ns_overlap: bool = False
    """engine=megatron, implementation=ours, DP x CP = 1: start each layer's NS in the last micro-batch's backward
    on a side stream, used at the step when clipping leaves the gradients unchanged (optim.megatron.overlap)."""


def _hydra_type(tp: Any) -> Any:
    """The OmegaConf-typed form of an `optim` field type: Literal -> str, tuple -> list, X | None -> Optional."""
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        return type(args[0])
    if origin is tuple:
        return list[_hydra_type(args[0])]  # type: ignore[misc]
    if origin in (Union, UnionType):
        inner = [a for a in args if a is not type(None)]
        return Optional[_hydra_type(inner[0])]  # noqa: UP045 -- OmegaConf reads typing.Optional
    return tp


def _thaw(value: Any) -> Any:
    return [_thaw(v) for v in value] if isinstance(value, tuple) else value


def _freeze(value: Any) -> Any:
    return tuple(_freeze(v) for v in value) if isinstance(value, list | tuple) else value


def _schema_fields(*classes: type) -> list[tuple[str, Any, Any]]:
    """(name, Hydra type, dataclasses.field) of every field of `classes`, with the classes' defaults."""
    out = []
    for cls in classes:
        hints = get_type_hints(cls)
        for f in fields(cls):
            default = f.default
            spec = (
                field(default_factory=lambda d=default: _thaw(d))
                if isinstance(default, tuple)
                else field(default=default)
            )
            out.append((f.name, _hydra_type(hints[f.name]), spec))
    return out


def _matrix_schema(name: str, algorithm: type, base: type = MatrixOptimizerSchema) -> type:
    cls = make_dataclass(
        f"{algorithm.__name__.removesuffix('Config')}Schema",
        [("name", str, field(default=name)), *_schema_fields(algorithm, RoutingConfig)],
        bases=(base,),
        namespace={
            "__doc__": f"`optimizer={name}`: {algorithm.__name__}'s and RoutingConfig's fields.",
            "ALGORITHM": algorithm,
        },
    )
    cls.__module__ = __name__
    return cls


RUN_FIELDS: dict[str, type] = {"muon": MuonRunSchema}
"""optimizer.name -> a schema base with the engine-side fields it has beside its algorithm's (Muon: ns_overlap)."""
OPTIMIZER_SCHEMAS: dict[str, type] = {"adamw": AdamWSchema}
"""optimizer.name -> its Hydra schema, generated from the registry entry's config (`optimizer_schemas`)."""


def optimizer_schemas() -> dict[str, type]:
    """Every registered optimizer's schema (`optim.registry.OPTIMIZERS`; matrix optimizers generated from their
    config class, once)."""
    for name in set(OPTIMIZER_SCHEMAS) - set(registry.OPTIMIZERS):
        del OPTIMIZER_SCHEMAS[name]
    for name, entry in registry.OPTIMIZERS.items():
        have = OPTIMIZER_SCHEMAS.get(name)
        if entry.matrix and (have is None or have.ALGORITHM is not entry.config):
            OPTIMIZER_SCHEMAS[name] = _matrix_schema(
                name, entry.config, RUN_FIELDS.get(name, MatrixOptimizerSchema)
            )
    return OPTIMIZER_SCHEMAS


optimizer_schemas()
MuonSchema = OPTIMIZER_SCHEMAS["muon"]
MOPSchema = OPTIMIZER_SCHEMAS["mop"]
SOAPSchema = OPTIMIZER_SCHEMAS["soap_rekls"]


def adamw_config(opt: OptimizerSchemaBase) -> AdamWConfig:
    """The AdamW of the non-matrix parameters (and the AdamW baseline)."""
    return AdamWConfig(
        lr=opt.lr, betas=(opt.adam_beta1, opt.adam_beta2), eps=opt.adam_eps, weight_decay=opt.weight_decay
    )


def algorithm_config(opt: OptimizerSchemaBase) -> Any:
    """The `optim` config of `opt`'s algorithm, field for field (its `__post_init__` checks the values)."""
    if not isinstance(opt, MatrixOptimizerSchema):
        return adamw_config(opt)
    cls = type(opt).ALGORITHM
    return cls(**{f.name: _freeze(getattr(opt, f.name)) for f in fields(cls)})


def routing_config(opt: OptimizerSchemaBase) -> RoutingConfig | None:
    """Which parameters the matrix optimizer takes; None for the AdamW baseline."""
    if not isinstance(opt, MatrixOptimizerSchema):
        return None
    return RoutingConfig(**{f.name: getattr(opt, f.name) for f in fields(RoutingConfig)})


def optim_configs(opt: OptimizerSchemaBase) -> tuple[Any, RoutingConfig | None, AdamWConfig]:
    """(algorithm config, RoutingConfig | None, AdamWConfig of the non-matrix side), as `optim.build_optimizer`
    and `optim.megatron` take them."""
    return algorithm_config(opt), routing_config(opt), adamw_config(opt)


# --------------------------------------------------------------------------------------------------------------
# hardware, precision, launcher, bench protocol (the engine group: muonbench.engines)
# --------------------------------------------------------------------------------------------------------------
@dataclass
class HardwareConfig:
    """Per-GPU rates and links; every number carries a source string."""

    name: str = MISSING
    peak_bf16_tflops: float = MISSING
    """Dense bf16 peak per GPU (TFLOP/s)."""
    peak_fp8_tflops: float = 0.0
    """Dense FP8/MXFP8 peak per GPU (TFLOP/s); 0 = not supported."""
    memory_gib: float = 0.0
    hbm_tbps: float = 0.0
    nvlink_gbps: float = 0.0
    """Unidirectional NVLink bandwidth per GPU (GB/s)."""
    nvlink_domain: int = 1
    """GPUs in one NVLink domain."""
    network_gbps: float = 0.0
    """Scale-out bandwidth per GPU (GB/s)."""
    network_latency_us: float = 0.0
    nvlink_latency_us: float = 0.0
    source: str = MISSING


@dataclass
class PrecisionConfig:
    name: str = MISSING
    """bf16 | fp8_mx."""
    params_dtype: str = "bf16"
    fp8_recipe: str = ""
    """'' | mxfp8."""
    fp8_param_gather: bool = False


@dataclass
class LauncherConfig:
    name: str = MISSING
    """local | slurm."""
    nproc_per_node: int = 0
    """0 = parallelism.gpus_per_node (or world_size for local)."""
    nodes: int = 0
    """0 = parallelism.nodes."""
    dry_run: bool = False
    # slurm
    partition: str = ""
    account: str = ""
    time_limit: str = "00:30:00"
    container_image: str = ""
    container_mounts: str = ""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables of the job (quoted when written to a script)."""
    via: str = "sbatch"
    """How the job starts: sbatch (`bench.slurm` writes the script) | nemo_run (NeMo-Run's SlurmExecutor, or its
    LocalExecutor for launcher=local; `bench.cluster`, docs/cluster.md)."""
    qos: str = ""
    constraint: str = ""
    gres: str = ""
    segment: int = 0
    """Slurm --segment: nodes that must share one NVLink domain (GB300 NVL72: at most 18); 0 = not set."""
    sbatch_args: list[str] = field(default_factory=list)
    """Further `--name=value` sbatch options, e.g. `launcher.sbatch_args=['--reservation=r1']`."""
    srun_args: list[str] = field(default_factory=list)
    """Further srun options of the training step, e.g. `launcher.srun_args=['--mpi=pmix']`."""


@dataclass
class BenchConfig:
    """The measurement protocol, stated in every report."""

    steps: int = 10
    warmup_steps: int = 3
    seed: int = 1234
    out_dir: str = "runs"
    """Root of run directories."""
    resume: str = ""
    """A sweep directory or `runs/LATEST.json` of an earlier `bench.run`: rerun its command, skipping the jobs whose
    run ended ok (given alone: `python -m bench.run bench.resume=runs/LATEST.json`)."""
    report_name: str = "latest"
    timeout_s: int = 1800
    """Seconds after which a run's launch (torchrun and its workers) is killed and recorded `timeout`."""
    budget_s: float = 0.0
    """Time budget of the invocation in seconds (0 = none): a job of a sweep that would start later than this many
    seconds after `bench.run` started is not launched and is recorded with status `skipped`; a running job is
    never stopped by it (`bench.timeout_s` bounds each job)."""
    data: str = "mock"
    """mock | indexed:<path prefix> (Megatron indexed dataset) | text:<path>."""
    log_every: int = 1
    progress: bool = True
    prewarm: bool = True
    """megatron + our matrix optimizer, local launcher: before the timed run, the same launch for one untimed step
    in a scratch directory, so the timed processes find our Triton kernels compiled and the NS plan measured on
    disk (a process that compiled them itself ran slower for its whole life: docs/megatron_h200.md, findings).
    Costs one setup and one first step."""
    optimizer_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Settings applied only when that optimizer runs, by `optimizer.name`: in a sweep over optimizers,
    `bench.optimizer_overrides.muon.num_ns_steps=6` sets Muon's NS steps and leaves AdamW alone
    (docs/configuration.md)."""
    allow_oversize: bool = False
    """Launch a config whose predicted peak memory (`bench.memory`) exceeds the hardware's memory, with a warning,
    instead of refusing it."""
    logger: str = "none"
    """Metrics sink of every step (rank 0): none | tensorboard (`<run_dir>/tensorboard`) | wandb | mlflow, each an
    optional extra of the same name (`bench.sinks`; the bridge engine also hands it to Bridge's LoggerConfig)."""
    logger_project: str = "muonbench"
    """W&B project and MLflow experiment of the runs (bench.logger=wandb | mlflow)."""
    probes: list[str] = field(default_factory=list)
    """megatron: diagnostics hooked into each step, by name (`experiments/<name>/probe.py`), with optional
    arguments: `[gpu_energy, "idle_before_step:seconds=0.3,mode=gpu_spin"]` (bench.probes)."""


@dataclass
class RootConfig:
    model: ModelConfig = MISSING
    parallelism: ParallelismConfig = MISSING
    optimizer: Any = MISSING
    hardware: HardwareConfig = MISSING
    precision: PrecisionConfig = MISSING
    engine: Any = MISSING
    """The selected engine's own config (`muonbench.engines.ENGINES`; a tagged union on `engine.name`)."""
    launcher: LauncherConfig = MISSING
    bench: BenchConfig = field(default_factory=BenchConfig)
    experiment_name: str = ""


SCHEMAS: dict[str, type] = {
    "model": ModelConfig,
    "parallelism": ParallelismConfig,
    "hardware": HardwareConfig,
    "precision": PrecisionConfig,
    "launcher": LauncherConfig,
}


RENAMED_OPTIMIZER_FIELDS = {
    "split_mla": "split_mla_kv_down",
    "router_to_matrix_optimizer": "router_to_matrix",
}
"""Optimizer fields of older run records -> today's names (the names of `optim.configs.RoutingConfig`)."""


def lift_record(config: dict[str, Any]) -> dict[str, Any]:
    """A resolved config dict (run.json) in today's field names (a copy; `config` is not changed): records written
    while the optimizer schema held the distribution fields have them moved to `parallelism.distribution`, and
    renamed optimizer fields take their new names, and fields deleted since are dropped (the engine's:
    `compose.config_from_dict`)."""
    names = {f.name for f in fields(DistributionConfig)}
    opt = {RENAMED_OPTIMIZER_FIELDS.get(k, k): v for k, v in (config.get("optimizer") or {}).items()}
    par = dict(config.get("parallelism") or {})
    dist = {**{k: opt.pop(k) for k in list(opt) if k in names}, **(par.get("distribution") or {})}
    out = {**config, "optimizer": opt, "parallelism": {**par, "distribution": dist}}
    for group, cls in SCHEMAS.items():  # fields deleted since (model.proxy_of, hardware.measured_matmul_tflops)
        if isinstance(out.get(group), dict):
            own = {f.name for f in fields(cls)}
            out[group] = {k: v for k, v in out[group].items() if k in own}
    return out
