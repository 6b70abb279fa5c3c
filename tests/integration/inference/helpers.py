"""Small helpers shared by the inference integration tests."""

import asyncio

from megatron_rl.inference import InferenceConfig, InferenceFleet


def run_with_fleet(config: InferenceConfig, body):
    """Run ``await body(fleet)`` on a fresh event loop with a fleet client over ``config``."""

    async def main():
        async with InferenceFleet(config) as fleet:
            return await body(fleet)

    return asyncio.run(main())
