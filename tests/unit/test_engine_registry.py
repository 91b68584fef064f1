"""The engine registry: a new engine is its config, its rules and its `Engine` class plus one entry in
`muonbench.engines.ENGINES`; the schema (a tagged union on `engine.name`), the config checks, the run record and
the worker's engine lookup read the entry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

import muonbench
from bench.engines import Engine, RankInfo, StepMetrics, engine_class
from muonbench import engines
from muonbench.errors import fail


@dataclass
class ToyEngineConfig(engines.EngineConfig):
    name: str = "toy"
    toy_knob: int = 1
    """A field only this engine has."""


def _check_toy(root: Any) -> None:
    if root.parallelism.world_size > 2:
        fail("parallelism.world_size", root.parallelism.world_size, "the toy engine runs at most 2 ranks")


class ToyEngine(Engine):
    name = "toy"

    def setup(self, cfg: Any, rank: RankInfo) -> None:
        self.knob = cfg.engine.toy_knob

    def step(self) -> StepMetrics:
        return StepMetrics(
            step_s=1.0, fwd_bwd_s=1.0, optim_s=0.0, ns_s=0.0, comm_s=None, tokens=self.knob, loss=0.0,
            peak_mem_bytes=None,
        )  # fmt: skip

    def teardown(self) -> None:
        pass


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> engines.EngineSpec:
    entry = engines.EngineSpec(config=ToyEngineConfig, engine=f"{__name__}:ToyEngine", check=_check_toy)
    monkeypatch.setitem(engines.ENGINES, "toy", entry)
    return entry


def test_a_toy_engine_needs_only_its_entry(toy: engines.EngineSpec) -> None:
    """Localises a consumer with its own list of engines or an engine-name branch to extend."""
    root = muonbench.load(["engine=base_toy", "engine.toy_knob=7"])
    assert isinstance(root.engine, ToyEngineConfig) and root.engine.toy_knob == 7
    assert muonbench.config_from_dict(muonbench.as_dict(root)) == root
    muonbench.check_runnable(root)
    wide = ["parallelism=cpu_dp4", "engine=base_toy"]
    with pytest.raises(muonbench.ConfigError, match=r"^parallelism.world_size=4: the toy engine runs at most 2"):
        muonbench.check_runnable(muonbench.load(wide))
    engine = engine_class("toy")()
    engine.setup(root, RankInfo(rank=0, world_size=1, local_rank=0))
    assert engine.step().tokens == 7


def test_an_engine_field_is_refused_on_another_engine(toy: engines.EngineSpec) -> None:
    """Localises `engine=hf engine.manual_gc=true` composing and the knob doing nothing."""
    with pytest.raises(muonbench.ConfigError, match=r"^engine.toy_knob=3: only engine=toy has it"):
        muonbench.load(["engine.toy_knob=3"])
    with pytest.raises(muonbench.ConfigError, match=r"^engine.manual_gc=true: only engine=megatron has it"):
        muonbench.load(["engine.manual_gc=true"])
    with pytest.raises(muonbench.ConfigError, match=r"^engine.recipe=x.y: only engine=bridge has it"):
        muonbench.load(["engine=megatron", "hardware=h200", "engine.recipe=x.y"])


def test_old_records_keep_only_their_engines_fields() -> None:
    """A run.json of the flat engine config (every engine's fields, `compile`) still reads back."""
    root = muonbench.load([])
    d = muonbench.as_dict(root)
    d["engine"] |= {"compile": False, "manual_gc": False, "ab_mode": "published", "layers": "auto"}
    assert muonbench.config_from_dict(d) == root


def test_features_only_from_a_checkpoint_follow_the_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine whose entry builds architecture features only as AutoBridge reads them refuses a conf/model model
    with one, naming the engine. Localises a refusal keyed on an engine name instead of the entry's field."""
    entry = engines.EngineSpec(
        config=ToyEngineConfig, engine=f"{__name__}:ToyEngine", check=engines.check_features,
        features_from_source=True,
    )  # fmt: skip
    monkeypatch.setitem(engines.ENGINES, "toy", entry)
    root = muonbench.load(["engine=base_toy", "model.sliding_window=8"])
    with pytest.raises(muonbench.ConfigError, match=r"^model.sliding_window=8: .*engine=toy builds sliding-window"):
        muonbench.check_runnable(root)
    muonbench.check_runnable(muonbench.load(["engine=base_toy"]))
