"""What every architecture gives the trainer and the decoder: ``TranslationModel`` and its decoding states.

Teacher forcing: ``model(batch, need_attention, align_layer, full_context)`` returns a ``ModelOutput``
(``full_context``: the attention asked for comes from a pass in which every target position sees the whole
target, Garg et al.'s alignment pass; the Transformer's, and a ValueError from a model that has none). A
Transformer may carry an alignment layer (``model.aligner``, ``attention.AlignmentLayer``): it reads the
translation detached, and its weights come as ``alignment`` and as the attention kind ``align``.
Decoding goes
through three calls that ``decoding/search.py`` relies on, and nothing else:

- ``encode(src, src_mask) -> state``: run the encoder once; the state holds what every step needs;
- ``step(tokens (N,), state, need_attention) -> (logits (N, V), state, attention (N, S) or None)``:
  one target position for every row;
- ``select(state, index (N',), inplace=False) -> state``: keep or repeat rows (beam search reorders
  its hypotheses with it, and drops the rows of finished sentences).

States are values. A step or a select returns a new state and never changes what the old one
decodes: stepping or selecting from one state twice gives two independent continuations. A model may
still write preallocated buffers in place (the Transformer's key/value cache does) as long as every
state it handed out keeps that promise. The one exception is asked for explicitly:
``select(..., inplace=True)`` says the caller is done with ``state`` *and with every state it was
stepped from*; the model may then reuse their storage (the searches pass it; a model may ignore it),
and using any of those states again raises RuntimeError.

Layout. A state is a frozen dataclass, a ``DecoderState``: each field is marked as per sentence (the
encoder's output, cross-attention keys and values, the source mask: one entry per source sentence) or
per row (what belongs to one hypothesis). Rows come in blocks of ``beams`` rows of one sentence (the
beams of a beam search; 1 for greedy), and a beam's rows attend to their sentence as extra query
positions, so per-sentence tensors are never copied per beam. ``select_rows`` moves the per-row fields
and, only when the sentences themselves change, the per-sentence ones.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch


@dataclass
class ModelOutput:
    logits: torch.Tensor  # (B, T, V)
    attention: dict[str, list[torch.Tensor]] | None = None
    """With ``need_attention``: name -> one weight tensor per layer, e.g. ``cross``: (B, H, T, S)."""
    alignment: torch.Tensor | None = None
    """With ``align_layer``: that layer's cross-attention (B, H, T, S), in the graph (guided alignment); from
    a model with an alignment layer (``model.aligner``), training or asked for attention: its weights
    (B, 1, T, S)."""
    align_logits: torch.Tensor | None = None
    """An alignment layer that learns by predicting (``objective: predict``), training: its logits
    (B, T, V)."""


def per_sentence() -> Any:
    """A ``DecoderState`` field with one entry per source sentence (dimension 0)."""
    return dataclasses.field(metadata={"per": "sentence"})


def per_row() -> Any:
    """A ``DecoderState`` field with one entry per decoded row (dimension 0)."""
    return dataclasses.field(metadata={"per": "row"})


@dataclass(frozen=True, kw_only=True, eq=False)
class DecoderState:
    """Base of the architectures' decoding states; see the module docstring for the layout. Compared by
    identity (``eq=False``): their fields are tensors."""

    beams: int = 1
    """Rows per sentence: the rows come in blocks of ``beams`` rows of one sentence each."""


State = TypeVar("State")


class TranslationModel(Protocol[State]):
    """An encoder-decoder as the trainer (``__call__``) and the searches (the other three) use it."""

    def __call__(self, batch: Any, need_attention: bool = False, align_layer: int | None = None,
                 full_context: bool = False) -> ModelOutput: ...

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> State: ...

    def step(self, tokens: torch.Tensor, state: State,
             need_attention: bool = False) -> tuple[torch.Tensor, State, torch.Tensor | None]: ...

    def select(self, state: State, index: torch.Tensor, inplace: bool = False) -> State: ...


def take_rows(value: Any, index: torch.Tensor) -> Any:
    """``value`` with every tensor in it indexed by ``index`` (N',) along dimension 0: a tensor, or lists,
    tuples and dicts of them; anything else is shared as it is. Always a copy."""
    if isinstance(value, torch.Tensor):
        return value.index_select(0, index)
    if isinstance(value, dict):
        return {k: take_rows(v, index) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(take_rows(v, index) for v in value)
    return value


def sentences_of(index: torch.Tensor, beams: int, n_sentences: int) -> tuple[torch.Tensor | None, int]:
    """For new rows ``index`` (N',) of a state with blocks of ``beams`` rows per sentence: which sentences
    the new state keeps, in order (None = all of them, unchanged), and its new rows per sentence.

    If the new rows do not come in equal blocks of one sentence each, every row becomes a sentence of its
    own (beams 1, per-sentence tensors repeated per row): always correct, just not the fast layout.
    """
    sentence = torch.div(index, beams, rounding_mode="floor")  # (N',) sentence of each new row
    n = sentence.numel()
    if n == 0:
        return sentence, 1
    changes = (sentence[1:] != sentence[:-1]).nonzero()
    first_run = int(changes[0, 0]) + 1 if changes.numel() else n
    if n % first_run == 0:
        blocks = sentence.view(-1, first_run)  # (B', G')
        if bool((blocks == blocks[:, :1]).all()):
            kept = blocks[:, 0]
            unchanged = (kept.numel() == n_sentences
                         and bool((kept == torch.arange(n_sentences, device=kept.device)).all()))
            return (None if unchanged else kept), first_run
    return sentence, 1


StateT = TypeVar("StateT", bound=DecoderState)


def select_rows(state: StateT, index: torch.Tensor, n_sentences: int, **changes: Any) -> StateT:
    """``state`` with the rows ``index`` (N',): every ``per_row`` field indexed by it, the ``per_sentence``
    fields by the sentences those rows belong to (``sentences_of``); ``changes`` replace fields as they are
    (a model passes the fields it moves itself)."""
    kept, beams = sentences_of(index, state.beams, n_sentences)
    new: dict[str, Any] = {"beams": beams}
    for f in dataclasses.fields(state):
        if f.name in changes:
            continue
        per = f.metadata.get("per")
        if per == "row":
            new[f.name] = take_rows(getattr(state, f.name), index)
        elif per == "sentence" and kept is not None:
            new[f.name] = take_rows(getattr(state, f.name), kept)
    return dataclasses.replace(state, **new, **changes)


def to_blocks(x: torch.Tensor, beams: int) -> torch.Tensor:
    """(B*K, ...) rows -> (B, K, ...): the rows of each sentence side by side."""
    return x.view(x.size(0) // beams, beams, *x.shape[1:])
