"""Shared pieces of the weight-transfer integration tests: perturbed checkpoints as the trainer's weights,
engines with the receiver mixin, and log-probs on fixed tokens from vLLM and from transformers."""

from __future__ import annotations

import math
import os
import shutil
import signal
import threading
import time
import zlib
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file

from megatron_rl.tiny import make_tiny_model
from weight_transfer.layout import TrainerLayout
from weight_transfer.plan import TransferPlan, specs_from_tensors
from weight_transfer.replicas import LLMReplica

TOKENS = [[5, 17, 300, 42, 7, 999, 1234, 64, 88, 2000, 3, 11, 512, 77, 1500, 9],
          [101, 202, 303, 404, 505, 606, 707, 808, 909, 1010, 1111, 1212]]
RECEIVER = "weight_transfer.vllm_receiver.WeightReceiver"
LOGPROB_TOLERANCE = 1e-3


def checkpoint(model_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(Path(model_dir) / "model.safetensors"))


def perturbed(model_dir: Path, seed: int) -> dict[str, torch.Tensor]:
    """The checkpoint plus deterministic noise per tensor (a stand-in for one optimizer step)."""
    out = {}
    for name, tensor in checkpoint(model_dir).items():
        gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
        out[name] = tensor + 0.03 * torch.randn(tensor.shape, generator=gen, dtype=tensor.dtype)
    return out


class PerturbedWeights:
    """``weights_fn`` for LocalSenders: version v yields the checkpoint perturbed with seed v.
    ``die_at=(version, after)`` makes the sender process exit after yielding ``after`` tensors of that version;
    ``raise_at=(version, after)`` makes the export raise there instead, once per sender process (the trainer's
    export failing while its process lives on); ``delay_s`` slows each tensor; ``started`` is a file created once
    yielding begins."""

    raised = False  # per sender process

    def __init__(self, model_dir: Path, die_at: tuple[int, int] | None = None, delay_s: float = 0.0,
                 started: str | None = None, raise_at: tuple[int, int] | None = None):
        self.model_dir, self.die_at, self.delay_s, self.started = Path(model_dir), die_at, delay_s, started
        self.raise_at = raise_at

    def __call__(self, rank: int, version: int):
        import time

        if self.started:
            Path(self.started).touch()
        for i, pair in enumerate(perturbed(self.model_dir, version).items()):
            if self.die_at and self.die_at == (version, i):
                os._exit(3)
            if self.raise_at == (version, i) and not PerturbedWeights.raised:
                PerturbedWeights.raised = True
                raise RuntimeError(f"export failed at tensor {i} of version {version}")
            time.sleep(self.delay_s)
            yield pair


def plan_for(model_dir: Path, tp: int, bucket_bytes: int, senders: str = "spread", ep: int = 1,
             etp: int | None = None) -> TransferPlan:
    """``spread``: PerturbedWeights yields every tensor on every rank, so both TP ranks send. The trainer has
    lcm(tp, etp x ep) ranks (data parallel takes the rest)."""
    config = transformers.AutoConfig.from_pretrained(model_dir)
    experts = getattr(config, "num_experts", 0) or 0
    world = math.lcm(tp, (etp or tp) * ep)
    layout = TrainerLayout(num_layers=config.num_hidden_layers, tp=tp, dp=world // tp, ep=ep, num_experts=experts,
                           etp=etp)
    return TransferPlan.build(specs_from_tensors(checkpoint(model_dir)), layout, bucket_bytes, senders=senders)


def make_llm(model_dir: Path):
    import torch
    from vllm import LLM

    # On a GPU vLLM refuses to start when gpu_memory_utilization (default 0.92) of the card exceeds what
    # is free, even with a fixed KV cache; a colocated trainer holds part of it.
    gpu = {"gpu_memory_utilization": 0.3} if torch.cuda.is_available() else {}
    if gpu:
        # torch 2.11's is_available() above poisons fork without initialising CUDA, so vLLM 0.26 (which
        # switches to spawn only once CUDA is initialised) forks its engine core, and the child fails with
        # "Cannot re-initialize CUDA in forked subprocess".
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
    return LLM(str(model_dir), dtype="float32", enforce_eager=True, max_model_len=256, seed=0,
               kv_cache_memory_bytes=1 << 26, worker_extension_cls=RECEIVER, **gpu)


def close_llm(llm) -> None:
    """Stop the engine's processes now rather than at interpreter exit."""
    llm.llm_engine.engine_core.shutdown()


def vllm_logprobs(llm) -> list[torch.Tensor]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
    outs = llm.generate([TokensPrompt(prompt_token_ids=t) for t in TOKENS], params, use_tqdm=False)
    return [torch.tensor([lp[tok].logprob for lp, tok in zip(o.prompt_logprobs[1:], t[1:])])
            for o, t in zip(outs, TOKENS)]


def hf_logprobs(model_dir: Path, tensors: dict[str, torch.Tensor], scratch: Path) -> list[torch.Tensor]:
    """Transformers' log-probs of TOKENS with ``tensors`` as the checkpoint (written next to the config)."""
    target = scratch / "hf-reference"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(model_dir, target)
    save_file(tensors, str(target / "model.safetensors"))
    model = transformers.AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for t in TOKENS:
            logits = model(torch.tensor([t])).logits[0, :-1]
            out.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor(t[1:])[:, None])[:, 0])
    return out


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b))


class ReplicaFleet:
    """Tiny ``arch`` model planned for TP=2 senders, ``engines`` vLLM replicas, and the log-probs each version
    should give (0: the checkpoint, v: ``perturbed(v)``)."""

    def __init__(self, arch, tmp, engines):
        self.model, self.tmp = make_tiny_model(arch, size="unit", seed=0), tmp
        self.plan = plan_for(self.model, tp=2, bucket_bytes=256 << 10)
        self.llms = [make_llm(self.model) for _ in range(engines)]
        self.replicas = [LLMReplica(llm, f"r{i}") for i, llm in enumerate(self.llms)]
        self.expected = {0: hf_logprobs(self.model, checkpoint(self.model), tmp)}

    def on(self, version):
        """Expected log-probs of ``version`` (0: the checkpoint)."""
        if version not in self.expected:
            self.expected[version] = hf_logprobs(self.model, perturbed(self.model, version), self.tmp)
        return self.expected[version]

    def versions(self, candidates, logprobs=None) -> dict[str, int]:
        """Which candidate version each replica serves; fails on a replica matching none (mixed weights)."""
        logprobs = logprobs or [vllm_logprobs(llm) for llm in self.llms]
        out = {}
        for replica, got in zip(self.replicas, logprobs):
            diffs = {v: max_diff(got, self.on(v)) for v in candidates}
            matches = [v for v, d in diffs.items() if d < LOGPROB_TOLERANCE]
            assert len(matches) == 1, f"{replica.name} matches no single version (mixed weights?): {diffs}"
            out[replica.name] = matches[0]
        return out

    def close(self):
        for llm in self.llms:
            close_llm(llm)


def update_restarting(fleet: ReplicaFleet, coordinator, version: int, started: Path, index: int = 1,
                      after_s: float = 1.0) -> dict:
    """``coordinator.update(version)`` in a thread while this one SIGKILLs replica ``index``'s engine ``after_s``
    after ``started`` appears (the senders began) and starts a new engine from the checkpoint behind the same
    replica handle, as a supervisor restarting a server at its address would. Returns the update's metrics."""
    replica = fleet.replicas[index]
    pid = replica.call("wt_describe", {}, 30)[0]["pid"]
    out: dict = {}

    def run():
        try:
            out["metrics"] = coordinator.update(version)
        except BaseException as err:  # re-raised below, in the test's thread
            out["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 300
    while not started.exists() and thread.is_alive():
        assert time.monotonic() < deadline, "the senders never started"
        time.sleep(0.05)
    time.sleep(after_s)
    assert thread.is_alive(), f"the update ended before the restart: {out}"
    os.kill(pid, signal.SIGKILL)
    dead = fleet.llms[index]
    fleet.llms[index] = replica.llm = make_llm(fleet.model)  # vLLM starts engines from the main thread only
    close_llm(dead)
    thread.join(600)
    assert not thread.is_alive(), "the update did not end within 600 s of the restart"
    if "error" in out:
        raise out["error"]
    return out["metrics"]


class FlipFirstSend:
    """Wraps a sender transport so that the first bucket rank 0's process ever sends has one byte flipped
    after its checksum was taken (a corrupted link); later sends, also after a reconnect, are clean."""

    flipped = False  # per sender process: the process outlives reconnects, the wrapper does not

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def send(self, version, bucket, flat):
        if bucket.sender == 0 and not FlipFirstSend.flipped:
            flat[bucket.nbytes // 2] ^= 0x5A
            FlipFirstSend.flipped = True
        self.inner.send(version, bucket, flat)


def flip_rank0(transport):
    """``wrap`` for LocalSenders: corrupt the first bucket that rank 0 sends."""
    return FlipFirstSend(transport)


class ProbeAfterFirstAttempt:
    """Senders that call ``probe()`` when the first attempt's buckets are released: the coordinator has
    finished (verified, maybe loaded) every replica of that attempt and nothing else is in flight."""

    def __init__(self, inner, probe):
        self.inner, self.probe, self.probed = inner, probe, None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def release(self, version):
        self.inner.release(version)
        if self.probed is None:
            self.probed = self.probe()


def token_batch():
    """TOKENS as a right-padded TrainingBatch (megatron's log-prob pass input)."""
    from megatron_rl.contracts import TrainingBatch

    rows, width = len(TOKENS), max(len(t) for t in TOKENS)
    input_ids, attn = torch.zeros(rows, width, dtype=torch.long), torch.zeros(rows, width)
    for b, t in enumerate(TOKENS):
        input_ids[b, :len(t)], attn[b, :len(t)] = torch.tensor(t), 1
    loss = attn.clone()
    loss[:, 0] = 0
    return TrainingBatch(input_ids=input_ids, attention_mask=attn, loss_mask=loss, advantages=torch.zeros(rows, width),
                         rollout_logprobs=torch.zeros(rows, width), group_ids=torch.arange(rows),
                         trajectory_ids=[f"t{b}" for b in range(rows)], prompt_lengths=torch.ones(rows, dtype=torch.long))


class MegatronExport:
    """``weights_fn`` for LocalSenders over every rank of a real megatron-core model (TP, EP and expert TP over
    gloo, lcm(tp, etp x ep) ranks).

    The first call builds the model from the checkpoint (parallel's provider and importer). Version v adds
    seeded noise to every local parameter shard (the same noise on each rank holding a replicated tensor),
    runs megatron's log-prob pass on TOKENS, then returns parallel's export iterator as weight syncs use it
    (q, k, v as row-block views). Rank 0 saves under ``out_dir`` megatron's log-probs (``megatron-v{v}.pt``),
    every rank the tensors it yields, in HF shape (``exported-v{v}-r{rank}``)."""

    def __init__(self, model_dir: Path, tp: int, out_dir: Path, ep: int = 1, etp: int | None = None):
        from weight_transfer.session import free_port

        self.model_dir, self.out_dir = str(model_dir), Path(out_dir)
        self.parallel = dict(tensor_model_parallel_size=tp, expert_model_parallel_size=ep, expert_tensor_parallel_size=etp)
        self.world = math.lcm(tp, (etp or tp) * ep)
        self.init_method, self.state = f"tcp://127.0.0.1:{free_port()}", None

    def _build(self, rank: int):
        from parallel import cpu_compat

        cpu_compat.enable()
        from parallel.config import ParallelConfig, TrainerConfig
        from parallel.groups import init_distributed
        from parallel.provider import load_model

        cfg = TrainerConfig(num_ranks=self.world, parallel=ParallelConfig(**self.parallel))
        pgs = init_distributed(cfg.parallel, rank, self.world, self.init_method)
        model = load_model(self.model_dir, cfg, pgs)
        return cfg, pgs, model

    def __call__(self, rank: int, version: int):
        self.state = self.state or self._build(rank)  # first: parallel's CPU layer precedes megatron imports
        from parallel.logprob_pass import compute_logprobs
        from parallel.weights.hf_export import HFExport
        from parallel.weights.placement import placements

        cfg, pgs, model = self.state
        with torch.no_grad():
            for param, place in placements(model, pgs).values():
                shard = place.tp_group.rank() if place.partition_dim is not None else 0
                gen = torch.Generator().manual_seed(version * 1_000_003 + zlib.crc32(f"{place.global_name}/{shard}".encode()))
                param.add_(0.03 * torch.randn(param.shape, generator=gen, dtype=param.dtype))
        logprobs = compute_logprobs(model, token_batch(), cfg.max_tokens_per_micro_batch, pgs)[0]
        if rank == 0:
            torch.save(logprobs, self.out_dir / f"megatron-v{version}.pt")
        return self._saving(HFExport(model, pgs).tensors(row_blocks=True), version, rank)

    def _saving(self, pairs, version: int, rank: int):
        kept = {}
        for name, tensor in pairs:
            kept[name] = tensor.flatten(0, 1) if tensor.dim() == 3 else tensor.clone()  # the models' HF weights are 2-D
            yield name, tensor
        save_file(kept, str(self.out_dir / f"exported-v{version}-r{rank}.safetensors"))


class SpoilFirstDelta:
    """Wraps a tensorstore_delta sender: after the first delta version this process writes (manifest
    included), one written chunk of it is deleted (``missing``) or has a byte flipped (``corrupted``), as a
    shared filesystem that lost or damaged a file would; later versions, also after a reconnect, are clean."""

    spoiled = False  # per sender process: the process outlives reconnects, the wrapper does not

    def __init__(self, inner, fault: str):
        self.inner, self.fault = inner, fault

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def finish(self, version):
        import json

        from weight_transfer.transports import tensorstore_delta as tsd

        self.inner.finish(version)
        manifest = json.loads(tsd.manifest_path(self.inner.session, self.inner.rank, version).read_text())
        if SpoilFirstDelta.spoiled or manifest["full"]:
            return
        index, entry = next((i, e) for i, e in manifest["buckets"].items() if e["chunks"])
        path = tsd.chunk_file(tsd.version_dir(self.inner.session, self.inner.rank, version) / f"b{index}", entry["chunks"][0])
        if self.fault == "missing":
            path.unlink()
        else:
            raw = bytearray(path.read_bytes())
            raw[len(raw) // 2] ^= 0x5A
            path.write_bytes(bytes(raw))
        SpoilFirstDelta.spoiled = True


def lose_a_chunk(transport):
    """``wrap`` for LocalSenders: the first delta loses one chunk file."""
    return SpoilFirstDelta(transport, "missing")


def corrupt_a_chunk(transport):
    """``wrap`` for LocalSenders: the first delta has one chunk file damaged."""
    return SpoilFirstDelta(transport, "corrupted")
