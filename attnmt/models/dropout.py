"""Dropout (Srivastava et al. 2014) whose mask is drawn faster on the CPU.

PyTorch's CPU dropout draws its mask with ``bernoulli_``, one element at a time: on a Multi30k
Transformer step it was the largest single item of the profile (23% of a bf16 step). Drawing uniform
floats with ``torch.rand`` (vectorised) and comparing them with p gives the same distribution, each
element kept with probability 1 - p and scaled by 1 / (1 - p), in about half the time
(``scripts/bench/bench_train.py --parts`` measures it). Elsewhere (CUDA) ``F.dropout``'s fused kernel is used.
The mask is drawn in fp32 whatever the dtype of x, so that p keeps its resolution under bf16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """x with each element zeroed with probability p and the rest scaled by 1 / (1 - p), in training."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, training)
    keep = (torch.rand(x.shape, device=x.device) >= p).to(x.dtype).mul_(1.0 / (1.0 - p))
    return x * keep


class Dropout(nn.Dropout):
    """``nn.Dropout`` (the same ``p``, ``state_dict`` and ``repr``) computed by ``dropout``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)
