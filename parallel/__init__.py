"""Everything Megatron: process groups, model provider, weight mapping, log-probs, policy worker."""
