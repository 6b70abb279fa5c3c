"""A Tinker-compatible training service: the official ``tinker`` SDK drives megatron-rl's trainer,
vLLM fleet and weight transfer over HTTP (``megatron-rl serve-training``).

``wire`` decodes and encodes the SDK's protobuf bodies, ``losses`` holds the Tinker losses as pure
tensor functions, ``ranks`` runs forward/backward and the optimizer step on the trainer ranks,
``service`` owns the one trained model, its futures and sampling sessions, ``app`` is the HTTP surface.
"""
