"""The HTTP surface the ``tinker`` SDK calls (``/api/v1/...``): JSON everywhere except the
forward_backward request and the forward_backward / sample results, which are protobuf as the SDK
sends and expects them. Work is answered with a future id; ``retrieve_future`` long-polls it."""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from megatron_rl.tinker.service import Refused, TrainingService

_PROTO = "application/x-protobuf"
_POLL_S = 20.0


def _future(request_id: str, model_id: str | None = None) -> dict:
    return {"request_id": request_id, "model_id": model_id}


def build_app(service: TrainingService) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app):
        await service.start()
        try:
            yield
        finally:
            await service.close()

    app = FastAPI(title="megatron-rl training service (Tinker API)", lifespan=lifespan)

    @app.exception_handler(Refused)
    async def refused(request: Request, err: Refused):
        return JSONResponse(status_code=400, content={"detail": str(err), "error": str(err)})

    async def body(request: Request) -> dict:
        return await request.json()

    @app.get("/api/v1/healthz")
    async def healthz():
        return {"status": "ok"}

    @app.get("/api/v1/get_server_capabilities")
    async def capabilities():
        return {"supported_models": [{"model_name": service.base_model, "max_context_length": service.max_len,
                                      "trainable": True, "sampleable": True}]}

    @app.post("/api/v1/client/config")
    async def client_config():
        # one forward_backward request per call keeps a client's requests in the order it sent them
        return {"pjwt_auth_enabled": False, "parallel_fwdbwd_chunks": False, "use_pyqwest_transport": False}

    @app.post("/api/v1/client/dynamic_config")
    async def dynamic_config():
        return {}

    @app.post("/api/v1/create_session")
    async def create_session():
        return {"type": "create_session", "session_id": f"s{uuid.uuid4().hex[:12]}"}

    @app.post("/api/v1/session_heartbeat")
    async def heartbeat():
        return {"type": "session_heartbeat"}

    @app.post("/api/v1/telemetry")
    async def telemetry():
        return {"status": "accepted"}

    @app.post("/api/v1/create_model")
    async def create_model(request: Request):
        r = await body(request)
        model_id = service.create_model(r["session_id"], r["model_seq_id"], r.get("base_model"), r.get("lora_config"))

        async def work():
            from megatron_rl.tinker.service import Outcome

            return Outcome(json={"type": "create_model", "model_id": model_id})

        return _future(service.submit(work), model_id)

    @app.post("/api/v1/get_info")
    async def get_info(request: Request):
        r = await body(request)
        service.check_model(r.get("model_id"))
        return {"type": "get_info", "model_id": r["model_id"], "is_lora": False,
                "model_data": {"arch": service.cfg.model.tiny_arch or "hf", "model_name": service.base_model,
                               "tokenizer_id": service.model_path}}

    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request):
        from megatron_rl.tinker.wire import decode_forward_backward

        raw = await request.body()
        if request.headers.get("content-encoding") == "zstd":
            import zstandard

            raw = zstandard.ZstdDecompressor().decompress(raw, max_output_size=1 << 30)
        call = decode_forward_backward(raw)
        return _future(service.forward_backward(call), call.model_id)

    @app.post("/api/v1/optim_step")
    async def optim_step(request: Request):
        r = await body(request)
        params = r.get("adam_params") or r.get("optimizer_params") or r.get("optim_params") or {}
        return _future(service.optim_step(r.get("model_id"), params), r.get("model_id"))

    @app.post("/api/v1/save_weights")
    async def save_weights(request: Request):
        r = await body(request)
        return _future(service.save_state(r.get("model_id"), r.get("path")), r.get("model_id"))

    @app.post("/api/v1/load_weights")
    async def load_weights(request: Request):
        r = await body(request)
        model_id = r.get("model_id")
        if model_id is None:  # create_training_client_from_state: create the model, then load into it
            model_id = service.create_model(r["session_id"], r["model_seq_id"], r.get("base_model") or service.base_model, None)
        return _future(service.load_state(model_id, r["path"], bool(r.get("optimizer"))), model_id)

    @app.post("/api/v1/save_weights_for_sampler")
    async def save_for_sampler(request: Request):
        r = await body(request)
        session = (r.get("model_id") or "").split(":")[0]
        return _future(service.save_for_sampler(r.get("model_id"), r.get("path"), r.get("sampling_session_seq_id"),
                                                session), r.get("model_id"))

    @app.post("/api/v1/create_sampling_session")
    async def create_sampling_session(request: Request):
        r = await body(request)
        sid = service.create_sampling_session(r["session_id"], r["sampling_session_seq_id"], r.get("base_model"),
                                              r.get("model_path"))
        return {"type": "create_sampling_session", "sampling_session_id": sid}

    @app.get("/api/v1/samplers/{sampler_id}")
    async def sampler(sampler_id: str):
        if sampler_id not in service.sessions:
            raise Refused(f"sampling_session_id: unknown session {sampler_id!r}")
        return {"sampler_id": sampler_id, "base_model": service.base_model}

    @app.post("/api/v1/weights_info")
    async def weights_info(request: Request):
        r = await body(request)
        service.known_path(r.get("tinker_path", ""))
        return {"base_model": service.base_model, "is_lora": False}

    @app.post("/api/v1/sessions/{session_id}/finish")
    async def finish(session_id: str):
        return {}

    @app.post("/api/v1/asample")
    async def asample(request: Request):
        r = await body(request)
        request_id = service.sample(r)
        return {**_future(request_id), "sample_sequence_ids": [f"{request_id}/{i}" for i in range(int(r.get("num_samples", 1)))]}

    @app.post("/api/v1/retrieve_future")
    async def retrieve_future(request: Request):
        r = await body(request)
        outcome = await service.retrieve(r["request_id"], _POLL_S)
        if outcome is None:
            return {"type": "try_again", "request_id": r["request_id"], "queue_state": "active"}
        if outcome.error is not None:
            return {"error": outcome.error, "category": outcome.category}
        if outcome.proto is not None:
            return Response(content=outcome.proto, media_type=_PROTO)
        return outcome.json

    return app


def serve(service: TrainingService, host: str, port: int) -> None:
    import uvicorn

    uvicorn.run(build_app(service), host=host, port=port, log_level="warning")


def state_dir_for(cfg) -> Path:
    return Path(cfg.run.output_dir) / cfg.run.name / "serve_training"


def run(overrides: list[str], host: str, port: int, lora_as_full: bool) -> None:
    """``megatron-rl serve-training``: ``model=DIR`` and training keys, then serve until interrupted."""
    from megatron_rl import console
    from megatron_rl.config import load_config

    cfg = load_config([f"model.path={w[6:]}" if w.startswith("model=") else w for w in overrides])
    if cfg.trainer.dtype != cfg.model.dtype:
        raise ValueError(f"trainer.dtype={cfg.trainer.dtype} differs from model.dtype={cfg.model.dtype}; set both")
    console.setup(cfg.run.verbose)
    service = TrainingService(cfg, state_dir_for(cfg), lora_as_full)
    print(f"serving the Tinker API for {service.base_model} at http://{host}:{port} (state in {service.state_dir}); "
          "Ctrl-C stops", flush=True)
    serve(service, host, port)


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(prog="python -m megatron_rl.tinker.app")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--lora-as-full-finetune", action="store_true")
    a = p.parse_args()
    run(a.overrides, a.host, a.port, a.lora_as_full_finetune)
