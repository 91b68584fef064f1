"""Quality bench: the data pipeline is fixed and disjoint, the tokenizer round-trips, every optimizer trains."""

from __future__ import annotations

import math

import pytest
import torch

from bench.tools.quality import data, run, sweep, tuning


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """Tokenizer and token streams built once for the module (in a private cache)."""
    tmp = tmp_path_factory.mktemp("quality-cache")
    corpus = data.stdlib_corpus()
    tok = data.load_or_train_tokenizer(tmp / "tokenizer.json", list(corpus.train_files), 512)
    train, _ = data.encode_files(tok, list(corpus.train_files), tmp / "train.npy")
    val_tokens, _ = data.encode_files(tok, list(corpus.val_files), tmp / "val.npy")
    val = data.fixed_val_batches(val_tokens, batch_size=4, seq_len=32, num_batches=2)
    return tok, train, val


def test_split_fixed_disjoint_and_covering() -> None:
    a, b = data.stdlib_corpus(), data.stdlib_corpus()
    assert a == b, "the split must be a pure function of the stdlib file names"
    train, val = set(a.train_files), set(a.val_files)
    assert not train & val
    assert len(val) >= 10 and len(train) >= 9 * len(val) - 9
    assert all(f.suffix == ".py" for f in train | val)


def test_tokenizer_round_trips_python_source(tmp_path) -> None:
    corpus = data.stdlib_corpus()
    path = tmp_path / "tokenizer.json"
    tok = data.load_or_train_tokenizer(path, list(corpus.train_files), 1024)
    text = corpus.val_files[0].read_text(encoding="utf-8")[:4000] + "\n# ünïcödé ✓\n"
    assert tok.decode(tok.encode(text).ids) == text
    again = data.load_or_train_tokenizer(path, [], 1024)  # from the file: no training data needed
    assert again.encode(text).ids == tok.encode(text).ids
    with pytest.raises(ValueError, match="vocab_size=2048 but .* holds a tokenizer of 1024"):
        data.load_or_train_tokenizer(path, [], 2048)


def test_encode_files_counts_and_cache(tmp_path, prepared) -> None:
    """Token stream = files joined by end-of-text; per-file counts sum to its length; the cache returns the same."""
    tok = prepared[0]
    files = list(data.stdlib_corpus().val_files[:3])
    ids, counts = data.encode_files(tok, files, tmp_path / "t.npy")
    assert ids.numel() == sum(counts) and len(counts) == 3
    eot = tok.token_to_id(data.EOT)
    ends = [sum(counts[: i + 1]) - 1 for i in range(3)]
    assert [int(ids[e]) for e in ends] == [eot] * 3
    assert ids[: counts[0] - 1].tolist() == tok.encode(data.read_text(files[0])).ids
    again, counts2 = data.encode_files(tok, [], tmp_path / "t.npy")
    assert torch.equal(again, ids) and counts2 == counts


def test_batches_are_the_windows_of_the_generator() -> None:
    """Vectorised windows equal slicing at the generator's start offsets (the CPU sweep's batches unchanged)."""
    tokens = torch.arange(1000, dtype=torch.int32)
    b = data.Batches(tokens, batch_size=3, seq_len=8, seed=5)
    gen = torch.Generator().manual_seed(5)
    for _ in range(data.Batches.CHUNK + 2):  # across a chunk boundary
        x, y = b.next()
        starts = torch.randint(0, 1000 - 9, (3,), generator=gen)
        want = torch.stack([tokens[s : s + 9] for s in starts.tolist()]).long()
        assert torch.equal(x, want[:, :-1]) and torch.equal(y, want[:, 1:]) and x.dtype == torch.int64


def test_schedule_completes_at_last_step() -> None:
    cfg = run.parse_cli(["steps=100", "eval_every=10"])
    assert run.lr_factor(0, cfg, 0.05) < 1
    assert math.isclose(run.lr_factor(cfg.steps - 1, cfg, 0.05), cfg.min_lr_frac)
    assert max(run.lr_factor(s, cfg, 0.05) for s in range(cfg.steps)) == pytest.approx(1.0)
    assert run.lr_factor(9, cfg, 0.1) == pytest.approx(1.0) and run.lr_factor(9, cfg, 0.2) == pytest.approx(
        0.5
    )


def test_bad_cli_names_key_and_allowed() -> None:
    with pytest.raises(ValueError, match="unknown key 'stepz'"):
        run.parse_cli(["stepz=3"])
    with pytest.raises(ValueError, match="profile='tpu'"):
        run.parse_cli(["profile=tpu"])
    with pytest.raises(ValueError, match="optimizers='lion' is not one of .*'muon_split_gate_up'"):
        run.parse_cli(["optimizers=adamw,lion"])
    with pytest.raises(ValueError, match="optimizers='muon,muon_split_gate_up' must include 'adamw'"):
        sweep.configure(["optimizers=muon,muon_split_gate_up"])


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
    hp = tuning.point(name, cfg, lr=3e-3)
    out = run.train_one(name, hp, cfg, train, val, tok.get_vocab_size(), lambda _: None)
    assert out["status"] == "ok"
    assert [p["step"] for p in out["curve"]] == [5, 10]
    assert out["curve"][-1]["val_loss"] < math.log(tok.get_vocab_size())


def test_optimizers_are_the_conf_yaml_plus_the_bench_overrides() -> None:
    """Muon and MOP as the bench ran them before it read conf/optimizer (a YAML default or an override that stops
    reaching the trial shows up here): the YAML's Nesterov and momentum, spectral scale x 0.2, the profile's
    precisions and weight decay, the trial's LR."""
    from optim import configs

    cfg = run.parse_cli(["profile=gpu", "out=unused"])
    muon, routing, adamw = run.optimizer_configs("muon", tuning.point("muon", cfg, lr=3e-3), cfg)
    assert muon == configs.MuonConfig(
        lr=3e-3, weight_decay=cfg.weight_decay, nesterov=True, scale_mode="spectral", extra_scale_factor=0.2,
        ns_precision="bf16",
    )  # fmt: skip
    assert routing == configs.RoutingConfig() and adamw == configs.AdamWConfig(lr=3e-3, weight_decay=0.01)
    mop, _, _ = run.optimizer_configs("mop", tuning.point("mop", cfg, lr=1e-2), cfg)
    assert (mop.scale_mode, mop.extra_scale_factor, mop.polar_method) == ("spectral", 0.2, "polar_express")


def test_changing_the_optimizer_yaml_changes_the_quality_bench(tmp_path, monkeypatch) -> None:
    """The bench reads conf/optimizer/muon.yaml through the product's compose path instead of restating it."""
    import shutil

    from muonbench import compose

    conf = tmp_path / "conf"
    shutil.copytree(compose.CONF_DIR, conf)
    yaml = conf / "optimizer" / "muon.yaml"
    yaml.write_text(yaml.read_text() + "momentum: 0.5\nnum_ns_steps: 7\n")
    cfg = run.parse_cli(["out=unused"])
    hp = tuning.point("muon", cfg, lr=1e-2)
    before, _, _ = run.optimizer_configs("muon", hp, cfg)
    monkeypatch.setattr(compose, "CONF_DIR", conf)
    after, _, _ = run.optimizer_configs("muon", hp, cfg)
    assert (before.momentum, before.num_ns_steps) == (0.95, 5)
    assert (after.momentum, after.num_ns_steps) == (0.5, 7)


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
        opt = run.build_opt(name, model, tuning.point(name, cfg, lr=1e-2), cfg)
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
    """The report's Command line re-parses to the same config (it printed `profile=cpu` for every run); the output
    directory is where, not what, so the command leaves it to the reader (`out=<dir>`)."""
    from dataclasses import asdict

    from bench.tools.quality import report

    args = ["profile=cpu", "seed=7", "steps=60", "optimizers=adamw,muon_split_gate_up", "out=/tmp/q"]
    stored = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(run.parse_cli(args)).items()}
    command = report._command(stored)
    assert command.startswith("python -m bench.tools.quality profile=cpu ")
    assert "out=" not in command
    assert run.parse_cli([*command.split()[3:], "out=/tmp/q"]) == run.parse_cli(args)
    assert (
        report._command(
            dict(
                stored,
                seed=1234,
                steps=400,
                optimizers=["adamw", "muon", "mop", "soap_rekls"],
                out="reports/quality_cpu_202612",
            )
        )
        == "python -m bench.tools.quality profile=cpu"
    )


def test_report_names_the_commit_of_every_piece() -> None:
    """A sweep resumed at another commit says which pieces ran where (it printed only the last piece's commit)."""
    from bench.tools.quality.report import commits_by_piece

    def piece(sha: str | None) -> dict:
        return {"git": {"sha": sha}} if sha else {}

    assert commits_by_piece([piece("a98250187566"), piece("a98250187566")]) == "a982501"
    assert (
        commits_by_piece([piece("a98250187566"), piece("a98250187566"), piece("b454239e7a15")])
        == "a982501 (pieces 1-2), b454239 (piece 3)"
    )
    assert commits_by_piece([piece("b454239e7a15"), piece(None)]) == "b454239 (piece 1), unknown (piece 2)"
