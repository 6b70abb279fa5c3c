"""A driver that starts a managed one-server fleet, samples once, prints its server pids and waits
to be interrupted. Run as a script: python fleet_main.py MODEL_DIR RUN_DIR"""

import asyncio
import faulthandler
import signal
import sys

import psutil

from megatron_rl.inference import GenerationRequest, InferenceConfig, InferenceFleet, SamplingParams, ServerConfig


async def main(model: str, run_dir: str) -> None:
    server = ServerConfig(model_path=model, max_model_len=512, kv_cache_gib=0.25, run_dir=run_dir)
    async with InferenceFleet(InferenceConfig(num_servers=1, server=server)) as fleet:
        result = await fleet.generate(GenerationRequest([1, 2, 3], SamplingParams(max_tokens=4, ignore_eos=True)))
        assert len(result.token_ids) == 4
        root = psutil.Process(fleet.local.servers[0].process.pid)
        pids = [root.pid] + [p.pid for p in root.children(recursive=True)]
        print("PIDS", " ".join(map(str, pids)), flush=True)
        await asyncio.sleep(3600)


if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks for stacks when shutdown hangs
    # Ctrl-C as in a terminal: a test run started in the background (nohup, `&` in a script) inherits
    # SIGINT ignored, and asyncio.run then leaves it ignored, so the driver would never stop.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    asyncio.run(main(sys.argv[1], sys.argv[2]))
