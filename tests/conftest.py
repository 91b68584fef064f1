"""Shared fixtures: seeds, device, and the GPU marker's skip."""

from __future__ import annotations

import os
import random

import pytest

os.environ.setdefault("HYDRA_FULL_ERROR", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `gpu` are skipped, with the reason, where CUDA is missing."""
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs CUDA (run `make test-gpu` on a GPU machine)")
    for item in items:
        if (
            item.get_closest_marker("gpu") is not None
        ):  # the marker, not the keyword (which matches tests/gpu/)
            item.add_marker(skip)


@pytest.fixture
def seed() -> int:
    import numpy as np
    import torch

    random.seed(1234)
    np.random.seed(1234)
    torch.manual_seed(1234)
    return 1234


@pytest.fixture
def device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
