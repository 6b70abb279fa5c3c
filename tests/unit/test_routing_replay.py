import json

import pytest
import torch

from correction.routing_replay import (
    RoutedExperts,
    RoutingReplayConfig,
    RoutingReplayMode,
)


def _routed(tokens=5, layers=3, topk=2, experts=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(experts, generator=g)[:topk] for _ in range(tokens * layers)])
    return RoutedExperts(indices=ids.reshape(tokens, layers, topk), num_experts=experts)


def test_valid_record_passes():
    _routed().validate(5, "traj 0", num_moe_layers=3, topk=2)


@pytest.mark.parametrize(
    "indices, experts, tokens, needle",
    [
        (torch.zeros(5, 3, dtype=torch.long), 8, 5, "shape"),
        (torch.zeros(5, 3, 1), 8, 5, "integers"),
        (torch.full((5, 3, 1), 8), 8, 5, "out of [0, 8)"),
        (torch.full((5, 3, 1), -1), 8, 5, "out of [0, 8)"),
        (torch.zeros(4, 3, 1, dtype=torch.long), 8, 5, "4 tokens"),
        (torch.zeros(5, 3, 2, dtype=torch.long), 8, 5, "same expert twice"),
        (torch.zeros(5, 3, 1, dtype=torch.long), 0, 5, "num_experts"),
    ],
)
def test_invalid_records_name_where_and_problem(indices, experts, tokens, needle):
    with pytest.raises(ValueError, match="traj 7") as err:
        RoutedExperts(indices, experts).validate(tokens, "traj 7")
    assert needle in str(err.value)


def test_expected_layers_and_topk_are_checked():
    with pytest.raises(ValueError, match="num_moe_layers=3, expected 4"):
        _routed().validate(5, "t", num_moe_layers=4)
    with pytest.raises(ValueError, match="topk=2, expected 8"):
        _routed().validate(5, "t", topk=8)


@pytest.mark.parametrize("experts, dtype", [(8, "uint8"), (256, "uint8"), (257, "int16"), (20000, "int16")])
def test_compact_roundtrip_is_exact_and_json_safe(experts, dtype):
    record = _routed(tokens=7, layers=2, topk=3, experts=experts)
    record.indices[0, 0] = torch.tensor([experts - 1, 0, 1])  # the extremes survive the packing
    compact = json.loads(json.dumps(record.to_compact()))
    assert compact["dtype"] == dtype
    assert compact["shape"] == [7, 2, 3]
    back = RoutedExperts.from_compact(compact)
    assert back.num_experts == experts
    assert back.indices.dtype == torch.int64
    assert torch.equal(back.indices, record.indices.long())


def test_compact_size_is_one_byte_per_id_up_to_256_experts():
    record = _routed(tokens=100, layers=4, topk=2, experts=64)
    assert len(record.to_compact()["data"]) == 4 * ((100 * 4 * 2 + 2) // 3)  # base64 of 800 bytes


def test_empty_record_roundtrips():
    record = RoutedExperts(torch.zeros(0, 2, 2, dtype=torch.long), 8)
    assert RoutedExperts.from_compact(record.to_compact()).indices.shape == (0, 2, 2)


def test_corrupt_compact_is_rejected():
    compact = _routed().to_compact()
    with pytest.raises(ValueError, match="bytes do not hold shape"):
        RoutedExperts.from_compact({**compact, "shape": [6, 3, 2]})
    with pytest.raises(ValueError, match="compact dtype"):
        RoutedExperts.from_compact({**compact, "dtype": "float32"})


def test_too_many_experts_for_compact_form():
    with pytest.raises(ValueError, match="int16"):
        RoutedExperts(torch.zeros(1, 1, 1, dtype=torch.long), 2**15 + 1).to_compact()


def test_mode_config():
    assert RoutingReplayConfig().mode is RoutingReplayMode.none
    assert RoutingReplayConfig(mode="r3").mode is RoutingReplayMode.r3
    with pytest.raises(ValueError, match="algorithm.routing_replay.mode"):
        RoutingReplayConfig(mode="r4")
