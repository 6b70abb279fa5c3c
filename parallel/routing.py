"""MoE routing replay through megatron-core's ``RouterReplay`` (0.19.2), per model, not global.

R3 replays the experts the sampler chose for each token; R2 records the experts of the trainer's
old-log-prob pass and replays them in the training pass. Records are ``[b, s, num_moe_layers, topk]``
per micro-batch; megatron's routers see tokens sequence-major (``[s * b]``), hence the transposes.

Activation recompute runs a router again inside backward, and under pipeline parallelism (1F1B)
other micro-batches' forwards come between. Each forward therefore also queues its routing on
megatron's backward list, and after it the routers switch to ``REPLAY_BACKWARD``, which pops that
list in order: backward passes run in forward order, so every recompute meets its own micro-batch's
experts. Free-routed micro-batches (fillers) queue the experts they chose.

While a forward replays, each router also computes the experts it would have chosen itself; the
training pass reports how often that choice differs from the replayed one (``disagreement``). Under
R3 that is the sampler/trainer router mismatch the R3 paper measures (~10% of routers, 94% of tokens
differing in at least one layer on Qwen3-30B-A3B); under R2 it is the expert change since the
old-log-prob pass, 0 in the first mini-batch and growing with each update (the GSPO paper's ~10% after
one update).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core.transformer.moe.router_replay import RouterReplayAction

from correction.routing_replay import RoutedExperts
from parallel.forward import MicroBatch
from parallel.weights.placement import unwrap


class RoutingReplay:
    """The RouterReplay handles of one model's MoE layers on this rank, by global MoE-layer index."""

    def __init__(self, model):
        gpt = unwrap(model)
        self.handles = [
            (layer.layer_number - 1, layer.mlp.router.router_replay)
            for layer in gpt.decoder.layers
            if getattr(getattr(layer.mlp, "router", None), "router_replay", None) is not None
        ]
        self.num_layers = gpt.config.num_layers if self.handles or gpt.config.num_moe_experts else 0
        self.num_experts = gpt.config.num_moe_experts or 0
        self.topk = gpt.config.moe_router_topk
        self._own: dict[int, torch.Tensor] = {}  # MoE layer -> the router's own top-k in the replaying forward
        self._differ: list[tuple[list[int], torch.Tensor, torch.Tensor]] = []  # (rows, differing layers, recorded)
        for layer, handle in self.handles:
            handle.get_replay_topk = self._observing(layer, handle)

    def _observing(self, layer: int, handle):
        """``handle``'s top-k, also keeping what the router chooses itself when it replays a forward."""
        replay_topk = handle.get_replay_topk

        def get_replay_topk(scores, topk, num_groups=None, group_topk=None, default_compute_topk=None):
            if handle.router_replay_action == RouterReplayAction.REPLAY_FORWARD:
                own = default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)[1]
                self._own[layer] = own.detach()
            return replay_topk(scores, topk, num_groups, group_topk, default_compute_topk)

        return get_replay_topk

    def _act(self, action) -> None:
        for _, handle in self.handles:
            handle.set_router_replay_action(action)

    def replay(self, mb: MicroBatch) -> None:
        """Before a forward: route ``mb``'s tokens to ``mb.routing`` (route freely if it is None).
        Pair with :meth:`replayed` after the forward."""
        if mb.routing is None:
            self._act(RouterReplayAction.RECORD)
            return
        self._act(RouterReplayAction.REPLAY_FORWARD)
        seq_major = mb.routing.transpose(0, 1)  # [s, b, L, k]
        for layer, handle in self.handles:
            # also queued on the handle's backward list, for a recompute of this micro-batch
            handle.set_target_indices(seq_major[:, :, layer].reshape(-1, self.topk).contiguous())

    def replayed(self, mb: MicroBatch) -> None:
        """After a forward: recomputes in backward replay the queued routing, in forward order; a replayed
        micro-batch's count of MoE layers whose own choice differed, per token, is kept for ``disagreement``."""
        if mb.routing is not None:
            b, s = mb.input_ids.shape
            differ = torch.zeros(b, s, dtype=torch.long)
            for layer, _ in self.handles:
                own = self._own.pop(layer).reshape(s, b, self.topk).transpose(0, 1).cpu()
                differ += (own.sort(-1).values != mb.routing[:, :, layer].sort(-1).values).any(-1)
            self._differ.append((mb.rows, differ, mb.routed))
        for _, handle in self.handles:
            if mb.routing is None:
                handle.replay_backward_list.append(handle.get_recorded_indices())
            handle.set_router_replay_action(RouterReplayAction.REPLAY_BACKWARD)

    def record(self, mb: MicroBatch) -> None:
        """Before a forward: let the routers choose and keep their choices."""
        self._act(RouterReplayAction.RECORD)

    def recorded(self, mb: MicroBatch) -> torch.Tensor:
        """After a recording forward: ``[b, s, num_moe_layers, topk]``, zero for other stages' layers."""
        b, s = mb.input_ids.shape
        out = torch.zeros(b, s, self.num_layers, self.topk, dtype=torch.long)
        for layer, handle in self.handles:
            out[:, :, layer] = handle.get_recorded_indices().reshape(s, b, self.topk).transpose(0, 1).cpu()
        return out

    def disagreement(self, batch, pg_collection) -> dict[str, float]:
        """After a replayed training pass (collective over data- and pipeline-parallel ranks): the share of
        recorded (token, MoE layer) pairs whose router chose other experts than it replayed
        (``routing/disagreement``) and of tokens where that happened in at least one layer
        (``routing/tokens_differing``)."""
        rows, width = batch.input_ids.shape
        differ = torch.zeros(rows, width, dtype=torch.long)
        recorded = torch.zeros(rows, width, dtype=torch.long)
        for mb_rows, count, mask in self._differ:
            differ[mb_rows, : count.shape[1]] = count
            recorded[mb_rows, : mask.shape[1]] = mask.long()
        layers = torch.tensor([len(self.handles)])
        for group, tensors in ((pg_collection.dp, (differ, recorded)), (pg_collection.pp, (differ, layers))):
            if group.size() > 1:
                for t in tensors:
                    dist.all_reduce(t, group=group)
        tokens = int(recorded.sum())
        if not tokens or not int(layers):
            return {}
        return {
            "routing/disagreement": float((differ * recorded).sum()) / (tokens * int(layers)),
            "routing/tokens_differing": float(((differ > 0) & recorded.bool()).sum()) / tokens,
        }

    def off(self) -> None:
        """Route freely again and drop held and queued indices."""
        self._own.clear()
        self._differ.clear()
        for _, handle in self.handles:
            handle.clear_indices()
            handle.clear_router_replay_action()


def gather_records(per_mb: list[tuple[list[int], torch.Tensor]], batch, replay: RoutingReplay, pg_collection) -> list[RoutedExperts]:
    """Per-row RoutedExperts of a whole batch from this rank's recorded micro-batches."""
    rows, width = batch.input_ids.shape
    full = torch.zeros(rows, width, replay.num_layers, replay.topk, dtype=torch.long)
    for mb_rows, rec in per_mb:
        if mb_rows:
            full[mb_rows, : rec.shape[1]] = rec
    for group in (pg_collection.dp, pg_collection.pp):  # rows split over DP, layers over PP
        if group.size() > 1:
            dist.all_reduce(full, group=group)
    lengths = batch.attention_mask.sum(dim=1).long().tolist()
    return [RoutedExperts(full[r, : lengths[r]].clone(), replay.num_experts) for r in range(rows)]
