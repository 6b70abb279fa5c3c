"""The generator the schedules call: a batch of prompts in, validated trajectories out."""

from __future__ import annotations

from rich.console import Console
from rich.progress import Progress

from megatron_rl.contracts import GeneratorInput, GeneratorOutput
from megatron_rl.envs.registry import env_tools, make_env
from megatron_rl.generator.batch import generate_batch
from megatron_rl.generator.chat import ChatRenderer
from megatron_rl.generator.config import GeneratorConfig
from megatron_rl.generator.episode import EpisodeContext


class Generator:
    """Multi-turn, token-in-token-out rollouts through an inference fleet."""

    def __init__(self, fleet, tokenizer, config: GeneratorConfig, vocab_size: int, env_configs: dict | None = None,
                 num_experts: int | None = None, return_routed_experts: bool = False, seed: int = 0,
                 show_progress: bool = True):
        self.fleet = fleet
        self.tokenizer = tokenizer
        self.config = config
        self.vocab_size = vocab_size
        """The model's embedding rows (may exceed the tokenizer's size); sampled ids must lie below it."""
        self.env_configs = env_configs or {}
        self.num_experts = num_experts
        self.return_routed_experts = return_routed_experts
        self.seed = seed
        self.show_progress = show_progress
        self._renderers: dict[str, ChatRenderer] = {}

    def renderer(self, env_class: str) -> ChatRenderer:
        if env_class not in self._renderers:
            self._renderers[env_class] = ChatRenderer(self.tokenizer, env_tools(env_class))
        return self._renderers[env_class]

    async def generate(self, gi: GeneratorInput, evaluation: bool = False) -> GeneratorOutput:
        """Roll out every group of ``gi``; evaluation samples at ``generator.eval_temperature``."""
        ctx = EpisodeContext(
            fleet=self.fleet,
            renderers={p.env_class: self.renderer(p.env_class) for p in gi.prompts},
            config=self.config,
            temperature=self.config.eval_temperature if evaluation else self.config.temperature,
            step=gi.step,
            policy_version=gi.policy_version,
            seed=self.seed,
            num_experts=self.num_experts,
            return_routed_experts=self.return_routed_experts,
        )
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id

        def new_env(item):
            return make_env(item.env_class, item.env_extras, self.env_configs.get(item.env_class))

        total = len(gi.prompts) * gi.n_samples_per_prompt
        # On stderr with the log lines; off where stderr is no terminal (a stopped bar there prints a blank line).
        console = Console(stderr=True)
        with Progress(transient=True, console=console, disable=not (self.show_progress and console.is_terminal)) as bar:
            task = bar.add_task("eval" if evaluation else f"generate step {gi.step}", total=total)
            out = await generate_batch(ctx, gi, new_env, pad, progress=lambda: bar.advance(task))
        out.check_matches(gi, vocab_size=self.vocab_size)
        return out
