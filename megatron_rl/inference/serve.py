"""``megatron-rl serve``: the inference fleet alone behind the OpenAI-compatible router, until Ctrl-C.

Managed servers (``inference.num_servers``) start from the same config keys as in training and listen on
loopback with the run secret; the router is the way in. With ``inference.external_server_urls`` the
router fronts servers started elsewhere.
"""

from __future__ import annotations

import dataclasses

from aiohttp import web

from megatron_rl.config import TrainConfig
from megatron_rl.inference.auth import new_secret
from megatron_rl.inference.launcher import LocalServers
from megatron_rl.inference.proxy import make_app


def _managed(cfg: TrainConfig, model_path: str, secret: str) -> LocalServers:
    server = dataclasses.replace(cfg.inference.server, model_path=model_path,
                                 dtype=cfg.inference.server.dtype or cfg.model.dtype,
                                 seed=cfg.run.seed, worker_extension="")
    return LocalServers(server, cfg.inference.num_servers, secret=secret)


def serve(cfg: TrainConfig, host: str, port: int) -> None:
    """Start the managed fleet (or front the external one), print the endpoint, serve until Ctrl-C/SIGTERM,
    then stop every server this started."""
    secret = None if cfg.inference.external else new_secret()
    model_path = "" if cfg.inference.external else cfg.model.resolve_path()
    fleet = _managed(cfg, model_path, secret) if secret else None
    try:
        if fleet is not None:
            fleet.start()
        urls = fleet.urls if fleet else cfg.inference.external_server_urls
        app = make_app(urls, cfg.inference.router, secret)
        model = model_path if fleet else "(the external servers' model)"
        print(f"serving {model} at http://{host}:{port}/v1 over {len(urls)} replica(s): {' '.join(urls)}; Ctrl-C stops",
              flush=True)
        web.run_app(app, host=host, port=port, print=None)
    finally:
        if fleet is not None:
            fleet.stop()
