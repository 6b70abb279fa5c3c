"""Test tiers: the first folder under tests/ sets the marker (unit, integration, gpu); gpu tests skip without CUDA."""

from pathlib import Path

import pytest

_TIERS = ("unit", "integration", "gpu")
_ROOT = Path(__file__).parent


def _tier(path: Path) -> str | None:
    parts = path.relative_to(_ROOT).parts
    return parts[0] if len(parts) > 1 and parts[0] in _TIERS else None


def pytest_collection_modifyitems(config, items):
    import torch

    cuda = torch.cuda.is_available()
    for item in items:
        tier = _tier(Path(str(item.fspath)))
        if tier:
            item.add_marker(getattr(pytest.mark, tier))
        if item.get_closest_marker("gpu") and not cuda:
            item.add_marker(pytest.mark.skip(reason="needs CUDA"))
