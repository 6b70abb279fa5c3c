"""The reference policy: a frozen copy of the policy's weights that KL is measured against.

It lives in the policy's own rank processes, with the same layout and process groups, and holds only
weights (no gradients, no optimizer). :meth:`ReferencePolicy.snapshot` copies the policy's current
weights into it: the job does so where RL starts (after the SFT warm start), so the KL anchors the
policy to the model RL began from. Checkpointed next to the policy, so a resumed run keeps its anchor.
"""

from __future__ import annotations

from pathlib import Path

import torch

from megatron_rl.contracts import TrainingBatch
from parallel.weights.placement import unwrap


class ReferencePolicy:
    """This rank's shard of the reference model, built beside ``policy`` (a MegatronPolicy)."""

    def __init__(self, policy):
        from parallel.provider import build_model

        self.cfg, self.pgs = policy.cfg, policy.pgs
        self.model = build_model(policy.hf_dir, policy.cfg, policy.pgs)
        self.model.requires_grad_(False)
        self.snapshot(policy)

    @torch.no_grad()
    def snapshot(self, policy) -> None:
        """Make the reference equal the policy's current weights."""
        source = dict(unwrap(policy.model).state_dict())
        target = self.model.state_dict()
        if source.keys() != target.keys():
            raise RuntimeError("reference: the policy's and the reference's parameters differ; build both from one config")
        for name, tensor in target.items():
            if tensor is not None and torch.is_tensor(tensor):
                tensor.copy_(source[name])

    def compute_logprobs(self, batch: TrainingBatch) -> torch.Tensor:
        """``[B, T]`` reference log-probs of the batch's tokens (routing free: the reference's own)."""
        from parallel.logprob_pass import compute_logprobs

        return compute_logprobs(self.model, batch, self.cfg.max_tokens_per_micro_batch, self.pgs)[0]

    def save(self, path: str | Path) -> None:
        from parallel.dist_checkpoint import save_weights

        save_weights(path, self.model, self.pgs)

    def load(self, path: str | Path) -> None:
        from parallel.dist_checkpoint import load_weights

        load_weights(path, self.model)
