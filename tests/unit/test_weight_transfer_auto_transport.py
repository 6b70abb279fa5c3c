"""``weight_transfer.transport.type: auto``: the transport is picked from the placement's route."""

from __future__ import annotations

import pytest

from weight_transfer.config import Route, TransportSpec, WeightTransferConfig, choose_transport


@pytest.mark.parametrize("route, kind", [
    (Route(on_gpu=True, colocated=True, same_host=True), "cuda_ipc"),
    (Route(on_gpu=True, same_host=True), "broadcast"),
    (Route(on_gpu=False, same_host=True), "shared_memory"),
    (Route(on_gpu=True, rdma=True), "nixl"),
    (Route(on_gpu=False, rdma=True), "nixl"),
    (Route(on_gpu=True), "broadcast"),
    (Route(on_gpu=True, rdma=True, network=False), "tensorstore_delta"),
])
def test_choice_by_route(route, kind):
    assert choose_transport(route) == kind


def test_auto_resolves_with_the_route_and_keeps_the_chosen_transports_options():
    config = WeightTransferConfig(transport=TransportSpec(type="auto", root="/shared/wt", chunk_kb=256))
    with pytest.raises(ValueError, match="type=auto: needs the placement"):
        config.resolved_transport
    resolved = config.for_route(Route(on_gpu=True, network=False)).resolved_transport
    assert (resolved.type, resolved.root, resolved.chunk_kb) == ("tensorstore_delta", "/shared/wt", 256)
    as_dict = WeightTransferConfig(transport={"type": "auto", "root": "/shared/wt"})
    assert as_dict.for_route(Route(on_gpu=True, rdma=True)).resolved_transport.type == "nixl"


def test_auto_onto_shared_storage_without_a_root_names_the_key():
    with pytest.raises(ValueError, match="weight_transfer.transport.root"):
        WeightTransferConfig(transport=TransportSpec(type="auto")).for_route(Route(on_gpu=False, network=False))


def test_the_loop_reads_the_route_from_where_ranks_and_engines_run():
    from megatron_rl.schedules.weight_sync import transfer_route

    one_host = transfer_route(["127.0.0.1", "127.0.0.1"], ["http://127.0.0.1:8000"], on_gpu=False, colocated=False,
                              rdma=False)
    assert one_host.same_host and choose_transport(one_host) == "shared_memory"
    colocated = transfer_route(["10.0.0.1"], ["http://10.0.0.1:8000"], on_gpu=True, colocated=True, rdma=False)
    assert choose_transport(colocated) == "cuda_ipc"
    apart = transfer_route(["10.0.0.1", "10.0.0.2"], ["http://10.0.0.1:8000", "http://10.0.0.3:8000"], on_gpu=True,
                           colocated=False, rdma=True)
    assert not apart.same_host and choose_transport(apart) == "nixl"
    assert choose_transport(transfer_route(["10.0.0.1"], ["http://10.0.0.2:8000"], True, False, False)) == "broadcast"
