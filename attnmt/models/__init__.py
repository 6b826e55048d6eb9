"""Model architectures: ``ARCHS`` maps ``model.arch`` to a class; ``build_model`` makes one from its config."""

from __future__ import annotations

from torch import nn

from ..config import LSTMConfig, TransformerConfig
from .lstm import LSTMModel
from .protocol import ModelOutput, select
from .transformer import TransformerModel

ARCHS: dict[str, type[nn.Module]] = {"lstm": LSTMModel, "transformer": TransformerModel}

__all__ = ["ARCHS", "ModelOutput", "build_model", "parameter_counts", "select"]


def build_model(cfg: LSTMConfig | TransformerConfig, src_vocab_size: int, tgt_vocab_size: int, pad_id: int = 0) -> nn.Module:
    return ARCHS[cfg.arch](cfg, src_vocab_size, tgt_vocab_size, pad_id)


def parameter_counts(model: nn.Module) -> dict[str, int]:
    """Trainable parameters per top-level part; a tied or shared tensor counts once, in the first part
    that holds it."""
    seen: set[int] = set()
    counts: dict[str, int] = {}
    for name, child in model.named_children():
        n = 0
        for p in child.parameters():
            if id(p) not in seen and p.requires_grad:
                seen.add(id(p))
                n += p.numel()
        counts[name] = n
    return counts
