"""CPU tests of the QuACK plan candidates and the new Triton configs: which candidates the plan lists, that nothing
imports QuACK before a QuACK body runs, the pinned extra, config validation, and the kernel report's plan and
product tables."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def test_plan_lists_quack_candidates_only_when_usable_and_aligned() -> None:
    """QuACK candidates (plain and Gram, symmetric-only and all products) appear with quack_ok and 16-byte operand
    rows; never without quack_ok, never for a dimension that is not a multiple of 8 (TMA would reject it)."""
    from optim.kernels.plan import QUACK_BACKENDS, candidate_names

    quack = {f"{body}_{b}" for body in ("plain", "gram") for b in QUACK_BACKENDS}
    names = candidate_names(128, 1536, 2048, 5, use_gram=True, triton_ok=True, quack_ok=True)
    assert quack <= set(names) and "plain_sym_ptma256" in names
    assert not quack & set(candidate_names(128, 1536, 2048, 5, use_gram=True, triton_ok=True))
    for r, c in ((130, 256), (256, 260)):
        assert not any("quack" in n for n in candidate_names(1, r, c, 5, True, True, quack_ok=True)), (r, c)
    small = candidate_names(1, 512, 2048, 5, use_gram=False, triton_ok=False, quack_ok=True)
    assert small == [
        "plain_torch",
        "plain_quack_sym",
        "plain_quack_all",
        "plain_torch+graph",
        "plain_quack_sym+graph",
        "plain_quack_all+graph",
    ]


def test_quack_candidates_build_without_importing_quack() -> None:
    """The plan's QuACK bodies, the cache check of an entry and `usable` on a non-CUDA device never import QuACK
    (an 18 s import on this machine; the package must work without it installed). Fresh interpreter."""
    code = """
import sys, torch
from optim.kernels import sym_quack
from optim.kernels.plan import Planner, _ops, candidate_names
ops = _ops("plain_quack_all")
assert isinstance(ops, sym_quack.QuackOps) and ops.general
assert not _ops("gram_quack_sym").general
Planner().body("plain_quack_sym+graph", [(3.4445, -4.775, 2.0315)], 1e-7, frozenset())
assert Planner.untried({"method": "plain_torch", "times_ms": {}}, torch.empty(2, 64, 64, device="meta"), 5, False)
assert not sym_quack.usable(torch.device("cpu")) and not sym_quack.usable(torch.device("meta"))
assert sym_quack.aligned(768, 2048) and not sym_quack.aligned(768, 2044)
assert not [m for m in sys.modules if m == "quack" or m.startswith(("quack.", "cutlass"))], "quack imported"
print("ok")
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False, cwd=ROOT
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_quack_extra_is_pinned_to_the_version_the_code_names() -> None:
    """pyproject's `quack` extra pins quack-kernels to `sym_quack.QUACK_VERSION` and every CuTe-DSL piece exactly."""
    from optim.kernels.sym_quack import QUACK_VERSION

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["quack"]
    assert f"quack-kernels=={QUACK_VERSION}" in extra
    assert all("==" in req for req in extra), extra
    names = {req.split("==")[0] for req in extra}
    assert {"nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-base", "nvidia-cutlass-dsl-libs-cu13"} <= names


def test_tile_config_rejects_grouped_or_persistent_without_tma() -> None:
    pytest.importorskip("triton")
    from optim.kernels.sym_triton import TILE_CONFIGS, TileConfig

    base = {"block": 128, "block_k": 64, "num_warps": 8, "num_stages": 3}
    for bad in ({"group": 8}, {"persistent": True}):
        with pytest.raises(ValueError, match="need tma=True"):
            TileConfig(**base, **bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="warp_specialize=True"):
        TileConfig(**base, tma=True, persistent=True, warp_specialize=True)
    with pytest.raises(ValueError, match="group=-1"):
        TileConfig(**base, tma=True, group=-1)
    persistent = {n for n, c in TILE_CONFIGS.items() if c.persistent}
    assert persistent == {"ptma128", "ptma256", "ptma128o"}
    assert all(TILE_CONFIGS[n].group for n in persistent | {"tma128g8", "tma256g4"})


def test_family_best_splits_the_plan_times() -> None:
    """The kernel report's families: cuBLAS bodies, QuACK, Triton, and Triton without grouped order or persistence."""
    pytest.importorskip("triton")
    from tools.ns_kernels_measure import family, family_best

    times = {
        "plain_torch": 2.0,
        "plain_torch+graph": 1.9,
        "plain_sym_t128": 1.5,
        "plain_sym_ptma256": 1.2,
        "gram_sym_tma128g8+graph": 1.4,
        "plain_quack_sym": 1.3,
        "plain_quack_all": 1.25,
    }
    assert [family(n) for n in ("gram_torch", "plain_quack_all+graph", "gram_sym_t64")] == [
        "cublas",
        "quack",
        "triton",
    ]
    assert family_best(times) == {
        "cublas": ("plain_torch+graph", 1.9),
        "triton": ("plain_sym_ptma256", 1.2),
        "triton_rowmajor": ("plain_sym_t128", 1.5),
        "quack": ("plain_quack_all", 1.25),
    }


def _result() -> dict[str, object]:
    """A results dict as `tools.ns_kernels_measure.run_all` writes it (one shape, the plan, one micro row)."""
    fb = {"cublas": ("plain_torch", 1.3), "triton_rowmajor": ("plain_sym_t128", 1.15)}
    fb |= {"triton": ("plain_sym_ptma128", 1.0), "quack": ("plain_quack_all", 0.98)}
    impls = {
        "ours": {"ms": 1.01, "method": "plain_quack_all", "family_best": fb, "warmup_s": 4.0},
        "cublas": {"ms": 1.3},
        "quack": {"ms": 0.99, "warmup_s": 3.1},
        "eo_plain": {"ms": 1.4},
        "torch_muon": {"ms": 0.5},  # other coefficients: never the peer the plan is held to
    }
    micro = {"product": "poly", "batch": 128, "m": 1536, "k": 1536, "cublas_ms": 1.2, "cublas_err": 0.004}
    micro |= {"best_triton": "ptma128", "best_triton_ms": 0.9, "ptma128_err": 0.004, "quack_ms": 0.866}
    micro |= {"quack_err": 0.004, "quack_first_s": 2.8}
    shape = {"name": "qwen_fc1_x128", "rows": 1536, "cols": 2048, "batch": 128, "impls": impls}
    return {"device_name": "H200", "ceiling_tflops": 774.0, "shapes": [shape], "product_micro": [micro]}


def test_plan_table_holds_ours_to_the_fastest_peer() -> None:
    """plan_rows: the fastest of cublas / quack / EO columns (not torch.optim.Muon, other coefficients) and the
    ratio; the README gets the plan and product tables."""
    from tools.ns_kernels import plan_rows, render_markdown

    (row,) = plan_rows(_result())
    assert row["fastest_peer"] == "quack" and row["fastest_peer_ms"] == 0.99
    assert row["ours_vs_fastest_peer"] == pytest.approx(1.01 / 0.99)
    assert row["plan_triton_rowmajor"] == "plain_sym_t128" and row["plan_quack_ms"] == 0.98
    md = render_markdown(_result())
    assert (
        "| qwen_fc1_x128 | 128 | plain_quack_all | 1.3 | 1.15 (plain_sym_t128) | 1 (plain_sym_ptma128) | "
        "0.98 (plain_quack_all) | 1.01 | 0.99 (quack) | 1.02 |"
    ) in md
    assert "| poly | 128x1536x1536 | 1.2 | 0.9 (ptma128) | 0.866 | 1.04 | 0.004 / 0.004 / 0.004 | 2.8 |" in md


def test_bench_layer_step_has_split_and_cublas_columns_on_cpu(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """tools.ns_kernels device=cpu: the fixed-cuBLAS NS column and optim.Muon with split gate/up halves run; the
    split step moves the parameters differently from the joint one (a different orthogonalization)."""
    from tools import ns_kernels_measure as m

    monkeypatch.setenv("MUONBENCH_CACHE", str(tmp_path))
    row = m.measure_shape(("tiny", 32, 48, 2, "tiny", "cpu"), "cpu", True, lambda s: None)
    assert row["impls"]["cublas"]["ms"] > 0 and row["impls"]["cublas"]["ortho_err"] < 0.1
    opts = m.optimizers("cpu", (32, 48))
    assert "optim_muon_split" in opts and "ours_quack" not in opts  # QuACK: CUDA only
    moved = {}
    for impl in ("optim_muon", "optim_muon_split"):
        ps = m.make_params([(32, 48, 2), (40, 24, 1)], "cpu")
        before = [p.detach().clone() for p in ps]
        opts[impl](ps).step()
        moved[impl] = torch.cat([(p.detach() - b).flatten() for p, b in zip(ps, before, strict=True)])
    split_part = moved["optim_muon_split"][: 2 * 32 * 48]
    assert not torch.allclose(split_part, moved["optim_muon"][: 2 * 32 * 48], rtol=1e-3, atol=1e-9)
    torch.testing.assert_close(moved["optim_muon_split"][2 * 32 * 48 :], moved["optim_muon"][2 * 32 * 48 :])
