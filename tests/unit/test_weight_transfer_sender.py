"""Checksums, config validation, and the sender streaming into buckets over the real shared-memory transport."""

from __future__ import annotations

import pytest
import torch

from weight_transfer.checksum import bucket_checksum
from weight_transfer.config import WeightTransferConfig
from weight_transfer.layout import TrainerLayout
from weight_transfer.plan import TensorSpec, TransferPlan
from weight_transfer.sender import send_weights
from weight_transfer.transports import make_receiver, make_sender


def test_checksum_sees_a_flipped_byte_and_moved_words():
    flat = torch.randint(0, 256, (1 << 16,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    base = bucket_checksum(flat)
    flipped = flat.clone()
    flipped[12345] ^= 0x10
    assert bucket_checksum(flipped) != base
    swapped = flat.clone()
    swapped[:4], swapped[-4:] = flat[-4:].clone(), flat[:4].clone()
    assert bucket_checksum(swapped) != base
    assert bucket_checksum(flat.clone()) == base


def test_config_names_the_bad_key():
    with pytest.raises(ValueError, match="weight_transfer.bucket_size_mb"):
        WeightTransferConfig(bucket_size_mb=0)
    with pytest.raises(ValueError, match="weight_transfer.transport.type"):
        WeightTransferConfig(transport={"type": "carrier_pigeon"})
    with pytest.raises(ValueError, match="weight_transfer.pause_mode"):
        WeightTransferConfig(pause_mode="later")
    with pytest.raises(ValueError, match="weight_transfer.load='inplace': use one of"):
        WeightTransferConfig(load="inplace")
    assert WeightTransferConfig(transport={"type": "shared_memory", "dir": "/tmp"}).resolved_transport.dir == "/tmp"


def _plan(tp: int) -> tuple[TransferPlan, dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    tensors = {f"model.layers.{i}.mlp.up_proj.weight": torch.randn(16, 8, generator=gen) for i in range(6)}
    specs = [TensorSpec(n, tuple(t.shape), "float32") for n, t in tensors.items()]
    return TransferPlan.build(specs, TrainerLayout(num_layers=6, tp=tp), bucket_bytes=1024, senders="spread"), tensors


def test_sender_streams_every_bucket_through_shared_memory(tmp_path):
    plan, tensors = _plan(tp=2)
    session = {"type": "shared_memory", "dir": str(tmp_path), "id": "t", "timeout_s": 5}
    checksums = {}
    for rank in plan.senders:
        out = send_weights(plan, rank, reversed(list(tensors.items())), make_sender(session, rank, torch.device("cpu")),
                           version=7, device=torch.device("cpu"), digests=False)
        checksums.update(out["buckets"])
    assert sorted(checksums) == [b.index for b in plan.buckets]
    receiver = make_receiver(session, 1, torch.device("cpu"))
    for bucket, flat in receiver.receive(7, plan.buckets):
        assert bucket_checksum(flat) == checksums[bucket.index]
        for slot in bucket.slots:
            got = flat[slot.offset:slot.offset + slot.nbytes].view(torch.float32).view(slot.shape)
            assert torch.equal(got, tensors[slot.name])


def test_sender_refuses_unknown_and_missing_tensors(tmp_path):
    plan, tensors = _plan(tp=1)
    session = {"type": "shared_memory", "dir": str(tmp_path), "id": "u", "timeout_s": 5}
    transport = make_sender(session, 0, torch.device("cpu"))
    with pytest.raises(ValueError, match="not in transfer plan"):
        send_weights(plan, 0, [("model.extra.weight", torch.zeros(1))], transport, 1, torch.device("cpu"))
    partial = list(tensors.items())[:-1]
    with pytest.raises(ValueError, match="never gave.*layers.5"):
        send_weights(plan, 0, partial, transport, 1, torch.device("cpu"))
    first = next(iter(tensors.items()))
    for twice in ([first, *tensors.items()], [*tensors.items(), first]):  # in an open bucket, in a sent one
        with pytest.raises(ValueError, match="gave it twice"):
            send_weights(plan, 0, twice, transport, 1, torch.device("cpu"))


def test_rank_without_buckets_drains_its_iterator_without_a_transport():
    # with the owner rule, TP rank 1 sends nothing but must still run its export (it takes part in gathers)
    gen = torch.Generator().manual_seed(2)
    tensors = {f"model.layers.{i}.mlp.up_proj.weight": torch.randn(16, 8, generator=gen) for i in range(2)}
    specs = [TensorSpec(n, tuple(t.shape), "float32") for n, t in tensors.items()]
    plan = TransferPlan.build(specs, TrainerLayout(num_layers=2, tp=2), bucket_bytes=1024)
    assert plan.senders == [0]
    drained = []

    def export():
        for pair in tensors.items():
            drained.append(pair[0])
            yield pair

    assert send_weights(plan, 1, export(), None, 1, torch.device("cpu")) == {"buckets": {}, "tensors": {}, "replayed": False}
    assert drained == list(tensors)


def test_qkv_row_blocks_pack_to_the_hf_tensors(tmp_path):
    """The export's row blocks of a fused QKV (views, no copy) land in the bucket as the HF q, k and v;
    shapes that only share the element count are refused."""
    from parallel.weights.layout import fuse_qkv, split_qkv, split_qkv_blocks

    gen = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(32, 16, generator=gen), torch.randn(8, 16, generator=gen), torch.randn(8, 16, generator=gen)
    fused = fuse_qkv(q, k, v, num_groups=4)
    blocks = split_qkv_blocks(fused, 4, 32, 8)
    assert [tuple(b.shape) for b in blocks] == [(4, 8, 16), (4, 2, 16), (4, 2, 16)]
    assert all(b.data_ptr() >= fused.data_ptr() for b in blocks) and not blocks[0].is_contiguous()  # views
    assert all(torch.equal(a, b) for a, b in zip(split_qkv(fused, 4, 32, 8), (q, k, v)))
    names = [f"model.layers.0.self_attn.{n}_proj.weight" for n in "qkv"]
    specs = [TensorSpec(n, tuple(t.shape), "float32") for n, t in zip(names, (q, k, v))]
    plan = TransferPlan.build(specs, TrainerLayout(num_layers=1), bucket_bytes=1 << 20)
    session = {"type": "shared_memory", "dir": str(tmp_path), "id": "qkv", "timeout_s": 5}
    out = send_weights(plan, 0, zip(names, blocks), make_sender(session, 0, torch.device("cpu")), 1, torch.device("cpu"))
    ((bucket, flat),) = make_receiver(session, 1, torch.device("cpu")).receive(1, plan.buckets)
    assert bucket_checksum(flat) == out["buckets"][bucket.index]
    hf = dict(zip(names, (q, k, v)))
    for slot in bucket.slots:
        assert torch.equal(flat[slot.offset:slot.offset + slot.nbytes].view(torch.float32).view(slot.shape), hf[slot.name])
    transport = make_sender(session, 0, torch.device("cpu"))
    for wrong in (q.t(), q.reshape(-1), q.reshape(4, 8, 16)[None], q.reshape(4, 8, 16).transpose(1, 2)):
        with pytest.raises(ValueError, match="q_proj.*plan says"):
            send_weights(plan, 0, [(names[0], wrong), *zip(names[1:], blocks[1:])], transport, 2, torch.device("cpu"))
