"""Off-policy correction as pure tensor functions returning ``(weights_or_masks, metrics)``."""
