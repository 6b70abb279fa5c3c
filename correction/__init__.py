"""Off-policy correction as pure tensor functions returning ``(weights_or_masks, metrics)``.

Ground floor: imports only torch. Start from :func:`correction.apply.apply_correction` with a
:class:`correction.config.CorrectionConfig`; the single corrections live in ``tis``,
``token_masks`` and ``sequence_masks``; ``routing_replay`` holds the MoE routing-replay record.
Metric values are detached 0-d tensors, so a caller can reduce them across ranks and convert once.
"""
