"""A user's env bundle for the server tests: gridsim tasks, an env that always fails, one that sleeps per step."""

import time

from megatron_rl.envs.base import Env, StepResult
from megatron_rl.envs.gridsim.tasks import generate_rows
from megatron_rl.envs.registry import register_env

TASKS = generate_rows(3, seed=5, split="train") + generate_rows(2, seed=6, split="test") + [
    {"prompt": [{"role": "user", "content": "Open the sandbox."}], "env_class": "test_always_fails", "env_extras": {},
     "split": "train", "instance_id": "always-fails"}]


@register_env
class AlwaysFails(Env):
    """A sandbox that crashes on every reset."""

    name = "test_always_fails"

    def init(self, prompt):
        raise RuntimeError("sandbox crashed")


@register_env
class SlowEcho(Env):
    """Sleeps ``extras["sleep_s"]`` per step, then ends with reward 1 (a slow tool)."""

    name = "test_slow_echo"

    def step(self, action):
        time.sleep(self.extras.get("sleep_s", 0.0))
        return StepResult([], 1.0, True)


@register_env
class Unscored(Env):
    """Ends its episode without a score: a broken task."""

    name = "test_unscored"

    def step(self, action):
        return StepResult([], None, True)  # raises TaskBug: an episode must end scored
