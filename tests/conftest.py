"""Test tiers: the folder sets the marker (unit, integration, gpu); gpu tests skip without CUDA."""

from pathlib import Path

import pytest

_TIERS = ("unit", "integration", "gpu")


def pytest_collection_modifyitems(config, items):
    import torch

    cuda = torch.cuda.is_available()
    for item in items:
        tier = Path(str(item.fspath)).parent.name
        if tier in _TIERS:
            item.add_marker(getattr(pytest.mark, tier))
        if item.get_closest_marker("gpu") and not cuda:
            item.add_marker(pytest.mark.skip(reason="needs CUDA"))
