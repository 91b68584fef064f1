"""The script's arguments, and on an SM90 GPU with QuACK the paired kernel (`optim.kernels._quack_paired`) against
fp32 products and against QuACK's 128 x 128 tiles without clusters, bit for bit (the schedule itself:
tests/unit/test_paired_schedule.py)."""

from __future__ import annotations

import pytest


def test_arguments():
    from experiments.quack_sym_pairs.pairs import parse_args

    assert parse_args(["shapes=2x256x512", "rounds=2"])["shapes"] == [(2, 256, 512)]
    with pytest.raises(ValueError, match="unknown arguments"):
        parse_args(["shape=2x256x512"])
    with pytest.raises(ValueError, match="m > n"):
        parse_args(["shapes=2x512x256"])


@pytest.mark.gpu
@pytest.mark.parametrize("b,m,k", [(3, 1536, 2048), (2, 768, 2048), (2, 640, 512), (1, 200, 256)])
def test_paired_kernel_matches_fp32_and_quack_tiles(b, m, k):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an SM90 GPU")
    pytest.importorskip("quack")
    from optim.kernels._quack_paired import paired_symmetric
    from optim.kernels._quack_scaled import scaled_symmetric

    torch.manual_seed(0)
    x = torch.randn(b, m, k, device="cuda").to(torch.bfloat16)
    u = torch.rand(b, device="cuda").view(-1, 1).expand(b, m).contiguous() + 0.5
    out, ref_tiles = (
        torch.full((b, m, m), float("nan"), device="cuda", dtype=torch.bfloat16),
        torch.empty(b, m, m, device="cuda", dtype=torch.bfloat16),
    )
    paired_symmetric(x, x, out, u)
    scaled_symmetric(x, x, ref_tiles, u, None, None, 128, 128, 1, True)
    ref = u.view(b, m, 1) * (x.float() @ x.float().mT)
    assert torch.isfinite(out.float()).all()  # every tile written, both halves
    assert ((out.float() - ref).abs().max() / ref.abs().max()).item() < 8e-3
    assert torch.equal(out, out.mT)
    assert torch.equal(
        out, ref_tiles
    )  # same tiles, same K order: the same bits as the unclustered 128 x 128 tiles
    c = out.clone()
    v = torch.full((b, m), 0.25, device="cuda")
    out2 = torch.full_like(out, float("nan"))
    paired_symmetric(c, c, out2, u, c, v)
    ref2 = u.view(b, m, 1) * (c.float() @ c.float()) + 0.25 * c.float()
    assert ((out2.float() - ref2).abs().max() / ref2.abs().max()).item() < 8e-3
