"""Cost of the full off-policy correction + loss stack against a plain PPO-clip loss.

Both run forward and backward through :func:`megatron_rl.algorithms.loss.policy_update_loss` on the
same ``batch x length`` float32 tensors (a quarter of the tokens masked), interleaved repetition
by repetition so that machine noise hits both alike. The stack is: outlier rejection, token mask,
token TIS and the geometric sequence mask, with every metric computed. Prints the median times,
their ratio (target: at most 1.5) and each variant's peak memory from the profiler's allocation
trace.

    OMP_NUM_THREADS=1 python benchmarks/bench_correction.py [--batch 64] [--length 4096] [--repeats 21]

On a shared 2-core machine one thread gives the steadiest ratio; with more threads the plain
loss's large elementwise ops scale better than the stack's many small reductions.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from correction.config import CorrectionConfig
from megatron_rl.algorithms.config import AlgorithmConfig
from megatron_rl.algorithms.loss import policy_update_loss

TARGET_RATIO = 1.5

FULL = AlgorithmConfig(
    correction=CorrectionConfig(
        outlier_token_is_threshold_low=1e-3,
        outlier_token_is_threshold_high=1e3,
        token_mask_eps_low=0.5,
        token_mask_eps_high=0.5,
        tis_ratio_type="token",
        sequence_mask_metric="geometric",
        geo_mask_low=0.9,
        geo_mask_high=1.1,
    )
)
PLAIN = AlgorithmConfig()


def make_batch(batch: int, length: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    rollout = -torch.rand(batch, length, generator=g) * 4
    old = rollout + 0.05 * torch.randn(batch, length, generator=g)
    return {
        "log_probs": old + 0.05 * torch.randn(batch, length, generator=g),
        "old_log_probs": old,
        "rollout_logprobs": rollout,
        "advantages": torch.randn(batch, length, generator=g),
        "loss_mask": torch.rand(batch, length, generator=g) < 0.75,
    }


def step(data: dict[str, torch.Tensor], config: AlgorithmConfig) -> None:
    log_probs = data["log_probs"].clone().requires_grad_(True)
    loss, metrics = policy_update_loss(
        log_probs,
        data["old_log_probs"],
        data["advantages"],
        data["loss_mask"],
        config,
        rollout_logprobs=data["rollout_logprobs"],
    )
    loss.backward()
    {k: v.item() for k, v in metrics.items()}  # what a trainer logs, so the syncs are counted


def timed(data: dict[str, torch.Tensor], config: AlgorithmConfig) -> float:
    start = time.perf_counter()
    step(data, config)
    return time.perf_counter() - start


def peak_bytes(data: dict[str, torch.Tensor], config: AlgorithmConfig) -> int:
    """Highest net allocation above the inputs during one step.

    Walks the profiler's events in start order adding each one's own net allocation (an op's
    outputs, or a free outside any op); an op's allocation counts from its start.
    """
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step(data, config)
    live = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += event.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    data = make_batch(args.batch, args.length)
    for config in (PLAIN, FULL):  # warm-up
        step(data, config)
    plain, full = [], []
    for _ in range(args.repeats):
        plain.append(timed(data, PLAIN))
        full.append(timed(data, FULL))
    plain_s, full_s = statistics.median(plain), statistics.median(full)
    ratio = full_s / plain_s
    mib = 2**20
    print(f"batch {args.batch} x {args.length} tokens, {torch.get_num_threads()} threads, "
          f"median of {args.repeats}, forward + backward")
    print(f"plain PPO-clip loss           : {plain_s * 1e3:8.2f} ms   peak {peak_bytes(data, PLAIN) / mib:7.1f} MiB")
    print(f"correction stack + PPO-clip   : {full_s * 1e3:8.2f} ms   peak {peak_bytes(data, FULL) / mib:7.1f} MiB")
    print(f"ratio (stack / plain)         : {ratio:8.2f}x   target <= {TARGET_RATIO}x "
          f"({'met' if ratio <= TARGET_RATIO else 'NOT met'})")


if __name__ == "__main__":
    main()
