"""Compose, type and validate the Hydra config tree.

`load(["model=qwen3_30b_a3b", "parallelism=dp8_ep8"])` composes `conf/config.yaml` with overrides, converts once to
typed dataclasses (`OmegaConf.to_object`) and validates the cross-group rules. Errors are `ConfigError` (a
`ValueError`) naming the field, the value and the rule or the allowed set.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import json
import math
import re
import shutil
import tempfile
from dataclasses import asdict, fields, is_dataclass
from pathlib import Path
from typing import Any

from muonbench import engines, schema
from muonbench.errors import ConfigError, fail
from muonbench.families import FAMILIES
from muonbench.pipeline import parse_pipeline_layout
from optim import configs as C

# The Hydra tree ships inside the package (`muonbench/conf`, a link to the checkout's `conf/`): found from anywhere.
CONF_DIR = (Path(__file__).parent / "conf").resolve()

USER_CONFIG_DIRS: list[Path] = []
"""Directories given with `--config-dir` (a user's own config files, laid out like conf/); a file there takes
precedence over the shipped file of the same name (`config_dir`). Set by `take_config_dirs`."""
_MERGED: dict[tuple[Path, ...], Path] = {}

CONFIG_DIR_FLAGS = ("--config-dir", "-cd")

# The optimizer's choice sets are `optim.configs`' own; listed here so the error names the config path.
ALLOWED: dict[str, tuple[str | int, ...]] = {
    "model.attention": ("gqa", "mla"),
    "model.moe_router_score_function": ("softmax", "sigmoid"),
    "model.rope_scaling_type": ("yarn", "llama3"),
    "model.activation": ("silu", "gelu_tanh"),
    "optimizer.implementation": ("ours", "megatron", "eo", "torch"),
    "optimizer.lr_decay": ("cosine", "linear", "constant"),
    "parallelism.distribution.tp_mode": C.TP_MODE_CHOICES,
    "parallelism.distribution.distributed": schema.DISTRIBUTED_CHOICES,
    "parallelism.distribution.assignment": ("round_robin", "ping_pong_numel", "lpt_cost"),
    "parallelism.distribution.grad_sync": ("reduce_scatter", "all_reduce"),
    "parallelism.distribution.collective": ("auto", "padded", "per_owner"),
    "optimizer.nonfinite_policy": C.NONFINITE_POLICIES,
    "optimizer.scale_mode": tuple(dict.fromkeys((*C.MUON_SCALE_MODES, *C.MOP_SCALE_MODES))),
    "optimizer.coefficient_type": C.COEFFICIENT_TYPES,
    "optimizer.ns_precision": C.NS_PRECISIONS,
    "optimizer.polar_method": C.POLAR_METHODS,
    "optimizer.weight_decay_method": C.WEIGHT_DECAY_METHODS,
    "precision.name": ("bf16", "fp8_mx"),
    "launcher.name": ("local", "slurm"),
    "launcher.via": ("sbatch", "nemo_run"),
    "bench.logger": ("none", "tensorboard", "wandb", "mlflow"),
}

LOGGER_EXTRAS: dict[str, str] = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
"""`bench.logger` sink -> the Python package it needs, installed by the pyproject extra of the same name."""


_fail = fail


def register_configs() -> None:
    """Register every schema in Hydra's ConfigStore as `<group>/base_<group>` (optimizers and engines:
    `base_<name>`, from their registries)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="base_config", node=schema.RootConfig)
    for group, cls in schema.SCHEMAS.items():
        cs.store(group=group, name=f"base_{group}", node=cls)
    for name, cls in schema.optimizer_schemas().items():
        cs.store(group="optimizer", name=f"base_{name}", node=cls)
    for name, entry in engines.ENGINES.items():
        cs.store(group="engine", name=f"base_{name}", node=entry.config)


def load(
    overrides: list[str] | None = None, *, config_name: str = "config", validate_: bool = True
) -> schema.RootConfig:
    """Compose `conf/<config_name>.yaml` with Hydra overrides and return the typed, validated config."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import ConfigCompositionException, MissingConfigException

    register_configs()
    overrides = expand_hf(take_config_dirs(list(overrides or [])))
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    check_syntax(overrides)
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        try:
            cfg = compose(config_name=config_name, overrides=overrides)
        except (MissingConfigException, ConfigCompositionException) as exc:
            raise ConfigError(_explain_missing(exc)) from exc
    return to_typed(cfg, validate_=validate_, overrides=overrides)


def take_config_dirs(argv: list[str]) -> list[str]:
    """`argv` without its `--config-dir DIR` / `--config-dir=DIR` / `-cd DIR` flags; each DIR (which must exist) is
    added to `USER_CONFIG_DIRS`, so every later `load` and Hydra entry point also finds the user's config files."""
    rest: list[str] = []
    it = iter(argv)
    for arg in it:
        flag, eq, value = arg.partition("=")
        if flag not in CONFIG_DIR_FLAGS:
            rest.append(arg)
            continue
        if not eq:
            value = next(it, "")
        path = Path(value).expanduser().resolve()
        if not value or not path.is_dir():
            _fail(flag, value, "must name an existing directory of config files (laid out like conf/)")
        if path not in USER_CONFIG_DIRS:
            USER_CONFIG_DIRS.append(path)
    return rest


def config_dir() -> Path:
    """The config tree Hydra composes: `CONF_DIR`, or with `--config-dir` a merged copy of its YAML files where
    the user's files replace shipped ones of the same name (the first directory given wins). Hydra's own
    `hydra.searchpath` would let a shipped file shadow the user's."""
    if not USER_CONFIG_DIRS:
        return CONF_DIR
    key = tuple(USER_CONFIG_DIRS)
    if key not in _MERGED:
        root = Path(tempfile.mkdtemp(prefix="muonbench_conf_"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        for src in (CONF_DIR, *reversed(key)):
            for f in src.rglob("*.yaml"):
                if src != CONF_DIR:
                    _check_yaml(f)
                dest = root / f.relative_to(src)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f, dest)
        _MERGED[key] = root
    return _MERGED[key]


HF_MODEL = "hf"
"""The model option `model=hf:<spec>` composes (`conf/model/hf.yaml`) before its fields are read from <spec>."""


def expand_hf(overrides: list[str]) -> list[str]:
    """`model=hf:<spec>` -> `model=hf model.source='hf:<spec>' model.name='<its name>'` (quoted: any path a shell
    can name, any folder name, passes Hydra's grammar as a string): Hydra cannot select a file outside the config tree,
    so the placeholder is composed and `to_typed` fills its fields from <spec> (`_fill_from_hf`). Every entry point
    that hands overrides to Hydra passes them through here first."""
    out = []
    for item in overrides:
        key, sep, value = item.partition("=")
        if sep and key.lstrip("+") == "model" and value.startswith(f"{HF_MODEL}:"):
            if not value.removeprefix(f"{HF_MODEL}:").strip("'\""):
                _fail("model", value, "give a config: model=hf:<config.json, folder or Hub id>")
            from muonbench.hf_model import model_name

            # the name too, so that run folders (hydra.run.dir reads model.name) say which model ran
            spec = value.removeprefix(f"{HF_MODEL}:").strip("'\"")
            name = model_name(spec)
            out += [
                f"{key}={HF_MODEL}",
                f"model.source={quoted(f'{HF_MODEL}:{spec}')}",
                f"model.name={quoted(name)}",
            ]
        else:
            out.append(item)
    return out


def check_syntax(overrides: list[str]) -> None:
    """Raises ConfigError naming the first override Hydra's grammar cannot parse (one line, not Hydra's trace)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    for item in overrides:
        if item.startswith("-"):
            raise ConfigError(f"{item}: unknown option here (see --help); overrides are key=value")
        try:
            parser.parse_overrides([item])
        except OverrideParseException as exc:
            lines = [ln.strip() for ln in str(exc).splitlines()]
            why = [
                ln for ln in lines if ln.strip("^ ") and not ln.startswith(("Error parsing", "See ", "Lexer"))
            ]
            detail = f" ({why[0].split(' expecting ')[0]})" if why else ""
            raise ConfigError(
                f"override {item!r} is not Hydra override syntax{detail}: write key=value, and quote a value "
                "holding spaces, brackets, commas or non-ASCII characters as key='value'"
            ) from None


def quoted(value: str) -> str:
    """`value` as a single-quoted Hydra override value: any path a shell can name survives Hydra's grammar."""
    # Hydra's rule: backslashes are literal except a run of them before a quote (or the closing quote), doubled
    body = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", value)
    return "'" + re.sub(r"(\\+)$", lambda m: m.group(1) * 2, body) + "'"


def _fill_from_hf(cfg: Any, overrides: list[str]) -> None:
    """Fill the composed placeholder model from the Hugging Face config named by `model.source`. What the user or an
    experiment set stays on top: a `model.<field>=` override, or a field that no longer holds the schema default (a
    slice: `model=hf:... model.num_layers=2`, or experiment=cpu/hf_tiny_dp2). A slice shorter than the config's
    leading dense layers keeps one MoE layer; shared experts keep their count at the slice's expert width."""
    from omegaconf import OmegaConf

    from muonbench.families import model_fields
    from muonbench.hf_model import HFConfigError

    source = str(cfg.model.source)
    if not source.startswith(f"{HF_MODEL}:"):
        _fail("model", HF_MODEL, "names no config; use model=hf:<config.json, folder or Hub id>")
    spec = source.removeprefix(f"{HF_MODEL}:").strip("'\"")
    given = {item.partition("=")[0].lstrip("+~").removeprefix("model.") for item in overrides}
    defaults = {f.name: f.default for f in fields(schema.ModelConfig)}
    try:
        values = model_fields(spec, trust_remote_code=bool(cfg.model.trust_remote_code))
    except HFConfigError as exc:
        msg = str(exc)
        raise ConfigError(msg if msg.startswith("model=") else f"model=hf:{spec}: {msg}") from exc
    for key, value in values.items():
        unset = OmegaConf.is_missing(cfg.model, key) or cfg.model[key] == defaults[key]
        if key not in given and (key == "name" or unset):
            cfg.model[key] = value
    m = cfg.model
    has_moe = values.get("num_experts") and values.get("num_dense_layers", 0) < values["num_layers"]
    sliced = m.num_layers < values["num_layers"]
    if "num_dense_layers" not in given and m.num_dense_layers >= m.num_layers:  # all dense stays all dense
        m.num_dense_layers = max(0, m.num_layers - 1) if has_moe and sliced else m.num_layers
    shared = values.get("moe_shared_expert_intermediate_size", 0)
    if shared and "moe_shared_expert_intermediate_size" not in given:
        m.moe_shared_expert_intermediate_size = shared // values["moe_ffn_hidden_size"] * m.moe_ffn_hidden_size


def _check_yaml(path: Path) -> None:
    """Raises ConfigError naming the file, line and column of a YAML syntax error (Hydra prints a trace)."""
    import yaml

    try:
        yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read ({exc})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}:{where}: YAML syntax error ({problem})") from None


def available_options(group: str) -> list[str]:
    """The options of a config group: the YAML files under `conf/<group>/` and under the same group of each
    `--config-dir`, nested ones as `sub/name`."""
    roots = [CONF_DIR / group, *(d / group for d in USER_CONFIG_DIRS)]
    return sorted({str(p.relative_to(r).with_suffix("")) for r in roots for p in r.rglob("*.yaml")})


_MISSING_CONFIG = re.compile(r"Could not find '([^']+)'")
_UNKNOWN_KEY = re.compile(r"Could not override '([^']+)'.*?Key '([^']+)' not in '(\w+)'", re.DOTALL)
_APPEND = re.compile(r"use \+(\S+?)=(\S*)")


def _explain_missing(exc: Exception) -> str:
    """One line: the group, the option asked for and the available ones (also for nested groups such as
    `experiment/gb300`, where Hydra lists none); other composition errors keep Hydra's text."""
    msg = str(exc)
    cause = exc.__cause__
    if cause is not None and str(cause) not in msg:
        msg = f"{msg}\n{cause}"
    unknown = _UNKNOWN_KEY.search(msg)
    owners = engines.owner_of(unknown.group(2)) if unknown and unknown.group(1).startswith("engine.") else []
    if unknown and owners:
        value = m.group(2) if (m := _APPEND.search(msg)) else "?"
        return (
            f"{unknown.group(1)}={value}: only engine={'|'.join(owners)} has it "
            f"(this engine's config is {unknown.group(3)})"
        )
    by_name = {e.config.__name__: e.config for e in engines.ENGINES.values()}
    cls = (getattr(schema, unknown.group(3), None) or by_name.get(unknown.group(3))) if unknown else None
    if unknown and cls is not None:
        names = sorted(f.name for f in fields(cls))
        return f"{unknown.group(1)}: no such field in {unknown.group(3)}; its fields: {', '.join(names)}"
    m = _MISSING_CONFIG.search(msg)
    if m and "/" in m.group(1):
        group, name = m.group(1).split("/", 1)
        if any((d / group).is_dir() for d in (CONF_DIR, *USER_CONFIG_DIRS)):
            return f"{group}={name}: no such option; available: {', '.join(available_options(group))}"
    return msg


def to_typed(
    cfg: Any, *, validate_: bool = True, overrides: list[str] | tuple[str, ...] = ()
) -> schema.RootConfig:
    """DictConfig -> RootConfig of dataclasses (converted once, at the entry point). A `model=hf:<spec>` placeholder
    is filled from its Hugging Face config first, under the `overrides` the config was composed with."""
    from omegaconf import OmegaConf

    if cfg.model.name == HF_MODEL or str(cfg.model.source).startswith(f"{HF_MODEL}:"):
        _fill_from_hf(cfg, list(overrides))

    _check_unknown_keys(cfg, "")
    _apply_optimizer_overrides(cfg)
    root = OmegaConf.to_object(cfg)
    assert isinstance(root, schema.RootConfig), type(root)
    if validate_:
        validate(root)
    return root


def _check_unknown_keys(node: Any, path: str) -> None:
    """Every key is a field of its schema: a key added with `+` (Hydra opens the struct for it) would otherwise be
    dropped in silence by `to_object`."""
    from omegaconf import DictConfig, OmegaConf

    cls = OmegaConf.get_type(node)
    if not (isinstance(node, DictConfig) and is_dataclass(cls)):
        return
    names = {f.name for f in fields(cls)}
    for key in node:
        dotted = f"{path}.{key}" if path else str(key)
        if key not in names:
            raise ConfigError(f"{dotted}: no such field in {cls.__name__}; its fields: {', '.join(sorted(names))}")
        _check_unknown_keys(node._get_node(key), dotted)


def _apply_optimizer_overrides(cfg: Any) -> None:
    """Merge `bench.optimizer_overrides.<name>` into `optimizer` when `optimizer.name` is `<name>`; every entry's
    optimizer and fields are checked against the schemas, also the ones this job does not apply."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    overrides = OmegaConf.to_container(cfg.bench.optimizer_overrides, resolve=True)
    for name, values in overrides.items():
        path = f"bench.optimizer_overrides.{name}"
        if name not in schema.optimizer_schemas():
            _fail(path, values, f"no such optimizer; allowed: {list(schema.optimizer_schemas())}")
        if not isinstance(values, dict):
            _fail(path, values, "must map fields of that optimizer to values")
        names = {f.name for f in fields(schema.optimizer_schemas()[name])} - {"name"}
        for key in values:
            if key not in names:
                raise ConfigError(
                    f"{path}.{key}: no such field of optimizer {name!r}; its fields: {', '.join(sorted(names))}"
                )
        if cfg.optimizer.name == name:
            try:
                cfg.optimizer = OmegaConf.merge(cfg.optimizer, values)
            except OmegaConfBaseException as exc:
                raise ConfigError(f"{path}: {exc}".splitlines()[0]) from exc


def as_dict(root: schema.RootConfig) -> dict[str, Any]:
    """Plain nested dict of a typed config (for run records and hashing)."""
    out = asdict(root) if is_dataclass(root) else dict(root)
    return out


def config_from_dict(d: dict[str, Any]) -> schema.RootConfig:
    """The inverse of `as_dict`: the typed `RootConfig` from the plain dict stored in run.json (the optimizer
    schema chosen by name; records of older trees lifted to today's field names first)."""
    d = schema.lift_record(d)
    parts: dict[str, Any] = {group: cls(**d[group]) for group, cls in schema.SCHEMAS.items()}
    parts["parallelism"].distribution = schema.DistributionConfig(**d["parallelism"]["distribution"])
    opt = d["optimizer"]
    if opt.get("name") not in schema.optimizer_schemas():
        raise ValueError(f"optimizer.name={opt.get('name')!r}: allowed {sorted(schema.optimizer_schemas())}")
    parts["optimizer"] = schema.optimizer_schemas()[opt["name"]](**opt)
    engine = engines.spec(d["engine"]["name"]).config  # records of the flat engine config held every engine's
    parts["engine"] = engine(**{f.name: d["engine"][f.name] for f in fields(engine) if f.name in d["engine"]})
    parts["bench"] = schema.BenchConfig(**d.get("bench", {}))
    return schema.RootConfig(**parts, experiment_name=d.get("experiment_name", ""))


def config_hash(root: schema.RootConfig) -> str:
    """Stable short hash of the resolved config (bench settings that do not change the workload excluded)."""
    d = as_dict(root)
    d.pop("bench", None)
    blob = json.dumps(d, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def _check_allowed(root: schema.RootConfig) -> None:
    for dotted, allowed in ALLOWED.items():
        *path, key = dotted.split(".")
        node: Any = root
        for part in path:
            node = getattr(node, part)
        if not hasattr(node, key):
            continue
        value = getattr(node, key)
        if value not in allowed:
            _fail(dotted, value, f"must be one of {list(allowed)}")


_ADAMW_TO_SCHEMA = {"betas[0]": "adam_beta1", "betas[1]": "adam_beta2", "eps": "adam_eps"}
"""AdamWConfig field -> optimizer field of the non-matrix AdamW (Megatron-core's names, `schema.adamw_config`)."""


def _check_optimizer(opt: Any) -> None:
    """The optimizer's ranges, checked by building its `optim` configs here (no torch), so a bad value fails at
    compose time with the config path instead of inside every rank."""
    for name in ("lr_warmup_steps", "min_lr", "clip_grad"):
        if getattr(opt, name) < 0:
            _fail(f"optimizer.{name}", getattr(opt, name), "must be >= 0")
    try:
        schema.algorithm_config(opt)
    except C.ConfigFieldError as exc:
        names = {} if isinstance(opt, schema.MatrixOptimizerSchema) else _ADAMW_TO_SCHEMA
        _fail(f"optimizer.{names.get(exc.field, exc.field)}", exc.value, exc.rule)
    except ValueError as exc:
        raise ConfigError(f"optimizer: {exc}") from exc
    try:
        schema.adamw_config(opt)
    except C.ConfigFieldError as exc:
        _fail(f"optimizer.{_ADAMW_TO_SCHEMA.get(exc.field, exc.field)}", exc.value, exc.rule)


def check_runnable(root: schema.RootConfig) -> None:
    """What the configured engine can run (`muonbench.engines`: the engine's own `check`), checked by `bench.run`
    before anything is launched (the engines raise the same inside a rank). Not part of `validate`: the analysis
    tools (`bench.flops`, `balance`, `project`) compose layouts that no local engine runs."""
    if root.launcher.via == "nemo_run" and importlib.util.find_spec("nemo_run") is None:
        _fail("launcher.via", "nemo_run", "needs the nemo-run extra: pip install 'muonbench[nemo-run]'")
    extra = LOGGER_EXTRAS.get(root.bench.logger)  # a cluster job's image is checked on its nodes, not here
    if extra and root.launcher.name == "local" and importlib.util.find_spec(extra) is None:
        _fail("bench.logger", root.bench.logger, f"needs the {extra} extra: pip install 'muonbench[{extra}]'")
    engines.spec(root.engine.name).check(root)
    _check_data(root)


def _check_data(root: schema.RootConfig) -> None:
    """`bench.data` is a kind the engine reads and, on a local launch, names files that exist."""
    spec, eng = root.bench.data, root.engine.name
    kind, _, arg = spec.partition(":")
    allowed = engines.spec(eng).data
    if kind not in allowed or (kind == "mock") != (spec == "mock") or (kind != "mock" and not arg):
        forms = ["mock" if k == "mock" else f"{k}:<{'file' if k == 'text' else 'path prefix'}>" for k in allowed]
        _fail("bench.data", spec, f"the {eng} engine reads {forms}")
    if root.launcher.name != "local" or kind == "mock":  # a cluster's paths are checked on its nodes
        return
    path = Path(arg).expanduser()
    files = [path] if kind == "text" else [path.with_name(path.name + ext) for ext in (".bin", ".idx")]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        _fail("bench.data", spec, f"no such file: {', '.join(missing)}")
    if kind == "text" and path.stat().st_size <= root.model.seq_length:
        size, seq = path.stat().st_size, root.model.seq_length
        _fail("bench.data", spec, f"the file has {size} bytes, needs > model.seq_length={seq}")
    if kind == "text" and root.model.vocab_size < 256:
        vocab = root.model.vocab_size
        _fail("bench.data", spec, f"byte-level text needs model.vocab_size >= 256, got {vocab}")


def _check_bench(b: schema.BenchConfig) -> None:
    if b.steps < 1:
        _fail("bench.steps", b.steps, "must be >= 1")
    if b.warmup_steps < 0:
        _fail("bench.warmup_steps", b.warmup_steps, "must be >= 0")
    if b.warmup_steps >= b.steps:
        _fail(
            "bench.warmup_steps", b.warmup_steps, f"must be < bench.steps={b.steps} (at least one timed step)"
        )
    if b.timeout_s < 1:
        _fail("bench.timeout_s", b.timeout_s, "must be >= 1 (seconds before the run is killed)")
    if not b.budget_s >= 0 or b.budget_s == float("inf"):
        _fail("bench.budget_s", b.budget_s, "must be a finite number of seconds >= 0 (0 = no time budget)")
    if b.log_every < 1:
        _fail("bench.log_every", b.log_every, "must be >= 1")


def _check_finite(node: Any, path: str) -> None:
    """Every float of the config tree (lists of them too) is finite: NaN passes every range check."""
    if is_dataclass(node):
        for f in fields(node):
            _check_finite(getattr(node, f.name), f"{path}.{f.name}" if path else f.name)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            _check_finite(item, f"{path}[{i}]")
    elif isinstance(node, float) and not math.isfinite(node):
        _fail(path, node, "must be a finite number")


def _read_by_bridge(m: schema.ModelConfig) -> bool:
    """The family is the model_type of the config `model=hf:` read through AutoBridge (outside the table)."""
    from muonbench.hf_model import HFConfigError, model_type

    if not m.source.startswith(f"{HF_MODEL}:"):
        return False
    try:
        return model_type(m.source.removeprefix(f"{HF_MODEL}:").strip("'\"")) == m.family
    except HFConfigError:
        return False


def _check_model_sizes(m: schema.ModelConfig) -> None:
    """Sizes that no builder can make (0 or negative), checked before the divisibility rules use them."""
    for name in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size", "seq_length"):
        if getattr(m, name) < 1:
            _fail(f"model.{name}", getattr(m, name), "must be >= 1")
    if m.make_vocab_size_divisible_by < 1:
        _fail("model.make_vocab_size_divisible_by", m.make_vocab_size_divisible_by, "must be >= 1")
    for name in ("num_dense_layers", "num_experts", "moe_shared_expert_intermediate_size", "mtp_num_layers",
                 "sliding_window", "window_attn_skip_freq"):
        if getattr(m, name) < 0:
            _fail(f"model.{name}", getattr(m, name), "must be >= 0")
    if m.family not in FAMILIES and not _read_by_bridge(m):
        _fail("model.family", m.family, f"must be one of {list(FAMILIES)}")
    if m.family in FAMILIES and FAMILIES[m.family].moe and m.num_experts < 1:
        _fail("model.num_experts", m.num_experts, f"must be >= 1: model.family={m.family!r} is a mixture of experts")
    if m.num_experts and m.num_dense_layers < m.num_layers and m.moe_ffn_hidden_size < 1:
        _fail("model.moe_ffn_hidden_size", m.moe_ffn_hidden_size, "must be >= 1 for the MoE layers")
    if (m.num_experts == 0 or m.num_dense_layers > 0) and m.ffn_hidden_size < 1:
        _fail("model.ffn_hidden_size", m.ffn_hidden_size, "must be >= 1 for the dense layers")
    if m.attention == "gqa" and m.kv_channels % 2:
        _fail("model.kv_channels", m.kv_channels, "must be even (rotary embeddings rotate pairs)")
    if m.attention == "mla" and m.qk_pos_emb_head_dim % 2:
        _fail("model.qk_pos_emb_head_dim", m.qk_pos_emb_head_dim, "must be even (rotary embeddings rotate pairs)")


def _check_parallelism(p: schema.ParallelismConfig) -> None:
    """The layout's own rules: sizes, world size = TP x PP x DP x CP over whole nodes, virtual stages."""
    for name in ("world_size", "tp", "pp", "vp", "cp", "ep", "etp", "mbs", "gbs"):
        if getattr(p, name) < 1:
            _fail(f"parallelism.{name}", getattr(p, name), "must be >= 1")
    model_par = p.tp * p.pp * p.cp
    if p.world_size % model_par:
        _fail(
            "parallelism.world_size",
            p.world_size,
            f"world size must equal TP x PP x DP x CP; {p.world_size} is not divisible by "
            f"tp*pp*cp = {p.tp}*{p.pp}*{p.cp} = {model_par}",
        )
    if p.nodes * p.gpus_per_node != p.world_size:
        _fail(
            "parallelism.nodes",
            p.nodes,
            f"nodes x gpus_per_node must equal world_size: {p.nodes} x {p.gpus_per_node} != {p.world_size}",
        )
    if p.vp > 1 and p.pp == 1:
        _fail("parallelism.vp", p.vp, "virtual pipeline stages need pp > 1")


def _check_experts(m: schema.ModelConfig, p: schema.ParallelismConfig) -> None:
    """Expert parallelism against the model's experts."""
    if not m.num_experts:
        if p.ep != 1:
            _fail("parallelism.ep", p.ep, "expert parallelism needs a MoE model (model.num_experts > 0)")
        return
    if m.num_experts % p.ep:
        _fail("parallelism.ep", p.ep, f"model.num_experts={m.num_experts} must be divisible by EP")
    if (p.dp * p.tp * p.cp) % (p.ep * p.etp):
        _fail(
            "parallelism.ep",
            p.ep,
            f"EP x ETP ({p.ep}x{p.etp}) must divide DP x TP x CP = {p.dp}x{p.tp}x{p.cp} = {p.dp * p.tp * p.cp}",
        )
    if m.moe_router_topk < 1 or m.moe_router_topk > m.num_experts:
        _fail("model.moe_router_topk", m.moe_router_topk, f"must be in [1, num_experts={m.num_experts}]")


def _check_pipeline(m: schema.ModelConfig, p: schema.ParallelismConfig) -> None:
    """The pipeline stages hold the model's layers: an explicit layout, or an even split."""
    if not p.pipeline_layout:
        if m.num_layers % (p.pp * p.vp):
            _fail(
                "model.num_layers",
                m.num_layers,
                f"layers must be divisible by PP x VP = {p.pp}x{p.vp} = {p.pp * p.vp} "
                "(or give parallelism.pipeline_layout)",
            )
        return
    try:
        chunks = parse_pipeline_layout(p.pipeline_layout)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if len(chunks) != p.pp * p.vp:
        _fail(
            "parallelism.pipeline_layout",
            p.pipeline_layout,
            f"has {len(chunks)} stages; must have PP x VP = {p.pp}x{p.vp} = {p.pp * p.vp}",
        )
    held = sum(c.count("t") for c in chunks)
    if held != m.num_layers:
        _fail(
            "parallelism.pipeline_layout",
            p.pipeline_layout,
            f"holds {held} decoder layers; model.num_layers={m.num_layers}",
        )


def _check_attention(m: schema.ModelConfig) -> None:
    """The head shapes GQA or MLA needs; dense layers within the model."""
    if m.attention == "gqa":
        if m.num_query_groups < 1 or m.num_attention_heads % m.num_query_groups:
            _fail(
                "model.num_query_groups",
                m.num_query_groups,
                f"must be >= 1 and divide num_attention_heads={m.num_attention_heads}",
            )
        if m.kv_channels < 1:
            _fail("model.kv_channels", m.kv_channels, "GQA needs the head dimension (>= 1)")
    else:
        for name in ("kv_lora_rank", "qk_head_dim", "v_head_dim"):
            if getattr(m, name) < 1:
                _fail(f"model.{name}", getattr(m, name), "MLA needs it >= 1")
    if m.num_dense_layers > m.num_layers:
        _fail("model.num_dense_layers", m.num_dense_layers, f"must be <= num_layers={m.num_layers}")


def _check_probes(root: schema.RootConfig) -> None:
    """`bench.probes` name existing probes, on an engine that runs them."""
    if root.bench.probes and not engines.spec(root.engine.name).probes:
        _fail(
            "bench.probes",
            root.bench.probes,
            f"only engine={'|'.join(n for n, e in engines.ENGINES.items() if e.probes)} runs probes "
            f"(engine.name={root.engine.name!r})",
        )
    probes = sorted(p.parent.name for p in (CONF_DIR.parent / "experiments").glob("*/probe.py"))
    for spec in root.bench.probes:
        if spec.partition(":")[0].strip() not in probes:
            _fail("bench.probes", spec, f"no such probe; allowed: {probes}")


def validate(root: schema.RootConfig) -> None:
    """The rules of each group, then the rules that span groups. Each error names the field, the value and the
    rule it breaks."""
    _check_allowed(root)
    _check_bench(root.bench)
    if root.optimizer.name not in schema.optimizer_schemas():
        _fail("optimizer.name", root.optimizer.name, f"must be one of {list(schema.optimizer_schemas())}")
    _check_finite(root, "")
    _check_optimizer(root.optimizer)
    opt = root.optimizer
    if getattr(opt, "ns_precision", "bf16") == "fp16" and opt.implementation != "ours":
        _fail(
            "optimizer.ns_precision",
            "fp16",
            f"only implementation='ours' iterates in fp16 (optimizer.implementation={opt.implementation!r})",
        )
    m, p = root.model, root.parallelism
    _check_model_sizes(m)
    _check_parallelism(p)
    _check_experts(m, p)
    _check_pipeline(m, p)
    if p.gbs % (p.mbs * p.dp):
        _fail(
            "parallelism.gbs",
            p.gbs,
            f"global batch must be divisible by MBS x DP = {p.mbs}x{p.dp} = {p.mbs * p.dp}",
        )
    if m.num_attention_heads % p.tp:
        _fail(
            "parallelism.tp",
            p.tp,
            f"model.num_attention_heads={m.num_attention_heads} must be divisible by TP",
        )
    _check_attention(m)
    engines.validate(root.engine)
    _check_probes(root)
