"""HF <-> Megatron weights: names, fused layouts, tensor-parallel shards, pipeline and expert placement."""
