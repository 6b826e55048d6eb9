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

from collections.abc import Sequence

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


def _packable(x: torch.Tensor, layers: Sequence[nn.Linear]) -> bool:
    return (
        ENABLED
        and not torch.is_grad_enabled()
        and x.dtype == torch.float32
        and x.device.type == "cpu"
        and forward_ad._current_level < 0  # inside a forward-mode AD level: the differentiable F.linear
        and x.dim() >= 2
        and x.numel() > 0
        and all(
            isinstance(m, Linear)
            and m.weight.dtype == torch.float32
            and not m.weight.is_inference()  # made under inference_mode: no version counter to key on
            for m in layers
        )
    )


def _key(*weights: torch.Tensor) -> tuple:
    return tuple((w.data_ptr(), w._version, tuple(w.shape)) for w in weights)


def _packed_product(x: torch.Tensor, layers: Sequence[Linear], activation: str = "none") -> torch.Tensor:
    """x (..., in) times the weights of ``layers`` stacked (sum of out): one oneDNN product with the
    weights packed once and kept on the first layer until any weight or bias changes."""
    first = layers[0]
    key = _key(*(m.weight for m in layers)) + _key(*(m.bias for m in layers if m.bias is not None))
    packed = first._packs.get(len(layers))
    if packed is None or packed[0] != key:
        with torch.inference_mode():
            weight = torch.cat([m.weight.detach() for m in layers])  # (sum out, in)
            bias = None
            if any(m.bias is not None for m in layers):
                bias = torch.cat([m.weight.new_zeros(m.out_features) if m.bias is None else m.bias.detach() for m in layers])
            packed = first._packs[len(layers)] = (key, _OPS[0](weight, 64), bias)
    rows = x.reshape(-1, x.size(-1)).contiguous()  # (M, in)
    out = _OPS[1](rows, packed[1], packed[2], activation, [], "")  # (M, sum out)
    return out.view(*x.shape[:-1], out.size(-1))


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same ``state_dict``) with the prepacked inference path.

    ``forward(x, relu=True)`` is ``relu(linear(x))``, fused into the product on the packed path."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._packs: dict[int, tuple] = {}  # number of layers stacked -> (key, packed weight, bias)

    def forward(self, x: torch.Tensor, relu: bool = False) -> torch.Tensor:
        if _packable(x, (self,)):
            return _packed_product(x, (self,), "relu" if relu else "none")
        out = F.linear(x, self.weight, self.bias)
        return F.relu(out) if relu else out

    def train(self, mode: bool = True) -> Linear:
        """Also drops the packed copies, so ``model.eval()`` (which every decoding path calls) always packs
        the weights as they are then, even after a change the version counter does not see."""
        self._packs = {}
        return super().train(mode)

    def __getstate__(self):  # a pickled or deep-copied module packs again where it lands
        return {**self.__dict__, "_packs": {}}


def stacked(layers: Sequence[Linear], x: torch.Tensor) -> list[torch.Tensor]:
    """``[layer(x) for layer in layers]``, as one product on the packed path (the weights stacked and
    packed together, kept on the first layer): a self-attention's query, key and value projections."""
    if not _packable(x, layers):
        return [layer(x) for layer in layers]
    out = _packed_product(x, layers)  # (..., sum out)
    return list(out.split([m.out_features for m in layers], dim=-1))
