"""Test tiers: the first folder under tests/ sets the marker (unit, integration, gpu); gpu tests skip without CUDA.

Under pytest-xdist (``-n 2``, the README's test command; ``--dist loadscope`` from pyproject) each test joins the
group that must stay on one worker: an integration folder (its session fixtures, shared servers and /tmp folders
are one worker's) or else its file (its module fixtures). Groups go out longest first, so the two workers end
together rather than one idling through a long group at the end.
"""

from pathlib import Path

import pytest

_TIERS = ("unit", "integration", "gpu")
_ROOT = Path(__file__).parent
# The longest groups (2-11 min each on 2 cores in the fresh-clone CI of 2026-12-07), about longest first; the rest
# follow in file order, the unit tests last.
_LONG = ("integration/slurm", "integration/test_train_job.py", "integration/test_learning.py",
         "integration/test_repro_routing_drift.py", "integration/test_repro_r2_vs_r3.py",
         "integration/test_repro_stability.py", "integration/test_repro_router_mismatch.py", "integration/envs",
         "integration/tinker", "integration/inference", "integration/test_schedules_async.py",
         "integration/weight_transfer", "integration/parallel", "integration/multinode",
         "integration/test_schedules_ppo.py")


def _tier(path: Path) -> str | None:
    parts = path.relative_to(_ROOT).parts
    return parts[0] if len(parts) > 1 and parts[0] in _TIERS else None


def _group(path: Path) -> str:
    parts = path.relative_to(_ROOT).parts
    return "/".join(parts[:2])  # integration/<folder> or <tier>/<file>


def _rank(group: str) -> int:
    return _LONG.index(group) if group in _LONG else len(_LONG) + (not group.startswith("integration/"))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadscope`` with a scope per group (xdist's own ``loadgroup`` puts the group in the test's id, which
    pytest 9 no longer lets a plugin change)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(_ROOT.parent / nodeid.split("::")[0])

    return ByGroup(config, log)


def pytest_collection_modifyitems(config, items):
    import torch

    cuda = torch.cuda.is_available()
    for item in items:
        path = Path(str(item.fspath))
        tier = _tier(path)
        if tier:
            item.add_marker(getattr(pytest.mark, tier))
        if item.get_closest_marker("gpu") and not cuda:
            item.add_marker(pytest.mark.skip(reason="needs CUDA"))
    items.sort(key=lambda item: _rank(_group(Path(str(item.fspath)))))
