"""Quality bench bookkeeping: the tuning protocol (stages, grid edges, extensions, seeds, run counts), the
non-matrix learning rate, the bootstrap interval, GPU-hours per milestone, the compute-optimal arithmetic and the
`muonbench quality` entry. No training: trial results come from a loss function of the hyperparameters."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.tools.quality import config, milestone, run, summary, tuning


def _finish(name: str, cfg: config.QualityConfig, loss, done: dict | None = None) -> dict:
    """Run `name`'s protocol to its end with `loss(hp)` as each trial's final validation loss."""
    done = {} if done is None else done
    while todo := tuning.walk(name, cfg, done).todo:
        for hp in todo:
            f = loss(hp)
            done[tuning.trial_id(name, hp, cfg)] = {
                "optimizer": name,
                "lr": hp.lr,
                "seed": hp.seed,
                "hparams": tuning.as_dict(hp),
                "final_val_loss": f,
                "status": "ok" if f < math.inf else "diverged",
            }
    return done


def _bowl(best_lr: float, best_alr: float = 3e-3):
    """A loss with its minimum at `best_lr` (and `best_alr` for the non-matrix LR), in log space."""
    return lambda hp: (
        3.0 + math.log(hp.lr / best_lr) ** 2 + (math.log(hp.adamw_lr / best_alr) ** 2 if hp.adamw_lr else 0.0)
    )


CFG = config.parse_cli(["profile=compute_optimal"])


def test_interior_best_is_not_extended_and_every_dimension_is_a_stage() -> None:
    """AdamW's best inside its grid: four stages (lr, warm-up, weight decay, beta2), each costing its grid minus
    the point already run, then 3 seeds; the run count is what the trial files hold."""
    done = _finish("adamw", CFG, _bowl(2e-3))
    w = tuning.walk("adamw", CFG, done)
    assert [s.dim for s in w.stages] == ["lr", "warmup_frac", "weight_decay", "beta2"]
    lr = w.stages[0]
    assert lr.values == [1e-3, 2e-3, 4e-3, 8e-3] and lr.best == 2e-3 and not lr.at_edge and lr.extensions == 0
    assert w.num_tuning_runs == 4 + 2 + 2 + 2 and w.num_runs == 12 and len(done) == 12
    assert [t["seed"] for t in w.seeds] == [1234, 1235, 1236] and not w.todo
    assert tuning.num_planned(CFG, done) >= 12 and w.best is not None and w.best.lr == 2e-3


def test_best_lr_on_an_edge_extends_the_grid_then_reports_the_edge() -> None:
    """A best LR on the upper edge grows the grid by one x2 step per extension (2 here); still on the edge after
    them, the stage says so. Localises a best-on-edge that is silently quoted as the optimum."""
    done = _finish("adamw", CFG, _bowl(0.1))
    lr = tuning.walk("adamw", CFG, done).stages[0]
    assert lr.values == [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2] and lr.extensions == 2
    assert lr.best == 3.2e-2 and lr.at_edge
    done = _finish("adamw", CFG, _bowl(1.2e-2))  # 1.6e-2 on the edge after the first, inside after the second
    lr = tuning.walk("adamw", CFG, done).stages[0]
    assert lr.values == [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2] and lr.best == 1.6e-2 and lr.extensions == 2
    assert not lr.at_edge
    done = _finish("adamw", CFG, _bowl(6e-3))  # best 8e-3 on the edge, inside after one extension
    lr = tuning.walk("adamw", CFG, done).stages[0]
    assert lr.values == [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2] and lr.best == 8e-3 and lr.extensions == 1
    done = _finish("adamw", CFG, _bowl(1e-4))  # the lower edge extends downwards
    lr = tuning.walk("adamw", CFG, done).stages[0]
    assert lr.values[:3] == [2.5e-4, 5e-4, 1e-3] and lr.at_edge


def test_non_matrix_lr_is_its_own_tuned_dimension() -> None:
    """Muon's non-matrix parameters keep the profile's adamw_lr while its matrix LR is swept, then get their own
    stage; no Muon trial takes its matrix LR for them. Localises the non-matrix side silently at Muon's LR."""
    done = _finish("muon", CFG, _bowl(8e-3, best_alr=1.5e-2))
    w = tuning.walk("muon", CFG, done)
    assert [s.dim for s in w.stages] == ["lr", "adamw_lr", "warmup_frac", "weight_decay"]
    hps = [tuning.hparams_of(t, CFG) for t in done.values()]
    lr_stage = [hp for hp in hps if hp.adamw_lr == CFG.adamw_lr]
    assert {hp.lr for hp in lr_stage} == {2e-3, 4e-3, 8e-3, 1.6e-2}
    assert w.best is not None and (w.best.lr, w.best.adamw_lr) == (8e-3, 1e-2)
    alr = w.stages[1]
    assert alr.values == [1e-3, 3e-3, 1e-2, 3e-2] and alr.extensions == 1 and not alr.at_edge
    assert w.num_runs == 4 + 3 + 2 + 2 + 2 and w.num_tuning_runs == 11
    # the lr-only profiles tie it to the trial's LR, and say so
    gpu = config.parse_cli(["profile=gpu"])
    assert tuning.tied_adamw_lr("muon", gpu) and tuning.point("muon", gpu, lr=1e-2).adamw_lr == 1e-2
    assert not tuning.tied_adamw_lr("muon", CFG) and tuning.point("muon", CFG, lr=1e-2).adamw_lr == 3e-3


def test_the_optimizer_steps_each_side_at_its_own_lr() -> None:
    """The schedule scales each parameter group's own peak: Muon's matrices at lr, the AdamW side at adamw_lr."""
    cfg = config.parse_cli(["profile=compute_optimal_tiny", "device=cpu"])
    model = run.build_model(cfg, 512)
    opt = run.build_opt("muon", model, tuning.point("muon", cfg, lr=2e-2, adamw_lr=3e-3), cfg)
    run.set_lr(opt, 0.5)
    assert {g["lr"] for g in opt.optimizers["matrix"].param_groups} == {1e-2}
    assert {g["lr"] for g in opt.optimizers["adamw"].param_groups} == {1.5e-3}
    adamw, _, _ = run.optimizer_configs("adamw", tuning.point("adamw", cfg, lr=1e-3, beta2=0.99), cfg)
    assert adamw.betas[1] == 0.99 and adamw.weight_decay == cfg.weight_decay


def test_a_stage_where_every_point_diverges_ends_the_tuning() -> None:
    done = _finish("soap_rekls", CFG, lambda hp: math.inf)
    w = tuning.walk("soap_rekls", CFG, done)
    assert w.failed_stage == "lr" and w.best is None and not w.todo and len(done) == 4


def test_compute_optimal_profile_meets_the_protocol() -> None:
    """>= 10 M non-embedding parameters, >= 20 tokens each, one trial <= 5 minutes on an H100 at 15% MFU,
    >= 3 seeds for every optimizer and the same number of tuned dimensions each (docs/quality.md)."""
    from bench.tools.quality.sweep import model_size
    from muonbench import load

    size = model_size(CFG, CFG.vocab_size)
    assert size["total_params_no_embedding"] >= 10e6 and size["tokens_per_param"] >= 20
    peak = load(["hardware=h100"]).hardware.peak_bf16_tflops * 1e12
    assert size["tokens_per_trial"] * size["model_flops_per_token"] / (0.15 * peak) < 300
    assert CFG.best_lr_seeds >= 3 and set(CFG.seed_optimizers) == set(CFG.optimizers)
    assert {len(tuning.tuned_dims(n, CFG)) for n in CFG.optimizers} == {4}
    assert len({len(CFG.lr_grids[n]) for n in CFG.optimizers}) == 1


def _curve(losses, tokens_per_eval=100, s_per_eval=1.0):
    return [
        {"step": i + 1, "tokens": (i + 1) * tokens_per_eval, "wall_s": (i + 1) * s_per_eval, "val_loss": v}
        for i, v in enumerate(losses)
    ]


def _run(losses, seed):
    c = _curve(losses)
    return {"curve": c, "final_val_loss": losses[-1], "wall_s": c[-1]["wall_s"], "steps": len(losses),
            "tokens_per_step": 100, "seed": seed}  # fmt: skip


def test_bootstrap_interval_over_seeds() -> None:
    """Identical seeds give a point interval at the ratio; a seed that never reaches the target gives an
    infinite upper end; the interval contains the point estimate."""
    rng = np.random.default_rng(0)
    adam = [_run([5, 4, 3, 2], s) for s in (1, 2, 3)]
    fast = [
        _run([4, 2, 1.5, 1], s) for s in (1, 2, 3)
    ]  # crosses 2.0 at the 2nd evaluation: 200 of 400 tokens
    lo, hi = summary.ratio_interval(fast, adam, "tokens", rng=rng)
    assert lo == hi == pytest.approx(0.5)
    mixed = [_run([4, 2, 1.5, 1], 1), _run([4, 3, 2.5, 2.2], 2), _run([3, 1.9, 1.5, 1], 3)]
    lo, hi = summary.ratio_interval(mixed, adam, "tokens", rng=rng)
    assert lo < 0.5 and hi == math.inf
    spread = [_run([5, 3, 2, 1], 1), _run([4, 2, 1.5, 1], 2), _run([3.5, 1.5, 1.2, 1], 3)]
    lo, hi = summary.ratio_interval(spread, adam, "tokens", rng=rng)
    xs = [summary.crossing(t["curve"], 2.0, "tokens") for t in spread]
    assert lo < np.mean(xs) / 400 < hi


def test_gpu_hours_rest_on_the_measurement_and_its_horizon() -> None:
    q = {
        "tokens_per_param": 20.0,
        "non_embedding_params": 10_000_000,
        "gpu": "NVIDIA H100",
        "time_to_target_ratio": {"muon": {"tokens_ratio": 0.8, "tokens_ci95": [0.7, None], "seeds": 3}},
    }
    m = milestone.gpu_hours(
        q,
        optimizer="muon",
        step_s=1.1,
        adamw_step_s=1.0,
        tokens_per_step=1e6,
        num_gpus=8,
        non_embedding=10**9,
    )
    assert m["horizon_tokens"] == 2e10 and m["adamw_gpu_hours"] == pytest.approx(2e4 * 8 / 3600)
    assert m["gpu_hours"] == pytest.approx(0.8 * 2e4 * 1.1 * 8 / 3600) and m["gpu_hours_ci95"][1] == math.inf
    line = milestone.format_line(m)
    assert (
        "20.0 tokens per non-embedding parameter" in line
        and "10.0 M non-embedding" in line
        and "never" in line
    )
    with pytest.raises(ValueError, match=r"optimizer='mop': summary.json measures \['muon'\]"):
        milestone.gpu_hours(q, optimizer="mop", step_s=1, adamw_step_s=1, tokens_per_step=1, num_gpus=1)


def test_recommend_prints_gpu_hours_from_a_quality_summary(tmp_path) -> None:
    """`recommend quality=DIR`: the user's batch, GPUs and non-embedding parameters set the horizon and the hours."""
    import json

    from bench.tools import recommend

    q = {
        "tokens_per_param": 20.0,
        "non_embedding_params": 10_000_000,
        "gpu": "NVIDIA H100",
        "time_to_target_ratio": {"muon": {"tokens_ratio": 0.8, "tokens_ci95": [0.7, 0.9], "seeds": 3}},
    }
    (tmp_path / "summary.json").write_text(json.dumps(q))
    _, overrides = recommend.split_args(["model=qwen3_30b_a3b", "parallelism=dp8_ep8", "hardware=h200"])
    res = {"muon_step_s": 2.0, "adamw_step_s": 1.9}
    m = recommend.quality_milestone(res, overrides, {"quality": str(tmp_path)})
    from muonbench import load

    root = load(overrides)
    n = milestone.non_embedding_params(root.model)
    assert 29e9 < n < 31e9 and m["horizon_tokens"] == 20.0 * n  # Qwen3-30B-A3B: ~29.9 B without embeddings
    steps = 20.0 * n / (root.parallelism.gbs * root.model.seq_length)
    assert m["gpu_hours"] == pytest.approx(0.8 * steps * 2.0 * root.parallelism.world_size / 3600)
    with pytest.raises(ValueError, match="horizon_tokens='x'"):
        recommend.quality_milestone(res, overrides, {"quality": str(tmp_path), "horizon_tokens": "x"})
    with pytest.raises(ValueError, match="no summary.json"):
        recommend.quality_milestone(res, overrides, {"quality": str(tmp_path / "none")})


def test_muonbench_quality_help_and_a_bad_key_through_the_cli(capsys) -> None:
    """`muonbench quality --help` failed with AttributeError (the table named a module without `main`); a bad
    key is one line and exit 2."""
    from bench.cli import main

    assert main(["quality", "--help"]) == 0
    assert "profile=compute_optimal" in capsys.readouterr().out
    assert main(["quality", "profile=nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: profile='nope': must be one of") and err.count("\n") == 1
