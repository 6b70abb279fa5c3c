"""The env registry: exact names, helpful unknown-name errors, user registration, tools."""

import pytest

from megatron_rl.envs import Env, StepResult, env_names, env_tools, get_env_class, make_env, register_env
from megatron_rl.envs.registry import _ENVS


def test_builtins_and_unknown_names():
    # other test modules register their own envs in the same process: the built-ins must be there
    assert {"arithmetic", "gridsim", "math", "text2sql"} <= set(env_names())
    with pytest.raises(ValueError, match="'Arithmetic' is not registered; known: arithmetic, gridsim, math"):
        get_env_class("Arithmetic")


def test_tools_per_env():
    assert env_tools("arithmetic") == []
    assert [t["function"]["name"] for t in env_tools("text2sql")] == ["run_sql"]
    assert [t["function"]["name"] for t in env_tools("gridsim")] == ["submit_schedule"]


def test_users_register_their_own():
    @register_env
    class Echo(Env):
        name = "echo_test"

        def step(self, action):
            return StepResult([], float(action == self.extras["want"]), True)

    try:
        env = make_env("echo_test", {"want": "hi"})
        assert env.init([{"role": "user", "content": "say hi"}]) == ([{"role": "user", "content": "say hi"}], {})
        assert env.step("hi").reward == 1.0
        with pytest.raises(ValueError, match="already registered"):
            register_env(type("Other", (Env,), {"name": "echo_test"}))
        with pytest.raises(ValueError, match=r"envs\.echo_test\.x: unknown key"):
            make_env("echo_test", {}, {"x": 1})
    finally:
        _ENVS.pop("echo_test")
    with pytest.raises(ValueError, match="name is empty"):
        register_env(type("Nameless", (Env,), {}))
    with pytest.raises(TypeError):
        register_env(object)
