"""Where a process computes: the device choice (shared by training and the decoding commands) and the
process group that ``torchrun`` describes.

``torchrun`` sets ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK``; without them a run is one process on the
same code path (``Dist()``: every collective is the identity). Backend: nccl on CUDA, gloo on the CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
import torch.distributed as torch_dist

from ..config.choices import Device
from ..errors import ConfigError


def choose_device(name: str | Device, where: str = "train.device") -> torch.device:
    """The device for ``name`` (auto, cpu or cuda); ``where`` names the setting in the error for a CUDA
    request on a machine without CUDA. Under torchrun each process takes the GPU of its ``LOCAL_RANK``."""
    name = Device(name)
    if name is Device.cuda and not torch.cuda.is_available():
        setting = f"{where} cpu" if where.startswith("-") else "device: cpu or auto"
        raise ConfigError(f"{where}: CUDA is not available on this machine; use {setting}")
    if name is Device.cpu or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


@dataclass
class Dist:
    """This process's place in the job, and the two collectives training needs."""

    world_size: int = 1
    rank: int = 0
    local_rank: int = 0
    # where collectives' tensors live
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def main(self) -> bool:
        """Rank 0: the process that validates, writes the run folder and talks to the user."""
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        if self.active:
            torch_dist.barrier()

    def all_sum(self, values: list[float]) -> list[float]:
        """Each value summed over the ranks (in float64, so counts stay exact)."""
        if not self.active:
            return values
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)  # nccl needs CUDA tensors
        torch_dist.all_reduce(tensor)
        return tensor.tolist()

    def close(self) -> None:
        if self.active and torch_dist.is_initialized():
            torch_dist.destroy_process_group()


def environment_rank() -> int:
    """The rank torchrun gave this process (0 outside torchrun), known before any process group exists."""
    return int(os.environ.get("RANK", "0"))


def setup_distributed(device: torch.device) -> Dist:
    """Join the process group torchrun describes, or a one-process ``Dist`` without torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    if not torch_dist.is_initialized():
        torch_dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Dist(world, torch_dist.get_rank(), int(os.environ.get("LOCAL_RANK", "0")), device)
