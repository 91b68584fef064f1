"""Layer-wise distributed optimizer on gloo: N-rank steps equal the single-process optimizer (fp32), for every
strategy, both gradient paths, both all-gather mechanisms, buckets and overlap; resume at the same and at a different
DP size; an interrupted save never corrupts the last good checkpoint.

Gradients are multiples of 2^-8, so their N-rank sums are exact and every DP size feeds the optimizers the same
bits; the remaining differences come from batching other sets of same-shape matrices into one NS call:
tolerance 2e-5 (abs and rel). Same-DP resume is bitwise (rtol = atol = 0). SOAP runs with a basis refresh every
10 steps (REKLS's per-step refresh moves a 21x16 matrix by up to 0.6 at lr 0.01 in its second step and turns
last-bit differences into O(1) ones). SOAP's 3-D expert stacks are compared only where the pieces equal the
single-process stacks: with Adam eps 1e-8 the first SOAP step divides the rounding noise of the rotated gradient
(which is diagonal in exact arithmetic) by itself, so batched and single matmuls (equal up to rounding) give O(1)
different updates; `test_soap_expert_stack_is_per_expert` shows per-expert equality once eps dominates that noise.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
from dist_harness import XDIST_GROUP, context, run_suite, subgroups
from torch import nn
from torch.testing import assert_close

from optim.configs import AdamWConfig, MOPConfig, MuonConfig, SOAPConfig
from optim.distributed.checkpoint import load_sharded, save_sharded
from optim.distributed.layerwise import LayerWiseConfig, LayerWiseDistributedOptimizer, default_is_expert
from optim.hybrid import build_optimizer

SHAPES = {  # odd shapes: uneven splits, same-shape matrices that batch, 3-D expert stacks, AdamW params cut by rows
    "model.embed_tokens.weight": (13, 8),
    "model.layers.0.self_attn.q_proj.weight": (21, 16),
    "model.layers.0.self_attn.o_proj.weight": (16, 21),
    "model.layers.0.input_layernorm.weight": (16,),
    "model.layers.0.mlp.gate.weight": (3, 16),
    "model.layers.0.mlp.experts.gate_up_proj": (5, 21, 16),
    "model.layers.0.mlp.experts.down_proj": (3, 16, 11),
    "model.layers.1.self_attn.q_proj.weight": (21, 16),
    "model.layers.1.self_attn.o_proj.weight": (16, 21),
    "model.norm.weight": (16,),
    "lm_head.weight": (13, 8),
}
Q0 = "model.layers.0.self_attn.q_proj.weight"
MUON = MuonConfig(ns_precision="fp32", lr=0.05, weight_decay=0.1, nesterov=True)
ADAMW = AdamWConfig(lr=0.01, weight_decay=0.1)
TOL = {"rtol": 2e-5, "atol": 2e-5}


MATRIX_CONFIGS = {
    "muon": MUON,
    "mop": MOPConfig(lr=0.05, weight_decay=0.1),
    # QR-power SOAP refreshing its basis every 10 steps: with a basis refresh every step (REKLS, the
    # default) the second step jumps by up to 60x lr on these shapes and amplifies last bits to O(1)
    "soap": SOAPConfig(
        lr=0.01, weight_decay=0.1, use_eigh=False, use_kl_shampoo=False, precondition_frequency=10
    ),
    "rekls": SOAPConfig(lr=0.01, weight_decay=0.1),
}  # the default SOAP-REKLS, at 1 rank only


def factory(named: list[tuple[str, torch.Tensor]], algo: str = "muon") -> torch.optim.Optimizer:
    return build_optimizer(named, MATRIX_CONFIGS[algo], adamw=ADAMW)


class Leaf(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + sum(p.sum() for p in self.parameters(recurse=False)) * 0


class Toy(nn.Module):
    """Modules nested as the dotted names say; forward runs every leaf (so forward pre-hooks fire)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        for name, shape in SHAPES.items():
            *path, leaf = name.split(".")
            mod: nn.Module = self
            for part in path:
                if not hasattr(mod, part):
                    mod.add_module(part, Leaf())
                mod = getattr(mod, part)
            mod.register_parameter(leaf, nn.Parameter(torch.randn(shape, generator=gen)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for m in self.modules():
            if isinstance(m, Leaf):
                x = m(x)
        return x


def micro_grads(step: int, num_micro: int = 4) -> list[dict[str, torch.Tensor]]:
    """The global batch's per-micro-batch gradients (identical on every rank), multiples of 2^-8: their sums and
    means over 1, 2 or 4 micro-batches are exact in fp32 in any order, so every DP size feeds the optimizer the
    same bits."""
    gen = torch.Generator().manual_seed(1000 + step)
    return [
        {n: torch.round(torch.randn(s, generator=gen) * 256) / 256 for n, s in SHAPES.items()}
        for _ in range(num_micro)
    ]


def set_local_grads(model: nn.Module, step: int, dp_rank: int, dp: int) -> None:
    """Rank dp_rank of dp averages its share of the micro-batches (for every parameter, expert or not)."""
    micro = micro_grads(step)
    share = micro[dp_rank * len(micro) // dp : (dp_rank + 1) * len(micro) // dp]
    for name, p in model.named_parameters():
        p.grad = torch.stack([g[name] for g in share]).mean(0)


def reference(
    seed: int,
    steps: range,
    *,
    expert_micro: slice = slice(None),
    model: Toy | None = None,
    opt: torch.optim.Optimizer | None = None,
) -> Toy:
    """Single-process run: full-batch mean gradients (expert params: the mean over `expert_micro`)."""
    model = model or Toy(seed)
    opt = opt or factory(list(model.named_parameters()))
    for step in steps:
        micro = micro_grads(step)
        for name, p in model.named_parameters():
            share = micro[expert_micro] if default_is_expert(name) else micro
            p.grad = torch.stack([g[name] for g in share]).mean(0)
        opt.step()
    return model


CONFIGS = [  # (placement and communication, matrix optimizer)
    (
        LayerWiseConfig(
            strategy="lpt_cost", grad_sync="reduce_scatter", collective="auto", overlap_param_gather=True
        ),
        "muon",
    ),
    (LayerWiseConfig(strategy="round_robin", grad_sync="all_reduce", collective="per_owner"), "soap"),
    (
        LayerWiseConfig(
            strategy="ping_pong_numel",
            grad_sync="reduce_scatter",
            collective="padded",
            bucket_numel=300,
            overlap_param_gather=True,
        ),
        "mop",
    ),
    (
        LayerWiseConfig(
            strategy="lpt_cost", grad_sync="reduce_scatter", collective="per_owner", bucket_numel=500
        ),
        "muon",
    ),
]


def _check_steps(rank: int, ws: int) -> None:
    """N-rank steps == single process, every config; at 4 ranks experts use pairs as expert-DP groups."""
    pairs, mine = subgroups(ws, 2) if ws == 4 else ([None], 0)
    extra = [(LayerWiseConfig(), "rekls")] if ws == 1 else []
    for cfg, algo in CONFIGS + extra:
        model = Toy(seed=3)
        e_group = pairs[mine] if ws == 4 else "dp"
        opt = LayerWiseDistributedOptimizer(
            model.named_parameters(),
            lambda named, a=algo: factory(named, a),
            dp_group=dist.group.WORLD,
            expert_dp_group=e_group,
            config=cfg,
        )
        if cfg.overlap_param_gather:
            opt.register_forward_hooks(model)
        ref_model = Toy(seed=3)
        ref_opt = factory(list(ref_model.named_parameters()), algo)
        for step in range(3):
            set_local_grads(model, step, rank, ws)  # experts: averaged over the pair only at 4 ranks
            before = model.get_parameter(Q0).detach().clone()
            opt.step()
            if cfg.overlap_param_gather:  # in flight until the forward pre-hook of the module that needs it
                assert torch.equal(model.get_parameter(Q0), before)
                model(torch.zeros(()))
            expert_micro = slice(2 * mine, 2 * mine + 2) if ws == 4 else slice(None)
            reference(3, range(step, step + 1), expert_micro=expert_micro, model=ref_model, opt=ref_opt)
        for (name, p), (_, q) in zip(model.named_parameters(), ref_model.named_parameters(), strict=True):
            if _stack_cut(opt, name, algo):
                continue
            assert_close(p, q, **TOL, msg=context(f"{algo} {cfg} {name}"))
    _check_clip(rank, ws)


def _stack_cut(opt: LayerWiseDistributedOptimizer, name: str, algo: str) -> bool:
    """SOAP and a 3-D stack cut into several pieces anywhere in the group (see the module docstring)."""
    if algo != "soap":
        return False
    for d in opt.domains:
        for b in d.buckets:
            idx = [i for i in b.params if d.names[i] == name]
            if idx and d.params[idx[0]].ndim == 3:
                return sum(pc.index == idx[0] for ps in b.pieces for pc in ps) > 1
    return False


def _check_clip(rank: int, ws: int) -> None:
    """Clipping uses the global norm of the averaged gradient (not each owner's local norm)."""
    cfg = LayerWiseConfig(max_grad_norm=1.0)
    model, ref_model = Toy(seed=5), Toy(seed=5)
    opt = LayerWiseDistributedOptimizer(
        model.named_parameters(), factory, dp_group=dist.group.WORLD, config=cfg
    )
    ref_opt = factory(list(ref_model.named_parameters()))
    seen: list[str] = []

    def record(fn, phase):  # type: ignore[no-untyped-def]
        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            seen.append(phase)
            return fn(*args, **kwargs)

        return call

    opt.instrument(record)  # the public timing hook the engines use: must not change the step
    set_local_grads(model, 0, rank, ws)
    opt.step()
    assert seen.count("clip") == 1 and "comm" in seen, seen
    micro = micro_grads(0)
    grads = {n: torch.stack([g[n] for g in micro]).mean(0) for n in SHAPES}
    total = torch.sqrt(sum(g.square().sum() for g in grads.values()))
    for name, p in ref_model.named_parameters():
        p.grad = grads[name] * min(1.0, 1.0 / (total.item() + 1e-6))
    ref_opt.step()
    for (name, p), (_, q) in zip(model.named_parameters(), ref_model.named_parameters(), strict=True):
        assert_close(p, q, **TOL, msg=context(f"clip {name}"))


def _run_dp(
    group: dist.ProcessGroup | None,
    dp_rank: int,
    dp: int,
    model: Toy,
    steps: range,
    ckpt_load: str | None = None,
    algo: str = "muon",
) -> LayerWiseDistributedOptimizer:
    opt = LayerWiseDistributedOptimizer(
        model.named_parameters(), lambda named: factory(named, algo), dp_group=group
    )
    if ckpt_load:
        model.load_state_dict(torch.load(os.path.join(ckpt_load, "model.pt"), weights_only=True))
        load_sharded(opt, ckpt_load)
    for step in steps:
        set_local_grads(model, step, dp_rank, dp)
        opt.step()
    return opt


def _check_resume(rank: int, ws: int, tmp: str, algo: str) -> None:
    """Save at DP=2 after 2 steps; resume at DP 2 (bitwise), 4 and 1 (fp32 tolerance) == the unbroken run.
    Muon state is momentum; SOAP state adds the Kronecker factors and eigenbases, per expert for 3-D stacks."""
    pairs, mine = subgroups(ws, 2)
    singles, _ = subgroups(ws, 1)
    ckpt = os.path.join(tmp, f"ckpt_{algo}")
    unbroken = Toy(seed=9)
    if mine == 0:
        model = Toy(seed=9)
        opt = _run_dp(pairs[0], rank, 2, model, range(2), algo=algo)
        save_sharded(opt, ckpt, tag="step2", group=pairs[0])
        if rank == 0:
            torch.save(model.state_dict(), os.path.join(ckpt, "model.pt"))
        _run_dp(pairs[0], rank, 2, unbroken, range(4), algo=algo)
    dist.barrier()
    for t in unbroken.state_dict().values():  # replica 0's unbroken result to everyone
        dist.broadcast(t, src=0)
    for label, group, dp_rank, dp in (
        ("dp2", pairs[mine], rank % 2, 2),
        ("dp4", dist.group.WORLD, rank, 4),
        ("dp1", singles[rank], 0, 1),
    ):
        resumed = Toy(seed=123)
        _run_dp(group, dp_rank, dp, resumed, range(2, 4), ckpt_load=ckpt, algo=algo)
        tol = {"rtol": 0, "atol": 0} if label == "dp2" else TOL
        for (name, p), (_, q) in zip(resumed.named_parameters(), unbroken.named_parameters(), strict=True):
            if label != "dp2" and algo == "soap" and p.ndim == 3:
                continue  # the pieces of the stacks differ from DP 2's (see the module docstring)
            assert_close(p, q, **tol, msg=context(f"resume {algo} {label} {name}"))


def _check_training(rank: int, ws: int) -> None:
    """Three steps of a tiny transformers Qwen3-MoE (3-D expert stacks, router, qk-norm) with Muon + AdamW on
    2 ranks == one process on the whole batch. Each rank runs its half as 2 micro-batches (the first under
    no_sync), with gradient collectives launched from backward hooks and the parameter gather overlapped with the
    next forward."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=24,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_experts=6,
        num_experts_per_tok=2,
        max_position_embeddings=64,
        use_cache=False,
    )
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(cfg)
    ref = Qwen3MoeForCausalLM(cfg)
    ref.load_state_dict(model.state_dict())
    lw = LayerWiseConfig(overlap_param_gather=True, overlap_grad_reduce=True, bucket_numel=3000)
    opt = LayerWiseDistributedOptimizer(
        model.named_parameters(), factory, dp_group=dist.group.WORLD, config=lw
    )
    assert len(opt.domains[0].buckets) > 1
    opt.register_forward_hooks(model)
    ref_opt = factory(list(ref.named_parameters()))
    batches = torch.randint(0, 96, (3, 4, 16), generator=torch.Generator().manual_seed(5))
    for x in batches:
        local = x[rank * 4 // ws : (rank + 1) * 4 // ws]
        with opt.no_sync():
            (model(input_ids=local[:1], labels=local[:1]).loss / 2).backward()
        assert not any(d.pending_grads for d in opt.domains)
        (model(input_ids=local[1:], labels=local[1:]).loss / 2).backward()
        assert all(len(d.pending_grads) == len(d.buckets) for d in opt.domains)  # launched during backward
        opt.step()
        opt.zero_grad()
        ref(input_ids=x, labels=x).loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
    opt.finish_param_sync()
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        assert_close(p, q, rtol=1e-4, atol=1e-4, msg=context(f"tiny Qwen3-MoE {name}"))


def layerwise_worker(rank: int, ws: int, tmp: str) -> None:
    """This module's checks on one rank (run by `dist_harness.run_suite`, one spawn per world size)."""
    _check_steps(rank, ws)
    if ws == 2:
        _check_training(rank, ws)
    if ws == 4:
        _check_resume(rank, ws, tmp, "muon")
        _check_resume(rank, ws, tmp, "soap")


@pytest.mark.dist
@pytest.mark.xdist_group(XDIST_GROUP)
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_layerwise_equals_single_process(world_size: int) -> None:
    """Localises: wrong owner offsets or padding, a gradient averaged over the wrong group (experts), a gather
    that misses pieces or completes too early/late with overlap, local instead of global clipping, and a resume
    that loses or misplaces state when the DP size changes."""
    failure = run_suite(world_size)
    assert failure is None, failure


def test_soap_expert_stack_is_per_expert() -> None:
    """A 3-D stack is a batch of independent matrices: SOAP on (3, 11, 11) equals SOAP on each matrix.

    Adam eps 0.5 (as in tests/unit/test_soap.py): with eps 1e-8 the first step's rotated gradient is diagonal plus
    fp32 rounding noise and Adam maps that noise to +-1, so batched and single matmuls disagree at O(1) even though
    both are correct up to rounding (the same happens between two BLAS builds).
    """
    from optim.optimizers.soap import SOAP

    torch.manual_seed(0)
    stack = nn.Parameter(torch.randn(3, 11, 11))
    singles = [nn.Parameter(stack.detach()[e].clone()) for e in range(3)]
    cfg = dataclasses.replace(MATRIX_CONFIGS["soap"], eps=0.5)
    opts = [SOAP([("e", p)], cfg) for p in (stack, *singles)]
    g = torch.randn(3, 11, 11)
    stack.grad = g.clone()
    for e, p in enumerate(singles):
        p.grad = g[e].clone()
    for o in opts:
        o.step()
    for e, p in enumerate(singles):
        assert_close(stack[e], p, rtol=1e-6, atol=1e-6, msg=context(f"expert {e}"))


def test_interrupted_save_keeps_last_good_checkpoint(tmp_path, monkeypatch) -> None:
    """A crash while writing leaves the previous manifest and files, which still load and resume identically."""
    model = Toy(seed=1)
    opt = _run_dp(None, 0, 1, model, range(2))
    save_sharded(opt, tmp_path, tag="good")
    good = {
        k: v.clone()
        for k, v in opt.inner.state_dict()["matrix"]["state"][0].items()
        if isinstance(v, torch.Tensor)
    }
    for step in range(2, 3):
        set_local_grads(model, step, 0, 1)
        opt.step()

    def crash(obj, f, *args, **kwargs):  # type: ignore[no-untyped-def]
        f.write(b"\x80\x02truncated")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        save_sharded(opt, tmp_path, tag="bad")
    monkeypatch.undo()
    fresh = LayerWiseDistributedOptimizer(Toy(seed=1).named_parameters(), factory)
    assert load_sharded(fresh, tmp_path) == "good"
    loaded = fresh.inner.state_dict()["matrix"]["state"][0]
    for k, v in good.items():
        assert torch.equal(loaded[k], v), k
    assert not (tmp_path / "bad.rank00000.pt").exists()
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        load_sharded(fresh, tempfile.mkdtemp())
