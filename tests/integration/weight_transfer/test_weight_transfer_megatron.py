"""A real megatron-core model on 2 gloo processes: its weights change, parallel's export iterator feeds the
transfer plan (rank 0 sends, rank 1 takes part in the gathers), and one vLLM CPU engine then gives the log-probs
of transformers on the exported weights and of megatron's own forward. Dense Qwen3 at TP=2; Qwen3-MoE with
attention split over both ranks (TP=2) and each routed expert whole on one of them (EP=2, expert TP=1), so rank 1
sends its own experts."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from megatron_rl.tiny import make_tiny_model
from weight_transfer.config import WeightTransferConfig
from weight_transfer.coordinator import WeightTransferCoordinator
from weight_transfer.local_senders import LocalSenders
from weight_transfer.replicas import LLMReplica
from wt_helpers import TOKENS, MegatronExport, checkpoint, close_llm, hf_logprobs, make_llm, max_diff, plan_for, vllm_logprobs

pytestmark = pytest.mark.timeout(900)


@pytest.mark.parametrize(("arch", "ep", "etp"), [("qwen3", 1, None), ("qwen3_moe", 2, 1)])
def test_megatron_export_streams_to_vllm(arch, ep, etp, tmp_path):
    model = make_tiny_model(arch, size="unit", seed=0)
    plan = plan_for(model, tp=2, bucket_bytes=256 << 10, senders="owner", ep=ep, etp=etp)
    assert plan.senders == list(range(ep)) and len(plan.buckets) > 2
    split = {e.spec.name: [(s.rank, s.dim) for s in e.shards] for e in plan.entries}
    assert split["model.layers.0.self_attn.o_proj.weight"] == [(0, 1), (1, 1)]
    if etp:
        assert split["model.layers.0.mlp.experts.3.down_proj.weight"] == [(1, None)], "expert TP, not TP"
    original = hf_logprobs(model, checkpoint(model), tmp_path)
    config = WeightTransferConfig(transport={"type": "broadcast"}, bucket_size_mb=1, timeout_s=120)
    llm = make_llm(model)
    senders = LocalSenders(plan, MegatronExport(model, tp=2, out_dir=tmp_path, ep=ep, etp=etp), ranks=[0, 1])
    try:
        coordinator = WeightTransferCoordinator(config, plan, [LLMReplica(llm, "r0")], senders)
        for version in (1, 2):  # the second update reuses the session
            metrics = coordinator.update(version)
            assert metrics["weight_transfer/retries"] == 0 and metrics["weight_transfer/bytes"] == plan.nbytes
            exported = {k: v for f in sorted(tmp_path.glob(f"exported-v{version}-r*.safetensors"))
                        for k, v in load_file(str(f)).items()}
            assert sorted(exported) == sorted(e.spec.name for e in plan.entries)
            expected = hf_logprobs(model, exported, tmp_path)
            megatron = torch.load(tmp_path / f"megatron-v{version}.pt")
            megatron = [megatron[b, 1:len(t)] for b, t in enumerate(TOKENS)]
            assert max_diff(expected, original) > 0.05, "the update must move log-probs measurably"
            got = vllm_logprobs(llm)
            assert max_diff(got, expected) < 1e-3, f"v{version}: vLLM vs transformers on the exported weights"
            assert max_diff(got, megatron) < 1e-3, f"v{version}: vLLM vs megatron's own forward"
    finally:
        senders.disconnect()
        close_llm(llm)
