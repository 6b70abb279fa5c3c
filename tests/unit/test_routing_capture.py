"""The worker extension's routing capture (R3 on the CPU build): per request and position, the experts of the
latest computation, when the engine computes a request again after a pause or a preemption."""

from __future__ import annotations

from collections import OrderedDict
from types import SimpleNamespace

import torch

from megatron_rl.inference.worker_extension import RoutingCaptureMixin


class Capture(RoutingCaptureMixin):
    """The mixin with one MoE layer and top-1, fed steps by hand instead of by vLLM's model runner."""

    def __init__(self):
        self._mrl_step, self._mrl_routed = [None], OrderedDict()
        self.model_runner = SimpleNamespace(input_batch=SimpleNamespace(req_ids=[]))

    def step(self, experts: dict[str, list[int]], new: dict[str, int] = {}, cached: dict[str, int] = {}) -> None:
        """One engine step computing ``experts[req]`` (one expert id per scheduled token) for each request;
        ``new``/``cached``: the requests scheduled as new or as running/resumed, with their computed tokens."""
        self.model_runner.input_batch.req_ids = list(experts)
        self._mrl_step = [torch.tensor([e for ids in experts.values() for e in ids])[:, None]]
        self._mrl_record_step(SimpleNamespace(
            num_scheduled_tokens={r: len(ids) for r, ids in experts.items()},
            scheduled_new_reqs=[SimpleNamespace(req_id=r, num_computed_tokens=n) for r, n in new.items()],
            scheduled_cached_reqs=SimpleNamespace(req_ids=list(cached), num_computed_tokens=list(cached.values()))))


def rows(*experts: int) -> list:
    """[tokens, layers, top_k] as nested lists: one layer, top-1."""
    return [[[e]] for e in experts]


def test_a_request_computed_again_keeps_its_latest_routing_per_position():
    c = Capture()
    c.step({"a-0": [1, 1, 1], "b-0": [5, 5]}, new={"a-0": 0, "b-0": 0})  # prompts
    c.step({"a-0": [1], "b-0": [5]}, cached={"a-0": 3, "b-0": 2})  # decode
    c.step({"a-0": [2, 2, 2, 2]}, cached={"a-0": 0})  # resumed after a weight update: all 4 positions again
    c.step({"a-0": [3], "b-0": [6]}, cached={"a-0": 4, "b-0": 3})
    assert c.mrl_pop_routed_experts("a") == {"start": 0, "experts": rows(2, 2, 2, 2, 3)}
    assert c.mrl_pop_routed_experts("b") == {"start": 0, "experts": rows(5, 5, 5, 6)}
    assert c.mrl_pop_routed_experts("a") is None, "popped records are gone"


def test_a_cached_prefix_starts_the_record_later_and_a_gap_gives_none():
    c = Capture()
    c.step({"a-0": [4, 4]}, new={"a-0": 16})  # 16 prompt tokens served from the prefix cache
    c.step({"a-0": [7]}, cached={"a-0": 18})
    assert c.mrl_pop_routed_experts("a") == {"start": 16, "experts": rows(4, 4, 7)}
    c.step({"b-0": [1, 1]}, new={"b-0": 0})
    c.step({"b-0": [1]}, cached={"b-0": 5})  # positions 2-4 never computed here
    assert c.mrl_pop_routed_experts("b") is None
