"""Quality bench, GPU profile pieces on CPU: package corpus, bf16 grouped experts, summary, resumable sweep."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
import torch

from bench.tools.quality import config, corpus, data, run, summary, sweep, tuning

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def test_scan_dedups_splits_by_name_and_skips(tmp_path) -> None:
    """Localises a split that depends on which roots are present, a duplicate kept twice, or a bad digest."""
    a, b = STDLIB, tmp_path / "b"
    shutil.copytree(STDLIB / "json", b / "json_copy")  # same bytes under other names: dropped as duplicates
    (b / "empty.py").write_text("")
    only_a = corpus.scan([("", a)])
    both = corpus.scan([("", a), ("", b)])
    assert both.num_duplicates == only_a.num_duplicates + len(list((STDLIB / "json").glob("*.py")))
    assert both.num_skipped == only_a.num_skipped + 1
    names = [f.name for f in both.train + both.val]
    assert len(names) == len(set(names)) and not any(n.startswith("json_copy/") for n in names)
    assert {f.name for f in only_a.val} == {f.name for f in both.val}, "split must depend on the name only"
    assert all(corpus.is_val(f.name) for f in both.val) and not any(corpus.is_val(f.name) for f in both.train)
    assert {f.package for f in both.val} <= {f.package for f in both.train} | {f.package for f in both.val}
    assert "json" in {f.package for f in both.train + both.val} and "site-packages" not in str(names)
    assert corpus.scan([("", a), ("", b)]).digest == both.digest == only_a.digest  # b adds only duplicates
    keys = [corpus.path_hash(f.name) for f in both.train]
    assert keys == sorted(keys), "training files are in path-hash order (a byte cap samples uniformly)"


def test_val_fraction_and_take_bytes() -> None:
    names = [f"pkg/mod_{i}.py" for i in range(20000)]
    frac = sum(map(corpus.is_val, names)) / len(names)
    assert 0.007 < frac < 0.013  # VAL_PERMILLE = 10
    files = [
        corpus.SourceFile(name=str(i), path=Path("."), package="p", size=400_000, sha="") for i in range(10)
    ]
    assert len(corpus.take_bytes(files, 1.0)) == 2
    assert len(corpus.take_bytes(files, 0.1)) == 1  # at least one file
    assert len(corpus.take_bytes(files, 0)) == 10


def test_manifest_counts_every_file_once() -> None:
    scan = corpus.scan([("", STDLIB)])
    counts = {f.name: 7 for f in scan.train[:5]}
    rows = corpus.manifest(scan, counts)
    assert sum(r["train_files"] + r["val_files"] for r in rows) == len(scan.train) + len(scan.val)
    assert sum(r["train_bytes"] for r in rows) == sum(f.size for f in scan.train)
    assert sum(r["encoded_tokens"] for r in rows) == 35 and sum(r["encoded_files"] for r in rows) == 5


def test_autocast_grouped_experts_match_fp32() -> None:
    """Under bf16 autocast the grouped experts equal the module's fp32 forward to bf16 rounding, in output and
    gradients (localises a wrong gate/up order, permutation or routing weight); outside autocast they are the
    module's own forward, bit for bit."""
    from bench.models.hf_experts import use_autocast_grouped_experts
    from bench.tools.quality.run import build_model

    cfg = config.parse_cli(["hidden_size=64", "vocab_size=512"])
    net = build_model(cfg, 512)
    ref = copy.deepcopy(net.model.layers[0].mlp.experts)
    assert use_autocast_grouped_experts(net) == cfg.num_layers
    exp = net.model.layers[0].mlp.experts
    g = torch.Generator().manual_seed(0)
    h = torch.randn(40, 64, generator=g, requires_grad=True)
    idx = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(40)])
    w = torch.rand(40, 2, generator=g)
    y0 = ref(h, idx, w)
    gy = torch.randn(y0.shape, generator=g)
    (y0 * gy).sum().backward()
    want = [ref.gate_up_proj.grad, ref.down_proj.grad, h.grad.clone()]
    h.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y1 = exp(h, idx, w)
    (y1 * gy).sum().backward()
    assert y1.dtype == torch.float32
    for got, ref_t in zip([y1, exp.gate_up_proj.grad, exp.down_proj.grad, h.grad], [y0, *want]):
        assert (got - ref_t).norm() / ref_t.norm() < 2e-2
    assert torch.equal(exp(h, idx, w), ref(h, idx, w))


def _trial(name, lr, seed, finals, walls, *, steps=10):
    curve = [
        {"step": i + 1, "tokens": (i + 1) * 100, "val_loss": v, "wall_s": wt}
        for i, (v, wt) in enumerate(zip(finals, walls))
    ]
    return {
        "optimizer": name,
        "lr": lr,
        "seed": seed,
        "status": "ok",
        "final_val_loss": finals[-1],
        "curve": curve,
        "wall_s": walls[-1],
        "opt_step_s": 0.1 * walls[-1],
        "steps": len(finals),
        "tokens_per_step": 100,
    }


def test_summary_target_seeds_and_edge() -> None:
    """Target = mean of AdamW's best-LR seeds; Muon's seconds to it averaged over its seeds; edge flags."""
    trials = [
        _trial("adamw", 1e-3, 1, [5.0, 4.0, 3.0], [1, 2, 3]),
        _trial("adamw", 3e-3, 1, [5.0, 3.5, 2.0], [1, 2, 3]),
        _trial("adamw", 1e-2, 1, [5.0, 4.0, 2.5], [1, 2, 3]),
        _trial("adamw", 3e-3, 2, [5.0, 3.5, 2.2], [1, 2, 3]),
        _trial("muon", 1e-3, 1, [4.0, 2.0, 1.5], [2, 4, 6]),
        _trial("muon", 1e-2, 1, [4.5, 2.5, 1.8], [2, 4, 6]),
        _trial("muon", 1e-3, 2, [4.0, 2.4, 1.6], [2, 4, 6]),
    ]
    cfg = config.QualityConfig(
        optimizers=("adamw", "muon"),
        seed=1,
        price_per_hour=3.6,
        best_lr_seeds=2,
        lr_grids={"adamw": (1e-3, 3e-3, 1e-2), "muon": (1e-3, 1e-2)},
    )
    s = summary.summarize(trials, cfg)
    assert s["target"] == pytest.approx(2.1) and s["adamw_wall_s"] == pytest.approx(3.0)
    rows = {r["optimizer"]: r for r in s["rows"]}
    assert not rows["adamw"]["best_at_grid_edge"] and rows["muon"]["best_at_grid_edge"]
    m = rows["muon"]
    # seed 1: 4.0 -> 2.0 over 2-4 s crosses 2.1 at 2 + 2 * 1.9 / 2.0 = 3.9 s; seed 2: 2.4 -> 1.6 over 4-6 s at
    # 4 + 2 * 0.3 / 0.8 = 4.75 s
    assert m["wall_s_to_target"] == pytest.approx((3.9 + 4.75) / 2)
    assert m["wall_ratio_vs_adamw"] == pytest.approx(4.325 / 3.0)
    assert m["cost_to_target"] == pytest.approx(4.325 / 3600 * 3.6)
    assert m["seeds"] == 2 and m["reached"] == 2
    assert rows["adamw"]["reached"] == 1 and rows["adamw"]["wall_s_to_target"] is None  # seed 2 ends at 2.2


def _args(out: Path, *extra: str) -> list[str]:
    return [
        "profile=tiny",
        f"out={out}",
        f"cache={out.parent / 'cache'}",
        f"corpus_roots={STDLIB}",
        "corpus_max_mb=0.5",
        "tokenizer_train_mb=0.3",
        "optimizers=adamw",
        "steps=4",
        "eval_every=2",
        "seq_len=16",
        "batch_size=2",
        "hidden_size=32",
        "prewarm_steps=0",
        *extra,
    ]


def test_sweep_resumes_skips_finished_and_refuses_other_settings(tmp_path, capsys) -> None:
    """A piece stopped by its budget leaves no partial trial; a rerun finishes the sweep (grid, then the
    best LR's extra seed), a deleted trial is the only one rerun, and other trial-defining keys are refused."""
    out = tmp_path / "q"
    assert sweep.main(_args(out, "budget_s=1e-6")) == 0
    said = capsys.readouterr().out
    assert re.search(r"stopped: budget_s=1e-06: \d+ s used, next trial adamw ~0 s \(nothing measured", said)
    assert not list((out / "trials").glob("*.json")) and (out / "corpus.json").exists()
    assert json.loads((out / "progress.json").read_text())["complete"] is False

    assert sweep.main(_args(out)) == 0
    ids = sorted(p.stem for p in (out / "trials").glob("*.json"))
    best = min(
        (json.loads((out / "trials" / f"{i}.json").read_text()) for i in ids if "seed1234" in i),
        key=lambda t: t["final_val_loss"],
    )
    assert len(ids) == 5 and f"adamw__lr{best['lr']:g}__seed1235" in ids
    assert json.loads((out / "progress.json").read_text()) == {"done": 5, "planned": 5, "complete": True}
    for f in ("README.md", "results.csv", "trials.csv", "run.json", "reproduce.sh", "loss_curves.png"):
        assert (out / f).exists(), f

    kept = {i: (out / "trials" / f"{i}.json").read_text() for i in ids}
    victim = "adamw__lr0.001__seed1234"
    (out / "trials" / f"{victim}.json").unlink()
    assert sweep.main(_args(out)) == 0
    piece = json.loads((out / "pieces.jsonl").read_text().splitlines()[-1])
    assert piece["trials_run"] == [victim]
    assert all((out / "trials" / f"{i}.json").read_text() == kept[i] for i in ids if i != victim)
    assert len((out / "pieces.jsonl").read_text().splitlines()) == 3

    capsys.readouterr()
    assert sweep.main(_args(out, "steps=6")) == 2
    assert re.fullmatch(
        r"error: out=.* holds a sweep with other settings: \{'steps': \(4, 6\)\} .*\n",
        capsys.readouterr().err,
    )


def test_resume_refuses_a_tokenizer_that_encodes_other_token_counts(tmp_path) -> None:
    """A sweep resumed with a lost and retrained (or another version's) tokenizer would mix token streams: the
    counts stored in corpus.json must match what the tokenizer here encodes."""
    out = tmp_path / "q"
    assert sweep.main(_args(out, "budget_s=1e-6")) == 0
    stored = json.loads((out / "corpus.json").read_text())
    assert sweep.main(_args(out, "budget_s=1e-6")) == 0  # same tokenizer: resumes
    (out / "corpus.json").write_text(json.dumps({**stored, "val_tokens": stored["val_tokens"] + 1}))
    with pytest.raises(ValueError, match="another tokenizer"):
        sweep.main(_args(out, "budget_s=1e-6"))


def test_sigterm_records_the_piece_and_a_rerun_resumes(tmp_path) -> None:
    """SIGTERM in the second trial (after the first trial's file): exit 128 + 15, no file for the trial in
    progress, the piece's line names the signal, trial and step, progress.json counts the finished trial, and a
    rerun finishes the sweep. Localises a signal that kills the process before it records its piece."""
    out, log_path = tmp_path / "q", tmp_path / "log"
    args = _args(out, "steps=8", "prewarm_steps=1")
    first, second = "adamw__lr0.001__seed1234", "adamw__lr0.003__seed1234"
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # the per-evaluation log lines reach the file at once
    with open(log_path, "w") as log:
        cmd = [sys.executable, "-m", "bench.tools.quality", *args]
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, cwd=root, env=env)
        deadline = time.monotonic() + 600  # a bound for a stalled machine, not a timing check
        while "lr=3e-03 seed=1234 step" not in log_path.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log_path.read_text()[-2000:]
            time.sleep(0.02)
        assert (out / "trials" / f"{first}.json").exists()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 128 + signal.SIGTERM, log_path.read_text()[-2000:]
    piece = json.loads((out / "pieces.jsonl").read_text().splitlines()[-1])
    stop = piece["interrupted"]
    finished = sorted(p.stem for p in (out / "trials").glob("*.json"))
    # The signal lands in the second trial unless this process was kept off the CPU past that trial's last step:
    # then in a later one, and the record must be as consistent about that one.
    assert stop["signal"] == "SIGTERM" and stop["trial"] not in finished and 0 <= stop["step"] <= 8
    at_step = f" at step {stop['step']}/8" if stop["step"] else ""
    assert piece["stopped"] == f"SIGTERM in trial {stop['trial']}{at_step}"
    assert first in finished and piece["trials_run"] == finished
    if stop["trial"] == second:
        assert finished == [first] and 2 <= stop["step"] <= 8
    progress = {"done": len(finished), "planned": 5, "complete": False}
    assert json.loads((out / "progress.json").read_text()) == progress
    assert piece["prewarm_step_s"]["adamw"] > 0  # prewarm_steps=1 runs 2 steps: no adamw trial was finished
    kept = {i: (out / "trials" / f"{i}.json").read_text() for i in finished}

    assert sweep.main(args) == 0
    assert json.loads((out / "progress.json").read_text()) == {"done": 5, "planned": 5, "complete": True}
    assert all((out / "trials" / f"{i}.json").read_text() == kept[i] for i in finished)
    pieces = [json.loads(x) for x in (out / "pieces.jsonl").read_text().splitlines()]
    assert len(pieces) == 2 and pieces[1]["stopped"] is None and pieces[1]["interrupted"] is None
    assert set(pieces[1]["trials_run"]) == {p.stem for p in (out / "trials").glob("*.json")} - set(finished)


def _done(name, trial_s, *, status="ok", eval_s=5.0):
    return {"optimizer": name, "status": status, "trial_s": trial_s, "eval_s": eval_s}


def test_estimate_prefers_own_trials_then_prewarm() -> None:
    """The next trial's estimate: the optimizer's own finished trials, else its prewarm's seconds per step (the
    other optimizers' trial times unused, their evaluation times used), else the others' mean. Localises the
    estimate that let a 390 s SOAP-REKLS trial start on the 60 s of the other optimizers' trials."""
    cfg = config.parse_cli(["profile=gpu"])  # 240 steps, an evaluation every 10: 24 evaluations
    warm = run.Prewarm(seconds=30.0, num_steps=11, build_s=0.5, step_s=1.6, eval_s=0.25)
    others = {"a": _done("adamw", 60.0, eval_s=5.0), "b": _done("muon", 62.0, eval_s=6.0)}
    need, basis = sweep.estimate_trial_s("soap_rekls", cfg, others, warm)
    assert need == pytest.approx(240 * 1.6 + 5.5 + 0.5) and basis == "prewarm: 1.60 s/step"
    need, _ = sweep.estimate_trial_s("soap_rekls", cfg, {}, warm)
    assert need == pytest.approx(240 * 1.6 + 24 * 0.25 + 0.5)
    mine = others | {
        "s1": _done("soap_rekls", 400.0),
        "s2": _done("soap_rekls", 380.0),
        "s3": _done("soap_rekls", 90.0, status="diverged"),
        "s4": _done("soap_rekls", 0.0, status="error: RuntimeError: x"),
    }
    assert sweep.estimate_trial_s("soap_rekls", cfg, mine, warm) == (
        390.0,
        "mean of 2 finished soap_rekls trial(s)",
    )
    one_step = run.Prewarm(seconds=3.0, num_steps=1, build_s=0.5, step_s=None, eval_s=0.25)
    for w in (None, one_step):
        assert sweep.estimate_trial_s("soap_rekls", cfg, others, w) == (
            61.0,
            "mean of 2 other optimizers' trial(s)",
        )
    assert sweep.estimate_trial_s("soap_rekls", cfg, {}, None) == (0.0, "nothing measured yet")
    assert (
        sweep.num_evals(cfg) == 24 and sweep.num_evals(config.parse_cli(["steps=25", "eval_every=10"])) == 3
    )


def test_prewarm_covers_a_refresh_period_until_a_trial_is_done() -> None:
    """SOAP-REKLS without a finished trial is prewarmed for 1 + precondition_frequency steps, so the timed steps
    after the first include one eigenbasis refresh; with a finished trial, for prewarm_steps only. Localises a
    per-step time that leaves out the periodic refresh."""
    cfg = config.parse_cli(
        ["profile=tiny", "prewarm_steps=1", "precondition_frequency=2", "hidden_size=32", "seq_len=16"]
    )
    tokens = torch.randint(0, 512, (20_000,), generator=torch.Generator().manual_seed(0))
    val = data.fixed_val_batches(tokens, batch_size=cfg.batch_size, seq_len=cfg.seq_len, num_batches=1)
    prep = sweep.Prepared(vocab=512, train_tokens=tokens, val=val, corpus={})
    warm = sweep._prewarm("soap_rekls", cfg, prep, {})
    assert warm is not None and warm.num_steps == 3 and warm.step_s > 0 and warm.eval_s > 0
    assert warm.seconds > warm.build_s + 2 * warm.step_s
    again = sweep._prewarm("soap_rekls", cfg, prep, {"t": _done("soap_rekls", 9.0)})
    assert again is not None and again.num_steps == 1 and again.step_s is None
    assert sweep._prewarm("adamw", cfg, prep, {}).num_steps == 2


def test_report_from_state_dir_only(tmp_path) -> None:
    """The compute-optimal protocol end to end at toy size: every stage and 3 seeds per optimizer, then the report
    rebuilt from a copy of the state directory (as copied back from the GPU machine), summary.json included."""
    from bench.tools.quality import report

    out = tmp_path / "q"
    tiny = (
        "profile=compute_optimal_tiny",
        "optimizers=adamw,muon",
        "max_lr_extensions=0",
        "steps=2",
        "eval_every=1",
    )
    assert sweep.main(_args(out, *tiny)) == 0
    copy_dir, dest = tmp_path / "state", tmp_path / "rep"
    shutil.copytree(out, copy_dir)
    table = report.write_report(copy_dir, dest)
    assert "| adamw |" in table and "| muon |" in table
    text = (dest / "README.md").read_text()
    assert "Muon reaches" in text or "does not reach" in text
    assert "## Corpus" in text and "stdlib" in text and "## Tuning" in text and "Wen et al." in text
    assert "python -m bench.tools.quality profile=compute_optimal_tiny" in (dest / "reproduce.sh").read_text()
    sj = json.loads((dest / "summary.json").read_text())
    assert sj["tokens_per_param"] == pytest.approx(2 * 2 * 16 / sj["non_embedding_params"])
    for name, dims in (
        ("adamw", {"lr", "warmup_frac", "weight_decay", "beta2"}),
        ("muon", {"lr", "adamw_lr", "warmup_frac", "weight_decay"}),
    ):
        arm = sj["arms"][name]
        assert set(arm["best"]) == dims and arm["lr_grid"] == list(config.LR_GRIDS_OPTIMAL_TINY[name])
        assert len(arm["seeds"]) == 3 and arm["runs"] == {"tuning": 3 + 1 + 1 + 1, "seeds": 2, "total": 8}
    assert (
        set(sj["time_to_target_ratio"]) == {"muon"} and len(sj["time_to_target_ratio"]["muon"]["ci95"]) == 2
    )
    assert "rests_on" in sj["gpu_hours_to_target"]["muon"]
    run_json = json.loads((dest / "run.json").read_text())
    assert run_json["progress"]["complete"] and len(run_json["pieces"]) == 1
    assert "## Reading the result" not in text and f"out={out}" not in (dest / "reproduce.sh").read_text()

    (dest / "analysis.md").write_text("AdamW's grid is too narrow here.\n")
    report.write_report(copy_dir, dest)
    text = (dest / "README.md").read_text()
    assert "## Reading the result\nAdamW's grid is too narrow here." in text
    assert text.index("## Reading the result") < text.index("## Protocol")


def test_cli_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="corpus='web' is not one of"):
        config.parse_cli(["corpus=web"])
    with pytest.raises(ValueError, match="seed_optimizers='lion' is not one of"):
        config.parse_cli(["seed_optimizers=lion"])
    gpu = config.parse_cli(["profile=gpu"])
    assert len({len(g) for g in gpu.lr_grids.values()}) == 1 and gpu.best_lr_seeds == 2
    assert tuning.num_planned(gpu, {}) == 5 * 4 + 2
