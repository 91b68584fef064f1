"""Hardware profiles: what `muonbench calibrate` measured on one GPU, and the efficiencies the model derives from it.

A profile is a small JSON file (`SCHEMA_VERSION`; written by `bench.tools.calibrate`): the GPU's name, compute
capability, driver and torch versions, the hardware group it belongs to (a `conf/hardware` row), measured TFLOP/s per
shape class (`dense` GEMMs, `grouped` expert GEMMs, `attention`), HBM GB/s (`copy`, and `adamw`: fused AdamW at
`constants.HBM_EFFICIENCY`'s 28 B/param, the kind of kernel that constant measured on H200), NS plan milliseconds per
plan key, the date and the command. Shipped profiles live in `SHIPPED_DIR` (chosen by hardware group); a user's
(`user_dir()`, where calibrate writes) takes precedence for its group, the newest first, one measured on the GPU
named first of all.

With a profile, a row's GEMM fraction is the measured dense rate over the datasheet peak, grouped expert GEMMs and
attention run at their measured rates, and the row's memory-bound fractions (fitted on whole runs) are scaled by the
profile's fused-AdamW bandwidth against the standalone fraction they were fitted beside
(`constants.HBM_EFFICIENCY`). Every prediction names its profile (`describe`) or says "not calibrated".
"""

from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.tools.perfmodel import constants as C

SCHEMA_VERSION = 1
SHIPPED_DIR = Path(__file__).resolve().parent / "data" / "hardware_profiles"
ENV_DIR = "MUONBENCH_HARDWARE_PROFILES"
TFLOPS_CLASSES = ("dense", "grouped", "attention")
HBM_KINDS = ("copy", "adamw")


def user_dir() -> Path:
    """$MUONBENCH_HARDWARE_PROFILES, else ~/.cache/muonbench/hardware_profiles (beside the NS plan cache)."""
    env = os.environ.get(ENV_DIR)
    return Path(env) if env else Path.home() / ".cache" / "muonbench" / "hardware_profiles"


@dataclass(frozen=True, kw_only=True, slots=True)
class Profile:
    """One hardware profile, validated."""

    name: str
    hardware: str
    """The hardware group (conf/hardware row) the GPU belongs to."""
    gpu: dict[str, str]
    tflops: dict[str, float]
    hbm_gbps: dict[str, float]
    ns_plan_ms: dict[str, float]
    date: str
    command: str
    source: str
    path: Path
    shipped: bool

    def describe(self) -> str:
        where = "shipped" if self.shipped else "user"
        return f"hardware profile {self.name} ({where}: {self.path}; {self.gpu['name']}, {self.date})"


def _refuse(path: Path, field: str, value: object, allowed: str) -> ValueError:
    return ValueError(f"hardware profile {path}: {field}={value!r}: must be {allowed}")


def _numbers(doc: dict[str, Any], path: Path, field: str, keys: tuple[str, ...] | None) -> dict[str, float]:
    table = doc.get(field)
    if not isinstance(table, dict):
        raise _refuse(path, field, table, "an object of positive numbers")
    for key, value in table.items():
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
        if not ok or (keys is not None and key not in keys):
            raise _refuse(path, f"{field}.{key}", value, f"a positive number, keys in {list(keys or ['any'])}")
    return {k: float(v) for k, v in table.items()}


def parse(doc: object, path: Path, *, shipped: bool = False) -> Profile:
    """A `Profile` of a decoded JSON document; ValueError naming the file, the field, its value and what is
    allowed."""
    if not isinstance(doc, dict):
        raise _refuse(path, "<document>", type(doc).__name__, "a JSON object")
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise _refuse(path, "schema_version", doc.get("schema_version"), f"{SCHEMA_VERSION}")
    if doc.get("hardware") not in C.FITTED:
        raise _refuse(path, "hardware", doc.get("hardware"), f"one of {sorted(C.FITTED)}")
    gpu = doc.get("gpu")
    if not isinstance(gpu, dict) or not all(isinstance(gpu.get(k), str) for k in ("name", "compute_capability")):
        raise _refuse(path, "gpu", gpu, "an object with strings name and compute_capability")
    for field in ("name", "date", "command", "source"):
        if not isinstance(doc.get(field), str) or not doc[field]:
            raise _refuse(path, field, doc.get(field), "a non-empty string")
    tflops = _numbers(doc, path, "tflops", TFLOPS_CLASSES)
    if "dense" not in tflops:
        raise _refuse(path, "tflops.dense", None, "a positive number (every profile measures dense GEMMs)")
    return Profile(
        name=doc["name"],
        hardware=doc["hardware"],
        gpu={k: str(v) for k, v in gpu.items()},
        tflops=tflops,
        hbm_gbps=_numbers(doc, path, "hbm_gbps", HBM_KINDS),
        ns_plan_ms=_numbers(doc, path, "ns_plan_ms", None) if "ns_plan_ms" in doc else {},
        date=doc["date"],
        command=doc["command"],
        source=doc["source"],
        path=path,
        shipped=shipped,
    )


def load(path: Path, *, shipped: bool = False) -> Profile:
    """The profile in `path`; ValueError (one line) for a file that is not one."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"hardware profile {path}: unreadable ({type(exc).__name__}: {exc})") from None
    return parse(doc, Path(path), shipped=shipped)


@functools.cache
def _profiles(folder: Path, shipped: bool) -> tuple[Profile, ...]:
    return tuple(load(p, shipped=shipped) for p in sorted(folder.glob("*.json")))


def available() -> list[Profile]:
    """The user's profiles, then the shipped ones (a bad file is refused with one line)."""
    return [*_profiles(user_dir(), False), *_profiles(SHIPPED_DIR, True)]


def select(hardware: str, gpu_name: str | None = None) -> Profile | None:
    """The profile a prediction for `hardware` rests on: a user's profile of that group (measured on `gpu_name`
    first, the newest first), else a shipped one of that group; None where there is none."""
    mine = sorted((p for p in available() if p.hardware == hardware), key=lambda p: p.date, reverse=True)
    mine.sort(key=lambda p: (p.shipped, gpu_name is not None and p.gpu["name"] != gpu_name))
    return mine[0] if mine else None


def describe(hardware: str) -> str:
    """Which profile a prediction on `hardware` rests on, or "not calibrated" and what it rests on instead."""
    prof = select(hardware)
    if prof is not None:
        return prof.describe()
    return (
        f"not calibrated: no hardware profile for {hardware} (datasheet row conf/hardware/{hardware}.yaml and "
        f"constants.FITTED['{hardware}']; muonbench calibrate on that GPU writes one)"
    )


def derive(eff: C.HardwareEfficiency, prof: Profile, peak_bf16_tflops: float, hbm_tbps: float) -> C.HardwareEfficiency:
    """A row's efficiencies with the profile's measurements in place of the assumed ones."""
    src = prof.describe()
    out = replace(eff, gemm_bf16=C.Sourced(value=prof.tflops["dense"] / peak_bf16_tflops, source=src))
    if "grouped" in prof.tflops:
        out = replace(out, gemm_grouped=C.Sourced(value=prof.tflops["grouped"] / peak_bf16_tflops, source=src))
    if "attention" in prof.tflops:
        out = replace(out, attention=C.Sourced(value=prof.tflops["attention"] / peak_bf16_tflops, source=src))
    if "adamw" in prof.hbm_gbps and hbm_tbps > 0:
        scale = prof.hbm_gbps["adamw"] / (hbm_tbps * 1e3) / C.HBM_EFFICIENCY.value
        fields = ("hbm", "optimizer_hbm", "hbm_bridge")
        scaled = {
            f: C.Sourced(value=getattr(eff, f).value * scale, source=f"{getattr(eff, f).source}; scaled by {src}")
            for f in fields
            if getattr(eff, f) is not None
        }
        out = replace(out, **scaled)
    return out


def clear() -> None:
    """Forget the profiles read so far (after calibrate writes one, and in tests)."""
    _profiles.cache_clear()


def effective(hw: Any) -> C.HardwareEfficiency:
    """The efficiencies a prediction on hardware row `hw` (a `HardwareConfig`) uses: `constants.efficiency`, with the
    selected profile's measurements where there is one."""
    eff = C.efficiency(hw.name)
    prof = select(hw.name)
    return eff if prof is None else derive(eff, prof, hw.peak_bf16_tflops, hw.hbm_tbps)
