"""What every architecture gives the trainer and the decoder.

``model(batch, need_attention)`` returns ``ModelOutput`` (teacher forcing). Decoding goes through four
calls that ``decode.py`` relies on, and nothing else:

- ``encode(src, src_mask) -> state``: run the encoder once; the state holds what every step needs;
- ``step(tokens (B,), state, need_attention) -> (logits (B, V), state, attention (B, S) or None)``:
  one target position; the cache is a value passed in and handed back, never stashed on the module;
- ``select(state, index)``: keep or repeat batch rows (beam search reorders hypotheses with it).

A state is a dict whose tensors have the batch on dimension 0 (lists and tuples of such tensors are
fine); plain ints are shared by the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class ModelOutput:
    logits: torch.Tensor  # (B, T, V)
    attention: dict[str, list[torch.Tensor]] | None = None
    """With ``need_attention``: name -> one weight tensor per layer, e.g. ``cross``: (B, H, T, S)."""


def select(state: Any, index: torch.Tensor) -> Any:
    """``state`` with every batch-first tensor indexed by ``index`` (B',) along dimension 0."""
    if isinstance(state, torch.Tensor):
        return state.index_select(0, index)
    if isinstance(state, dict):
        return {k: select(v, index) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(select(v, index) for v in state)
    return state
