"""``Linear``: ``nn.Linear`` that, when nothing needs its gradient, multiplies by a prepacked weight.

PyTorch's CPU ``F.linear`` calls MKL's sgemm on the weight as stored, every time. oneDNN can instead
reorder the weight once into the blocked layout its GEMM kernels read fastest (the step
``torch.compile`` takes for frozen CPU weights), which makes the decoder's larger products 10-35%
faster at decoding sizes (320 x 256 by 256 x 8,000, the output layer: 8.7 ms -> 6.5 ms on 2 cores;
``scripts/bench_decode.py --parts``). The packed copy is kept on the module, out of ``state_dict``, and is made again whenever
the weight changes (an optimizer step, a loaded checkpoint): the key is the tensor's storage and its
version counter.

The packed path is taken only for float32 CPU inputs with gradients off (``torch.no_grad`` or
``torch.inference_mode``) when this PyTorch build has the oneDNN ops; everything else, training
included, is plain ``F.linear`` (so is a layer created under ``torch.inference_mode``, whose weight
has no version counter to notice changes by). Results agree with ``F.linear`` to float32 rounding (the tests
compare them), and each row is computed on its own, so a sentence's output does not depend on its
batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _packed_ops():
    """(reorder, linear) oneDNN ops, or None when this build lacks them."""
    try:
        ops = torch.ops.mkldnn
        if not torch.backends.mkldnn.is_available():
            return None
        return ops._reorder_linear_weight, ops._linear_pointwise
    except (AttributeError, RuntimeError):
        return None


_OPS = _packed_ops()
ENABLED = _OPS is not None  # module-level switch (tests turn it off to compare)


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same ``state_dict``) with the prepacked inference path."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._packed: tuple[tuple, torch.Tensor] | None = None

    def _packed_weight(self) -> torch.Tensor:
        weight = self.weight
        key = (weight.data_ptr(), weight._version, tuple(weight.shape))
        if self._packed is None or self._packed[0] != key:
            with torch.inference_mode():
                self._packed = (key, _OPS[0](weight.detach(), 64))
        return self._packed[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            ENABLED
            and not torch.is_grad_enabled()
            and x.dtype == torch.float32
            and x.device.type == "cpu"
            and self.weight.dtype == torch.float32
            and not self.weight.is_inference()  # made under inference_mode: no version counter to key on
            and x.dim() >= 2
            and x.numel() > 0
        ):
            rows = x.reshape(-1, x.size(-1)).contiguous()  # (M, in)
            bias = None if self.bias is None else self.bias.detach()
            out = _OPS[1](rows, self._packed_weight(), bias, "none", [], "")  # (M, out)
            return out.view(*x.shape[:-1], out.size(-1))
        return F.linear(x, self.weight, self.bias)

    def __getstate__(self):  # a pickled or deep-copied module packs again where it lands
        return {**self.__dict__, "_packed": None}
