"""The device this rank computes on: its CUDA device, or the CPU."""

import torch


def device() -> torch.device:
    """``cuda:<current>`` on GPU machines, else ``cpu``."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
