"""tensorstore_delta through real tensorstore on a temporary folder, sender and receiver in one process:
only changed chunks are written and read, the receiver rebuilds exact bytes (also without the previous
version, from the chain), missing and corrupted chunks fail the receive, old versions are collected."""

from __future__ import annotations

import json

import pytest
import torch

from weight_transfer.buckets import pack
from weight_transfer.config import WeightTransferConfig
from weight_transfer.layout import TrainerLayout
from weight_transfer.plan import TensorSpec, TransferPlan
from weight_transfer.sender import send_weights
from weight_transfer.session import new_session
from weight_transfer.transports import TransportError, make_receiver, make_sender
from weight_transfer.transports import tensorstore_delta as tsd

CPU = torch.device("cpu")
N, NUMEL, CHUNK_KB = 100, 1 << 15, 16  # 100 bf16 tensors of 64 KiB (6.4 MB), 4 chunks each


def _setup(tmp_path, full_every=16):
    specs = [TensorSpec(f"model.layers.{i}.mlp.up_proj.weight", (NUMEL,), "bfloat16") for i in range(N)]
    plan = TransferPlan.build(specs, TrainerLayout(num_layers=N), 1 << 20)
    config = WeightTransferConfig(transport={"type": "tensorstore_delta", "root": str(tmp_path), "chunk_kb": CHUNK_KB,
                                             "full_every": full_every}, timeout_s=5)
    session = new_session(config, plan, 1)
    gen = torch.Generator().manual_seed(0)
    weights = {s.name: torch.randn(NUMEL, generator=gen).to(torch.bfloat16) for s in specs}
    tsd._STATES.clear()
    tsd._HELD.clear()
    return plan, session, weights


def _send(plan, session, weights, version):
    sender = make_sender(session, 0, CPU)
    try:
        return send_weights(plan, 0, weights.items(), sender, version, CPU)
    finally:
        sender.close()


def _receive(plan, session, version):
    receiver = make_receiver(session, 1, CPU)
    got = {b.index: flat.clone() for b, flat in receiver.receive(version, plan.buckets)}
    return got, receiver.stats


def _expected(plan, weights):
    return {b.index: pack(b, weights, torch.empty(b.nbytes, dtype=torch.uint8)) for b in plan.buckets}


def _manifest(session, version):
    return json.loads(tsd.manifest_path(session, 0, version).read_text())


def test_one_percent_of_tensors_changed_writes_and_reads_only_their_chunks(tmp_path):
    plan, session, weights = _setup(tmp_path)
    _send(plan, session, weights, 1)
    got, stats = _receive(plan, session, 1)
    assert all(torch.equal(got[i], flat) for i, flat in _expected(plan, weights).items())
    full = _manifest(session, 1)
    full_bytes = sum(e["stored_bytes"] for e in full["buckets"].values())
    assert full["full"] and stats["bytes_read"] == full_bytes and stats["chunks_read"] == N * 4
    assert full_bytes > 0.5 * plan.nbytes, "random bf16 hardly compresses: the first version is written whole"

    changed = ["model.layers.7.mlp.up_proj.weight"]  # 1 of 100 tensors
    weights[changed[0]] = weights[changed[0]] + 0.01 * torch.randn(NUMEL).to(torch.bfloat16)
    sent = _send(plan, session, weights, 2)
    got, stats = _receive(plan, session, 2)
    assert all(torch.equal(got[i], flat) for i, flat in _expected(plan, weights).items())
    delta = _manifest(session, 2)
    assert not delta["full"]
    written = {i: e["chunks"] for i, e in delta["buckets"].items() if e["chunks"]}
    bucket = plan.bucket_of_tensor[changed[0]]
    slot = next(s for s in bucket.slots if s.name == changed[0])
    assert written == {str(bucket.index): list(range(slot.offset // (CHUNK_KB << 10), (slot.offset + slot.nbytes) // (CHUNK_KB << 10)))}
    delta_bytes = sum(e["stored_bytes"] for e in delta["buckets"].values())
    assert 0 < delta_bytes <= slot.nbytes and stats["bytes_read"] == delta_bytes and stats["chunks_read"] == 4
    assert delta_bytes < 0.01 * full_bytes, (delta_bytes, full_bytes)
    assert {str(i): c for i, c in sent["buckets"].items()} == {i: e["checksum"] for i, e in delta["buckets"].items()}


def test_sparse_element_changes_compress(tmp_path):
    """1% of the elements of every tensor change (as in bf16 training): every chunk is written, but XOR
    leaves the rest zero and the shuffle + zstd keep the delta small."""
    plan, session, weights = _setup(tmp_path)
    _send(plan, session, weights, 1)
    _receive(plan, session, 1)
    gen = torch.Generator().manual_seed(1)
    for name, tensor in weights.items():
        where = torch.rand(NUMEL, generator=gen) < 0.01
        weights[name] = torch.where(where, tensor * 1.01 + 0.01, tensor)
    _send(plan, session, weights, 2)
    got, stats = _receive(plan, session, 2)
    assert all(torch.equal(got[i], flat) for i, flat in _expected(plan, weights).items())
    delta_bytes = sum(e["stored_bytes"] for e in _manifest(session, 2)["buckets"].values())
    assert stats["chunks_read"] == N * 4 and delta_bytes < 0.1 * plan.nbytes, delta_bytes / plan.nbytes


def test_fresh_receiver_rebuilds_from_the_chain_and_old_versions_are_collected(tmp_path):
    plan, session, weights = _setup(tmp_path, full_every=3)
    for version in (1, 2, 3):
        name = f"model.layers.{version}.mlp.up_proj.weight"
        weights[name] = -weights[name]
        _send(plan, session, weights, version)
    tsd._HELD.clear()  # a replica that restarted: holds nothing
    got, _ = _receive(plan, session, 3)
    assert all(torch.equal(got[i], flat) for i, flat in _expected(plan, weights).items())
    assert [_manifest(session, v)["full"] for v in (1, 2, 3)] == [True, False, False]
    _send(plan, session, weights, 4)  # 4 - 1 >= full_every: full, versions 1-3 are deleted
    assert _manifest(session, 4)["full"]
    assert sorted(p.name for p in tsd.rank_dir(session, 0).iterdir()) == ["v4"]
    tsd._HELD.clear()
    got, stats = _receive(plan, session, 4)
    assert all(torch.equal(got[i], flat) for i, flat in _expected(plan, weights).items())


@pytest.mark.parametrize("fault", ["missing", "corrupted"])
def test_missing_or_corrupted_chunk_fails_the_receive_and_a_resend_is_full(tmp_path, fault):
    plan, session, weights = _setup(tmp_path)
    _send(plan, session, weights, 1)
    _receive(plan, session, 1)
    name = "model.layers.50.mlp.up_proj.weight"
    weights[name] = weights[name] * 2
    _send(plan, session, weights, 2)
    bucket = plan.bucket_of_tensor[name]
    chunk = _manifest(session, 2)["buckets"][str(bucket.index)]["chunks"][0]
    path = tsd.chunk_file(tsd.version_dir(session, 0, 2) / f"b{bucket.index}", chunk)
    if fault == "missing":
        path.unlink()
    else:
        raw = bytearray(path.read_bytes())
        raw[len(raw) // 2] ^= 0x5A
        path.write_bytes(bytes(raw))
    with pytest.raises(TransportError, match="missing" if fault == "missing" else "bucket"):
        _receive(plan, session, 2)
    assert tsd._HELD[(session["root"], session["plan"], bucket.index)][0] == 1, "the failed version is not held"
    retry = {**session, "id": "retry"}  # the coordinator's retry: a fresh session, the same version
    _send(plan, retry, weights, 2)
    assert _manifest(retry, 2)["full"], "a version sent again is written whole"
    got, _ = _receive(plan, retry, 2)
    assert all(torch.equal(got[i], flat) for i, flat in _expected(plan, weights).items())


def test_receiver_waits_for_its_own_sessions_manifest(tmp_path):
    plan, session, weights = _setup(tmp_path)
    _send(plan, session, weights, 1)
    later = {**session, "id": "later", "timeout_s": 0.2}
    with pytest.raises(TransportError, match="not published"):
        _receive(plan, later, 1)


def test_config_names_the_missing_root():
    with pytest.raises(ValueError, match="weight_transfer.transport.root"):
        WeightTransferConfig(transport={"type": "tensorstore_delta"})


def test_a_sender_that_dies_mid_write_publishes_nothing_and_its_successor_writes_whole(tmp_path):
    """Half of version 2's buckets written, no finish (the process died): receivers of version 2 time out
    and keep version 1; a new sender process (no state) writes version 2 whole and it arrives exact."""
    plan, session, weights = _setup(tmp_path)
    _send(plan, session, weights, 1)
    _receive(plan, session, 1)
    changed = {n: t * 3 for n, t in weights.items()}
    sender = make_sender(session, 0, CPU)
    for bucket in plan.buckets[:len(plan.buckets) // 2]:
        sender.send(2, bucket, pack(bucket, changed, sender.buffer(bucket, CPU)))
    assert not tsd.manifest_path(session, 0, 2).exists()
    with pytest.raises(TransportError, match="not published"):
        _receive(plan, {**session, "timeout_s": 0.3}, 2)
    assert {v for v, _ in tsd._HELD.values()} == {1}
    tsd._STATES.clear()  # the successor process
    retry = {**session, "id": "successor"}
    _send(plan, retry, changed, 2)
    assert _manifest(retry, 2)["full"]
    got, _ = _receive(plan, retry, 2)
    assert all(torch.equal(got[i], flat) for i, flat in _expected(plan, changed).items())
