"""The wire protocol shared by server and client: one WebSocket per episode.

client → ``{"op": "reset", "env_class", "extras", "prompt", "config"}``; server → ``{"op": "ready", "prompt", "tools"}``
client → ``{"op": "step", "action"}``;  server → ``{"op": "result", "observations", "reward", "done", "metadata", "metrics"}``
client → ``{"op": "close"}``; the server closes the env and the socket. On a failure the server sends
``{"op": "error", "kind": "task_bug" | "env_error" | "bad_request", "message"}`` and closes the session.
"""

SESSION_PATH = "/session"
HEALTH_PATH = "/health"
ENVS_PATH = "/envs"
TASKS_PATH = "/tasks"

CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_POLICY = 1008
"""Authentication failed (sent before the handshake completes: the client sees HTTP 403)."""
CLOSE_SERVICE_RESTART = 1012
CLOSE_TRY_AGAIN = 1013
"""The server stayed at its concurrency limit past its bounded wait."""

TASK_BUG = "task_bug"
ENV_ERROR = "env_error"
BAD_REQUEST = "bad_request"
