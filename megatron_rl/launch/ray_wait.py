"""``megatron-rl slurm wait-nodes``: wait until every node of a Slurm job has joined the Ray cluster with its
GPUs, or fail naming the nodes that did not, so that no driver starts on half a cluster."""

from __future__ import annotations

import time

NODE_LABEL = "slurm_node_"
"""Each Ray node of a Slurm job carries ``slurm_node_<i>`` (i = its position in the job's node list; 0 = head)."""


class NodesMissing(ValueError):
    """Some nodes did not join in time; the message names them."""


def node_report(ray_nodes: list[dict], names: list[str], gpus_per_node: int) -> list[str]:
    """What is still missing: one entry per node that has not joined or joined without its GPUs."""
    joined: dict[int, dict] = {}
    for node in ray_nodes:
        if not node.get("Alive"):
            continue
        for key in node.get("Resources", {}):
            if key.startswith(NODE_LABEL) and key[len(NODE_LABEL):].isdigit():
                joined[int(key[len(NODE_LABEL):])] = node["Resources"]
    problems = []
    for i, name in enumerate(names):
        if i not in joined:
            problems.append(f"{name} (slurm_node_{i}) has not joined")
        elif joined[i].get("GPU", 0) < gpus_per_node:
            problems.append(f"{name} (slurm_node_{i}) joined with {joined[i].get('GPU', 0):g} GPU(s), "
                            f"expected {gpus_per_node}")
    return problems


def wait_for_nodes(address: str, names: list[str], gpus_per_node: int, timeout_s: float, poll_s: float = 1.0) -> None:
    if not names:
        raise ValueError("--nodes: name at least one node (the job's node list, head first)")
    if timeout_s <= 0:
        raise ValueError(f"--timeout: {timeout_s} must be > 0 seconds")
    import ray

    deadline = time.monotonic() + timeout_s
    ray.init(address=address, logging_level="ERROR", log_to_driver=False, configure_logging=False)
    try:
        while True:
            problems = node_report(ray.nodes(), names, gpus_per_node)
            if not problems:
                print(f"wait-nodes: all {len(names)} node(s) joined at {address} "
                      f"({gpus_per_node} GPU(s) each)", flush=True)
                return
            if time.monotonic() >= deadline:
                raise NodesMissing(f"after {timeout_s:g} s (MRL_RAY_WAIT_S) {len(problems)} of {len(names)} node(s) "
                                   f"missing from the Ray cluster at {address}: {'; '.join(problems)}")
            time.sleep(poll_s)
    finally:
        ray.shutdown()
