"""The placement realised as Ray placement groups: one group per role (its strategy, one bundle per trainer rank
or engine), reserved atomically before any actor starts; each actor then runs inside its own bundle."""

from __future__ import annotations

from megatron_rl.runtime.placement import BundleGroup, PlacementError


def _bundle(group: BundleGroup) -> dict[str, float]:
    return {**({"GPU": float(group.gpus)} if group.gpus else {}), **({"CPU": float(group.cpus)} if group.cpus else {}),
            **{k: float(v) for k, v in group.labels.items()}}


class Reserved:
    """The run's placement groups; ``options(role)`` gives each actor of ``role`` its bundle, ``release`` frees them."""

    def __init__(self, groups: list[BundleGroup], timeout_s: float = 120.0):
        from ray.util import placement_group

        self.groups: dict = {}
        try:
            for group in groups:
                if not any(_bundle(group).values()):
                    continue  # nothing to reserve (CPU actors without labels): Ray places them anywhere
                pg = placement_group([_bundle(group)] * group.count, strategy=group.strategy, name=f"mrl-{group.role}")
                self.groups[group.role] = pg
                if not pg.wait(timeout_s):
                    raise PlacementError(f"placement: Ray could not reserve the {group.role}'s {group.count} bundle(s) "
                                         f"{_bundle(group)} ({group.strategy}) within {timeout_s:.0f} s; the cluster "
                                         "lacks them (see `ray status`)")
        except BaseException:
            self.release()
            raise

    def options(self, role: str, count: int) -> list[dict]:
        """Ray actor options per actor of ``role`` (empty dicts where the role has no group)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        pg = self.groups.get(role)
        if pg is None:
            return [{} for _ in range(count)]
        return [{"scheduling_strategy": PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)}
                for i in range(count)]

    def release(self) -> None:
        from ray.util import remove_placement_group

        for pg in self.groups.values():
            remove_placement_group(pg)
        self.groups = {}
