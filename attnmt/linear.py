"""``Linear``: ``nn.Linear`` that, when nothing needs its gradient, multiplies by a prepacked weight.

PyTorch's CPU ``F.linear`` calls MKL's sgemm on the weight as stored, every time. oneDNN can instead
reorder the weight once into the blocked layout its GEMM kernels read fastest (the step
``torch.compile`` takes for frozen CPU weights), which makes the decoder's larger products 10-35%
faster at decoding sizes (320 x 256 by 256 x 8,000, the output layer: 8.7 ms -> 6.5 ms on 2 cores;
``scripts/bench_decode.py --parts``). The packed copy is kept on the module, out of ``state_dict``, and is made again whenever
the weight changes (an optimizer step, a loaded checkpoint): the key is the tensor's storage and its
version counter, and ``train()`` / ``eval()`` drop it. A change that bypasses the version counter
(writing through ``weight.data``, or a fused optimizer kernel) while the module stays in eval mode is
not seen until the next ``eval()``.

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
from torch.autograd import forward_ad


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


def _packable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (
        ENABLED
        and not torch.is_grad_enabled()
        and x.dtype == torch.float32
        and x.device.type == "cpu"
        and weight.dtype == torch.float32
        and not weight.is_inference()  # made under inference_mode: no version counter to key on
        and forward_ad._current_level < 0  # inside a forward-mode AD level: the differentiable F.linear
        and x.dim() >= 2
        and x.numel() > 0
    )


def _key(*weights: torch.Tensor) -> tuple:
    return tuple((w.data_ptr(), w._version, tuple(w.shape)) for w in weights)


def _packed_product(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, activation: str) -> torch.Tensor:
    rows = x.reshape(-1, x.size(-1)).contiguous()  # (M, in)
    out = _OPS[1](rows, packed, bias, activation, [], "")  # (M, out)
    return out.view(*x.shape[:-1], out.size(-1))


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same ``state_dict``) with the prepacked inference path.

    ``forward(x, relu=True)`` is ``relu(linear(x))``, fused into the product on the packed path."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._packed: tuple[tuple, torch.Tensor] | None = None
        self._stacked: tuple[tuple, torch.Tensor, torch.Tensor | None] | None = None

    def _packed_weight(self) -> torch.Tensor:
        key = _key(self.weight)
        if self._packed is None or self._packed[0] != key:
            with torch.inference_mode():
                self._packed = (key, _OPS[0](self.weight.detach(), 64))
        return self._packed[1]

    def forward(self, x: torch.Tensor, relu: bool = False) -> torch.Tensor:
        if _packable(x, self.weight):
            bias = None if self.bias is None else self.bias.detach()
            return _packed_product(x, self._packed_weight(), bias, "relu" if relu else "none")
        out = F.linear(x, self.weight, self.bias)
        return F.relu(out) if relu else out

    def train(self, mode: bool = True) -> Linear:
        """Also drops the packed copies, so ``model.eval()`` (which every decoding path calls) always packs
        the weights as they are then, even after a change the version counter does not see."""
        self._packed = self._stacked = None
        return super().train(mode)

    def __getstate__(self):  # a pickled or deep-copied module packs again where it lands
        return {**self.__dict__, "_packed": None, "_stacked": None}


def stacked(layers: list[Linear], x: torch.Tensor) -> list[torch.Tensor]:
    """``[layer(x) for layer in layers]``, as one product on the packed path (the weights stacked and
    packed together, kept on the first layer): a self-attention's query, key and value projections."""
    first = layers[0]
    if not (_packable(x, first.weight) and all(isinstance(m, Linear) and not m.weight.is_inference() for m in layers)):
        return [layer(x) for layer in layers]
    key = _key(*(m.weight for m in layers)) + _key(*(m.bias for m in layers if m.bias is not None))
    if first._stacked is None or first._stacked[0] != key:
        with torch.inference_mode():
            weight = torch.cat([m.weight.detach() for m in layers])  # (sum out, in)
            has_bias = [m.bias is not None for m in layers]
            bias = None
            if any(has_bias):
                bias = torch.cat([m.bias.detach() if m.bias is not None else m.weight.new_zeros(m.out_features) for m in layers])
            first._stacked = (key, _OPS[0](weight, 64), bias)
    out = _packed_product(x, first._stacked[1], first._stacked[2], "none")  # (..., sum out)
    return list(out.split([m.out_features for m in layers], dim=-1))
