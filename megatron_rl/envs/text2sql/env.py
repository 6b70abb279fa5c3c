"""``text2sql``: answer a question with one SQLite query; errors come back and the model may repair it.

Each turn the reply's query (a ``run_sql`` tool call, else the last ```sql block) runs read-only against the
row's database with a time and row limit. An error or a missing query comes back as an observation (reward 0)
until ``max_turns``; a query that runs ends the episode with reward 1 if its result set equals the gold
query's (order-insensitive unless the gold query has ORDER BY), else ``runs_reward`` (default 0).
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from megatron_rl.envs.base import Env, StepResult, TaskBug
from megatron_rl.envs.registry import register_env
from megatron_rl.envs.text2sql.compare import is_ordered, results_match
from megatron_rl.envs.text2sql.databases import write_database
from megatron_rl.envs.text2sql.executor import QueryResult, run_query
from megatron_rl.envs.tool_calls import PARSERS, ParsedReply, parse_tool_calls

_SQL_BLOCK = re.compile(r"```sql\s*(.*?)```", re.DOTALL | re.IGNORECASE)

RUN_SQL = {"type": "function", "function": {
    "name": "run_sql",
    "description": "Run one read-only SQLite query against the database and submit its result as the answer.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "One SQLite SELECT."}},
                   "required": ["query"]},
}}


@dataclass
class Text2SQLConfig:
    """``envs.text2sql.*``: limits of one episode."""

    max_turns: int = 3
    """Assistant turns before the episode ends with reward 0."""
    time_limit_s: float = 2.0
    """Seconds one query may run."""
    max_rows: int = 1000
    """Rows a query may return; more counts as a wrong answer."""
    tool_call_format: str = "hermes"
    """Tool-call syntax the policy writes (hermes or qwen3_coder)."""
    runs_reward: float = 0.0
    """Reward for a query that runs but returns other rows than the gold query's, below the right answer's 1.
    A reply with no query that runs earns 0, so a wrong answer and a malformed reply are told apart."""

    def __post_init__(self) -> None:
        for key in ("max_turns", "max_rows"):
            if getattr(self, key) < 1:
                raise ValueError(f"envs.text2sql.{key}: must be >= 1, got {getattr(self, key)}")
        if self.time_limit_s <= 0:
            raise ValueError(f"envs.text2sql.time_limit_s: must be > 0, got {self.time_limit_s}")
        if not 0 <= self.runs_reward < 1:
            raise ValueError(f"envs.text2sql.runs_reward: must be in [0, 1) (a right answer earns 1), "
                             f"got {self.runs_reward}")
        if self.tool_call_format not in PARSERS:
            raise ValueError(f"envs.text2sql.tool_call_format: '{self.tool_call_format}'; known: {', '.join(PARSERS)}")


def _find_query(parsed: ParsedReply, reply: str) -> tuple[str | None, str | None, str]:
    """(query, problem, role): the submitted query, or a message saying why there is none."""
    if parsed.error:
        return None, f"Your tool call could not be parsed: {parsed.error}", "tool"
    for call in parsed.calls:
        if call.name != "run_sql":
            return None, f"Unknown tool '{call.name}'; the only tool is run_sql.", "tool"
        if not isinstance(call.arguments.get("query"), str):
            return None, "run_sql needs a string argument 'query'.", "tool"
        return call.arguments["query"], None, "tool"
    blocks = _SQL_BLOCK.findall(reply)
    if blocks:
        return blocks[-1].strip(), None, "user"
    return None, "No SQL query found. Call run_sql or write the query in a ```sql block.", "user"


@register_env
class Text2SQLEnv(Env):
    """Multi-turn SQL answering and repair against ``extras["db"]`` (a spec) or ``extras["db_path"]``."""

    name = "text2sql"
    tools = [RUN_SQL]
    Config = Text2SQLConfig
    required_extras = ("gold_sql",)

    def __init__(self, extras: dict, config=None):
        super().__init__(extras, config)
        if "gold_sql" not in extras or ("db" not in extras and "db_path" not in extras):
            raise ValueError(f"env_extras for env_class 'text2sql': needs 'gold_sql' and 'db' or 'db_path' (got {sorted(extras)})")
        self._tmp: str | None = None
        self.turns = 0
        self.metrics = {"sql_errors": 0.0, "parse_errors": 0.0, "turns": 0.0, "correct": 0.0}

    def init(self, prompt):
        if "db" in self.extras:
            self._tmp = tempfile.mkdtemp(prefix="text2sql-")
            self.db_path = Path(self._tmp) / "db.sqlite"
            write_database(self.extras["db"], self.db_path)
        else:
            self.db_path = Path(self.extras["db_path"])
        gold = run_query(self.db_path, self.extras["gold_sql"], 60.0, self.config.max_rows)
        if gold.error or gold.truncated:
            raise TaskBug(f"text2sql gold query cannot be scored: {gold.error or 'over max_rows rows'}")
        self.gold = gold
        return prompt, {}

    def step(self, action: str) -> StepResult:
        self.turns += 1
        self.metrics["turns"] = float(self.turns)
        parsed = parse_tool_calls(action, self.config.tool_call_format)
        self.metrics["parse_errors"] += float(parsed.error is not None)
        query, problem, role = _find_query(parsed, action)
        if problem is None:
            result = run_query(self.db_path, query, self.config.time_limit_s, self.config.max_rows)
            if result.error is None:
                return self._score(result)
            self.metrics["sql_errors"] += 1
            problem = f"{result.error}\nFix the query and try again."
        if self.turns >= self.config.max_turns:
            return StepResult([], 0.0, True, {"correct": 0.0})
        return StepResult([{"role": role, "content": problem}], 0.0, False, {})

    def _score(self, result: QueryResult) -> StepResult:
        ok = not result.truncated and results_match(result.rows, self.gold.rows, is_ordered(self.extras["gold_sql"]))
        self.metrics["correct"] = float(ok)
        reward = 1.0 if ok else self.config.runs_reward
        return StepResult([], reward, True, {"correct": float(ok), "rows": float(len(result.rows))})

    def close(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    @classmethod
    def generate_rows(cls, n: int, seed: int, split: str = "train", **knobs) -> list[dict]:
        from megatron_rl.envs.text2sql.tasks import generate_rows

        return generate_rows(n, seed, split, **knobs)

    @classmethod
    def reference_reply(cls, extras: dict) -> str:
        return f'<tool_call>\n{{"name": "run_sql", "arguments": {{"query": {json.dumps(extras["gold_sql"])}}}}}\n</tool_call>'

