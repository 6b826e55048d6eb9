"""Dropout (Srivastava et al. 2014) whose mask is drawn faster on the CPU.

PyTorch's CPU dropout draws its mask with ``bernoulli_``, and ``torch.rand`` with its Mersenne Twister,
one element at a time on one thread: on a Multi30k Transformer step the random numbers were the largest
single item of the profile (16% of a bf16 step, ``bench_train.py --profile``). Here each mask takes one
draw from torch's generator (so ``torch.manual_seed`` decides it, as the trainer's exact resume needs),
which seeds numpy's SFC64, whose raw 64-bit words give four 16-bit integers each, about 6x faster than
``torch.rand``. An element is kept when its integer is at least ``p`` on a 1/65536 grid, and scaled by the
inverse of the kept probability on the same grid, so the expectation is exactly x; the rate differs
from ``p`` by at most 1/131072 (0.2 is 0.19999695). Elsewhere (CUDA) ``F.dropout``'s fused kernel is used.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

GRID = 65536  # the mask's 16-bit integers


def keep_mask(shape: torch.Size | tuple[int, ...], p: float) -> tuple[torch.Tensor, float]:
    """A boolean mask of ``shape``, each element True with probability ``1 - p'`` independently, where
    ``p'`` is ``p`` rounded to a multiple of 1/65536; and ``1 / (1 - p')``, the scale of the kept."""
    dropped = round(p * GRID)
    n = math.prod(shape)
    seed = int(torch.randint(0, 2**62, (1,)))  # torch's seeded stream decides the mask
    with torch.profiler.record_function("dropout masks"):  # numpy's time, named in a profile
        words = np.random.SFC64(seed).random_raw((n + 3) // 4)
    bits = torch.from_numpy(words.view(np.int16)[:n]).view(shape)  # uniform on [-32768, 32767]
    return bits >= dropped - GRID // 2, GRID / (GRID - dropped)


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """x with each element zeroed with probability p and the rest scaled by 1 / (1 - p), in training."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, training)
    keep, scale = keep_mask(x.shape, p)
    return x * keep.to(x.dtype).mul_(scale)


class Dropout(nn.Dropout):
    """``nn.Dropout`` (the same ``p``, ``state_dict`` and ``repr``) computed by ``dropout``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)
