"""TP Newton-Schulz modes and the layer-wise distributed optimizer over NCCL on 2 GPUs equal one-GPU results.

`MUONBENCH_TEST_WORLD=4` (or 8) runs the same checks on that many ranks / GPUs (checked with gloo at 4 on CPU).
Two ranks are spawned in-process (torch.multiprocessing spawn + FileStore), one GPU each, NVLink multicast off
(NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1, as the device README asks).
Every reference is computed in the same rank process, on the same GPU, by the single-process code path
(`tp_group=None`, the plain optimizer).
TF32 is switched off so fp32 GEMMs are fp32.

`MUONBENCH_TEST_BACKEND=gloo` runs the same checks on 2 CPU gloo ranks (then the test is a `dist` test, not a
`gpu` one): it is how this file is checked without GPUs. tests/conftest.py skips everything under tests/gpu
where CUDA is missing, so that run needs `--noconftest`:
`MUONBENCH_TEST_BACKEND=gloo python -m pytest --noconftest tests/gpu/test_dist_nccl.py`.

Tolerances (fp32 NS, quintic, 5 steps):
- duplicated: 1e-6 abs and rel. The gathered matrix goes through the same NS as the reference, so the result
  is bitwise equal in practice; the slack only covers cuBLAS picking another kernel for another alignment.
- distributed, distributed_gram (full and lower-triangle reduce): 5e-5. The Gram is a sum of per-shard partial
  Grams, a different summation order than one GEMM (the gloo tests hold 2e-5 on CPU).
- blockwise: rtol = atol = 0 against NS of the shard alone (same call on the same tensor).
- layer-wise optimizer: 2e-5 on parameters after 3 steps. Gradients are multiples of 2^-8, so their sums over
  ranks are exact and both sides feed the optimizers the same bits; what remains is NS batching other sets of
  same-shape matrices (another bmm batch size) and AdamW being element-wise.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import tempfile
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.testing import assert_close

from optim.configs import AdamWConfig, MuonConfig
from optim.distributed.comm import split_sizes
from optim.distributed.layerwise import LayerWiseConfig, LayerWiseDistributedOptimizer, default_is_expert
from optim.distributed.tp_orthogonalize import TPMode, tp_newton_schulz
from optim.functional.newton_schulz import newton_schulz
from optim.hybrid import build_optimizer

BACKEND = os.environ.get("MUONBENCH_TEST_BACKEND", "nccl")
WORLD = int(os.environ.get("MUONBENCH_TEST_WORLD", "2"))
ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

if BACKEND not in ("nccl", "gloo"):
    raise ValueError(f"MUONBENCH_TEST_BACKEND={BACKEND!r}: must be one of ['nccl', 'gloo']")
if WORLD not in (2, 4, 8):
    raise ValueError(f"MUONBENCH_TEST_WORLD={WORLD}: must be one of [2, 4, 8] (processes, one GPU each)")
pytestmark = [pytest.mark.gpu] if BACKEND == "nccl" else [pytest.mark.dist]
needs_gpus = pytest.mark.skipif(
    BACKEND == "nccl" and torch.cuda.device_count() < WORLD,
    reason=f"needs {WORLD} CUDA GPUs for NCCL (found {torch.cuda.device_count()}); "
    "MUONBENCH_TEST_BACKEND=gloo runs it on CPU",
)


def _msg(text: str) -> Callable[[str], str]:
    return lambda default: f"{default}\n{text}"


# ------------------------------------------------------------------------------------------ process harness
def _entry(rank: int, check: Callable[[int, torch.device], None], backend: str, store_path: str) -> None:
    os.environ.update(ENV)
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    else:
        torch.set_num_threads(1)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        device = torch.device("cpu")
    store = dist.FileStore(store_path, WORLD)
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=WORLD, device_id=device if backend == "nccl" else None
    )
    try:
        check(rank, device)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _spawn(check: Callable[[int, torch.device], None]) -> None:
    os.environ.update(ENV)  # children inherit it; also set again before init in each child
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(
            _entry,
            args=(check, BACKEND, os.path.join(tmp, "store")),
            nprocs=WORLD,
            join=True,
            start_method="spawn",
        )


# ------------------------------------------------------------------------------------------------ TP NS modes
# (full shape, sharded dim): long side sharded (distributed valid), short side sharded (falls back to
# duplicated), 3-D stacks, and sizes that are not multiples of any tile.
TP_CASES = [
    ((21, 16), 0),
    ((16, 21), 1),
    ((3, 21, 16), 1),
    ((3, 16, 21), -1),
    ((67, 130), 1),
    ((131, 66), 0),
    ((5, 37, 90), 2),
]
TOL_DUPLICATED = {"rtol": 1e-6, "atol": 1e-6}
TOL_DISTRIBUTED = {"rtol": 5e-5, "atol": 5e-5}


def _check_tp_modes(rank: int, device: torch.device) -> None:
    gen = torch.Generator().manual_seed(7)
    group = dist.group.WORLD
    for shape, pdim in TP_CASES:
        full = torch.randn(shape, generator=gen).to(device)
        shard = torch.tensor_split(full, WORLD, dim=pdim)[rank].contiguous()
        kw: dict[str, Any] = {
            "partition_dim": pdim,
            "tp_group": group,
            "compute_dtype": torch.float32,
            "shard_sizes": split_sizes(full.size(pdim), WORLD),
        }

        def ref_chunk(use_gram: bool, full: torch.Tensor = full, pdim: int = pdim) -> torch.Tensor:
            ref = newton_schulz(full, compute_dtype=torch.float32, use_gram=use_gram)
            return torch.tensor_split(ref, WORLD, dim=pdim)[rank]

        out = tp_newton_schulz(shard, mode=TPMode.DUPLICATED, **kw)
        assert out.device == device and out.shape == shard.shape
        assert_close(out, ref_chunk(False), **TOL_DUPLICATED, msg=_msg(f"duplicated {shape} pdim={pdim}"))
        for mode, tri in itertools.product((TPMode.DISTRIBUTED, TPMode.DISTRIBUTED_GRAM), (False, True)):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # short-dim sharding falls back to duplicated with a warning
                out = tp_newton_schulz(shard, mode=mode, triangular_reduce=tri, **kw)
            assert_close(
                out,
                ref_chunk(mode == TPMode.DISTRIBUTED_GRAM),
                **TOL_DISTRIBUTED,
                msg=_msg(f"{mode} {shape} pdim={pdim} triangular={tri}"),
            )
        out = tp_newton_schulz(shard, mode=TPMode.BLOCKWISE, **kw)
        assert_close(
            out,
            newton_schulz(shard, compute_dtype=torch.float32),
            rtol=0,
            atol=0,
            msg=_msg(f"blockwise {shape} pdim={pdim}"),
        )


@needs_gpus
def test_tp_modes_equal_single_gpu() -> None:
    """Localises NCCL-specific breakage of the TP modes: wrong shard offsets on uneven splits, a Gram
    all-reduce on the wrong stream or dtype, a broken lower-triangle pack on CUDA, blockwise touching other
    shards."""
    _spawn(_check_tp_modes)


# ------------------------------------------------------------------------------------------ layer-wise step
SHAPES: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (13, 8)}
for _layer in range(3):  # same-shape matrices in every layer batch together on an owner
    _p = f"model.layers.{_layer}"
    SHAPES |= {
        f"{_p}.self_attn.q_proj.weight": (21, 16),
        f"{_p}.self_attn.k_proj.weight": (7, 16),
        f"{_p}.self_attn.o_proj.weight": (16, 21),
        f"{_p}.input_layernorm.weight": (16,),
        f"{_p}.mlp.gate.weight": (5, 16),
        f"{_p}.mlp.experts.gate_up_proj": (5, 22, 16),
        f"{_p}.mlp.experts.down_proj": (5, 16, 11),
    }
SHAPES |= {"model.norm.weight": (16,), "lm_head.weight": (13, 8)}
PROBE = "model.layers.1.self_attn.q_proj.weight"
MUON = MuonConfig(ns_precision="fp32", lr=0.05, weight_decay=0.1, nesterov=True)
ADAMW = AdamWConfig(lr=0.01, weight_decay=0.1)
TOL_STEP = {"rtol": 2e-5, "atol": 2e-5}
NUM_MICRO, NUM_STEPS = 4, 3


def _factory(named: list[tuple[str, torch.Tensor]]) -> torch.optim.Optimizer:
    return build_optimizer(named, MUON, adamw=ADAMW)


class _Leaf(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + sum(p.sum() for p in self.parameters(recurse=False)) * 0


def _model(device: torch.device) -> nn.Module:
    """Modules nested as the dotted names say, fixed values; forward visits every leaf (pre-hooks fire)."""
    root = nn.Module()
    gen = torch.Generator().manual_seed(3)
    for name, shape in SHAPES.items():
        *path, leaf = name.split(".")
        mod = root
        for part in path:
            if not hasattr(mod, part):
                mod.add_module(part, _Leaf())
            mod = getattr(mod, part)
        mod.register_parameter(leaf, nn.Parameter(torch.randn(shape, generator=gen)))
    return root.to(device)


def _forward(model: nn.Module, device: torch.device) -> None:
    x = torch.zeros((), device=device)
    for m in model.modules():
        if isinstance(m, _Leaf):
            x = m(x)


def _micro_grads(step: int, device: torch.device) -> list[dict[str, torch.Tensor]]:
    """Per-micro-batch gradients, multiples of 2^-8 (exact sums and means in any order), same on all ranks."""
    gen = torch.Generator().manual_seed(1000 + step)
    return [
        {n: (torch.round(torch.randn(s, generator=gen) * 256) / 256).to(device) for n, s in SHAPES.items()}
        for _ in range(NUM_MICRO)
    ]


def _set_grads(
    model: nn.Module, micro: list[dict[str, torch.Tensor]], share: slice, expert_share: slice
) -> None:
    for name, p in model.named_parameters():
        part = micro[expert_share if default_is_expert(name) else share]
        p.grad = torch.stack([g[name] for g in part]).mean(0)


def _configs() -> list[tuple[LayerWiseConfig, bool]]:
    """Every strategy x overlap x grad path (collective, bucket size varied along), plus expert-DP of one
    rank, gradient collectives launched from backward hooks, and global-norm clipping."""
    out = []
    combos = itertools.product(
        ("round_robin", "ping_pong_numel", "lpt_cost"), (False, True), ("reduce_scatter", "all_reduce")
    )
    for i, (strategy, overlap, grad_sync) in enumerate(combos):
        out.append(
            (
                LayerWiseConfig(
                    strategy=strategy,
                    overlap_param_gather=overlap,
                    grad_sync=grad_sync,
                    collective=("auto", "padded", "per_owner")[i % 3],
                    bucket_numel=(0, 700)[i % 2],
                ),
                False,
            )
        )
    out.append((LayerWiseConfig(strategy="lpt_cost", overlap_param_gather=True), True))
    # gradient collectives launched from backward hooks (NCCL work from the autograd thread), and clipping
    out.append(
        (LayerWiseConfig(overlap_grad_reduce=True, overlap_param_gather=True, bucket_numel=700), False)
    )
    out.append(
        (
            LayerWiseConfig(
                strategy="round_robin",
                overlap_grad_reduce=True,
                grad_sync="all_reduce",
                collective="per_owner",
                bucket_numel=700,
            ),
            False,
        )
    )
    out.append((LayerWiseConfig(strategy="ping_pong_numel", max_grad_norm=1.0, bucket_numel=700), False))
    return out


def _backward_grads(
    opt: LayerWiseDistributedOptimizer, model: nn.Module, micro: list[dict[str, torch.Tensor]]
) -> None:
    """Accumulate the mean of `micro` by backward (d/dp (p * g).sum() / k = g / k, exact for k = 2), all but
    the last micro-batch under no_sync, so the last backward's hooks launch the bucket collectives."""
    params = dict(model.named_parameters())
    for i, g in enumerate(micro):
        with opt.no_sync() if i < len(micro) - 1 else contextlib.nullcontext():
            loss = sum((p * g[n]).sum() for n, p in params.items()) / len(micro)
            loss.backward()
    assert all(len(d.pending_grads) == len(d.buckets) for d in opt.domains), "not launched during backward"


def _clip_reference(model: nn.Module, max_norm: float) -> None:
    grads = [p.grad for p in model.parameters()]
    total = torch.sqrt(sum(g.square().sum() for g in grads))
    scale = max_norm / (total.item() + 1e-6)
    assert scale < 1.0  # the check must exercise clipping
    for g in grads:
        g.mul_(scale)


def _check_layerwise(rank: int, device: torch.device) -> None:
    singles = [dist.new_group([r]) for r in range(WORLD)]  # every rank creates every group
    share = slice(rank * NUM_MICRO // WORLD, (rank + 1) * NUM_MICRO // WORLD)
    for cfg, expert_local in _configs():
        model, ref_model = _model(device), _model(device)
        opt = LayerWiseDistributedOptimizer(
            model.named_parameters(),
            _factory,
            dp_group=dist.group.WORLD,
            expert_dp_group=singles[rank] if expert_local else "dp",
            config=cfg,
        )
        if cfg.overlap_param_gather:
            opt.register_forward_hooks(model)
        ref_opt = _factory(list(ref_model.named_parameters()))
        for step in range(NUM_STEPS):
            micro = _micro_grads(step, device)
            if cfg.overlap_grad_reduce:
                _backward_grads(opt, model, micro[share])
            else:
                _set_grads(model, micro, share, share)  # each rank its share of the micro-batches
            # expert-DP of one rank: expert grads are not reduced; the reference sees this rank's share only
            _set_grads(ref_model, micro, slice(None), share if expert_local else slice(None))
            if cfg.max_grad_norm > 0:
                _clip_reference(ref_model, cfg.max_grad_norm)
            before = model.get_parameter(PROBE).detach().clone()
            opt.step()
            ref_opt.step()
            if cfg.overlap_grad_reduce:
                opt.zero_grad()
            if cfg.overlap_param_gather:  # still in flight until the forward pre-hook of its module
                assert torch.equal(model.get_parameter(PROBE), before), (
                    f"{cfg}: gather completed before forward"
                )
                _forward(model, device)
            assert not torch.equal(model.get_parameter(PROBE), before), f"{cfg}: step {step} did not update"
        for (name, p), (_, q) in zip(model.named_parameters(), ref_model.named_parameters(), strict=True):
            assert p.device == device
            assert_close(p, q, **TOL_STEP, msg=_msg(f"{cfg} expert_local={expert_local} {name}"))


@needs_gpus
def test_layerwise_step_equals_single_gpu() -> None:
    """Localises NCCL-specific breakage of the layer-wise optimizer: reduce-scatter / all-reduce / per-owner
    reduce offsets on CUDA buffers, async gathers completing early or never (overlap), expert gradients
    averaged over the wrong group, CPU tensors handed to NCCL (load gather, clipping), gradient collectives
    launched from backward hooks that race the accumulation."""
    _spawn(_check_layerwise)
