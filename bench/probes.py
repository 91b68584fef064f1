"""Diagnostics reach a training engine through one interface: a `Probe`, enabled by a list in the config.

`bench.probes=[gpu_energy,microbatch_times]` (or `["idle_before_step:seconds=0.3,mode=gpu_spin"]`) loads each named
probe from `experiments/<name>/probe.py` (its class `Probe`; keyword arguments after the colon, as strings). The
engine calls, in list order:

- `setup(engine)` after the engine is built (model, optimizer, data);
- `before_step()` before each step, outside its timing;
- `wrap_forward_step(fn)` once per step: may wrap Megatron's forward-step function (per micro-batch hooks);
- `mark(phase)` when a phase of the step ends (`fwd_bwd` inside the timed step, `optim` after it);
- `after_step() -> dict` after each step: numbers for that step's steps.jsonl line, under the probe's `keys`;
- `teardown()` when the engine is torn down.

The product never imports a probe module by name: experiments depend on the product, not the reverse.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

EXPERIMENTS_DIR = Path(__file__).resolve().parent.parent / "experiments"


class Probe:
    """A diagnostic hooked into the engine's step; every hook is a no-op here."""

    keys: ClassVar[tuple[str, ...]] = ()
    """The steps.jsonl fields `after_step` may return."""

    def setup(self, engine: Any) -> None:
        """Called once the engine holds its model, optimizer and data."""

    def before_step(self) -> None:
        """Before each step, outside its timing."""

    def wrap_forward_step(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Megatron's forward-step function of this step (called once per micro-batch)."""
        return fn

    def mark(self, phase: str) -> None:
        """The step's phase `phase` (`fwd_bwd`, `optim`) has ended."""

    def after_step(self) -> dict[str, float]:
        """This step's numbers (a subset of `keys`)."""
        return {}

    def teardown(self) -> None:
        """Release what `setup` acquired."""


def available() -> list[str]:
    """Probe names: the folders of `experiments/` that hold a `probe.py`."""
    return sorted(p.parent.name for p in EXPERIMENTS_DIR.glob("*/probe.py"))


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """`name` or `name:key=value,key=value` -> (name, {key: value})."""
    name, _, args = spec.partition(":")
    kwargs: dict[str, str] = {}
    for item in filter(None, args.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"bench.probes entry {spec!r}: arguments must be key=value, comma-separated")
        kwargs[key.strip()] = value.strip()
    return name.strip(), kwargs


def probe_class(spec: str) -> tuple[type[Probe], dict[str, str]]:
    """The class and keyword arguments of one `bench.probes` entry; ValueError naming the entry and the probes
    there are."""
    name, kwargs = parse_spec(spec)
    if name not in available():
        raise ValueError(f"bench.probes entry {spec!r}: no probe {name!r}; allowed: {available()}")
    cls: type[Probe] = importlib.import_module(f"experiments.{name}.probe").Probe
    return cls, kwargs


def load(specs: list[str]) -> list[Probe]:
    """Instantiate the probes of `bench.probes`."""
    probes = []
    for spec in specs:
        cls, kwargs = probe_class(spec)
        try:
            probes.append(cls(**kwargs))
        except TypeError as exc:
            raise ValueError(f"bench.probes entry {spec!r}: {exc}") from exc
    return probes


def keys(specs: list[str]) -> tuple[str, ...]:
    """The steps.jsonl fields the probes of `bench.probes` may write, in order, without repeats."""
    return tuple(dict.fromkeys(k for spec in specs for k in probe_class(spec)[0].keys))
