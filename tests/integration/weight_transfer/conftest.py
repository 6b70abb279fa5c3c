"""vLLM caches, temp files and IPC sockets of these tests go under /tmp/wt2."""

import os
from pathlib import Path

RUN = Path("/tmp/wt2")
RUN.mkdir(parents=True, exist_ok=True)
os.environ.setdefault("VLLM_CACHE_ROOT", str(RUN / "vllm-cache"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(RUN / "inductor"))
os.environ.setdefault("VLLM_RPC_BASE_PATH", str(RUN))
os.environ.setdefault("TMPDIR", str(RUN))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
