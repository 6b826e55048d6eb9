"""int8 in attnmt's own search (``--int8``, ``decode.quantize: int8``): every ``nn.Linear`` of a loaded
model, the output projection included, with int8 weights (one scale per output row) and activations
quantized as they come (dynamic quantization), through PyTorch's own quantized CPU engine
(``torch.ao.quantization``: oneDNN's or fbgemm's VNNI / AMX int8 products). Embeddings, layer norms,
attention's own products and the search stay float32, and the module tree keeps its shape, so every
search mode, the attention that ``plot``, ``align`` and ``--markup`` read, ensembles and the server work as
on the float model. CPU only; takes a model in, gives it back quantized in place.

The quantized linear layers replace the fast path's prepacked float ones (``fastpath.py``): a model is one
or the other. The engine is oneDNN where the CPU has AMX's int8 products (``engine``: measured faster
there for beam search), else PyTorch's own choice (``x86``). PyTorch marks ``torch.ao.quantization`` as
deprecated (its successor is torchao, which leans on ``torch.compile``); the warning is PyTorch's own and
is kept off the user's screen here.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from ..config.choices import cpu_flags
from . import fastpath


def engine() -> str:
    """The quantized engine for this CPU (``torch.backends.quantized.engine``); see the module docstring."""
    supported = torch.backends.quantized.supported_engines
    if "onednn" in supported and "amx_int8" in cpu_flags():
        return "onednn"
    return "x86" if "x86" in supported else torch.backends.quantized.engine


def quantize_int8(model: nn.Module) -> int:
    """Quantize ``model``'s linear layers in place (the fast path taken off first); returns how many."""
    fastpath.remove(model)
    torch.backends.quantized.engine = engine()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*deprecat", category=UserWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
        torch.ao.quantization.quantize_dynamic(model, {nn.Linear: qconfig}, dtype=torch.qint8, inplace=True)
    return sum(1 for m in model.modules() if is_quantized_module(m))


def is_quantized_module(module: nn.Module) -> bool:
    """A linear layer ``quantize_int8`` made (not the packed weights it holds)."""
    return isinstance(module, torch.ao.nn.quantized.dynamic.Linear)


def quantized(model: nn.Module) -> bool:
    """Whether ``quantize_int8`` went over ``model``."""
    return any(is_quantized_module(m) for m in model.modules())


def parameter_count(model: nn.Module) -> int:
    """The model's parameters, a quantized linear layer's int8 weights and bias counted as they were."""
    count = sum(p.numel() for p in model.parameters())
    for module in model.modules():
        if is_quantized_module(module):
            bias = module.bias()
            count += module.weight().numel() + (bias.numel() if bias is not None else 0)
    return count
