"""Shared fixtures: the session-scoped multi-rank worker pools and the GPU skip."""

from __future__ import annotations

import pytest
import torch

from tests.mp_pool import close_pools, get_pool


@pytest.fixture(scope="session")
def pools():
    """``pools(world_size)`` -> the session's :class:`WorkerPool` for that size."""
    yield get_pool
    close_pools()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
