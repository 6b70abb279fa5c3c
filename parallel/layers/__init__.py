"""Fast megatron-core layer-spec modules for machines without Transformer Engine (see spec.py)."""
