"""The hf engine in one process: step metrics, NS timing and FLOP counting, determinism, the LR schedule."""

from __future__ import annotations

import pytest

import muonbench
from bench import flops
from bench.engines import RankInfo, engine_class

ONE_RANK = RankInfo(rank=0, world_size=1, local_rank=0)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matmuls: one intra-op thread avoids oversubscribing a shared CPU (as torchrun's OMP_NUM_THREADS=1)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _cfg(*overrides: str):
    return muonbench.load(
        [
            "model=qwen3_moe_tiny",
            "parallelism=single_gpu",
            "parallelism.gbs=4",
            "parallelism.mbs=2",
            "engine=hf",
            "hardware=cpu",
            "bench.steps=3",
            "bench.warmup_steps=1",
            *overrides,
        ]
    )


def _run(cfg, steps: int = 2):
    eng = engine_class("hf")()
    eng.setup(cfg, ONE_RANK)
    try:
        return [eng.step() for _ in range(steps)], eng.describe()
    finally:
        eng.teardown()


def test_muon_step_metrics_and_ns_flops_match_the_enumeration():
    """Localises NS time/FLOPs not being captured, or the hook counting other shapes than bench.flops enumerates."""
    cfg = _cfg("optimizer=muon")
    metrics, info = _run(cfg)
    m = metrics[-1]
    assert m.tokens == 4 * cfg.model.seq_length and m.loss > 0
    assert m.step_s >= m.fwd_bwd_s > 0 and m.optim_s >= m.ns_s > 0 and m.comm_s == 0.0
    mats = flops.enumerate_ns_matrices(cfg.model, split_qkv=True)
    assert m.ns_flops == pytest.approx(flops.ns_flops_per_step(mats, cfg.optimizer.num_ns_steps, "plain"))
    assert info["model_class"] == "Qwen3MoeForCausalLM" and info["routes"]["matrix/expert_stack"] == 4
    assert info["optimizer_distribution"].startswith("replicated")


def test_adamw_baseline_has_no_ns_and_all_params_on_adamw():
    metrics, info = _run(_cfg("optimizer=adamw"))
    assert metrics[-1].ns_s is None and metrics[-1].ns_flops == 0.0
    assert {k.split("/")[0] for k in info["routes"]} == {"adamw"}


@pytest.mark.parametrize("polar_method", ["svd", "polar_express"])
def test_mop_steps_with_ns_flops_only_for_iterations(polar_method):
    """Localises the exact-SVD MOP (no NS iterations, k = 0) crashing the NS FLOP counter (`num_ns_steps=0`)."""
    cfg = _cfg("optimizer=mop", f"optimizer.polar_method={polar_method}")
    metrics, _ = _run(cfg, steps=1)
    m = metrics[-1]
    assert m.ns_s is not None and m.ns_s > 0
    if polar_method == "svd":
        assert m.ns_flops == 0.0
    else:
        mats = flops.enumerate_ns_matrices(cfg.model, split_qkv=True)
        assert m.ns_flops == pytest.approx(flops.ns_flops_per_step(mats, cfg.optimizer.num_ns_steps, "plain"))


def test_same_seed_same_losses():
    """Bitwise-identical losses for two engines at one seed (model init and mock data are seeded)."""
    a, _ = _run(_cfg("optimizer=muon"), steps=2)
    b, _ = _run(_cfg("optimizer=muon"), steps=2)
    assert [x.loss for x in a] == [x.loss for x in b]


def test_deepseek_family_builds_and_steps():
    metrics, info = _run(_cfg("model=kimi_k2_tiny", "optimizer=muon"), steps=1)
    assert info["model_class"] == "DeepseekV3ForCausalLM" and metrics[0].ns_flops > 0


def test_bad_engine_inputs_are_value_errors():
    eng = engine_class("hf")()
    with pytest.raises(ValueError, match="world_size=2 but 1 processes"):
        eng.setup(muonbench.load(["experiment=cpu/qwen3_moe_tiny_dp2"]), ONE_RANK)
    with pytest.raises(ValueError, match="bench.data='indexed:/x'"):
        eng.setup(_cfg("bench.data=indexed:/x"), ONE_RANK)
    with pytest.raises(ValueError, match=r"optimizer.ns_overlap=True: engine=megatron only"):
        engine_class("hf")().setup(_cfg("optimizer=muon", "optimizer.ns_overlap=true"), ONE_RANK)


def test_lr_schedule_warmup_then_cosine_to_min():
    from bench.engines.hf import lr_lambda

    opt = _cfg(
        "optimizer=muon", "optimizer.lr_warmup_steps=4", "optimizer.lr=1e-3", "optimizer.min_lr=1e-4"
    ).optimizer
    mult = lr_lambda(opt, total_steps=14)
    assert [mult(i) for i in range(4)] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert (
        mult(9) == pytest.approx(0.55) and mult(14) == pytest.approx(0.1) and mult(20) == pytest.approx(0.1)
    )


def test_token_stream_text_windows_are_file_bytes(tmp_path):
    from bench.engines.hf import TokenStream

    text = bytes(range(256)) * 3
    path = tmp_path / "corpus.bin"
    path.write_bytes(text)
    stream = TokenStream(f"text:{path}", vocab_size=512, seq_length=16, mbs=3, seed=7)
    batch = stream.next()
    assert batch.shape == (3, 16)
    for row in batch.tolist():
        assert bytes(row) in text
    with pytest.raises(ValueError, match="vocab_size >= 256"):
        TokenStream(f"text:{path}", vocab_size=128, seq_length=16, mbs=1, seed=0)
    mock = TokenStream("mock", vocab_size=512, seq_length=16, mbs=2, seed=7).next()
    assert mock.equal(TokenStream("mock", vocab_size=512, seq_length=16, mbs=2, seed=7).next())
