"""CPU tests of the QuACK plan candidates and the new Triton configs: which candidates the plan lists, that nothing
imports QuACK before a QuACK body runs, the pinned extra, config validation, and the kernel report's plan and
product tables."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from optim.functional.newton_schulz import ns_coefficients

ROOT = Path(__file__).resolve().parents[2]
QUINTIC = ns_coefficients("quintic", 5)


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
assert isinstance(ops, sym_quack.QuackOps) and ops.general and ops.config is None
assert _ops("plain_quack_all_coop128x256_cl2x1").config == "coop128x256_cl2x1"
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


# bench.tools.ns_kernels shapes whose (B, m, n) problem gets the explicit general-product configs: the expert batches and
# the single matrices from 7168 x 8192 up (not launch-bound), not attention q / o, k / v, MLA or routers.
CONFIG_SHAPES = {
    "qwen_fc1_x128", "qwen_fc2_x128", "k2_expert_half_x8", "k2_fc1_x6", "k2_fc2_x6", "k2_o", "k2_dense_fc2",
    "k2_dense_fc1", "square_8192",
}  # fmt: skip
CONFIG_CANDIDATES = [
    "plain_quack_all_coop256x208_cl1x2", "plain_quack_all_coop128x256_cl2x1", "plain_quack_all_sym128pp",
    "plain_quack_all_sym128paired",
]  # fmt: skip


def test_quack_general_configs_offered_on_large_problems_on_sm90() -> None:
    """The explicit general-product configs appear as plain bodies only with the QuACK candidates (quack_ok, aligned
    rows) on SM90 (quack_configs), only on the problems that are not launch-bound, never as Gram or graph bodies;
    each name builds QuackOps with its config.

    Localises: configs compiled and timed on launch-bound shapes (warm-up for nothing), offered off SM90, or a name
    that does not map to its config."""
    from bench.tools.ns_kernels import SHAPES
    from optim.kernels.plan import _ops, candidate_names
    from optim.kernels.sym_quack import GENERAL_CONFIGS, SYMMETRIC_CONFIGS, QuackOps

    configs = [*GENERAL_CONFIGS, *SYMMETRIC_CONFIGS]
    assert configs == [n.removeprefix("plain_quack_all_") for n in CONFIG_CANDIDATES]
    offered = set()
    for name, rows, cols, batch, _, _ in SHAPES:
        m, n = min(rows, cols), max(rows, cols)
        names = candidate_names(
            batch, m, n, 5, use_gram=True, triton_ok=True, quack_ok=True, quack_configs=True
        )
        extra = [x for x in names if x.removesuffix("+graph").split("_", 1)[1].startswith("quack_all_")]
        if extra:
            offered.add(name)
            assert extra == CONFIG_CANDIDATES, (name, extra)
        # not on SM90, or no QuACK: none
        assert not set(CONFIG_CANDIDATES) & set(candidate_names(batch, m, n, 5, True, True, quack_ok=True))
        assert not set(CONFIG_CANDIDATES) & set(candidate_names(batch, m, n, 5, True, True, False, True))
    assert offered == CONFIG_SHAPES
    unaligned = candidate_names(128, 1536, 2044, 5, True, True, True, True)  # rows not a multiple of 16 bytes
    assert not any("quack" in x for x in unaligned)
    for cand in CONFIG_CANDIDATES:
        ops = _ops(cand)
        name = cand.removeprefix("plain_quack_all_")
        assert isinstance(ops, QuackOps) and ops.general and ops.config == name
        # a symmetric-product config leaves the general product in QuACK's default, and the other way round
        assert (ops.symmetric is not None) == (name in SYMMETRIC_CONFIGS)
    with pytest.raises(ValueError, match="needs general=True"):
        QuackOps(general=False, config="coop128x256_cl2x1")
    with pytest.raises(ValueError, match="coop999.*coop128x256_cl2x1.*sym128pp"):
        QuackOps(general=True, config="coop999")


def test_symmetric_config_needs_one_square_tile_per_cluster() -> None:
    """QuACK's triangular schedule assigns one square output tile per cluster; a config breaking that (128 x 128
    tiles in 2-CTA clusters wrote wrong products on the H200, experiments/quack_sym_tiles) is refused on
    construction, naming the rule."""
    from optim.kernels.sym_quack import SYMMETRIC_CONFIGS, SymmetricConfig

    with pytest.raises(ValueError, match="tile_n == tile_m \\* cluster_m"):
        SymmetricConfig(tile_m=128, tile_n=128, cluster_m=2, pingpong=False)
    assert all(c.tile_n == c.tile_m * c.cluster_m for c in SYMMETRIC_CONFIGS.values() if not c.paired)
    # the paired schedule (two tiles of one tile column per cluster) is written for one tile config only
    assert [n for n, c in SYMMETRIC_CONFIGS.items() if c.paired] == ["sym128paired"]
    with pytest.raises(ValueError, match="paired schedule runs 128 x 128 pingpong tiles in 2 x 1 clusters"):
        SymmetricConfig(tile_m=128, tile_n=256, cluster_m=2, pingpong=False, paired=True)


def test_ns_skip_env_drops_quack_configs(monkeypatch: pytest.MonkeyPatch) -> None:
    """$MUONBENCH_NS_SKIP names QuACK general-product configs as it names Triton tiles: a skipped config is not
    offered (nor required of a cached entry); an unknown name raises naming both kinds."""
    from optim.kernels.plan import Planner, candidate_names

    monkeypatch.setenv("MUONBENCH_NS_SKIP", "coop256x208_cl1x2,tma128o,sym128pp")
    names = candidate_names(128, 1536, 2048, 5, False, True, True, True)
    quack_configs = ["plain_quack_all_coop128x256_cl2x1", "plain_quack_all_sym128paired"]
    assert [x for x in names if "quack_all_" in x] == quack_configs
    assert "plain_sym_tma128o" not in names and "plain_quack_all" in names
    entry = {"method": "plain_torch", "times_ms": {n: 1.0 for n in names}}
    assert Planner.untried(entry, torch.empty(128, 1536, 2048, device="meta"), 5, False) == []
    monkeypatch.setenv("MUONBENCH_NS_SKIP", "coop1x1")
    with pytest.raises(ValueError, match="coop1x1.*tma128.*coop256x208_cl1x2"):
        candidate_names(1, 64, 64, 5, use_gram=False, triton_ok=True)


def test_plan_drops_a_quack_config_that_fails_and_times_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    """A general-product config whose compilation raises is rejected with its error and never timed; the other
    config and QuACK's default are timed. On CPU, QuACK's interface is replaced by torch products (QuACK needs an
    SM90 GPU), the one under coop256x208_cl1x2 raising as a failed CuTe-DSL compilation would; the shape is
    declared not launch-bound so the configs are offered."""
    import types

    import optim.kernels as k
    from optim.kernels import plan as plan_mod
    from optim.kernels import sym_quack

    def gemm_symmetric(a, b, c=None, alpha=1.0, beta=1.0):  # type: ignore[no-untyped-def]
        out = alpha * (a.float() @ b.float())
        return (out if c is None else out + beta * c.float()).to(a.dtype)

    def gemm_add(a, b, c, alpha=1.0, beta=1.0, tuned=True):  # type: ignore[no-untyped-def]
        return torch.baddbmm(c.float(), a.float(), b.float(), beta=beta, alpha=alpha).to(a.dtype)

    def gemm_tuned_fn(a, b, out, c, alpha=1.0, beta=1.0, config=None):  # type: ignore[no-untyped-def]
        if config == "coop256x208_cl1x2":
            raise RuntimeError("compile failed: tile 256x208")
        out.copy_(gemm_add(a, b, c, alpha, beta))

    def symmetric_dispatch(a, b, out, c, semaphore, *, alpha=1.0, beta=1.0, **tiles):  # type: ignore[no-untyped-def]
        assert semaphore is None and tiles["tile_N"] == tiles["tile_M"] * tiles["cluster_M"], tiles
        out.copy_(gemm_symmetric(a, b.mT, c, alpha, beta))

    iface = types.SimpleNamespace(
        gemm_symmetric=gemm_symmetric, gemm_add=gemm_add, gemm_tuned=types.SimpleNamespace(fn=gemm_tuned_fn)
    )
    monkeypatch.setattr(sym_quack, "_iface", lambda: iface)

    def paired(a, b, out, u, c=None, v=None):  # type: ignore[no-untyped-def]
        prod = u.unsqueeze(-1) * (a.float() @ b.float().mT)
        out.copy_(prod if c is None else prod + v.unsqueeze(-1) * c.float())

    monkeypatch.setattr(sym_quack, "_symmetric_dispatch", lambda: symmetric_dispatch)
    monkeypatch.setattr(sym_quack, "_paired", lambda: paired)
    monkeypatch.setattr(sym_quack, "_gemm_config", lambda name: name)
    monkeypatch.setattr(sym_quack, "_default_general_config", lambda device: "default")
    monkeypatch.setattr(sym_quack, "usable", lambda device: True)
    monkeypatch.setattr(sym_quack, "configs_usable", lambda device: True)
    monkeypatch.setattr(k, "triton_importable", lambda: False)
    monkeypatch.setattr(plan_mod, "launch_sensitive", lambda *args: False)
    x = torch.randn(2, 64, 128)
    entry = plan_mod.Planner().measure(x, QUINTIC, 1e-7, False, frozenset(), "test")
    times, rejected = entry["times_ms"], entry["rejected"]
    assert set(times) == {  # type: ignore[arg-type]
        "plain_torch", "plain_quack_sym", "plain_quack_all", "plain_quack_all_coop128x256_cl2x1",
        "plain_quack_all_sym128pp", "plain_quack_all_sym128paired",
    }  # fmt: skip
    assert list(rejected) == ["plain_quack_all_coop256x208_cl1x2"]  # type: ignore[call-overload]
    assert rejected["plain_quack_all_coop256x208_cl1x2"].startswith("RuntimeError: compile failed")  # type: ignore[index]
    assert entry["method"] in times  # type: ignore[operator]


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
    from bench.tools.ns_kernels_measure import family, family_best

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
    """A results dict as `bench.tools.ns_kernels_measure.run_all` writes it (one shape, the plan, one micro row)."""
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
    general = {
        "product": "apply",
        "batch": 128,
        "m": 768,
        "n": 2048,
        "k": 768,
        "best": "quack_coop256x208_cl1x2",
    }
    general |= {
        "cublas_ms": 1.1,
        "cublas_err": 0.003,
        "quack_ms": 0.9,
        "quack_err": 0.003,
        "quack_first_s": 0.01,
    }
    general |= {"quack_coop256x208_cl1x2_ms": 0.62, "quack_coop256x208_cl1x2_err": 0.003}
    general |= {"quack_coop256x208_cl1x2_tflops": 399.0, "quack_coop256x208_cl1x2_first_s": 3.2}
    return {
        "device_name": "H200",
        "ceiling_tflops": 774.0,
        "shapes": [shape],
        "product_micro": [micro],
        "general_micro": [general],
    }


def test_plan_table_holds_ours_to_the_fastest_peer() -> None:
    """plan_rows: the fastest of cublas / quack / EO columns (not torch.optim.Muon, other coefficients) and the
    ratio; the README gets the plan and product tables."""
    from bench.tools.ns_kernels import plan_rows, render_markdown

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
    flat = re.sub(r" +\|", " |", md)  # the micro table's cells are padded (pandas to_markdown)
    assert "| B x m x n | cublas | quack | quack_coop256x208_cl1x2 | fastest (TFLOP/s) |" in flat
    assert (
        "| 128x768x2048 | 1.1 | 0.9 | 0.62 | quack_coop256x208_cl1x2 (399) | 0.003 / 0.003 / 0.003 | 0.01 / 3.2 |"
    ) in flat


def test_product_table_shows_quack_symmetric_configs_where_measured() -> None:
    """render_micro: a column per QuACK symmetric tile config that the run measured (SYMMETRIC_CONFIGS), between
    QuACK's fixed tiles and the ratio; no such column when no row has one."""
    from bench.tools.ns_kernels import render_micro

    res = _result()
    (micro,) = res["product_micro"]
    plain = render_micro([micro])
    assert not any("sym128pp" in line for line in plain)
    md = render_micro([micro | {"quack_sym128pp_ms": 0.71, "quack_sym128pp_err": 0.004}])
    header = next(line for line in md if line.startswith("| product"))
    assert "| QuACK | QuACK sym128pp | Triton / QuACK |" in header
    assert "| poly | 128x1536x1536 | 1.2 | 0.9 (ptma128) | 0.866 | 0.71 | 1.04 |" in "\n".join(md)
    assert len(md[md.index(header) + 1].split("|")) == len(header.split("|"))


def test_bench_layer_step_has_split_and_cublas_columns_on_cpu(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """bench.tools.ns_kernels device=cpu: the fixed-cuBLAS NS column and optim.Muon with split gate/up halves run; the
    split step moves the parameters differently from the joint one (a different orthogonalization)."""
    from bench.tools import ns_kernels_measure as m

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


def test_quack_kernel_cache_keys_on_our_kernel_sources() -> None:
    """QuACK keys its persistent compiled-kernel cache on its own sources; our subclass kernels register their
    directory, so a changed kernel of ours is compiled again rather than loaded stale (needs quack-kernels, no GPU)."""
    pytest.importorskip("quack.cache")
    from pathlib import Path

    import quack.cache

    import optim.kernels._quack_paired  # noqa: F401 - registers through _quack_scaled
    from optim.kernels import _quack_scaled

    here = Path(_quack_scaled.__file__).resolve().parent
    assert quack.cache.EXTRA_SOURCE_DIRS.count(here) == 1
