"""The Triton tile configs of the symmetric NS products, read once from `sym_tiles.json` (no Triton import: the NS
plan lists its candidates from the names, `optim.kernels.sym_triton` builds its `TileConfig`s from the fields)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TILE_SPECS: dict[str, dict[str, Any]] = json.loads((Path(__file__).with_name("sym_tiles.json")).read_text())["tiles"]
"""Tile name -> its `TileConfig` fields, in the plan's candidate order."""
TILE_NAMES: tuple[str, ...] = tuple(TILE_SPECS)
