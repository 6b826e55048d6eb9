"""The opt-in CPU fast path for decoding: prepacked oneDNN products, applied to a loaded model.

PyTorch's CPU ``F.linear`` calls MKL's sgemm on the weight as stored, every time. oneDNN can instead
reorder a weight once into the blocked layout its GEMM kernels read fastest (the step ``torch.compile``
takes for frozen CPU weights). ``apply(model)`` makes a model's products use such prepacked weights:

- every ``nn.Linear`` becomes a ``PackedLinear``;
- a self-attention's query, key and value projections run as one product (``PackedMultiHeadAttention``);
- a ``Linear`` followed by a ``ReLU`` inside an ``nn.Sequential`` (the Transformer's feed-forward
  sublayer) runs as one product with the ReLU fused into it.

How: each such module's class is swapped for a subclass that overrides only how it computes, so the
parameters (tied ones included), buffers, ``state_dict`` and hooks stay exactly as they were. A fused
ReLU is set aside and its place in the Sequential holds an ``nn.Identity`` (hooks on that ReLU do not
run while it is fused). ``remove(model)`` undoes all of it, the very same ReLU modules put back.

When the packed path is taken: float32 CPU inputs with gradients off (``torch.no_grad`` or
``torch.inference_mode``), outside forward-mode AD, with weights that were not made under
``inference_mode`` (they have no version counter to notice changes by). Everything else, training
included, takes the plain ``F.linear``: a model with the fast path applied still trains correctly, it
only computes the same products by another route where that is safe. Results agree with ``F.linear`` to
float32 rounding (the tests compare them), and each row is computed on its own, so a sentence's output
does not depend on the other sentences of its batch.

The packed copy of a weight lives on the module, out of ``state_dict``, keyed by the weight's storage
and version counter: an optimizer step or a loaded checkpoint makes it be packed again, and ``train()``
/ ``eval()`` drop it. A change that bypasses the version counter (writing through ``weight.data``, a
fused optimizer kernel) while the module stays in eval mode is not seen until the next ``eval()``.

Private PyTorch ops, quarantined here: ``torch.ops.mkldnn._reorder_linear_weight`` and
``_linear_pointwise``. ``available()`` says whether this build has them (``tests/decoding/test_fastpath.py``
fails, rather than passing slower, when a PyTorch upgrade takes them away); without them ``apply`` changes
nothing and returns 0. ``scripts/bench/bench_decode.py --parts`` measures what the packing gains.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd import forward_ad

from ..models.attention import MultiHeadAttention


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
ENABLED = _OPS is not None  # a module-level switch: tests turn it off to compare the two paths


def available() -> bool:
    """Whether this PyTorch build has the oneDNN ops the fast path needs."""
    return _OPS is not None


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
            isinstance(m, PackedLinear)
            and m.weight.dtype == torch.float32
            and not m.weight.is_inference()  # made under inference_mode: no version counter to key on
            for m in layers
        )
    )


def _key(*weights: torch.Tensor) -> tuple:
    return tuple((w.data_ptr(), w._version, tuple(w.shape)) for w in weights)


def _packed_product(x: torch.Tensor, layers: Sequence[PackedLinear],
                    activation: str = "none") -> torch.Tensor:
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
                bias = torch.cat([m.weight.new_zeros(m.out_features) if m.bias is None else m.bias.detach()
                                  for m in layers])
            packed = first._packs[len(layers)] = (key, _OPS[0](weight, 64), bias)
    rows = x.reshape(-1, x.size(-1)).contiguous()  # (M, in)
    m = rows.size(0)
    padded = row_bucket(m)
    if padded != m:  # zero rows: each row is computed alone, so the real ones are unchanged
        rows = torch.cat([rows, rows.new_zeros(padded - m, rows.size(1))])
    out = _OPS[1](rows, packed[1], packed[2], activation, [], "")  # (M', sum out)
    return out[:m].view(*x.shape[:-1], out.size(-1))


def row_bucket(m: int) -> int:
    """The row count a product runs with: ``m`` rounded up to one of 8 sizes per doubling (at most 12.5%
    more rows; multiples of 8 up to 64). oneDNN compiles and caches a kernel for every input shape it
    meets, and decoding meets a new row count with nearly every batch and finished sentence: unbucketed,
    a streaming ``translate`` filled its caches with 1,775 shapes in 20,000 lines, about 0.7 GB
    (``scripts/check_growth.py``)."""
    if m <= 64:
        return -(-m // 8) * 8
    step = 1 << (m.bit_length() - 4)  # 8 steps between 2**k and 2**(k + 1)
    return -(-m // step) * step


class PackedLinear(nn.Linear):
    """``nn.Linear`` (same parameters, same ``state_dict``) with the prepacked product, and optionally a
    ReLU fused into it (``fused_relu``: the ``Sequential`` it sits in holds an ``nn.Identity`` where the
    ReLU was)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._packs: dict[int, tuple] = {}  # number of layers stacked -> (key, packed weight, bias)
        self.fused_relu = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        activation = "relu" if self.fused_relu else "none"
        if _packable(x, (self,)):
            return _packed_product(x, (self,), activation)
        out = F.linear(x, self.weight, self.bias)
        return F.relu(out) if self.fused_relu else out

    def train(self, mode: bool = True) -> PackedLinear:
        """Also drops the packed copies, so ``model.eval()`` (which every decoding path calls) always packs
        the weights as they are then, even after a change the version counter does not see."""
        self._packs = {}
        return super().train(mode)

    def __getstate__(self):  # a pickled or deep-copied module packs again where it lands
        return {**self.__dict__, "_packs": {}}


class PackedMultiHeadAttention(MultiHeadAttention):
    """Self-attention's three projections as one product of the stacked (and packed) weights."""

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        layers = (self.q_proj, self.k_proj, self.v_proj)
        if not _packable(x, layers):
            return super().project_qkv(x)
        q, k, v = _packed_product(x, layers).split([m.out_features for m in layers], dim=-1)
        return self._split_heads(q), self._split_heads(k), self._split_heads(v)


def apply(model: nn.Module) -> int:
    """Give ``model`` the fast path, in place (see the module docstring); returns how many modules now
    take it (0 when this build lacks the ops). Idempotent."""
    if not available():
        return 0
    changed = 0
    for module in list(model.modules()):
        if type(module) is nn.Linear:
            module.__class__ = PackedLinear
            module._packs, module.fused_relu = {}, False
            changed += 1
        elif type(module) is PackedLinear:
            changed += 1
        elif type(module) is MultiHeadAttention and module.heads == "full":
            module.__class__ = PackedMultiHeadAttention
    for module in list(model.modules()):
        if isinstance(module, nn.Sequential):
            children = list(module)
            for i in range(len(children) - 1):
                if type(children[i]) is PackedLinear and type(children[i + 1]) is nn.ReLU:
                    children[i].fused_relu = True
                    # Set aside (a plain dict: not a submodule), so that remove() puts back this very ReLU.
                    module.__dict__.setdefault("_fused_relus", {})[i + 1] = children[i + 1]
                    module[i + 1] = nn.Identity()
    return changed


def remove(model: nn.Module) -> None:
    """Undo ``apply``: plain ``nn.Linear`` and ``MultiHeadAttention`` again, the ReLUs back in place."""
    for module in list(model.modules()):
        if isinstance(module, nn.Sequential):
            for i, relu in module.__dict__.pop("_fused_relus", {}).items():
                module[i] = relu
    for module in list(model.modules()):
        if type(module) is PackedLinear:
            del module._packs, module.fused_relu
            module.__class__ = nn.Linear
        elif type(module) is PackedMultiHeadAttention:
            module.__class__ = MultiHeadAttention
