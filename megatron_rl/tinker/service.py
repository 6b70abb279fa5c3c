"""The models a ``serve-training`` service trains: its trainer ranks, the vLLM fleet that samples
them, the weight versions the fleet serves, the SDK's futures and sampling sessions.

Training calls run one at a time in arrival order (the SDK sends a client's requests in order);
each is a future the SDK polls. Every training client is a model of its own (weights, Adam state,
step count) that starts from the base checkpoint; they take turns on the one set of trainer ranks:
a call for a model the ranks do not hold first parks the held model's state on disk (``swap/``) and
restores the called one's. Sampling runs concurrently through the fleet, bound to the weight version
its sampling session was made for; the fleet holds only the latest weights, so a session of replaced
weights is refused rather than answered by other weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
import shutil
import uuid
from pathlib import Path

from megatron_rl.config.schema import TrainConfig
from megatron_rl.tinker import ranks
from megatron_rl.tinker.batch import per_datum, to_batch
from megatron_rl.tinker.losses import check_loss
from megatron_rl.tinker.wire import ForwardBackwardCall, encode_forward_backward_output, encode_sample_response

log = logging.getLogger("megatron_rl")


class Refused(ValueError):
    """A request the service will not run; the message names the field."""


@dataclasses.dataclass
class Outcome:
    json: dict | None = None
    proto: bytes | None = None
    error: str | None = None
    category: str = "user"


class TrainingService:
    def __init__(self, cfg: TrainConfig, state_dir: Path, lora_as_full: bool = False):
        self.cfg, self.state_dir, self.lora_as_full = cfg, Path(state_dir), lora_as_full
        self.model_path = str(cfg.model.resolve_path())
        self.base_model = Path(self.model_path).name
        self.futures: dict[str, asyncio.Task] = {}
        self.models: set[str] = set()
        """every model (training client) created, by id."""
        self.held: str | None = None
        """the model whose state the trainer ranks hold; the others' states are parked under ``swap/``."""
        self._base_on_ranks = True
        """the ranks hold the base checkpoint as loaded at start (no model has been held yet)."""
        self.unstepped: dict[str, tuple[Path, bool] | None] = {}
        """models that took no optimizer step yet -> the state they were loaded from (folder, with its
        optimizer), None for the base checkpoint: they are restored by loading that again, never parked
        (megatron cannot checkpoint a distributed optimizer that never stepped)."""
        self.version = 0
        self.sessions: dict[str, int] = {}
        """sampling session id -> the weight version it samples."""
        self.sampler_paths: dict[str, int] = {}
        self._train_lock = asyncio.Lock()
        self._ids = itertools.count()
        self._stack = contextlib.AsyncExitStack()

    # ---- life cycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        import transformers

        from megatron_rl.inference.fleet import InferenceFleet
        from megatron_rl.runtime.plan import reserve
        from megatron_rl.schedules.job import fleet_config
        from megatron_rl.schedules.weight_sync import FleetWeightSync, build_plan
        from parallel.worker_group import WorkerGroup

        cfg = self.cfg
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(self.model_path)
        hf = transformers.AutoConfig.from_pretrained(self.model_path)
        self.vocab_size = hf.vocab_size
        self.max_len = cfg.inference.server.max_model_len
        reserved = reserve(cfg)
        self._stack.callback(reserved.release)
        world = cfg.trainer.num_ranks
        self.policy = await asyncio.to_thread(
            WorkerGroup, self.model_path, cfg.trainer, cfg.algorithm, world, None, False,
            cfg.placement.trainer_resources, reserved.options("trainer", world))
        self._stack.callback(self.policy.shutdown)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self._swap, ignore_errors=True)  # models of an earlier run of the service are gone
        fleet = InferenceFleet(fleet_config(cfg, self.model_path, self.state_dir),
                               cfg.placement, reserved.options("inference", cfg.inference.num_servers))
        self.fleet = await self._stack.enter_async_context(fleet)
        plan = build_plan(Path(self.model_path), hf, cfg.trainer, world, cfg.weight_transfer.bucket_bytes)
        self.weight_sync = FleetWeightSync(cfg.weight_transfer, plan, self.policy, self.fleet,
                                           colocated=cfg.placement.layout == "colocated")

    async def close(self) -> None:
        for task in self.futures.values():
            task.cancel()
        await self._stack.aclose()

    # ---- futures ---------------------------------------------------------------------------------
    def submit(self, work, training: bool = True) -> str:
        request_id = f"req-{next(self._ids)}-{uuid.uuid4().hex[:8]}"

        async def run() -> Outcome:
            try:
                if training:
                    async with self._train_lock:
                        return await work()
                return await work()
            except Refused as err:
                return Outcome(error=str(err), category="user")
            except Exception as err:  # a failure the SDK must see as a failed request, not a hang
                log.exception("request %s failed", request_id)
                return Outcome(error=f"{type(err).__name__}: {err}", category="server")

        self.futures[request_id] = asyncio.ensure_future(run())
        return request_id

    async def retrieve(self, request_id: str, wait_s: float) -> Outcome | None:
        """The outcome, or None while it runs (after waiting up to ``wait_s``)."""
        task = self.futures.get(request_id)
        if task is None:
            raise Refused(f"request_id: unknown request {request_id!r}")
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(task), wait_s)
        return task.result() if task.done() else None

    # ---- models ----------------------------------------------------------------------------------
    def check_base_model(self, name: str | None, field: str = "base_model") -> None:
        if name not in (self.base_model, self.model_path):
            raise Refused(f"{field}: this service trains {self.base_model!r} (from {self.model_path}), not {name!r}")

    def create_model(self, session_id: str, seq_id: int, base_model: str, lora: dict | None) -> str:
        """A new model starting from the base checkpoint (its state is made when it is first called)."""
        self.check_base_model(base_model)
        if lora is not None and not self.lora_as_full:
            raise Refused(
                f"lora_config.rank: LoRA is not supported (megatron-core has no LoRA); this service fine-tunes all "
                f"weights. Start it with --lora-as-full-finetune to accept LoRA requests as full fine-tuning (rank "
                f"{lora.get('rank')} ignored)")
        model_id = f"{session_id}:train:{seq_id}"
        self.models.add(model_id)
        self.unstepped[model_id] = None
        return model_id

    def check_model(self, model_id: str | None) -> None:
        if model_id not in self.models:
            raise Refused(f"model_id: unknown model {model_id!r} (this service trains {sorted(self.models)})")

    @property
    def _swap(self) -> Path:
        return self.state_dir / "swap"

    async def _hold(self, model_id: str, replacing: bool = False) -> None:
        """Make the trainer ranks hold ``model_id``'s state (call under the training lock): park the held
        model's state in ``swap/``, then restore ``model_id``'s: its parked state, or for a model that took
        no step yet the state it was loaded from or the base checkpoint. ``replacing``: the caller loads a
        saved state next, so nothing is restored."""
        if self.held == model_id:
            return
        if self.held is not None:
            if (await asyncio.to_thread(self.policy.run, ranks.pending_gradients))[-1]:
                raise Refused(
                    f"model_id: the trainer holds gradients of model {self.held} that no optim_step has applied; "
                    f"models take turns on the trainer between optimizer steps, so call optim_step for it first")
            if self.held not in self.unstepped:
                await asyncio.to_thread(self.policy.save, self._swap / self.held)
            self.held, self._base_on_ranks = None, False
        parked = self._swap / model_id
        if not replacing:
            await self._restore(model_id, parked)
        shutil.rmtree(parked, ignore_errors=True)
        self.held, self._base_on_ranks = model_id, False

    async def _restore(self, model_id: str, parked: Path) -> None:
        """Put ``model_id``'s state on the ranks: parked, the state it was loaded from, or the base checkpoint."""
        if model_id not in self.unstepped:
            await asyncio.to_thread(self.policy.load, parked)
        elif self.unstepped[model_id] is not None:
            await self._load(*self.unstepped[model_id])
        elif not self._base_on_ranks:
            await asyncio.to_thread(self.policy.run, ranks.load_base)

    async def _load(self, folder: Path, with_optimizer: bool) -> None:
        await asyncio.to_thread(self.policy.load, folder)
        if not with_optimizer:
            await asyncio.to_thread(self.policy.run, ranks.reset_optimizer)

    # ---- training --------------------------------------------------------------------------------
    def forward_backward(self, call: ForwardBackwardCall) -> str:
        self.check_model(call.model_id)
        try:
            check_loss(call.loss_fn, call.config, self.cfg.algorithm)
            batch = to_batch(call.data, call.loss_fn, self.vocab_size, self.max_len, self.tokenizer.pad_token_id or 0)
        except ValueError as err:
            raise Refused(str(err)) from None

        async def work() -> Outcome:
            await self._hold(call.model_id)
            results = await asyncio.to_thread(
                self.policy.run, ranks.forward_backward, batch, call.loss_fn, call.config, call.forward_only)
            logp, token_loss, metrics = results[-1]
            out = {"loss:sum": metrics.pop("loss", 0.0), **{f"{k}:sum": v for k, v in metrics.items()}}
            return Outcome(proto=encode_forward_backward_output(per_datum(batch, logp, token_loss), out))

        return self.submit(work)

    def optim_step(self, model_id: str, adam: dict) -> str:
        self.check_model(model_id)
        keys = ("learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm")
        unknown = sorted(set(adam) - set(keys) - {"type"})
        if unknown or adam.get("type", "adamw") not in ("adamw", "adam"):
            raise Refused(f"adam_params.{unknown[0] if unknown else 'type'}: only Adam is supported ({', '.join(keys)})")
        if adam.get("learning_rate", 1e-4) < 0:
            raise Refused("adam_params.learning_rate: must be >= 0")
        args = [float(adam.get(k, d)) for k, d in zip(keys, (1e-4, 0.9, 0.95, 1e-12, 0.0, 0.0))]

        async def work() -> Outcome:
            await self._hold(model_id)
            metrics = (await asyncio.to_thread(self.policy.run, ranks.optim_step, *args))[-1]
            self.unstepped.pop(model_id, None)
            return Outcome(json={"type": "optim_step", "metrics": metrics})

        return self.submit(work)

    # ---- weights ---------------------------------------------------------------------------------
    def _dir(self, path: str, kind: str) -> Path:
        prefix = "tinker://"
        if not path.startswith(prefix) or len(path[len(prefix):].split("/")) != 3:
            raise Refused(f"path: {path!r} is not a tinker://MODEL/{kind}/NAME path of this service")
        model, segment, name = path[len(prefix):].split("/")
        if segment != kind:
            raise Refused(f"path: {path!r} is a {segment} path; expected {kind}")
        return self.state_dir / "checkpoints" / model / segment / name

    def known_path(self, path: str) -> None:
        """Raise unless ``path`` names state or sampler weights this service saved."""
        kind = "sampler_weights" if "/sampler_weights/" in path else "weights"
        if not self._dir(path, kind).is_dir():
            raise Refused(f"tinker_path: {path!r} names nothing this service saved")

    def save_state(self, model_id: str, name: str | None) -> str:
        self.check_model(model_id)
        name = name or f"state-{uuid.uuid4().hex[:8]}"
        if "/" in name:
            raise Refused("path: a checkpoint name may not contain '/'")
        path = f"tinker://{model_id}/weights/{name}"
        final = self._dir(path, "weights")

        async def work() -> Outcome:
            await self._hold(model_id)
            tmp = final.with_name(final.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            await asyncio.to_thread(self.policy.save, tmp)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            return Outcome(json={"type": "save_weights", "path": path})

        return self.submit(work)

    def load_state(self, model_id: str, path: str, optimizer: bool) -> str:
        self.check_model(model_id)
        folder = self._dir(path, "weights")
        if not (folder / "policy").is_dir():
            raise Refused(f"path: no saved state at {path} (looked in {folder})")

        async def work() -> Outcome:
            await self._hold(model_id, replacing=True)
            await self._load(folder, optimizer)
            self.unstepped[model_id] = (folder, optimizer)
            return Outcome(json={"type": "load_weights", "path": path, "model_id": model_id})

        return self.submit(work)

    async def _sync(self) -> int:
        self.version += 1
        await self.weight_sync(self.version)
        return self.version

    def save_for_sampler(self, model_id: str, name: str | None, session_seq_id: int | None, session_id: str) -> str:
        """Ephemeral (no name): weights go into the fleet, the answer is a sampling session bound to them.
        Persistent (a name): also an HF checkpoint on disk, its tinker:// path the answer."""
        self.check_model(model_id)
        path = f"tinker://{model_id}/sampler_weights/{name}" if name else None
        if name and "/" in name:
            raise Refused("path: a checkpoint name may not contain '/'")

        async def work() -> Outcome:
            await self._hold(model_id)
            version = await self._sync()
            if path is None:
                sid = f"{session_id}:sample:{session_seq_id}"
                self.sessions[sid] = version
                return Outcome(json={"type": "save_weights_for_sampler", "sampling_session_id": sid})
            folder = self._dir(path, "sampler_weights")
            await asyncio.to_thread(self.policy.run, ranks.save_hf, str(folder))
            self.sampler_paths[path] = version
            return Outcome(json={"type": "save_weights_for_sampler", "path": path})

        return self.submit(work)

    def create_sampling_session(self, session_id: str, seq_id: int, base_model: str | None, model_path: str | None) -> str:
        if model_path:
            if model_path not in self.sampler_paths:
                raise Refused(f"model_path: {model_path!r} is not sampler weights this service saved")
            version = self.sampler_paths[model_path]
        else:
            self.check_base_model(base_model)
            version = 0
        sid = f"{session_id}:sample:{seq_id}"
        self.sessions[sid] = version
        return sid

    # ---- sampling --------------------------------------------------------------------------------
    def sample(self, req: dict) -> str:
        from megatron_rl.inference.types import SamplingParams

        sid = req.get("sampling_session_id")
        if sid is not None:
            if sid not in self.sessions:
                raise Refused(f"sampling_session_id: unknown session {sid!r}")
            version = self.sessions[sid]
        elif req.get("model_path"):
            if req["model_path"] not in self.sampler_paths:
                raise Refused(f"model_path: {req['model_path']!r} is not sampler weights this service saved")
            version = self.sampler_paths[req["model_path"]]
        else:
            self.check_base_model(req.get("base_model"))
            version = 0
        if version != self.version:
            raise Refused(f"sampling_session_id: it samples weight version {version}, replaced by version "
                          f"{self.version}; the fleet serves only the latest weights: make a new sampling client")
        tokens = []
        for k, chunk in enumerate(req["prompt"]["chunks"]):
            if chunk.get("type", "encoded_text") != "encoded_text":
                raise Refused(f"prompt.chunks[{k}]: only token chunks (encoded_text) are supported")
            tokens.extend(chunk["tokens"])
        if not tokens:
            raise Refused("prompt: empty")
        p = req.get("sampling_params", {})
        stop = p.get("stop")
        stop_ids = tuple(stop) if isinstance(stop, list) and all(isinstance(s, int) for s in stop) else ()
        stop_strs = [stop] if isinstance(stop, str) else (list(stop) if stop and not stop_ids else [])
        n = int(req.get("num_samples", 1))
        if n < 1:
            raise Refused("num_samples: must be >= 1")
        seed = p.get("seed")
        try:
            params = [SamplingParams(max_tokens=int(p.get("max_tokens") or 16), temperature=float(p.get("temperature", 1.0)),
                                     top_p=float(p.get("top_p", 1.0)), top_k=int(p.get("top_k", -1)),
                                     seed=None if seed is None else int(seed) + i, stop_token_ids=stop_ids)
                      for i in range(n)]
        except ValueError as err:
            raise Refused(f"sampling_params: {err}") from None
        want_prompt = bool(req.get("prompt_logprobs"))

        async def work() -> Outcome:
            if version != self.version:
                raise Refused(f"sampling_session_id: its weights (version {version}) were replaced while the request waited")
            answers = await asyncio.gather(*(self._one(tokens, sp, stop_strs, want_prompt and i == 0)
                                             for i, sp in enumerate(params)))
            seqs = [a[0] for a in answers]
            return Outcome(proto=encode_sample_response(seqs, answers[0][1] if want_prompt else None))

        return self.submit(work, training=False)

    async def _one(self, tokens, sp, stop_strs, prompt_logprobs: bool):
        from megatron_rl.inference.protocol import completion_payload, parse_choice
        from megatron_rl.inference.types import GenerationRequest

        payload = completion_payload(GenerationRequest(tokens, sp), self.fleet.model, f"weights-{self.version}")
        if stop_strs:
            payload["stop"] = stop_strs
        if prompt_logprobs:
            payload["prompt_logprobs"] = 0
        body, *_ = await self.fleet.router.send(payload, None)
        ids, logprobs, reason, _ = parse_choice(body)
        if reason == "abort":
            raise RuntimeError("the fleet aborted the request")
        prompt = None
        if prompt_logprobs:
            raw = body["choices"][0].get("prompt_logprobs") or body.get("prompt_logprobs") or []
            prompt = [float("nan")] + [float(entry[str(tok)]["logprob"]) for tok, entry in zip(tokens[1:], raw[1:])]
        return (ids, logprobs, reason), prompt
