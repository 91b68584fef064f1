"""Quality bench: the data pipeline is fixed and disjoint, the tokenizer round-trips, every optimizer trains."""

from __future__ import annotations

import math

import pytest

from tools.quality import data, run


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """Tokenizer and token streams built once for the module (in a private cache)."""
    cache = tmp_path_factory.mktemp("quality-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("MUONBENCH_CACHE", str(cache))
    corpus = data.stdlib_corpus()
    tok = data.train_tokenizer(corpus, 512)
    train = data.encode_split(corpus, tok, "train")
    val = data.fixed_val_batches(
        data.encode_split(corpus, tok, "val"), batch_size=4, seq_len=32, num_batches=2
    )
    yield tok, train, val
    mp.undo()


def test_split_fixed_disjoint_and_covering() -> None:
    a, b = data.stdlib_corpus(), data.stdlib_corpus()
    assert a == b, "the split must be a pure function of the stdlib file names"
    train, val = set(a.train_files), set(a.val_files)
    assert not train & val
    assert len(val) >= 10 and len(train) >= 9 * len(val) - 9
    assert all(f.suffix == ".py" for f in train | val)


def test_tokenizer_round_trips_python_source(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MUONBENCH_CACHE", str(tmp_path))
    corpus = data.stdlib_corpus()
    tok = data.train_tokenizer(corpus, 1024)
    text = corpus.val_files[0].read_text(encoding="utf-8")[:4000] + "\n# ünïcödé ✓\n"
    assert tok.decode(tok.encode(text).ids) == text
    again = data.train_tokenizer(corpus, 1024)  # from the cache
    assert again.encode(text).ids == tok.encode(text).ids


def test_schedule_completes_at_last_step() -> None:
    cfg = run.parse_cli(["steps=100", "eval_every=10"])
    peak = 1e-3
    assert run.lr_at(0, cfg, peak) < peak
    assert math.isclose(run.lr_at(cfg.steps - 1, cfg, peak), cfg.min_lr_frac * peak)
    assert max(run.lr_at(s, cfg, peak) for s in range(cfg.steps)) == pytest.approx(peak)


def test_bad_cli_names_key_and_allowed() -> None:
    with pytest.raises(ValueError, match="unknown key 'stepz'"):
        run.parse_cli(["stepz=3"])
    with pytest.raises(ValueError, match="profile='tpu'"):
        run.parse_cli(["profile=tpu"])
    with pytest.raises(ValueError, match="optimizers='lion' is not one of .*'muon_split_gate_up'"):
        run.parse_cli(["optimizers=adamw,lion"])
    with pytest.raises(ValueError, match="optimizers='muon,muon_split_gate_up' must include 'adamw'"):
        run.main(["optimizers=muon,muon_split_gate_up"])


def test_crossing_interpolates() -> None:
    curve = [{"step": 10, "val_loss": 5.0, "wall_s": 1.0}, {"step": 20, "val_loss": 3.0, "wall_s": 2.0}]
    assert run.crossing(curve, 4.0, "step") == pytest.approx(15.0)
    assert run.crossing(curve, 2.0, "step") is None


@pytest.mark.parametrize("name", ["adamw", "muon", "muon_split_gate_up", "mop", "soap_rekls"])
def test_ten_step_smoke_per_optimizer(name: str, prepared) -> None:
    """10 steps of the proxy with each optimizer: finite losses, a validation point, a loss drop."""
    tok, train, val = prepared
    cfg = run.parse_cli(
        [
            "steps=10",
            "eval_every=5",
            "seq_len=32",
            "batch_size=4",
            "hidden_size=32",
            "vocab_size=512",
            "val_batches=2",
            f"optimizers={name}",
        ]
    )
    out = run.train_one(name, 3e-3, cfg, train, val, tok.get_vocab_size(), lambda _: None)
    assert out["status"] == "ok"
    assert [p["step"] for p in out["curve"]] == [5, 10]
    assert out["curve"][-1]["val_loss"] < math.log(tok.get_vocab_size())


def test_split_gate_up_variant_splits_fused_fc1_only() -> None:
    """muon_split_gate_up: Muon's LR grid; every experts.gate_up_proj (and nothing else) is split into equal
    [gate; up] halves, and its first update differs from joint Muon there only (localises a variant that is
    silently routed like plain muon, or a split that leaks to other matrices)."""
    import torch

    from optim.functional.split import RowSplit

    assert run.LR_GRIDS["muon_split_gate_up"] == run.LR_GRIDS["muon"]
    cfg = run.parse_cli(["steps=10", "eval_every=5", "hidden_size=32", "vocab_size=512", "seq_len=32"])
    x = torch.randint(0, 512, (2, 32), generator=torch.Generator().manual_seed(0))
    after = {}
    for name in ("muon", "muon_split_gate_up"):
        torch.manual_seed(cfg.seed)
        model = run.build_model(cfg, 512)
        opt = run.build_opt(name, model, 1e-2, cfg)
        matrix = opt.optimizers["matrix"]
        by_id = {id(p): n for n, p in model.named_parameters()}
        split_names = {by_id[i]: s for i, s in matrix.splits.items()}
        fc1 = {n: p for n, p in model.named_parameters() if n.endswith("mlp.experts.gate_up_proj")}
        assert len(fc1) == cfg.num_layers
        if name == "muon":
            assert split_names == {}
        else:
            assert set(split_names) == set(fc1)
            for n, p in fc1.items():
                rows = p.size(-2)
                assert split_names[n] == RowSplit(
                    num_groups=1, sizes=(rows // 2, rows // 2), labels=("gate", "up")
                )
            assert {r.name for r in opt.routes if r.split is not None} == set(fc1)
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        after[name] = {n: p.detach().clone() for n, p in model.named_parameters()}
    for n, joint in after["muon"].items():
        split = after["muon_split_gate_up"][n]
        if n.endswith("mlp.experts.gate_up_proj"):
            assert not torch.allclose(split, joint, rtol=1e-4, atol=1e-6), n
        else:
            torch.testing.assert_close(split, joint, rtol=1e-5, atol=1e-6, msg=lambda m, n=n: f"{n}: {m}")


def test_report_command_reproduces_config() -> None:
    """The report's Command line re-parses to the same config (it printed `profile=cpu` for every run)."""
    from dataclasses import asdict

    from tools.quality import report

    args = ["profile=cpu", "seed=7", "steps=60", "optimizers=adamw,muon_split_gate_up", "out=/tmp/q"]
    stored = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(run.parse_cli(args)).items()}
    command = report._command(stored)
    assert command.startswith("python -m tools.quality profile=cpu ")
    assert run.parse_cli(command.split()[3:]) == run.parse_cli(args)
    assert (
        report._command(
            dict(
                stored,
                seed=1234,
                steps=400,
                optimizers=["adamw", "muon", "mop", "soap_rekls"],
                out="reports/quality_cpu_202611",
            )
        )
        == "python -m tools.quality profile=cpu"
    )
