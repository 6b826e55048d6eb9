"""What every architecture gives the trainer and the decoder.

``model(batch, need_attention)`` returns ``ModelOutput`` (teacher forcing). Decoding goes through four
calls that ``decode.py`` relies on, and nothing else:

- ``encode(src, src_mask) -> state``: run the encoder once; the state holds what every step needs;
- ``step(tokens (B,), state, need_attention) -> (logits (B, V), state, attention (B, S) or None)``:
  one target position; the cache is a value passed in and handed back, never stashed on the module
  (a model may write preallocated buffers in place, as the Transformer does, if every state it ever
  handed out still decodes the same: stepping or selecting from one state twice must work);
- ``select(state, index, inplace=False)``: keep or repeat batch rows (beam search reorders hypotheses
  with it). ``inplace=True`` says the caller is done with ``state`` and with the states it was stepped
  from: the model may then overwrite their storage (the searches pass it; a model is free to ignore it).

A state is a dict whose tensors have the rows on dimension 0 (lists and tuples of such tensors are
fine); plain ints are shared by the whole batch. Models keep what belongs to the source sentence (the
encoder's output, cross-attention keys and values, the source mask) once per sentence, and what
belongs to a hypothesis once per row; the rows come in blocks of ``group`` rows of one sentence (the
beams of a beam search). ``regroup`` turns a row index into that layout, so a beam reordering its
hypotheses moves only the per-row tensors, and the per-sentence ones move only when sentences leave.
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


def select(state: Any, index: torch.Tensor, inplace: bool = False) -> Any:
    """``state`` with every batch-first tensor indexed by ``index`` (B',) along dimension 0 (always a
    copy: ``inplace`` is accepted for the protocol and ignored)."""
    if isinstance(state, torch.Tensor):
        return state.index_select(0, index)
    if isinstance(state, dict):
        return {k: select(v, index) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(select(v, index) for v in state)
    return state


def regroup(index: torch.Tensor, group: int, n_sentences: int) -> tuple[torch.Tensor | None, int]:
    """For new rows ``index`` (N',) of a state with blocks of ``group`` rows per sentence: which
    sentences the new state keeps, in order (None = all of them, unchanged), and its new group size.

    If the new rows do not come in equal blocks of one sentence each, every row becomes its own block
    (group 1, per-sentence tensors repeated per row): always correct, just not the fast layout.
    """
    sentence = torch.div(index, group, rounding_mode="floor")  # (N',) sentence of each new row
    n = sentence.numel()
    if n == 0:
        return sentence, 1
    changes = (sentence[1:] != sentence[:-1]).nonzero()
    first_run = int(changes[0, 0]) + 1 if changes.numel() else n
    if n % first_run == 0:
        blocks = sentence.view(-1, first_run)  # (B', G')
        if bool((blocks == blocks[:, :1]).all()):
            kept = blocks[:, 0]
            unchanged = kept.numel() == n_sentences and bool((kept == torch.arange(n_sentences, device=kept.device)).all())
            return (None if unchanged else kept), first_run
    return sentence, 1


def select_grouped(state: dict, index: torch.Tensor, row_keys: tuple[str, ...], sentence_keys: tuple[str, ...], n_sentences: int) -> dict:
    """``select`` for a state laid out as ``regroup`` describes (``group`` in the state)."""
    kept, group = regroup(index, state["group"], n_sentences)
    new = {**state, "group": group}
    for key in row_keys:
        new[key] = select(state[key], index)
    if kept is not None:
        for key in sentence_keys:
            new[key] = select(state[key], kept)
    return new


def to_blocks(x: torch.Tensor, group: int) -> torch.Tensor:
    """(B*G, ...) rows -> (B, G, ...): the rows of each sentence side by side."""
    return x.view(x.size(0) // group, group, *x.shape[1:])
