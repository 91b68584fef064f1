"""The optimizer registry: a new optimizer is its own config and class plus one entry in `optim.registry`; the
schema, the config checks, the run record and `build_optimizer` read the entry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch

import muonbench
from muonbench import schema
from optim import build_optimizer, registry
from optim.configs import ConfigFieldError


@dataclass(frozen=True, kw_only=True, slots=True)
class ToyConfig:
    """Sign descent."""

    lr: float = 0.1
    weight_decay: float = 0.0
    nonfinite_policy: str = "skip"

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ConfigFieldError("lr", self.lr, "is not > 0")


class ToySign(torch.optim.Optimizer):
    def __init__(self, params: Any, config: ToyConfig) -> None:
        params = [p for _, p in params]
        super().__init__(params, {"lr": config.lr})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                p.add_(p.grad.sign(), alpha=-group["lr"])


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> registry.OptimizerSpec:
    entry = registry.OptimizerSpec(config=ToyConfig, optimizer=f"{__name__}:ToySign")
    monkeypatch.setitem(registry.OPTIMIZERS, "toy", entry)
    yield entry
    monkeypatch.undo()
    schema.optimizer_schemas()


def test_a_toy_optimizer_needs_only_its_entry(toy: registry.OptimizerSpec) -> None:
    """Localises a consumer with its own list of optimizers (a dispatcher or a name switch to extend)."""
    root = muonbench.load(["optimizer=base_toy", "optimizer.lr=0.5"])
    algo, routing, _ = schema.optim_configs(root.optimizer)
    assert algo == ToyConfig(lr=0.5) and routing is not None
    assert muonbench.config_from_dict(muonbench.as_dict(root)) == root
    with pytest.raises(muonbench.ConfigError, match=r"^optimizer.lr=-1.0"):
        muonbench.load(["optimizer=base_toy", "optimizer.lr=-1"])

    model = torch.nn.Sequential(torch.nn.Linear(4, 4, bias=True))
    opt = build_optimizer(model.named_parameters(), algo, routing=routing)
    assert isinstance(opt.optimizers["matrix"], ToySign)
    before = model[0].weight.detach().clone()
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    assert torch.allclose(model[0].weight, before - 0.5 * model[0].weight.grad.sign())

    from bench.results.record import ns_flops_enumerated

    assert ns_flops_enumerated(muonbench.as_dict(root)) is None  # no Newton-Schulz registered


def test_every_registered_optimizer_has_a_schema_and_a_yaml() -> None:
    from muonbench.compose import available_options

    assert set(schema.optimizer_schemas()) == set(registry.OPTIMIZERS)
    assert set(registry.OPTIMIZERS) <= set(available_options("optimizer"))


def test_ns_work_comes_from_the_entry() -> None:
    """Localises the NS FLOP count keeping its own rule of which optimizer runs Newton-Schulz."""
    from bench.results.record import ns_flops_enumerated

    def flops(*overrides: str) -> float | None:
        return ns_flops_enumerated(muonbench.as_dict(muonbench.load(list(overrides))))

    assert flops("optimizer=muon") and flops("optimizer=adamw") is None
    assert flops("optimizer=mop") is None  # SVD polar factor
    assert flops(
        "optimizer=mop", "optimizer.polar_method=polar_express", "optimizer.num_ns_steps=5"
    ) == flops("optimizer=muon", "optimizer.num_ns_steps=5")
