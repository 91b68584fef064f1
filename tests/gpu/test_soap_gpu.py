"""GPU tests of SOAP-REKLS's eigenbasis refresh on CUDA streams: `eigh_descending`'s chunked path equals the single
batched call bitwise, from the default or a side caller stream, is taken for a 64 x 256 x 256 stack, survives being
a process's first linalg call, and leaves SOAP's steps unchanged."""

from __future__ import annotations

import subprocess
import sys
from functools import partial

import pytest
import torch

from optim.configs import SOAPConfig
from optim.functional import soap_math
from optim.optimizers.soap import SOAP

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _psd(count: int, k: int, seed: int = 0) -> torch.Tensor:
    g = torch.randn(count, k, k, generator=torch.Generator().manual_seed(seed))
    return (g @ g.mT / k).cuda()


def test_streams_equal_the_batched_call() -> None:
    """Localises a chunk that is dropped, reordered or read before the caller's stream wrote it, or a result read
    before the side streams finished: 64 x 256 x 256 in 8 chunks (automatic), 3 uneven chunks, and from a side
    caller stream, all bitwise equal to the single batched call."""
    f = _psd(64, 256)
    ref = soap_math.eigh_descending(f, streams=1)
    auto = soap_math.eigh_descending(f)
    assert len(soap_math._chunk_bounds(f, None)) == soap_math.DEFAULT_EIGH_STREAMS
    assert len(soap_math._SIDE_STREAMS[torch.cuda.current_device()]) >= soap_math.DEFAULT_EIGH_STREAMS
    assert torch.equal(auto, ref)
    assert torch.equal(soap_math.eigh_descending(f, streams=3), ref)
    caller = torch.cuda.Stream()
    caller.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(caller):
        g = f * 1.0  # written on the caller stream just before the call
        out = soap_math.eigh_descending(g).clone()
    torch.cuda.current_stream().wait_stream(caller)
    assert torch.equal(out, ref)
    vals = torch.linalg.eigvalsh(f).flip(-1)
    torch.testing.assert_close(soap_math.approx_eigvals(f, auto), vals, atol=1e-4, rtol=1e-4)


def test_first_linalg_call_of_a_process_is_the_stream_path() -> None:
    """Localises the race of torch's lazy linalg load ("lazy wrapper should be called at most once") when the first
    linalg call of a process comes from several threads at once."""
    code = (
        "import torch\n"
        "from optim.functional.soap_math import eigh_descending\n"
        "g = torch.randn(32, 64, 64, device='cuda')\n"
        "q = eigh_descending(g @ g.mT)\n"
        "torch.cuda.synchronize()\n"
        "assert torch.isfinite(q).all()\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-2000:]


def test_soap_steps_unchanged_by_the_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    """Localises an optimizer-visible difference of the stream path: REKLS on a 64-expert 256 x 256 stack (both
    factors refreshed by eigh every step) steps bitwise like the single batched call."""

    def run() -> torch.Tensor:
        gen = torch.Generator().manual_seed(0)
        w = torch.randn(64, 256, 256, generator=gen).cuda().requires_grad_()
        opt = SOAP([w], SOAPConfig(lr=0.01))
        for _ in range(3):
            w.grad = torch.randn(64, 256, 256, generator=gen).cuda()
            opt.step()
        return w.detach()

    streamed = run()
    monkeypatch.setattr(soap_math, "eigh_descending", partial(soap_math.eigh_descending, streams=1))
    batched = run()
    assert torch.isfinite(streamed).all()
    assert torch.equal(streamed, batched)
