"""Model architectures: ``ARCHS`` maps ``model.arch`` to a class; ``build_model`` makes one from its config.

Adding an architecture: a module here with a class that takes (its config slice, source vocabulary size,
target vocabulary size, pad id) and satisfies ``protocol.TranslationModel``, an entry in ``ARCHS``, its
config section in ``config/model.py``, and its attention layout in ``attention_layout``. Nothing in
``decoding/search.py`` changes.
"""

from __future__ import annotations

from torch import nn

from ..config.schema import LSTMConfig, TrainConfig, TransformerConfig
from .attention import attach_aligner
from .ensemble import Ensemble
from .lstm import LSTMModel
from .protocol import DecoderState, ModelOutput, TranslationModel, take_rows
from .transformer import TransformerModel

ARCHS: dict[str, type[nn.Module]] = {"lstm": LSTMModel, "transformer": TransformerModel}

__all__ = ["ARCHS", "DecoderState", "Ensemble", "ModelOutput", "TranslationModel", "attention_layout",
           "build_model", "parameter_counts", "take_rows"]


def build_model(cfg: LSTMConfig | TransformerConfig, src_vocab_size: int, tgt_vocab_size: int,
                pad_id: int = 0, train: TrainConfig | None = None) -> nn.Module:
    """The model of ``cfg``; with ``train`` whose ``alignment.module`` is ``layer``, carrying an alignment
    layer (``attention.AlignmentLayer``, its weights drawn from ``train.seed``, apart from the
    translation's)."""
    model = ARCHS[cfg.arch](cfg, src_vocab_size, tgt_vocab_size, pad_id)
    guided = train.alignment if train is not None else None
    if guided is not None and guided.module == "layer":
        attach_aligner(model, cfg.d_model, guided.layer - 1, guided.full_context,
                       guided.objective == "predict", seed=train.seed + 1, shift=guided.shift,
                       feed_forward=guided.feed_forward, dropout=guided.dropout)
    return model


def attention_layout(cfg: LSTMConfig | TransformerConfig) -> tuple[dict[str, int], int]:
    """({attention kind: layers}, heads) of a model config, as ``model(batch, need_attention=True)``
    returns them: an LSTM has one single-head cross-attention; a Transformer has cross, encoder-self and
    decoder-self attention in every layer."""
    if cfg.arch == "transformer":
        return {"cross": cfg.dec_layers, "enc_self": cfg.enc_layers, "dec_self": cfg.dec_layers}, cfg.n_heads
    return {"cross": 1}, 1


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
